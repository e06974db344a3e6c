"""The MapFormer paper's Fig. 7 (appendix 10.4) as two specs with plots drawn from the records:

    python -m mapformer reproduce mapformer fig7a --scale cpu --seeds 3
    python -m mapformer reproduce mapformer fig7a-128 --scale cpu --seeds 3
    python -m mapformer reproduce mapformer fig7bd --scale cpu --seeds 3

Fig. 7a: MapEM-b2 (``mapem``), -b4, -NC (blocks of 4, K = 6; NC-L), -SLN, all MapEM-s
(positional scores only), on 2D navigation: IID accuracy against model width, one part per
width (the paper's x-axis is unstated; our reading: d_model, 2 heads). Fig. 7b-d: MapEM-NC-L,
MapEM-NC-NL, RoPE and MapEM-s with blocks of 4 on 4D-rotation navigation (``rotation4d``,
planes 12,23), trained on 16 steps: IID accuracy through training (evaluated every
``eval_every`` steps, kept in each record's ``evals``) and OOD accuracy at 32 steps
("ood_sparse"). The paper gives no numbers; its claims: b4 worse than b2, NC about b2, SLN
solves it; only NC-NL holds its OOD accuracy.

Scales: ``paper`` (7a: 128 steps, grid 64, d_model 32-256; 200K sequences of batch 128),
``cpu`` (7a: 32 steps, grid 16, d_model 32-128, and ``fig7a-128`` at 128 steps, grid 64;
7b-d: d_model 64; 400 steps of batch 64, 25,600 sequences, evaluations every 50 steps),
``tiny`` (proves the specs).
"""
from ..experiments.records import unknown_provenance
from ..experiments.runs import Run
from ..experiments.tables import Table, overridden
from ..models import ModelConfig
from ..train import TrainConfig
from .plots import finish, pyplot, sweep

MAPEM_S = {"mapem_scores": "positional"}
FIG7A = {"MapEM-b2": ("mapem", {}), "MapEM-b4": ("mapem_b4", {}),
         "MapEM-NC": ("mapem_nc", {"nc_map": "linear"}), "MapEM-SLN": ("mapem_sln", {})}
FIG7BD = {"MapEM-NC-L": ("conjunctive", "mapem_nc", {"nc_map": "linear"}),
          "MapEM-NC-NL": ("conjunctive", "mapem_nc", {"nc_map": "mlp"}),
          "RoPE": ("attention", "rope", {}),
          "MapEM-s (b4)": ("conjunctive", "mapem_b4", {})}
SCALES = {  # 7a: steps, grid, widths, sequences; 7b-d: width, sequences, eval_every
    "paper": dict(a_steps=128, a_grid=64, widths=(32, 64, 128, 256), a_sequences=200_000,
                  bd_width=128, bd_sequences=200_000, eval_every=100, batch=128),
    "cpu": dict(a_steps=32, a_grid=16, widths=(32, 64, 128), a_sequences=64 * 400,
                bd_width=64, bd_sequences=64 * 400, eval_every=50, batch=64),
    "tiny": dict(a_steps=4, a_grid=4, widths=(32,), a_sequences=16, bd_width=32,
                 bd_sequences=16, eval_every=1, batch=8),
}
LENGTH_128 = dict(a_steps=128, a_grid=64)
"""``fig7a-128``: Fig. 7a at the paper's sequence length (its caption: "trained on sequences of
length 128") and grid (its 2D preset's 64), at the scale's widths and budget."""
NOTES = {"paper": "the paper's 2D presets, 200K sequences of batch 128",
         "cpu": "7a: {a_steps} steps, grid {a_grid}; 7b-d: 4D rotations, 16 steps (OOD 32), "
                "d_model 64; 400 steps of batch 64 (25,600 sequences)",
         "tiny": "a few sequences: proves the spec, measures nothing"}


def model_config(mixer, positional, options, width, task):
    """MapEM-s (conjunctive, positional scores) or RoPE (attention) with ``positional``'s
    positions, 2 heads; delta_rank stays 2: 2D, and the 2 generators of 4D."""
    preset = "mapem_s" if mixer == "conjunctive" else "rope"
    if mixer == "conjunctive":
        options = {**options, **MAPEM_S}
    return ModelConfig.for_task(preset, task, d_model=width, n_heads=2, mixer=mixer,
                                positional=positional, **options)


def fig7a_run(label, width, s, seed, sequences, eval_sequences):
    train_config = TrainConfig(task="navigation", dims=2, steps=s["a_steps"],
                               grid_size=s["a_grid"], sequences=sequences,
                               batch_size=s["batch"], seed=seed, eval_sequences=eval_sequences)
    positional, options = FIG7A[label]
    return Run.of(model_config("conjunctive", positional, options, width,
                               train_config.task_config()), train_config)


def fig7bd_run(label, s, seed, sequences, eval_sequences):
    train_config = TrainConfig(task="rotation4d", sequences=sequences, batch_size=s["batch"],
                               seed=seed, eval_every=s["eval_every"],
                               eval_sequences=eval_sequences)
    mixer, positional, options = FIG7BD[label]
    return Run.of(model_config(mixer, positional, options, s["bd_width"],
                               train_config.task_config()), train_config)


def table(name, scale="cpu", sequences=None, eval_sequences=None):
    """Fig. 7a ("fig7a"; "fig7a-128" at the paper's length 128, :data:`LENGTH_128`) or 7b-d
    ("fig7bd") at ``scale``."""
    if scale not in SCALES:
        raise ValueError(f"Fig. 7 has scales {sorted(SCALES)}, not {scale!r}")
    if name not in TABLE_NAMES:
        raise ValueError(f"Fig. 7 has tables {', '.join(TABLE_NAMES)}, not {name!r}")
    s, eval_sequences = SCALES[scale], eval_sequences or 256
    if name == "fig7a-128":  # the paper's sequence length at the scale's budget and widths
        s = {**s, **LENGTH_128}
    note = NOTES[scale].format(**s) + overridden(sequences)
    if name in ("fig7a", "fig7a-128"):
        n = sequences or s["a_sequences"]
        parts = tuple(f"d_model {w}" for w in s["widths"])

        def make_run(part, label, seed):
            return fig7a_run(label, int(part.split()[1]), s, seed, n, eval_sequences)

        return Table("mapformer", name, f"Fig. 7a: MapEM-s positions on 2D navigation of "
                     f"{s['a_steps']} steps, IID accuracy against width", scale, note, parts,
                     tuple(FIG7A), ("iid",), ("accuracy",), make_run, digits=3,
                     plot=plot_fig7a)
    n = sequences or s["bd_sequences"]

    def make_run(part, label, seed):
        return fig7bd_run(label, s, seed, n, eval_sequences)

    return Table("mapformer", name, "Fig. 7b-d: 4D-rotation navigation, IID (16 steps) and "
                 "OOD (32 steps) accuracy", scale, note, ("",), tuple(FIG7BD),
                 ("iid", "ood_sparse"), ("accuracy",), make_run, digits=3, plot=plot_fig7bd)


def plot_fig7a(table, store, seeds, path):
    """Mean IID accuracy against d_model, a line per model (seeds' spread as error bars)."""
    sweep(table, store, seeds, path, {p: int(p.split()[1]) for p in table.parts},
          "d_model (2 heads)", title=f"Fig. 7a ({table.scale} scale): 2D navigation")


def plot_fig7bd(table, store, seeds, path):
    """7c: IID accuracy through training; 7d: OOD (2x length) accuracy through training; the
    seeds' mean per model (the final evaluation as the last point)."""
    import numpy as np
    plt = pyplot()
    found = table.records(store, seeds)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for row in table.rows:
        records = [r for (_, label, _), r in found.items() if label == row]
        if not records:
            continue
        curves = [[(e["step"], e["eval"]) for e in r["evals"]]
                  + [(r["steps"], r["metrics"])] for r in records]
        steps = [step for step, _ in curves[0]]
        for ax, column in zip(axes, ("iid", "ood_sparse")):
            mean = np.mean([[e[column]["accuracy"] for _, e in c] for c in curves], axis=0)
            ax.plot(steps, mean, label=f"{row} (n={len(records)})")
    axes[0].set(title="7c: 4D rotations, IID (16 steps)", xlabel="optimizer step",
                ylabel="accuracy")
    axes[1].set(title="7d: 4D rotations, OOD (32 steps)", xlabel="optimizer step",
                ylabel="accuracy")
    finish(fig, axes, path)


def steps(run):
    return run.train["sequences"] // run.train["batch_size"]


def legacy_records(path):
    """The records of ``results/fig7_<scale>.json`` (the script this module replaced): each run
    the spec's run of its (panel, model, width, seed) at the file's scale, its metrics the
    final evaluation, its ``evals`` the curve; provenance unknown."""
    import json
    from pathlib import Path
    legacy = json.loads(Path(path).read_text())
    scale = legacy["scale"]
    s = SCALES[scale]
    if {k: (tuple(v) if isinstance(v, list) else v) for k, v in legacy["settings"].items()} != s:
        raise ValueError(f"{path}: its settings {legacy['settings']} are not scale {scale}'s")
    out = []
    for old in legacy["runs"]:  # its curve ends with the final evaluation: the metrics here
        if old["panel"] == "7a":
            run = fig7a_run(old["model"], old["width"], s, old["seed"], s["a_sequences"], 256)
        else:
            run = fig7bd_run(old["model"], s, old["seed"], s["bd_sequences"], 256)
        out.append({"id": run.id, "run": run.to_dict(), "metrics": old["eval"],
                    "evals": [{"step": step, "eval": e} for step, e in old.get("curve", [])
                              if step < steps(run)],
                    "steps": steps(run),
                    "provenance": unknown_provenance(
                        path, "benchmarks/reproduce_fig7.py", "it recorded no configs either: "
                        "the run is today's spec's for the file's (panel, model, width, "
                        "seed)")})
    return out


TABLE_NAMES = ("fig7a", "fig7a-128", "fig7bd")
