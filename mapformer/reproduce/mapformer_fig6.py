"""The MapFormer paper's Fig. 6 and appendix 10.2 (frequency initialisation) as two specs with
plots drawn from the records:

    python -m mapformer reproduce mapformer fig6 --scale cpu --seeds 3        # positions
    python -m mapformer reproduce mapformer fig6-omega --scale cpu --seeds 3  # omega_max

``fig6`` (Fig. 6a): MapWM, MapEM-os and MapEM-s trained on Table 2's 1D part (r = 1), then
read by :func:`mapformer.analysis.position_map` on the three evaluation sets: the histogram of
the one number each integrates (its position), its effective frequencies, and how position
maps cells (slope, drift per step, r2). The paper's claim: the longest distances the model
reaches are comparable with one cycle of its lowest frequency (metric
``extent_over_min_period``, about 1), which appendix 10.2 sets from the grid,
omega_min = 2 pi / n. The runs are of kind :func:`execute_positions` (a "train" run plus the
reading), so their records are not Table 2's.

``fig6-omega`` (the appendix's "initializing 1 < omega_max <= 2 pi works well in practice"):
the same three models on Table 2's 2D part with the initial fastest frequency ``omega_max`` swept
over :data:`OMEGA_MAX` (the library's default is pi; omega still falls to omega_max / grid,
``omega_grid``). Its pi part is Table 2's 2D runs themselves (the same run ids, so the same
records).

Scales: Table 2's (``cpu``: 32 steps, grid 16, 2 heads of 32, 38,400 sequences; ``paper``).
"""
import math
from dataclasses import replace

import numpy as np

from ..experiments.runs import task_from_dict, train_record, train_run
from ..experiments.tables import Table, overridden
from .plots import finish, pyplot, sweep

ROWS = ("MapWM", "MapEM-os", "MapEM-s")
OMEGA_MAX = {"omega_max 0.25": 0.25, "omega_max 0.5": 0.5, "omega_max 1": 1.0,
             "omega_max 2": 2.0, "omega_max pi": math.pi, "omega_max 2pi": 2 * math.pi,
             "omega_max 4pi": 4 * math.pi, "omega_max 8pi": 8 * math.pi}
"""fig6-omega's parts: the initial fastest frequency (radians per unit of Delta)."""
POSITION_METRICS = ("extent_over_min_period", "extent_cells", "min_period_cells",
                    "max_period_cells", "r2", "drift_action_cells", "drift_observation_cells",
                    "drift_cells_per_step")
"""The scalars of :func:`mapformer.analysis.position_map` that a fig6 record's metrics hold
per evaluation set (the histogram and the rest are under the record's ``positions``)."""
KIND = "mapformer.reproduce.mapformer_fig6:execute_positions"


def execute_positions(run):
    """Kind ``mapformer.reproduce.mapformer_fig6:execute_positions``: a "train" run, then
    :func:`mapformer.analysis.position_map` of its layer 0 on each of run.evals (1D
    navigation; the sets the evaluation used: same size and seed). Returns the "train"
    result with :data:`POSITION_METRICS` added to each set's metrics, and "positions": {set:
    position_map's whole reading}, "frequencies": the effective frequencies nu (H, NB)."""
    from .. import analysis
    from ..tasks import navigation
    from ..train import TrainConfig, eval_seed

    result = train_run(run)
    record = train_record(run, result)
    model, train_config = result["model"], TrainConfig.from_dict(run.train)
    readings = {}
    for name, values in run.evals.items():
        task = task_from_dict(values)
        batches = navigation.eval_set(task, train_config.eval_sequences,
                                      eval_seed(train_config), 32)
        readings[name] = analysis.position_map(model, batches, task)
        record["metrics"][name].update({k: readings[name][k] for k in POSITION_METRICS})
    return {**record, "positions": readings,
            "frequencies": analysis.effective_frequencies(model).tolist()}


def table(name, scale="cpu", sequences=None, eval_sequences=None):
    """``fig6`` (positions on 1D navigation) or ``fig6-omega`` (the omega_max sweep on 2D) at
    one of Table 2's scales."""
    from .mapformer import TABLES, Row, mapformer_run

    spec = TABLES["2"]
    if scale not in spec["scales"]:
        raise ValueError(f"{name} has Table 2's scales {sorted(spec['scales'])}, not {scale!r}")
    at, eval_sequences = spec["scales"][scale], eval_sequences or 256
    n = sequences or at.sequences
    rows = {r.label: r for r in spec["rows"] if r.label in ROWS}
    note = at.note + overridden(sequences)
    if name == "fig6":
        def make_run(part, label, seed):
            return replace(mapformer_run(rows[label], at.parts["1D"], at, seed, n,
                                         eval_sequences), kind=KIND)

        return Table("mapformer", name, "Fig. 6a: the 1D position each model integrates, "
                     "against its lowest frequency's period", scale, "1D: " + note, ("1D",),
                     ROWS, ("iid", "ood_dense", "ood_sparse"),
                     ("object_accuracy",) + POSITION_METRICS, make_run, digits=2,
                     plot=plot_positions)
    if name != "fig6-omega":
        raise ValueError(f"Fig. 6 has tables fig6, fig6-omega, not {name!r}")

    def make_run(part, label, seed):
        row = rows[label]
        row = Row(row.label, row.model, row.n_layers,
                  {**row.options, "omega_max": OMEGA_MAX[part]})
        return mapformer_run(row, at.parts["2D"], at, seed, n, eval_sequences)

    return Table("mapformer", name, "Appendix 10.2: 2D recall accuracy against the initial "
                 "omega_max", scale, "2D: " + note, tuple(OMEGA_MAX), ROWS,
                 ("iid", "ood_dense", "ood_sparse"), ("accuracy", "object_accuracy"),
                 make_run, digits=2, plot=plot_omega)


def plot_omega(table, store, seeds, path):
    """IID and OOD-sparse object recalls against omega_max (log axis)."""
    sweep(table, store, seeds, path, {p: round(v, 2) for p, v in OMEGA_MAX.items()},
          "initial omega_max (radians; the paper: 1 < omega_max <= 2 pi works)",
          (("iid", "object_accuracy"), ("ood_sparse", "object_accuracy")),
          title=f"Appendix 10.2: omega_max, 2D ({table.scale} scale)")


def plot_positions(table, store, seeds, path):
    """Fig. 6a, a row per model and a column per seed: the histogram of the integrated
    position on the IID set, in cells (p / slope), with cos(nu p) at the highest and lowest
    |nu| (the paper's green and orange); each title gives the seed's object recalls, the
    extent over the lowest frequency's period and the drift per step."""
    plt = pyplot()
    found = table.records(store, seeds)
    rows = [r for r in table.rows if any(k[1] == r for k in found)]
    columns = sorted({k[2] for k in found}) or [0]
    fig, axes = plt.subplots(max(len(rows), 1), len(columns),
                             figsize=(4.2 * len(columns), 3.0 * max(len(rows), 1)),
                             squeeze=False)
    for row, line in zip(rows, axes):
        for seed, ax in zip(columns, line):
            record = found.get(("1D", row, seed))
            if record is None:
                ax.set_visible(False)
                continue
            reading = record["positions"]["iid"]
            unit = abs(reading["slope"]) or 1.0
            edges = np.array(reading["edges"]) / unit
            counts = np.array(reading["counts"], float)
            density = counts / max(counts.sum(), 1) / np.diff(edges)
            ax.stairs(density, edges, fill=True, alpha=0.5, color="tab:blue",
                      label="position (iid)")
            cells = np.linspace(edges[0], edges[-1], 1200)
            for nu, color, what in ((reading["nu_max"], "tab:green", "highest"),
                                    (reading["nu_min"], "tab:orange", "lowest")):
                ax.plot(cells, density.max() * (1 + np.cos(nu * unit * cells)) / 2,
                        color=color, lw=0.7, alpha=0.8, label=f"cos, {what} |nu|")
            recall = record["metrics"]["iid"]["object_accuracy"]
            drift = reading["drift_cells_per_step"]
            ax.set_title(f"{row}, seed {seed}: recalls {recall:.2f}\nextent / lowest period "
                         f"{reading['extent_over_min_period']:.2f}, drift "
                         f"{drift if drift is None else round(drift, 2)} cells / step",
                         fontsize=8)
            ax.set(xlabel="position in cells (p / slope)", ylabel="density")
    fig.suptitle(f"{table.title} ({table.scale} scale)", fontsize=9)
    finish(fig, axes.ravel(), path)


TABLE_NAMES = ("fig6", "fig6-omega")
