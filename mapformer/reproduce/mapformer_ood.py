"""Where MapFormers lose long, sparse (OOD) sequences, as a spec of the experiment layer:
MapWM and MapEM-os trained on the cpu-scale configs of Tables 1 and 2 and the README's main
job, then diagnosed with :mod:`mapformer.ood`.

    python -m mapformer reproduce mapformer ood --seeds 3 --rows "MapWM,MapWM log-n"
    python -m mapformer reproduce mapformer ood --seeds 3 --sequences 200000

Each run's record holds, per evaluation set (iid, ood_dense, ood_sparse) and evaluation
variant (``T=1``; ``T=2``: every attention logit times 2 at test time; ``,log``: log-length
scaling at test time, clamped within the training length, for models not trained with it):
recall accuracy bucketed by position and by lag, the attention mass on the correct key
against the number of keys (per layer and head), and the float32 against float64 error of the
path-integrated angles (``diagnosis``); its ``metrics`` are the accuracy and object-recall
accuracy of every variant ("object_accuracy T=2"). Runs checkpoint every 100 steps under
``$MAPFORMER_RUNS/<run id>/`` (default ``runs/``), so an interrupted run resumes where it
stopped when the table is run again.

Parts: ``table1`` (Table 1 at scale cpu: selective copy, 16 tokens among 16 blanks, OOD 8 and
32; 2 layers, d_model 64, 2 heads; 600 steps of batch 64; r = 1), ``table2_1d`` and
``table2_2d`` (Table 2 at scale cpu: navigation of 32 steps on a grid of 16, OOD-sparse 128
steps on 32 with p_empty 0.8; 1 layer; r = the world's dimension), ``main`` (the paper's 2D
IID preset: 128 steps, grid 64, OOD-sparse 512 steps on 128; 1 layer, d_model 128, 2 heads;
76,800 sequences of batch 128; r = 2). Rows: the model (MapWM, MapEM-os; the depth of the
table's MapWM row), a rank r of Delta other than the part's, and ``log-n``: trained with the
unclamped log-length scaling of the logits (``attn_log_scale`` = the training length in
tokens, ``attn_log_clamp`` false). A rank row on a part whose own rank it is (r = 2 on
``table2_2d`` and ``main``) is that part's MapWM row: the same runs.
"""
from pathlib import Path

import numpy as np

from .. import ood
from ..experiments.records import unknown_provenance
from ..experiments.runs import Run, json_safe, run_directory, task_to_dict
from ..experiments.tables import Table, overridden
from ..models import ModelConfig, options_of, preset_parts
from ..train import TrainConfig, eval_seed, task_module, train
from .mapformer import TABLES

SETS = ("iid", "ood_dense", "ood_sparse")
PARTS = {"table1": ("1", ""), "table2_1d": ("2", "1D"), "table2_2d": ("2", "2D"),
         "main": None}
# row -> (model preset, rank of Delta (None: the part's), trained with log-n scaling)
ROWS = {"MapWM": ("mapwm", None, False), "MapWM r=2": ("mapwm", 2, False),
        "MapWM r=4": ("mapwm", 4, False), "MapWM log-n": ("mapwm", None, True),
        "MapWM r=4 log-n": ("mapwm", 4, True), "MapEM-os": ("mapem_os", None, False),
        "MapEM-os log-n": ("mapem_os", None, True)}
TEMPERATURES = (1.0, 2.0)
KIND = "mapformer.reproduce.mapformer_ood:execute"


def part_config(part):
    """(ModelConfig values, TrainConfig, eval tasks) of a part: a README table's MapWM row
    at scale cpu, or the main job."""
    if PARTS[part] is None:
        train_config = TrainConfig(sequences=76_800, batch_size=128)
        return (dict(d_model=128, n_heads=2, n_layers=1, delta_rank=2), train_config,
                train_config.eval_tasks())
    table, name = PARTS[part]
    scale = TABLES[table]["scales"]["cpu"]
    row = next(r for r in TABLES[table]["rows"] if r.label == "MapWM")
    p = scale.parts[name]
    values = dict(d_model=scale.d_model, n_heads=scale.n_heads, n_layers=row.n_layers,
                  delta_rank=row.options.get("delta_rank", getattr(p["train"], "dims", 1)))
    return values, TrainConfig(**p["train_fields"], sequences=scale.sequences,
                               batch_size=scale.batch_size), p["eval"]


def make_run(part, label, seed, sequences=None, eval_sequences=256, detail_sequences=32):
    """The run of ``label`` (a key of :data:`ROWS`) on ``part`` at ``seed``."""
    preset, rank, log_n = ROWS[label]
    values, base, eval_tasks = part_config(part)
    task = base.task_config()
    options = {**values, "delta_rank": rank or values["delta_rank"]}
    if log_n:
        options.update(attn_log_scale=task.seq_len, attn_log_clamp=False)
    if "delta_rank" not in options_of(*preset_parts(preset)[:3]):
        options.pop("delta_rank")
    train_config = TrainConfig(**{**base.to_dict(), "seed": seed,
                                  "sequences": sequences or base.sequences,
                                  "checkpoint_every": 100})
    return Run(model=ModelConfig.for_task(preset, task, **options).to_dict(),
               train=train_config.to_dict(),
               evals={k: task_to_dict(v) for k, v in eval_tasks.items()}, kind=KIND,
               extra={"eval_sequences": eval_sequences, "detail_sequences": detail_sequences})


def variants(train_length, trained_options):
    """{label: model options at test time}: each temperature, and with log-length scaling
    at test time for a model not trained with it."""
    found = {}
    for t in TEMPERATURES:
        found[f"T={t:g}"] = {} if t == 1.0 else {"attn_scale": t}
        if not trained_options.get("attn_log_scale"):
            found[f"T={t:g},log"] = {**found[f"T={t:g}"], "attn_log_scale": train_length}
    return found


def execute(run):
    """Train ``run`` (resuming its checkpoint in :func:`~mapformer.experiments.runs.
    run_directory` when there is one; a finished one is read back, not trained) and diagnose
    the model: the record's metrics, diagnosis and variants (wall_s None when read back)."""
    from ..experiments.runs import task_from_dict
    from ..train import checkpoint_meta, load_checkpoint
    model_config = ModelConfig.from_dict(run.model)
    train_config = TrainConfig.from_dict(run.train)
    eval_tasks = {k: task_from_dict(v) for k, v in run.evals.items()}
    run_dir = run_directory(run)
    checkpoint = run_dir / "checkpoint.npz"
    done = checkpoint.is_file() and checkpoint_meta(checkpoint)["step"] == train_config.total_steps
    if done:
        model, wall = load_checkpoint(checkpoint)[0], None
    else:
        result = train(model_config, train_config, out_dir=run_dir,
                       resume=checkpoint if checkpoint.is_file() else None, progress=False,
                       log=lambda *a: None, eval_tasks=eval_tasks)
        model, wall = result["model"], result["wall_s"]
    found = variants(train_config.task_config().seq_len, model.config.options)
    diagnosis = diagnose(model, train_config, eval_tasks, found, run.extra["eval_sequences"],
                         run.extra["detail_sequences"])
    return json_safe({"metrics": metrics_of(diagnosis), "variants": found,
                      "diagnosis": diagnosis, "wall_s": wall})


def metrics_of(diagnosis):
    """{set: {"accuracy", "object_accuracy" (T=1), "accuracy T=2", ...}} of a diagnosis."""
    out = {}
    for label, sets in diagnosis["variants"].items():
        suffix = "" if label == "T=1" else f" {label}"
        for set_name, d in sets.items():
            for m in ("accuracy", "object_accuracy"):
                out.setdefault(set_name, {})[m + suffix] = d["accuracy"][m]
    return out


def table(name="ood", scale="cpu", sequences=None, eval_sequences=None):
    """The diagnosis at scale cpu (its configs are the cpu tables' and the main job)."""
    if scale != "cpu":
        raise ValueError(f"the OOD diagnosis has scale cpu only, not {scale!r}")
    eval_sequences = eval_sequences or 256
    note = ("cpu-scale Tables 1 and 2 (38,400 sequences) and the main job (76,800); "
            "checkpoints every 100 steps") + overridden(sequences)
    metrics = tuple(m + s for s in ("", " T=2", " T=1,log", " T=2,log")
                    for m in ("object_accuracy", "accuracy"))
    return Table("mapformer", name, "Where long, sparse sequences are lost (recall "
                 "accuracy; T=c: logits times c at test time; ,log: log-length scaling at "
                 "test time)", scale, note, tuple(PARTS), tuple(ROWS), SETS, metrics,
                 lambda part, row, seed: make_run(part, row, seed, sequences, eval_sequences),
                 digits=3, plot=plot_by_lag)


def plot_by_lag(table, store, seeds, path):
    """Object-recall accuracy on ood_sparse against the lag (T=1), a panel per part, a line
    per row (the seeds' mean)."""
    from .plots import finish, pyplot
    plt = pyplot()
    found = table.records(store, seeds)
    parts = [p for p in table.parts if any(k[0] == p for k in found)]
    fig, axes = plt.subplots(1, max(1, len(parts)), figsize=(4.5 * max(1, len(parts)), 3.8),
                             squeeze=False)
    from matplotlib.ticker import NullLocator, ScalarFormatter
    for ax, part in zip(axes[0], parts):
        drawn = set()
        for row in table.rows:
            records = [r for (p, label, _), r in found.items() if (p, label) == (part, row)]
            ids = frozenset(r["id"] for r in records)
            if not records or ids in drawn:  # a rank row that is the part's own MapWM row
                continue
            drawn.add(ids)
            tables = [r["diagnosis"]["variants"]["T=1"]["ood_sparse"]["accuracy"]["by_lag"]
                      for r in records]
            lags = [b["lo"] for b in tables[0]]
            mean = np.mean([[b["object_accuracy"] if b["object_accuracy"] is not None
                             else np.nan for b in t] for t in tables], axis=0)
            ax.plot(lags, mean, marker="o", label=f"{row} (n={len(records)})")
        ax.set(title=f"{part}: ood_sparse", xlabel="lag (tokens, bucket start)",
               ylabel="object-recall accuracy")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
    finish(fig, axes[0], path)


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


def legacy_records(directory):
    """The records of the script this module replaced (``results/ood/<name>.json``, name
    ``<part>_<model>_r<rank>[_trainlog][_n<sequences>]_s<seed>``, and ``run_<name>`` for a
    later diagnosis of the same checkpoint with more variants, merged into its run's
    record): [(record, whether its configs are today's spec's)]; provenance unknown."""
    import json

    from .mapformer import recorded_configs
    merged = {}
    for path in sorted(Path(directory).glob("*.json")):
        old = json.loads(path.read_text())
        name = old["name"].removeprefix("run_")
        part = next(p for p in PARTS if name.startswith(p + "_"))
        fields = name[len(part) + 1:].split("_")
        seed = int(fields.pop()[1:])
        sequences = int(fields.pop()[1:]) if fields[-1].startswith("n") else None
        log_n = fields[-1] == "trainlog"
        rank = int(fields[-2 if log_n else -1][1:])
        preset = "_".join(fields[:-2 if log_n else -1])
        default = part_config(part)[0]["delta_rank"]
        label = next(k for k, v in ROWS.items()
                     if v == (preset, None if rank == default else rank, log_n))
        run = make_run(part, label, seed, sequences, old["eval_sequences"],
                       old["detail_sequences"])
        same = recorded_configs(old) == (run.model, run.train)
        if not same:
            run = Run(model=old["model"], train=old["train"], evals=run.evals, kind=KIND,
                      extra=run.extra)
        held = merged.get(run.id)
        record = {"id": run.id, "run": run.to_dict(),
                  "metrics": metrics_of(old["diagnosis"]), "variants": old["variants"],
                  "diagnosis": old["diagnosis"],
                  "wall_s": old["wall_s"] if old["wall_s"] is not None
                  else (held[0]["wall_s"] if held else None),
                  "provenance": unknown_provenance(path, "benchmarks/diagnose_ood.py")}
        if held is None or len(old["variants"]) > len(held[0]["variants"]):
            if held is not None and record["wall_s"] is None:
                record["wall_s"] = held[0]["wall_s"]
            merged[run.id] = (record, same)
    return list(merged.values())
