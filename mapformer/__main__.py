"""Command line: ``python -m mapformer train | eval | plot | info | map | reproduce``.

``--model`` picks one of the paper's models (a preset of mixer, positional scheme and options:
mapformer.models.MODELS); ``--mixer`` and ``--positional`` replace the preset's parts. Every
other flag is a field of :class:`mapformer.models.ModelConfig` or
:class:`mapformer.train.TrainConfig`, or an option of a registered positional scheme, mixer or
bottleneck (same names, dashes for underscores); an option flag is accepted only when one of
the chosen components declares it. Run with ``-h`` for the list. Defaults are the library's
(the paper's recipe) unless stated; options with a task default (omega_grid, cope_positions,
coord_dims, coord_source, ape_positions, ape_tree_depth) take it from the training task.
``--import MODULE`` (before the command) imports a module first, so that the schemes, mixers or bottlenecks it registers can be picked.
"""
import argparse
import importlib
import json
import math
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import numpy as np

try:
    from . import _C  # noqa: F401  (first: a C core that refuses to load is one line)
except ImportError as exc:  # MAPFORMER_KERNELS or MAPFORMER_POOL_MB refused (mapformer/__init__)
    if __name__ != "__main__":
        raise
    print(f"python -m mapformer: error: {exc}", file=sys.stderr)
    sys.exit(2)
from . import backend as backends
from . import registry
from .experiments import cli as experiments_cli
from .bottlenecks import BOTTLENECKS
from .mixers import MIXERS
from .plots import learning_curves
from .models import MODELS, ModelConfig, components, options_of, preset_parts
from .schemes import SCHEMES
from .tasks import navigation, trees
from .train import (PRESETS, SCHEDULES, TASKS, TrainConfig, eval_seed, evaluate, format_eval,
                    load_checkpoint, model_kind, train)

MODEL_FIELDS = [f for f in fields(ModelConfig)
                if f.name not in ("vocab_size", "options", "mixer", "positional", "bottleneck")]
TRAIN_FIELDS = list(fields(TrainConfig))
PARTS = {"mixer": MIXERS, "positional": SCHEMES, "bottleneck": BOTTLENECKS}
FIELD_HELP = {
    "task": "the task (copy, repeat, reverse: APE's sequence transductions; tree_copy, "
            "tree_rotate, tree_c3, tree_ops: its tree transductions; grid_copy, "
            "grid_transpose, grid_rotate90, grid_flip: 2D grid transductions; rooms: walks "
            "of one of TDB's aliased rooms, with --loss-positions observations; ginc: GINC's "
            "documents and in-context prompts, with --loss-positions observations)",
    "task_options": "the task's own options, 'name=value,...' (rooms: height, width, n_obs, "
                    "patch, topology, walks (the training pool), context, noise (the share of "
                    "the pool's observations replaced at random), e.g. "
                    "'height=10,width=15,patch=3,walks=2048'; navigation: walk (uniform or "
                    "no_backtrack), action_repeat, fixed_map, map_seed; ginc: documents, "
                    "length, window, seed)",
    "grid_side": "grid tasks: the mean grid side (sides within +-1 of it; default 5)",
    "tree_depth": "tree tasks: the mean tree depth (the paper's 7)",
    "tree_order": "tree tasks: the target's order, breadth(-first) or depth(-first, pre-order)",
    "mean_length": "copy, repeat, reverse: the mean source length (the paper's 100)",
    "preset": "the task's preset",
    "steps": "override the preset's walk length T (tokens = 2T)",
    "grid_size": "override the preset's grid side",
    "p_empty": "override the preset's fraction of empty cells",
    "ood_dense": "override fields of the OOD-dense test set, derived from the training task "
                 "by the paper's ratios (half the steps and grid, p_empty 0.2; selective copy: "
                 "half the blanks), e.g. 'steps=16,grid_size=8'",
    "ood_sparse": "override fields of the OOD-sparse test set, derived from the training task "
                  "by the paper's ratios (4x the steps, 2x the grid, p_empty 0.8; selective "
                  "copy: twice the blanks), e.g. 'steps=256'",
    "loss_positions": "where the training loss is taken: revisits (the scored positions, as "
                      "the paper does), observations (every observation, navigation only) or "
                      "all",
    "decay": "parameters AdamW decays: comma-separated 'matrices' (linear and embedding "
             "weights, CoPE position embeddings, TAPE's head mix), 'all', 'none' and "
             "parameter-name globs, e.g. 'matrices,*.omega' to also decay MapWM's omega",
    "planes": "rotation4d: the 90-degree rotation planes generating the group, pairs of axes "
              "1..4 (default '12,23': 24 elements; '12,23,34': 192; '12,34': commuting, 16)",
    "sequences": "training sequences in all",
    "schedule": "linear (the paper's), cosine (with --warmup-steps) or constant (TDB's)",
    "eval_every": "optimizer steps between evaluations (0: at the end only)",
    "checkpoint_every": "optimizer steps between checkpoints (0: at the end only)",
}


BACKEND_HELP = dict(default="c", choices=("c", "cuda"),
                    help="run the model on the C core (default) or the CUDA kernels (a CUDA "
                         "build, CuPy and a GPU: pip install '.[cuda]'); checkpoints load on "
                         "either")


def parse_bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def flag(name):
    return "--" + name.replace("_", "-")


def positive_int(text):
    """argparse type: an integer >= 1 (0 is refused, never read as 'the default')."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


FIELD_CHOICES = {"task": sorted(TASKS), "preset": list(PRESETS), "schedule": list(SCHEDULES),
                 "loss_positions": list(navigation.LOSS_POSITIONS),
                 "tree_order": list(trees.ORDERS)}


def add_field_flags(parser, config_fields):
    for f in config_fields:
        default = None if f.default is MISSING else f.default
        kind = type(default) if default is not None else (float if f.name == "p_empty" else int)
        if f.name in ("ood_dense", "ood_sparse", "decay", "planes", "task_options",
                      *FIELD_CHOICES):
            kind = str
        help_text = FIELD_HELP.get(f.name, f.name.replace("_", " "))
        parser.add_argument(flag(f.name), type=kind, default=None,
                            choices=FIELD_CHOICES.get(f.name),
                            help=f"{help_text} (default: {default})")


def add_part_flags(parser):
    for part, parts in PARTS.items():
        parser.add_argument(flag(part), default=None, choices=sorted(parts.entries),
                            help=f"the {parts.kind} (default: the model's)")


def add_option_flags(parser):
    """One flag per registered option, grouped by the kind of component declaring it."""
    groups = {}
    for name, option in registry.registered_options().items():
        kind = registry.declarations(name)[0][0].kind
        if kind not in groups:
            groups[kind] = parser.add_argument_group(f"{kind} options")
        who = registry.declared_by(name)
        default = "from the task" if option.from_task else option.default
        groups[kind].add_argument(
            flag(name), dest=name, default=None, choices=option.choices,
            type=parse_bool if option.type is bool else option.type,
            help=f"{option.help} [{who}] (default: {default})")


def pick(args, names):
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m mapformer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)  # --import whole, as import_modules
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="MODULE", help="import MODULE first (it may register schemes, "
                        "mixers or bottlenecks); repeatable")
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a model on a task, then evaluate it on its presets")
    tr.add_argument("--out", default=None,
                    help="directory for checkpoint.npz and metrics.jsonl (default: none)")
    tr.add_argument("--resume", default=None, help="checkpoint to continue from")
    tr.add_argument("--no-progress", action="store_true", help="no progress line")
    tr.add_argument("--json", action="store_true", help="print the final results as JSON")
    tr.add_argument("--backend", **BACKEND_HELP)
    tr.add_argument("--data-parallel", action="store_true",
                    help="one rank of data-parallel training over MPI: run as mpiexec -n K "
                    "python -m mapformer train ... --data-parallel (mapformer.parallel; "
                    "pip install \".[mpi]\")")
    model = tr.add_argument_group("model")
    model.add_argument("--model", default="mapwm", choices=list(MODELS),
                       help="the paper's model: a preset of mixer, positional scheme and "
                            "options (default: mapwm)")
    add_part_flags(model)
    add_field_flags(model, MODEL_FIELDS)
    add_option_flags(tr)
    add_field_flags(tr.add_argument_group("training"), TRAIN_FIELDS)
    ev = sub.add_parser("eval", help="evaluate a checkpoint on the IID and OOD presets")
    ev.add_argument("checkpoint", help="path to a checkpoint.npz written by train")
    ev.add_argument("--sequences", type=positive_int, default=None,
                    help="sequences per preset (default: the run's eval_sequences)")
    ev.add_argument("--seed", type=int, default=None, help="evaluation seed")
    ev.add_argument("--json", action="store_true", help="print the results as JSON")
    ev.add_argument("--backend", **BACKEND_HELP)
    sub.add_parser("info", help="the version, the kernel set in use, the BLAS, the thread "
                   "count, the output pool and the CUDA backend's state: the first thing a "
                   "bug report needs")
    pl = sub.add_parser("plot", help="learning curves of training runs side by side, as a PNG")
    pl.add_argument("runs", nargs="+", metavar="RUN_DIR",
                    help="directories written by train --out (each holds metrics.jsonl)")
    pl.add_argument("--out", default="learning_curves.png",
                    help="the PNG to write (default: learning_curves.png)")
    pl.add_argument("--labels", default=None,
                    help="comma-separated legend labels, one per run (default: the "
                         "directory names)")
    mp = sub.add_parser("map", help="the cognitive map of a TDB checkpoint, or of a MapWM / "
                        "MapEM one from its path-integrated angles (a training checkpoint of "
                        "the rooms task: mapformer.reproduce.tdb's runs write them to "
                        "$MAPFORMER_RUNS/RUN_ID/): GraphML, a plot beside the true "
                        "room, and the planning metrics")
    mp.add_argument("checkpoint", help="a TDB (or MapWM / MapEM transformer) checkpoint.npz of "
                    "the rooms task")
    mp.add_argument("--out", default=".", help="directory for cogmap.graphml and cogmap.png "
                    "(default: the current one)")
    mp.add_argument("--context", type=int, default=None,
                    help="plans go from position C to N - C (default: the checkpoint's)")
    mp.add_argument("--d-hamming", type=float, default=0.25,
                    help="TDB with M > 1 codebooks: code tuples within this Hamming distance "
                    "(the share of differing codes) are one cluster (default 0.25, the "
                    "paper's)")
    mp.add_argument("--threshold", type=float, default=0.1,
                    help="TDB: a transition is an edge when its count is at least this share "
                    "of the largest (default 0.1, the paper's t_ratio)")
    mp.add_argument("--angle-places", type=positive_int, default=None,
                    help="MapWM / MapEM: k-means places of the angles (default 500, the cpu "
                    "scale's, as the reproduction scores it)")
    experiments_cli.add_parser(sub, positive_int)
    return parser


def run_map(parser, args):
    """The ``map`` command: prints the metrics as JSON, writes the graph and its plot. The
    room, its walks and the context come from the checkpoint's rooms task."""
    from . import cogmap
    # CheckpointError: one line, exit 2
    model, _, train_config, _ = load_checkpoint(args.checkpoint)
    if train_config.task != "rooms":
        fail(f"{args.checkpoint}: a checkpoint of task {train_config.task!r} has no room: map "
             "reads one of the rooms task", 2)
    meta = train_config.task_config().map_meta(train_config.eval_sequences)
    steps = cogmap.room_config(meta).steps
    context = meta["context"] if args.context is None else args.context
    if not 0 <= context < steps - context:
        parser.error(f"--context must leave positions between C and N - C, got {context}")
    for name in ("d_hamming", "threshold"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1], got "
                         f"{getattr(args, name)}")
    if model_kind(model.config).name == "tdb":
        cm, room, metrics = cogmap.evaluate_map(model, meta, context,
                                                d_hamming=args.d_hamming,
                                                threshold=args.threshold)
    elif model.config.positional in ("mapwm", "mapem"):
        places = 500 if args.angle_places is None else args.angle_places
        config, room, train, test = cogmap.walks_of(meta)
        cm, metrics = cogmap.evaluate_angle_map(model, config, room, train, test, context,
                                                places)
    else:
        parser.error(f"{args.checkpoint}: a {model.config.positional} transformer has no map "
                     "(TDB, mapwm or mapem only)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cogmap.write_graphml(cm.graph, out / "cogmap.graphml")
    cogmap.plot_maps(cm.graph, room, out / "cogmap.png")
    print(json.dumps(metrics))
    print(f"wrote {out / 'cogmap.graphml'} and {out / 'cogmap.png'}")


def format_info():
    """What ``python -m mapformer info`` prints: mapformer's version and what its C core sees
    (:func:`mapformer._C.info`)."""
    from . import __version__, _C, cuda

    info = _C.info()
    pool = info["pool"]
    others = [k for k in info["kernel_sets"] if k != info["kernels"]]
    return "\n".join([
        f"mapformer {__version__} ({Path(__file__).resolve().parent})",
        f"kernels      {info['kernels']} (this CPU's best: {info['cpu_level']}; also runs "
        f"{', '.join(others)}; MAPFORMER_KERNELS or mapformer._C.set_kernels picks one)",
        "simd width   " + ", ".join(f"{k} {w} floats" for k, w in info["simd_width"].items()),
        f"threads      {info['threads']} (OpenMP; OMP_NUM_THREADS sets it)",
        f"blas         {info['blas']['library']}: {info['blas']['config']} (its own threads: "
        f"{info['blas']['threads']}; the core splits products over OpenMP's)",
        f"compiler     {info['compiler']['name']} {info['compiler']['version']}",
        f"output pool  holds {pool['held_bytes'] / 2**20:.1f} MB in {pool['held_blocks']} "
        f"blocks, at most {pool['limit_bytes'] / 2**20:.0f} MB (MAPFORMER_POOL_MB)",
        f"python       {sys.version.split()[0]}, numpy {np.__version__}",
        f"cuda         {cuda.describe()}"])


def leading_imports(argv):
    """(modules, the rest of argv) of the ``--import MODULE`` (or ``--import=MODULE``) flags
    that open the command line: their documented place, before the command."""
    modules, i = [], 0
    while i < len(argv):
        name, eq, module = argv[i].partition("=")
        if name != "--import":
            break
        if not eq:  # --import MODULE
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                break  # no value: the parser refuses the line
            i += 1
            module = argv[i]
        modules.append(module)
        i += 1
    return modules, argv[i:]


def import_modules(argv):
    """Import the modules of the --import flags before the command (:func:`leading_imports`;
    anywhere else the parser refuses them), before the parser's flags are made from the
    registries they fill, and only once the command line parses as far as it can without
    them: a command other than train (whose flags the registries make) parses in full first.
    A module that is missing or raises: one line on stderr, exit 2."""
    modules, rest = leading_imports(argv)
    if modules and rest[:1] != ["train"]:
        build_parser().parse_args(argv)  # a line refused here imports nothing
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # whatever the module raises
            fail(f"--import {module}: {type(exc).__name__}: {exc}", 2)


def model_config(parser, args, task):
    """The ModelConfig of the train command's model flags, for ``task``. An option flag the
    chosen components do not declare is a usage error naming it and who declares it."""
    mixer, positional, bottleneck, _ = preset_parts(args.model, args.mixer, args.positional,
                                                    args.bottleneck)
    owned = options_of(mixer, positional, bottleneck)
    given = pick(args, registry.registered_options())
    for name in given:
        if name not in owned:
            parser.error(registry.foreign_option_message(
                name, components(mixer, positional, bottleneck), flag(name)))
    return ModelConfig.for_task(args.model, task, **pick(args, PARTS),
                                **pick(args, [f.name for f in MODEL_FIELDS]), **given)


def parse_task_options(text):
    """'name=value,...' -> {name: value} (--task-options): integers as int, other numbers as
    float, the rest as text; the task checks names and types. ValueError for an item
    without '='."""
    options = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"task_options: expected 'name=value,...', got {item!r}")
        options[key.strip().replace("-", "_")] = number_or_text(value.strip())
    return options


def number_or_text(value):
    """An int, else a float (a finite one), else the text itself."""
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def fail(message, status):
    """One line on stderr, ``python -m mapformer: error: ...``, and exit with ``status`` (2: a
    bad argument, as argparse's own errors; 1: a run that failed)."""
    print(f"python -m mapformer: error: {message}".replace("\n", " "), file=sys.stderr)
    sys.exit(status)


def main(argv=None):
    """Run a command. Expected failures end in one line on stderr, never a traceback: a bad
    argument or an unreadable file exits 2, a diverged run or non-finite results exit 1."""
    argv = sys.argv[1:] if argv is None else argv
    import_modules(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "backend"):
        try:
            args.backend = backends.get(args.backend)
        except RuntimeError as exc:  # no CUDA build, CuPy or device
            fail(str(exc), 2)
    try:
        return run(parser, args)
    except FloatingPointError as exc:
        fail(str(exc), 1)
    except (ValueError, OSError, backends.MissingKernel) as exc:  # CheckpointError: ValueError
        fail(str(exc), 2)
    except MemoryError as exc:
        fail(f"out of memory ({str(exc) or 'MemoryError'}): lower the batch size (--batch-size, "
             "--eval-batch-size), the sequence length (--steps, --mean-length, ...) or the "
             "model (--d-model, --n-layers)", 2)


def run(parser, args):
    """The command of parsed ``args``."""
    if args.command == "train":
        try:
            given = pick(args, [f.name for f in TRAIN_FIELDS])
            if "task_options" in given:
                given["task_options"] = parse_task_options(given["task_options"])
            train_config = TrainConfig(**given)
            config = model_config(parser, args, train_config.task_config())
        except ValueError as exc:
            parser.error(str(exc))
        parallel = None
        if args.data_parallel:
            from .parallel import DataParallel
            try:
                parallel = DataParallel()
            except ImportError as exc:
                fail(str(exc), 2)
        result = train(config, train_config, out_dir=args.out, resume=args.resume,
                       progress=not args.no_progress, backend=args.backend, parallel=parallel)
        if parallel is not None and not parallel.root:
            return 0
        if args.json:
            print(json.dumps({k: v for k, v in result.items() if k != "model"}))
    elif args.command == "info":
        print(format_info())
    elif args.command == "map":
        run_map(parser, args)
    elif args.command == "reproduce":
        return experiments_cli.run(args)
    elif args.command == "plot":
        import matplotlib
        matplotlib.use("Agg")  # a file, no window
        labels = args.labels.split(",") if args.labels else None
        if labels is not None and len(labels) != len(args.runs):
            parser.error(f"--labels has {len(labels)} labels for {len(args.runs)} runs")
        try:
            learning_curves(args.runs, out=args.out, labels=labels)
        except (FileNotFoundError, ValueError) as exc:
            parser.error(str(exc))
        print(f"wrote {args.out}")
    else:
        model, _, train_config, step = load_checkpoint(args.checkpoint, args.backend)
        results = evaluate(model, train_config.eval_tasks(),
                           train_config.eval_sequences if args.sequences is None
                           else args.sequences,
                           eval_seed(train_config) if args.seed is None else args.seed,
                           train_config.eval_batch_size)
        print(json.dumps(results) if args.json else
              f"{args.checkpoint} (step {step}, {model.config.label}):\n"
              f"{format_eval(results)}")
        bad = [name for name, r in results.items() if not np.isfinite(r["loss"])]
        if bad:
            raise FloatingPointError(f"{args.checkpoint}: the loss on {', '.join(bad)} is not "
                                     "finite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
