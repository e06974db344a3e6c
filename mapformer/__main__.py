"""Command line: ``python -m mapformer train ...`` and ``python -m mapformer eval ...``.

Each flag maps to one field of :class:`mapformer.models.ModelConfig` or
:class:`mapformer.train.TrainConfig` (same names, dashes for underscores); run with ``-h``
for the list. Defaults are the library's (the paper's recipe) unless stated.
"""
import argparse
import json
import sys
from dataclasses import MISSING, fields

from .models import ModelConfig
from .train import (TrainConfig, default_omega_grid, eval_seed, evaluate, format_eval,
                    load_checkpoint, train)

MODEL_FLAGS = [f for f in fields(ModelConfig) if f.name != "vocab_size"]
TRAIN_FLAGS = list(fields(TrainConfig))
CONFIG_HELP = {
    "positional": "positional scheme: rope, mapwm, cope, tape, mapem_os, mapem_s or mapem_o",
    "mapem_mode": "MapEM-os score combination: score_product, softmax_product or sum",
    "mapem_separate_start": "separate MapEM start vectors q*, k* (true/false)",
    "delta_rank": "rank r of Delta = W_out W_in x (MapWM)",
    "omega_grid": "MapWM omega init spans omega_max .. omega_max/omega_grid "
                  "(default: the task's grid side, or sequence length for selective copy)",
    "task": "navigation or selective_copy",
    "preset": "task preset: iid, ood_dense or ood_sparse",
    "steps": "override the preset's walk length T (tokens = 2T)",
    "grid_size": "override the preset's grid side",
    "p_empty": "override the preset's fraction of empty cells",
    "sequences": "training sequences in all",
    "schedule": "linear (paper) or cosine (with --warmup-steps)",
    "cope_positions": "CoPE position embeddings (default: the training sequence length)",
    "eval_every": "optimizer steps between evaluations (0: at the end only)",
    "checkpoint_every": "optimizer steps between checkpoints (0: at the end only)",
}


def parse_bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_config_flags(parser, config_fields):
    for f in config_fields:
        default = None if f.default is MISSING else f.default
        kind = type(default) if default is not None else (float if f.name == "p_empty" else int)
        if f.name in ("positional", "preset", "schedule", "task", "mapem_mode"):
            kind = str
        if kind is bool:
            kind = parse_bool
        help_text = CONFIG_HELP.get(f.name, f.name.replace("_", " "))
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None,
                            help=f"{help_text} (default: {default})")


def pick(args, config_fields):
    return {f.name: getattr(args, f.name) for f in config_fields
            if getattr(args, f.name) is not None}


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m mapformer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model on a task, then evaluate it on its presets")
    tr.add_argument("--out", default=None,
                    help="directory for checkpoint.npz and metrics.jsonl (default: none)")
    tr.add_argument("--resume", default=None, help="checkpoint to continue from")
    tr.add_argument("--no-progress", action="store_true", help="no progress line")
    tr.add_argument("--json", action="store_true", help="print the final results as JSON")
    add_config_flags(tr.add_argument_group("model"), MODEL_FLAGS)
    add_config_flags(tr.add_argument_group("training"), TRAIN_FLAGS)
    ev = sub.add_parser("eval", help="evaluate a checkpoint on the IID and OOD presets")
    ev.add_argument("checkpoint", help="path to a checkpoint.npz written by train")
    ev.add_argument("--sequences", type=int, default=None,
                    help="sequences per preset (default: the run's eval_sequences)")
    ev.add_argument("--seed", type=int, default=None, help="evaluation seed")
    ev.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command == "train":
        train_config = TrainConfig(**pick(args, TRAIN_FLAGS))
        task = train_config.task_config()
        model_values = {"omega_grid": default_omega_grid(task), "cope_positions": task.seq_len,
                        **pick(args, MODEL_FLAGS)}
        model_config = ModelConfig(vocab_size=task.vocab_size, **model_values)
        result = train(model_config, train_config, out_dir=args.out, resume=args.resume,
                       progress=not args.no_progress)
        if args.json:
            print(json.dumps({k: v for k, v in result.items() if k != "model"}))
    else:
        model, _, train_config, step = load_checkpoint(args.checkpoint)
        results = evaluate(model, train_config.eval_tasks(),
                           args.sequences or train_config.eval_sequences,
                           eval_seed(train_config) if args.seed is None else args.seed,
                           train_config.eval_batch_size)
        print(json.dumps(results) if args.json else
              f"{args.checkpoint} (step {step}, {model.config.positional}):\n"
              f"{format_eval(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
