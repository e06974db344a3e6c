"""Diagnose where a model loses long, sparse sequences (issue 16), with mapformer.ood.

Trains a model on a config (or loads a checkpoint with --run DIR) and writes, per eval set
(iid, ood_dense, ood_sparse) and per evaluation variant (the attention temperature, and the
test-time log-length scaling), recall accuracy bucketed by position and by lag, the attention
mass on the correct key against the number of keys (per layer and head) and the float32 vs
float64 error of the path-integrated angles, as JSON: one file per config x model x training
variant x seed under --out (default results/ood/); a rerun skips the files that exist.
Checkpoints go to runs/ood/NAME/ every --checkpoint-every steps: a rerun whose JSON is
missing loads a finished run's (no retraining) and resumes an interrupted one, so a long run
(e.g. --sequences 200000) can be done over several sittings.

Configs (--configs):
  table1     README Table 1 at scale cpu: selective copy, 16 tokens among 16 blanks (OOD 8 and
             32), 2 layers, d_model 64, 2 heads, 600 steps of batch 64; MapWM's row: r = 1
  table2_1d, table2_2d
             README Table 2 at scale cpu: navigation, 32 steps, grid 16 (OOD-sparse 128 steps,
             grid 32, p_empty 0.8), 1 layer, d_model 64, 2 heads, 600 steps of batch 64; r = dims
  main       README's main job: the paper's 2D IID preset (128 steps, grid 64; OOD-sparse 512
             steps, grid 128), 1 layer, d_model 128, 2 heads, 76,800 sequences of batch 128,
             r = 2

Examples:
  python benchmarks/diagnose_ood.py --configs table1 --seeds 3 --delta-rank 1,2,4 \\
      --temperature 1,2 --eval-log-scale
  python benchmarks/diagnose_ood.py --run runs/my_run --temperature 1,2
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mapformer import ood  # noqa: E402
from mapformer.models import ModelConfig  # noqa: E402
from mapformer.reproduce.mapformer import TABLES  # noqa: E402
from mapformer.train import (TrainConfig, eval_seed, load_checkpoint, task_module,  # noqa: E402
                             train)

SETS = ("iid", "ood_dense", "ood_sparse")


def table_config(table, part, label):
    """(model preset, layers, ModelConfig values, TrainConfig, eval tasks) of a README table's
    row at scale cpu."""
    scale = TABLES[table]["scales"]["cpu"]
    row = next(r for r in TABLES[table]["rows"] if r.label == label)
    p = scale.parts[part]
    values = dict(d_model=scale.d_model, n_heads=scale.n_heads, n_layers=row.n_layers,
                  delta_rank=row.options.get("delta_rank", getattr(p["train"], "dims", 1)))
    train_config = TrainConfig(**p["train_fields"], sequences=scale.sequences,
                               batch_size=scale.batch_size)
    return values, train_config, p["eval"]


def main_config():
    train_config = TrainConfig(sequences=76_800, batch_size=128)
    return dict(d_model=128, n_heads=2, n_layers=1, delta_rank=2), train_config, \
        train_config.eval_tasks()


CONFIGS = {
    "table1": lambda: table_config("1", "", "MapWM"),
    "table2_1d": lambda: table_config("2", "1D", "MapWM"),
    "table2_2d": lambda: table_config("2", "2D", "MapWM"),
    "main": main_config,
}


def diagnose(model, train_config, eval_tasks, variants, eval_sequences, detail_sequences):
    """{variant: {set: {"accuracy": ..., "attention": ...}}, "angles": {set: tables}}."""
    seed = eval_seed(train_config)
    alias_grid = getattr(train_config.task_config(), "grid_size", None)  # navigation
    out = {"variants": {label: {} for label in variants}, "angles": {}}
    for set_name, task in eval_tasks.items():
        module = task_module(task)
        batches = module.eval_set(task, eval_sequences, seed, batch_size=32)
        detail = module.eval_set(task, detail_sequences, seed, batch_size=detail_sequences)[0]
        for label, options in variants.items():
            same = {k: v for k, v in options.items() if k != "attn_log_scale"}
            if options.get("attn_log_scale", 0) >= task.seq_len and same != options:
                # clamped log scaling within its length: every factor is 1, as without it
                base = next(k for k, v in variants.items() if v == same)
                out["variants"][label][set_name] = out["variants"][base][set_name]
                continue
            view = ood.with_options(model, **options) if options else model
            out["variants"][label][set_name] = {
                "accuracy": ood.accuracy_by_position_and_lag(view, batches, task),
                "attention": ood.attention_tables(ood.attention_mass(view, detail, task,
                                                                     alias_grid=alias_grid))}
        twin = ood.float64_twin(model)
        out["angles"][set_name] = {
            str(layer): ood.angle_tables(ood.angle_errors(model, detail, task, layer, twin))
            for layer in range(model.config.n_layers)}
    return out


def summary(name, record):
    """A few lines: per variant and set, accuracy (object recalls), accuracy at the shortest
    and longest lag, the best head's mass on the correct key at the fewest and most keys
    (last layer; navigation: and on aliases of the cell modulo the training grid) and how
    often its most weighted key is a right one or a neighbour (all recalls of the detail
    set), then the largest float32 angle error and the weighted closure at the longest lag."""
    wall = record.get("wall_s")
    lines = [f"{name}: " + ("read from its checkpoint" if wall is None
                            else f"trained {wall:.0f}s")]
    for label, sets in record["diagnosis"]["variants"].items():
        for set_name, d in sets.items():
            acc, lag = d["accuracy"], d["accuracy"]["by_lag"]
            layer = d["attention"][max(d["attention"], key=int)]["best"]["by_keys"]
            obj = acc["object_accuracy"]
            lines.append(
                f"  {label:<10} {set_name:<10} acc {acc['accuracy']:.3f}"
                + (f" (objects {obj:.3f})" if obj is not None else "")
                + f"  by lag: {lag[0]['accuracy']:.2f} @ {lag[0]['lo']}-{lag[0]['hi'] - 1}"
                f" .. {lag[-1]['accuracy']:.2f} @ {lag[-1]['lo']}-{lag[-1]['hi'] - 1}"
                f"  mass on key: {layer[0]['mass']:.2f} @ {layer[0]['lo']}+ keys .. "
                f"{layer[-1]['mass']:.2f} @ {layer[-1]['lo']}+"
                + ("" if layer[-1]["alias_mass"] is None
                   else f" (aliases {layer[-1]['alias_mass']:.2f})")
                + "; top key right {:.2f}, a neighbour {:.2f}".format(
                    *(sum(row["n"] * row[k] for row in layer) / sum(row["n"] for row in layer)
                      for k in ("top_right", "top_near"))))
    for set_name, layers in record["diagnosis"]["angles"].items():
        for layer, tables in layers.items():
            heads = [t for k, t in tables.items() if k.startswith("head")]
            worst = max(row["model_error_max"] for t in heads for row in t)
            closure = [t[-1]["closure_weighted"] for t in heads]
            lines.append(f"  angles {set_name:<10} layer {layer}: float32 error max "
                         f"{worst:.1e} rad; closure (weighted) at lag {heads[0][-1]['lo']}+: "
                         + ", ".join("-" if c is None else f"{c:.3f}" for c in closure))
    return "\n".join(lines)


def parse_list(text, kind):
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--configs", default="table1,main",
                        help=f"comma-separated among {', '.join(CONFIGS)} (default table1,main)")
    parser.add_argument("--model", default="mapwm", help="model preset (default mapwm)")
    parser.add_argument("--run", default=None,
                        help="diagnose the checkpoint DIR/checkpoint.npz instead of training")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 .. N-1 (default 1)")
    parser.add_argument("--sequences", type=int, default=None,
                        help="training sequences (default: the config's)")
    parser.add_argument("--delta-rank", default=None,
                        help="comma-separated ranks r of Delta, one run each (default: the "
                        "config's)")
    parser.add_argument("--temperature", default="1",
                        help="comma-separated attention logit factors (attn_scale) to evaluate "
                        "each trained model with (default 1)")
    parser.add_argument("--eval-log-scale", action="store_true",
                        help="also evaluate with attn_log_scale = the training length "
                        "(clamped: a test-time change only)")
    parser.add_argument("--train-log-scale", action="store_true",
                        help="train with attn_log_scale = the training length, unclamped "
                        "(attn_log_clamp false: the literature's log-n scaling)")
    parser.add_argument("--eval-sequences", type=int, default=256,
                        help="sequences per set for the accuracy tables (default 256)")
    parser.add_argument("--detail-sequences", type=int, default=32,
                        help="sequences per set for attention and angles (default 32)")
    parser.add_argument("--out", default=str(ROOT / "results" / "ood"))
    parser.add_argument("--checkpoints", default=str(ROOT / "runs" / "ood"),
                        help="where each run's checkpoint goes (default runs/ood/NAME/)")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="optimizer steps between checkpoints: an interrupted run resumes "
                        "from its last one when the command is run again (default 100)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    temperatures = parse_list(args.temperature, float)

    def variants(train_length, trained_options):
        found = {}
        for t in temperatures:
            found[f"T={t:g}"] = {} if t == 1.0 else {"attn_scale": t}
            if args.eval_log_scale and not trained_options.get("attn_log_scale"):
                found[f"T={t:g},log"] = {**found[f"T={t:g}"], "attn_log_scale": train_length}
        return found

    jobs = []
    if args.run:
        model, _, train_config, _ = load_checkpoint(Path(args.run) / "checkpoint.npz")
        jobs.append((f"run_{Path(args.run).resolve().name}", model, train_config,
                     train_config.eval_tasks()))
    else:
        for config in parse_list(args.configs, str):
            if config not in CONFIGS:
                parser.error(f"unknown config {config!r}; the configs are {list(CONFIGS)}")
            values, base_train, eval_tasks = CONFIGS[config]()
            ranks = parse_list(args.delta_rank, int) if args.delta_rank else [values["delta_rank"]]
            for rank in ranks:
                for seed in range(args.seeds):
                    jobs.append((config, values, base_train, eval_tasks, rank, seed))
    for job in jobs:
        t0 = time.perf_counter()
        if args.run:
            name, model, train_config, eval_tasks = job
            path = out / f"{name}.json"
            if path.exists():
                print(summary(name, json.loads(path.read_text())) + "  (earlier record)")
                continue
            wall = None
        else:
            config, values, base_train, eval_tasks, rank, seed = job
            task = base_train.task_config()
            options = {**values, "delta_rank": rank}
            if args.train_log_scale:
                options.update(attn_log_scale=task.seq_len, attn_log_clamp=False)
            name = (f"{config}_{args.model}_r{rank}" + ("_trainlog" if args.train_log_scale
                                                        else "")
                    + (f"_n{args.sequences}" if args.sequences else "") + f"_s{seed}")
            path = out / f"{name}.json"
            if path.exists():
                print(summary(name, json.loads(path.read_text())) + "  (earlier record)")
                continue
            train_config = TrainConfig(**{**base_train.to_dict(), "seed": seed,
                                          "sequences": args.sequences or base_train.sequences,
                                          "checkpoint_every": args.checkpoint_every})
            if "delta_rank" not in ModelConfig.preset(args.model, task.vocab_size).options:
                options.pop("delta_rank")
            model_config = ModelConfig.for_task(args.model, task, **options)
            run_dir = Path(args.checkpoints) / name
            checkpoint = run_dir / "checkpoint.npz"
            model = wall = resume = None
            if checkpoint.exists():
                model, _, saved, step = load_checkpoint(checkpoint)
                if saved != train_config or model.config != model_config:
                    model = None  # another run's: train again
                elif step < saved.total_steps:
                    model, resume = None, checkpoint  # an interrupted run: go on from there
            if model is None:
                result = train(model_config, train_config, out_dir=run_dir, resume=resume,
                               progress=False, eval_tasks=eval_tasks)
                model, wall = result["model"], result["wall_s"]
        seq_len = train_config.task_config().seq_len
        record = {"name": name, "model": model.config.to_dict(),
                  "train": train_config.to_dict(), "wall_s": wall,
                  "eval_sets": {k: vars(v) for k, v in eval_tasks.items()},
                  "variants": variants(seq_len, model.config.options),
                  "eval_sequences": args.eval_sequences,
                  "detail_sequences": args.detail_sequences}
        record["diagnosis"] = diagnose(model, train_config, eval_tasks, record["variants"],
                                       args.eval_sequences, args.detail_sequences)
        record["diagnose_s"] = time.perf_counter() - t0 - (wall or 0)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, separators=(",", ":"), default=_plain))
        tmp.replace(path)
        print(summary(name, record) + f"  (diagnosis {record['diagnose_s']:.0f}s)", flush=True)


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


if __name__ == "__main__":
    main()
