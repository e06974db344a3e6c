"""The MapFormer paper's Tables 1, 2, 3 and 4 as data (every row: a model preset, a depth,
options; the paper's figures; two scales of tasks and model sizes) and as table specs
(:func:`table`): ``python -m mapformer reproduce mapformer 2 --scale cpu --seeds 3``.

Scales:
- ``paper``: the paper's settings (200K training sequences, batch 128, its model sizes and
  task presets).
- ``cpu``: reduced so that a whole table runs in about an hour on 2 cores; each table's
  ``cpu`` entry states its reduction (shorter sequences, smaller grids and models, fewer
  training sequences). OOD sets keep the paper's ratios to the training set.

Tables: "1" selective copy, "2" 1D and 2D navigation, "2-modes" the MapEM-os combination-mode
ablation, "2-no-backtrack" Table 2's 2D part under the walk reading that never undoes a step
(:data:`mapformer.tasks.navigation.WALKS`), "2-action-repeat" Table 2 under the reading whose
actions come in runs (:data:`ACTION_REPEAT`; "-by-lag" reads any of the three by lag), "3"
SSMs against MapFormers, "4" 3D and 5D navigation; figures "fig4a", "fig4b", "fig4c" and the
5D data sweep "5d-data" (:mod:`.mapformer_fig4`), "fig5a" (Delta on observations and actions
through training, :func:`delta_steps`), "fig6" and "fig6-omega" (positions and the omega_max
sweep, :mod:`.mapformer_fig6`), "fig7a" (and at length 128, "fig7a-128") and "fig7bd"
(:mod:`.mapformer_fig7`); "ood", where long sparse sequences are lost (:mod:`.mapformer_ood`).
"""
from dataclasses import dataclass, field, replace

import numpy as np

from ..experiments.runs import Run
from ..experiments.tables import Table, mean_spread, overridden
from ..models import ModelConfig, options_of, preset_parts
from ..tasks import navigation, selective_copy
from ..train import TrainConfig, add_histogram
from . import mapformer_fig4, mapformer_fig6, mapformer_fig7

COLUMNS = ("iid", "ood_dense", "ood_sparse")
LAG_METRICS = tuple(f"object_accuracy_lag_gt{k}" for k in navigation.SCORED_LAGS)
NAVIGATION_METRICS = ("accuracy", "object_accuracy") + LAG_METRICS
"""Table 2's metrics (:func:`mapformer.train.evaluate`): every revisit, the object recalls
(revisits whose target is not blank: the paper's figures), and the object recalls of lag
above 2 and above 4 steps (:data:`LAG_METRICS`, from
:data:`mapformer.tasks.navigation.SCORED_LAGS`: the scoring readings that leave out a step
straight back, and the smallest 2D loops too). Tables 3 and 4 read the first two (their
records hold the others too)."""


@dataclass(frozen=True)
class Row:
    """One table row: a label, a model preset (mapformer.models.MODELS), a depth, and options
    over the preset's."""

    label: str
    model: str
    n_layers: int = 1
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Scale:
    """What one scale trains: model width and heads, batch, sequences, and the task configs
    per part of the table (e.g. '1D', '2D'): {part: {"train": config, "eval": {column:
    config}, "train_fields": TrainConfig fields}}."""

    d_model: int
    n_heads: int
    batch_size: int
    sequences: int
    parts: dict
    note: str


def navigation_part(dims, steps, grid):
    """Train on (steps, grid, p_empty 0.5); OOD sets at the paper's 2D ratios
    (:func:`mapformer.tasks.navigation.scaled_presets`)."""
    evals = {name: navigation.NavigationConfig(dims=dims, **fields)
             for name, fields in navigation.scaled_presets(steps, grid).items()}
    return {"train": evals["iid"], "eval": evals,
            "train_fields": dict(task="navigation", dims=dims, steps=steps, grid_size=grid,
                                 p_empty=0.5)}


def paper_navigation_part(dims):
    """The paper's presets (mapformer.tasks.navigation.preset) for ``dims``."""
    evals = {name: navigation.preset(name, dims=dims) for name in COLUMNS}
    iid = evals["iid"]
    return {"train": iid, "eval": evals,
            "train_fields": dict(task="navigation", dims=dims, steps=iid.steps,
                                 grid_size=iid.grid_size, p_empty=iid.p_empty)}


def table3_part(dims, steps, grid):
    """Table 3 (appendix 10.1): train on (steps, grid, p_empty 0.5); OOD-dense half the steps
    and grid (p_empty 0.2), OOD-sparse 2x the steps and grid (p_empty 0.8):
    :func:`mapformer.tasks.navigation.table3_ood_sets`."""
    iid = navigation.NavigationConfig(dims=dims, steps=steps, grid_size=grid, p_empty=0.5)
    return {"train": iid, "eval": {"iid": iid, **navigation.table3_ood_sets(iid)},
            "train_fields": dict(task="navigation", preset="table3", dims=dims, steps=steps,
                                 grid_size=grid, p_empty=0.5)}


def copy_part(n_copy, blanks, dense, sparse):
    """Train with ``blanks`` blanks among ``n_copy`` tokens; OOD sets with dense/sparse."""
    def config(n_blanks):
        return selective_copy.SelectiveCopyConfig(n_copy=n_copy, n_blanks=n_blanks)
    return {"train": config(blanks),
            "eval": {"iid": config(blanks), "ood_dense": config(dense),
                     "ood_sparse": config(sparse)},
            "train_fields": dict(task="selective_copy", n_copy=n_copy, n_blanks=blanks)}


PAPER_SEQUENCES = 200_000

TABLES = {
    "1": {
        "title": "Table 1: selective copy accuracy",
        "metrics": ("accuracy",),  # every target is a token to copy: no blank targets
        "rows": [Row("MapEM-o", "mapem_o", 2), Row("MapEM-s", "mapem_s", 2),
                 Row("RoPE", "rope", 2), Row("TAPE", "tape", 2), Row("CoPE", "cope", 2),
                 Row("MapWM", "mapwm", 2, {"delta_rank": 1}),
                 Row("MapEM-os", "mapem_os", 2, {"delta_rank": 1})],
        "paper": {"": {"MapEM-o": (0.11, 0.08, 0.07), "MapEM-s": (0.10, 0.11, 0.10),
                       "RoPE": (1.0, 0.48, 0.22), "TAPE": (1.0, 0.88, 0.10),
                       "CoPE": (1.0, 1.0, 1.0), "MapWM": (1.0, 1.0, 1.0),
                       "MapEM-os": (1.0, 1.0, 1.0)}},
        "scales": {
            "paper": Scale(256, 4, 128, PAPER_SEQUENCES, {"": copy_part(128, 128, 64, 256)},
                           "128 tokens to copy among 128 blanks (OOD 64 and 256); 2 layers, "
                           "4 heads of 64; 200K sequences of batch 128"),
            "cpu": Scale(64, 2, 64, 64 * 600, {"": copy_part(16, 16, 8, 32)},
                         "16 tokens among 16 blanks (OOD 8 and 32: the paper's ratios); "
                         "2 layers, 2 heads of 32; 600 steps of batch 64 (38,400 sequences)"),
        },
    },
    "2": {
        "title": "Table 2: 1D and 2D forced-navigation recall accuracy",
        "metrics": NAVIGATION_METRICS,
        "rows": [Row("MapEM-o", "mapem_o"),
                 *[Row(f"RoPE ({n}L)", "rope", n) for n in (1, 2, 4)],
                 *[Row(f"TAPE ({n}L)", "tape", n) for n in (1, 2, 4)],
                 *[Row(f"CoPE ({n}L)", "cope", n) for n in (1, 2, 4)],
                 Row("MapWM", "mapwm"), Row("MapEM-os", "mapem_os"),
                 Row("MapEM-s", "mapem_s")],
        "paper": {
            "1D": {"MapEM-o": (0.14, 0.20, 0.12), "RoPE (1L)": (0.24, 0.39, 0.16),
                   "RoPE (2L)": (0.28, 0.42, 0.15), "RoPE (4L)": (0.20, 0.31, 0.11),
                   "TAPE (1L)": (0.23, 0.40, 0.15), "TAPE (2L)": (0.52, 0.44, 0.22),
                   "TAPE (4L)": (0.54, 0.43, 0.24), "CoPE (1L)": (0.58, 0.74, 0.42),
                   "CoPE (2L)": (0.67, 0.74, 0.57), "CoPE (4L)": (0.72, 0.83, 0.62),
                   "MapWM": (1.0, 1.0, 1.0), "MapEM-os": (1.0, 1.0, 1.0),
                   "MapEM-s": (1.0, 1.0, 1.0)},
            "2D": {"MapEM-o": (0.16, 0.08, 0.08), "RoPE (1L)": (0.33, 0.35, 0.29),
                   "RoPE (2L)": (0.33, 0.31, 0.29), "RoPE (4L)": (0.33, 0.32, 0.28),
                   "TAPE (1L)": (0.32, 0.32, 0.25), "TAPE (2L)": (0.59, 0.38, 0.27),
                   "TAPE (4L)": (0.58, 0.36, 0.28), "CoPE (1L)": (0.66, 0.74, 0.59),
                   "CoPE (2L)": (0.63, 0.72, 0.52), "CoPE (4L)": (0.67, 0.73, 0.57),
                   "MapWM": (0.99, 0.99, 0.96), "MapEM-os": (1.0, 0.99, 0.97),
                   "MapEM-s": (1.0, 1.0, 0.99)},
        },
        "scales": {
            "paper": Scale(128, 2, 128, PAPER_SEQUENCES,
                           {"1D": paper_navigation_part(1), "2D": paper_navigation_part(2)},
                           "128 steps, grid 64, p_empty 0.5 (OOD-dense 64/32/0.2, OOD-sparse "
                           "512/128/0.8); 2 heads of 64; r = world dimension; 200K sequences "
                           "of batch 128"),
            "cpu": Scale(64, 2, 64, 64 * 600,
                         {"1D": navigation_part(1, 32, 16), "2D": navigation_part(2, 32, 16)},
                         "32 steps, grid 16 (OOD-dense 16 steps/grid 8/p_empty 0.2, OOD-sparse"
                         " 128 steps/grid 32/p_empty 0.8: the paper's ratios); 2 heads of 32; "
                         "600 steps of batch 64 (38,400 sequences)"),
        },
        "ablation": [Row(f"MapEM-os ({mode})", "mapem_os", 1, {"mapem_mode": mode})
                     for mode in ("score_product", "softmax_product", "sum")],
    },
    "3": {
        "title": "Table 3: 2D forced-navigation recall accuracy, SSMs against MapFormers",
        "metrics": NAVIGATION_METRICS[:2],
        "rows": [Row("Mamba", "mamba"), Row("MAMPa", "mampa"),  # no decay: the paper's A := S
                 Row("MAMPa (signed angle)", "mampa", 1, {"signed_angle": True}),
                 Row("MAMPa (decay)", "mampa", 1, {"mampa_alpha": True}),
                 Row("MAMPa (decay, signed angle)", "mampa", 1,
                     {"mampa_alpha": True, "signed_angle": True}),
                 Row("MAMPa (decay, ZOH)", "mampa", 1, {"mampa_alpha": True, "zoh": True}),
                 Row("MapWM", "mapwm"), Row("MapEM-os", "mapem_os"), Row("MapEM-s", "mapem_s")],
        "paper": {"2D": {"Mamba": (0.42, 0.77, 0.40), "MAMPa": (0.74, 0.93, 0.60),
                         "MapWM": (1.0, 1.0, 1.0), "MapEM-os": (1.0, 1.0, 1.0),
                         "MapEM-s": (1.0, 1.0, 1.0)}},
        "scales": {
            "paper": Scale(128, 2, 128, PAPER_SEQUENCES, {"2D": table3_part(2, 16, 64)},
                           "train 16 steps, grid 64, p_empty 0.5; OOD-dense 8 steps/grid 32/"
                           "p_empty 0.2, OOD-sparse 32 steps/grid 128/p_empty 0.8 (grids and "
                           "p_empty: our reading of 'as section 5.2'); 1 layer, d_model 128 "
                           "(MapFormers: 2 heads of 64; Mamba/MAMPa: d_state 16, expand 2, "
                           "d_conv 4); 200K sequences of batch 128"),
            "cpu": Scale(64, 2, 64, 64 * 600, {"2D": table3_part(2, 16, 64)},
                         "the paper's task (16 steps, grid 64; OOD-dense 8/32/0.2, OOD-sparse "
                         "32/128/0.8); 1 layer, d_model 64 (MapFormers: 2 heads of 32; "
                         "Mamba/MAMPa: d_state 16, expand 2, d_conv 4); 600 steps of batch 64 "
                         "(38,400 sequences)"),
        },
    },
    "4": {
        "title": "Table 4: 3D and 5D forced-navigation recall accuracy",
        "metrics": NAVIGATION_METRICS[:2],
        "rows": [Row("RoPE (1L)", "rope"), Row("CoPE (1L)", "cope"), Row("MapWM", "mapwm"),
                 Row("MapEM-os", "mapem_os"), Row("MapEM-s", "mapem_s")],
        "paper": {
            "3D": {"RoPE (1L)": (0.39, 0.36, 0.35), "CoPE (1L)": (0.78, 0.82, 0.74),
                   "MapWM": (1.0, 0.95, 0.94), "MapEM-os": (1.0, 0.99, 0.99),
                   "MapEM-s": (1.0, 1.0, 0.98)},
            "5D": {"RoPE (1L)": (0.74, 0.45, 0.33), "CoPE (1L)": (0.94, 0.80, 0.69),
                   "MapWM": (0.75, 0.50, 0.35), "MapEM-os": (1.0, 0.98, 0.84),
                   "MapEM-s": (1.0, 1.0, 0.87)},
        },
        "scales": {
            "paper": Scale(128, 2, 128, PAPER_SEQUENCES,
                           {"3D": paper_navigation_part(3), "5D": paper_navigation_part(5)},
                           "3D: 256 steps, grid 16; 5D: 16 steps, grid 5 (OOD sets: our "
                           "reading, see mapformer.tasks.navigation); 2 heads of 64; 200K "
                           "sequences of batch 128"),
            "cpu": Scale(64, 2, 64, 64 * 600,
                         {"3D": navigation_part(3, 64, 8), "5D": navigation_part(5, 16, 5)},
                         "3D: 64 steps, grid 8 (OOD-dense 32 steps/grid 4, OOD-sparse 256 steps/"
                         "grid 16); 5D: 16 steps, grid 5 (OOD-dense 8 steps/grid 3, OOD-sparse 64 "
                         "steps/grid 10): the 2D ratios; "
                         "2 heads of 32; 600 steps of batch 64 (38,400 sequences)"),
        },
    },
}


FIGURES = (mapformer_fig4, mapformer_fig6, mapformer_fig7)  # modules with tables of their own
TABLE_NAMES = ("1", "1-delta", "1-delta-steps", "2", "2-by-lag", "2-modes", "2-no-backtrack",
               "2-no-backtrack-by-lag", "2-action-repeat", "2-action-repeat-by-lag", "3", "4",
               *mapformer_fig4.TABLE_NAMES, "fig5a", *mapformer_fig6.TABLE_NAMES,
               *mapformer_fig7.TABLE_NAMES, "ood")
LAG_ROWS = ("MapEM-o", "RoPE (1L)", "TAPE (1L)", "CoPE (1L)", "MapWM", "MapEM-os", "MapEM-s")
LAG_EDGES = (1, 3, 5, 9, 17, 33, 65, 129, 257, 513)  # lag buckets: 1-2, 3-4, 5-8, ...


ACTION_REPEAT = 6
"""The "2-action-repeat" reading: actions in runs of uniform length 1..6 (the task's
``action_repeat``). It was picked before training, from the lag shares alone: at 6 the share
of object recalls at lag 1-2 (a step and its inverse) falls to 0.24 (1D) and 0.31 (2D) IID
(0.65 / 0.59 for single actions), inside the 0.20-0.37 that the paper's one-layer RoPE and
TAPE figures need if their per-lag accuracy is ours (:func:`predicted_by_lag` on the 38,400
records: RoPE (1L) 0.27 / 0.34 IID against the paper's 0.24 / 0.33)."""


def task_reading(part, **options):
    """A navigation part under a reading of the task (``options``: task fields such as
    walk="no_backtrack" or action_repeat=6): its training and evaluation sets, and the
    training config's task_options."""
    evals = {k: replace(v, **options) for k, v in part["eval"].items()}
    return {"train": evals["iid"], "eval": evals,
            "train_fields": {**part["train_fields"], "task_options": dict(options)}}


def mapformer_run(row, part, scale, seed, sequences, eval_sequences):
    """The run of a MapFormer table row (reproduce.Row) on a part of a scale at a seed: the
    preset at the scale's width and heads, r = the world's dimension where the preset has a
    path-integration rank, trained on the part's task, evaluated on its three sets."""
    train_config = TrainConfig(**part["train_fields"], sequences=sequences,
                               batch_size=scale.batch_size, seed=seed,
                               eval_sequences=eval_sequences)
    task = part["train"]
    options = dict(row.options)
    if "delta_rank" in options_of(*preset_parts(row.model)[:3]):
        options.setdefault("delta_rank", getattr(task, "dims", 1))
    model_config = ModelConfig.for_task(row.model, task, d_model=scale.d_model,
                                        n_heads=scale.n_heads, n_layers=row.n_layers, **options)
    return Run.of(model_config, train_config, part["eval"])


def table(name, scale="cpu", sequences=None, eval_sequences=None):
    """MapFormer table ``name`` at ``scale``; ``sequences`` overrides the scale's training
    sequences (then it is not a reproduction, and the note says so)."""
    for figures in FIGURES:
        if name in figures.TABLE_NAMES:
            return figures.table(name, scale, sequences, eval_sequences)
    if name == "ood":
        from .mapformer_ood import table as diagnosis
        return diagnosis(name, scale, sequences, eval_sequences)
    if name == "1-delta":
        return delta_view(table("1", scale, sequences, eval_sequences))
    if name == "1-delta-steps":
        return delta_steps(table("1", scale, sequences, eval_sequences))
    if name == "fig5a":
        return delta_steps(table("2", scale, sequences, eval_sequences), name="fig5a",
                           parts=("2D",),
                           title="Fig. 5a: accuracy and the observations' |Delta| over the "
                                 f"actions' through training (evaluated every "
                                 f"{DELTA_EVAL_EVERY} steps), 2D navigation")
    if name in ("2-by-lag", "2-no-backtrack-by-lag", "2-action-repeat-by-lag"):
        return by_lag(table(name[:-len("-by-lag")], scale, sequences, eval_sequences))
    key = "2" if name in ("2-modes", "2-no-backtrack", "2-action-repeat") else name
    if key not in TABLES or name not in TABLE_NAMES:
        raise ValueError(f"MapFormer has tables {', '.join(TABLE_NAMES)}, not {name!r}")
    eval_sequences = eval_sequences or 256
    spec = TABLES[key]
    if scale not in spec["scales"]:
        raise ValueError(f"table {name} has scales {sorted(spec['scales'])}, not {scale!r}")
    at = spec["scales"][scale]
    if name == "2-no-backtrack":  # 2D only: a 1D walk that never backtracks goes straight on
        at = replace(at, parts={"2D": task_reading(at.parts["2D"], walk="no_backtrack")},
                     note=at.note.replace("32 steps", "2D only; walks that never undo their "
                                          "previous step; 32 steps", 1))
    if name == "2-action-repeat":
        at = replace(at, parts={p: task_reading(v, action_repeat=ACTION_REPEAT)
                                for p, v in at.parts.items()},
                     note=f"actions in runs of 1..{ACTION_REPEAT}; " + at.note)
    n = sequences or at.sequences
    rows = {r.label: r for r in (spec["ablation"] if name == "2-modes" else spec["rows"])}
    note = at.note + overridden(sequences)

    def make_run(part, label, seed):
        return mapformer_run(rows[label], at.parts[part], at, seed, n, eval_sequences)

    title = spec["title"] + {"2-modes": ", MapEM-os combination modes",
                             "2-no-backtrack": ", walks without backtracking",
                             "2-action-repeat": f", actions in runs of 1..{ACTION_REPEAT}"
                             }.get(name, "")
    return Table("mapformer", name, title, scale, note, tuple(at.parts), tuple(rows), COLUMNS,
                 spec["metrics"], make_run, {} if name == "2-modes" else spec["paper"])


DELTA_ROWS = ("MapEM-s", "MapWM", "MapEM-os")  # the rows that integrate Delta (MapEM-o: none)
DELTA_READINGS = {  # base table: (metric prefix, the plot's axis label, layers)
    "1": ("delta_blank_over_data", "|Delta| blank / data", 2),
    "2": ("delta_observation_over_action", "|Delta| observation / action", 1),
}
"""How a Delta view reads its table's records: the task's ``delta_metrics`` (selective
copy: blanks over data tokens; navigation: observations over actions), per layer."""


def delta_metrics_of(base):
    prefix, _, layers = DELTA_READINGS[base.name]
    return tuple(f"{prefix}_layer{i}" for i in range(layers))


def delta_view(base):
    """A table's runs (so its records) read at what their integration times do: accuracy
    beside the paper, then the task's Delta reading per layer (:data:`DELTA_READINGS`; no
    paper figure). Table 1: mean |Delta| on blanks over that on data tokens."""
    return replace(base, name=base.name + "-delta", reference_metrics=("accuracy",),
                   metrics=("accuracy",) + delta_metrics_of(base),
                   title=base.title + ", and what Delta does on the blanks",
                   rows=DELTA_ROWS, default_rows=DELTA_ROWS)


DELTA_EVAL_EVERY = 50  # optimizer steps between the evaluations of the through-training views


def delta_steps(base, every=DELTA_EVAL_EVERY, name=None, title=None, parts=None):
    """A table's runs of :data:`DELTA_ROWS` evaluated every ``every`` optimizer steps
    through training (their own runs: eval_every is part of a run), read as :func:`delta_view`
    reads its records, with a plot of accuracy and the Delta reading against the step.
    Table 1's is "1-delta-steps"; Table 2's 2D part is "fig5a" (the paper's Fig. 5a:
    observations stop rotating the map as the accuracy rises)."""
    prefix, label, layers = DELTA_READINGS[base.name]

    def make_run(part, row, seed):
        run = base.make_run(part, row, seed)
        return replace(run, train={**run.train, "eval_every": every})

    def plot(table, store, seeds, path):
        plot_delta_steps(table, store, seeds, path, prefix=prefix, label=label, layers=layers)

    return replace(delta_view(base), name=name or base.name + "-delta-steps",
                   make_run=make_run, plot=plot, parts=parts or base.parts,
                   title=title or base.title + f", and Delta on the blanks through training "
                                               f"(evaluated every {every} steps)")


def delta_curves(record, column="iid", prefix="delta_blank_over_data", layers=2):
    """steps (E,), accuracy (E,), the Delta reading ``prefix`` (E, layers) of a record's
    evaluations through training, the final one last."""
    evals = [(e["step"], e["eval"][column]) for e in record["evals"]]
    evals.append((record["steps"], record["metrics"][column]))
    steps = np.array([s for s, _ in evals])
    accuracy = np.array([m["accuracy"] for _, m in evals])
    ratio = np.array([[m.get(f"{prefix}_layer{i}", np.nan) for i in range(layers)]
                      for _, m in evals], dtype=float)
    return steps, accuracy, ratio


def plot_delta_steps(table, store, seeds, path, column="iid", prefix="delta_blank_over_data",
                     label="|Delta| blank / data", layers=2):
    """A panel per row: IID accuracy and, on a second axis, the Delta reading ``prefix`` in
    each layer, against the optimizer step, a line per seed."""
    from .plots import finish, pyplot

    plt = pyplot()
    found = table.records(store, seeds)
    rows = [r for r in table.rows if any(k[1] == r for k in found)]
    fig, axes = plt.subplots(1, max(len(rows), 1), figsize=(4.8 * max(len(rows), 1), 3.8),
                             squeeze=False)
    for row, ax in zip(rows, axes[0]):
        twin = ax.twinx()
        for (part, name, seed), record in sorted(found.items()):
            if name != row:
                continue
            steps, accuracy, ratio = delta_curves(record, column, prefix, layers)
            ax.plot(steps, accuracy, color="black", alpha=0.4 + 0.2 * seed,
                    label=f"accuracy, seed {seed}")
            for i, color in zip(range(layers), ("tab:blue", "tab:orange")):
                twin.plot(steps, ratio[:, i], color=color, alpha=0.4 + 0.2 * seed,
                          linestyle="--", label=f"layer {i}" if seed == 0 else None)
        ax.set(title=row, xlabel="optimizer step", ylabel=f"{column} accuracy", ylim=(0, 1.02))
        twin.set_ylabel(label)
        twin.set_ylim(bottom=0)
        twin.legend(fontsize=7, loc="center right")
    fig.suptitle(f"{table.title} ({table.scale} scale)", fontsize=9)
    finish(fig, axes[0], path)


def by_lag(base):
    """The scoring readings' view of a navigation table: the same runs (so the same records),
    read at the object recalls of lag above 2 and above 4 steps beside the paper's figures,
    and plotted as object recalls against the lag (:func:`plot_by_lag`)."""
    return replace(base, name=base.name + "-by-lag", metrics=LAG_METRICS, plot=plot_by_lag,
                   title=base.title + ", object recalls scored by lag",
                   default_rows=tuple(r for r in base.rows if r in LAG_ROWS) or None)


def recalls_by_lag(records, column):
    """(positions, hits) int64 (L,) summed over ``records``' ``object_recalls_by_lag`` on
    evaluation set ``column`` (None when no record has them)."""
    found = [r["metrics"][column]["object_recalls_by_lag"] for r in records
             if "object_recalls_by_lag" in r["metrics"].get(column, {})]
    if not found:
        return None
    size = max(len(f["positions"]) for f in found)
    positions, hits = np.zeros(size, np.int64), np.zeros(size, np.int64)
    for f in found:
        positions[:len(f["positions"])] += f["positions"]
        hits[:len(f["hits"])] += f["hits"]
    return positions, hits


def bucket_counts(counts):
    """Per-lag counts int64 (L,) summed into the buckets of :data:`LAG_EDGES` (lags beyond the
    last edge dropped): int64 (len(LAG_EDGES) - 1,)."""
    edges = np.array(LAG_EDGES)
    return np.add.reduceat(np.pad(counts, (0, max(0, edges[-1] - counts.size)))[:edges[-1]],
                           edges[:-1])


def bucketed_recalls(found, part, row, column):
    """(object recalls, hits) per lag bucket, int64 (len(LAG_EDGES) - 1,) each, of the
    records ``found`` ({(part, row, seed): record}, :meth:`Table.records`) of one part and row
    on evaluation set ``column``, the seeds pooled; None when none has per-lag counts."""
    counts = recalls_by_lag([r for (p, w, _), r in found.items() if p == part and w == row],
                            column)
    return None if counts is None else tuple(bucket_counts(c) for c in counts)


def lag_shares(task, sequences=512, seed=0):
    """The share of a navigation task's object recalls in each lag bucket of
    :data:`LAG_EDGES`, over ``sequences`` generated sequences: float64 (len(LAG_EDGES) - 1,)."""
    counts = np.zeros(0, np.int64)
    for batch in navigation.eval_set(task, sequences, seed):
        counts = add_histogram(counts, navigation.recall_lags(batch)[
            batch.mask & (batch.targets != task.blank_id)])
    buckets = bucket_counts(counts)
    return buckets / max(buckets.sum(), 1)


def predicted_by_lag(table, store, seeds, tasks, rows=None):
    """What the rows of a navigation ``table`` would score on other tasks if their accuracy at
    each lag stayed what their records measured: {(part, row, column): sum over lag buckets of
    the task's share of object recalls there (:func:`lag_shares`) times the records' pooled
    accuracy there (0 for a bucket the records never saw)}. tasks: {(part, column): task
    config}, e.g. the paper's presets for the cpu scale's sets."""
    found = table.records(store, seeds)
    predicted = {}
    for (part, column), task in tasks.items():
        shares = lag_shares(task)
        for row in rows or table.rows:
            counts = bucketed_recalls(found, part, row, column)
            if counts is None:
                continue
            n, k = counts
            predicted[(part, row, column)] = float((shares * k / np.maximum(n, 1)).sum())
    return predicted


def plot_by_lag(table, store, seeds, path, columns=("iid", "ood_sparse")):
    """A panel per (part, column): object-recall accuracy against the lag (steps since the
    cell was last visited, in the buckets of :data:`LAG_EDGES`), a line per default row
    (:data:`LAG_ROWS`; its seeds' recalls pooled, from the records' per-lag counts), and
    under it the share of the recalls in each bucket (of the first row drawn: the sets are
    the same for every row)."""
    from .plots import finish, pyplot

    plt = pyplot()
    found = table.records(store, seeds)
    panels = [(p, c) for p in table.parts for c in columns]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 5.5), squeeze=False,
                             gridspec_kw={"height_ratios": (3, 1)}, sharex="col")
    edges = np.array(LAG_EDGES)
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(edges[:-1], edges[1:])]
    for (part, column), ax, share in zip(panels, axes[0], axes[1]):
        used = np.zeros(len(labels), bool)
        for row in table.default_rows or table.rows:
            counts = bucketed_recalls(found, part, row, column)
            if counts is None:
                continue
            n, k = counts
            keep = n > 0
            ax.plot(np.flatnonzero(keep), k[keep] / n[keep], marker="o", label=row)
            if not used.any():
                share.bar(np.flatnonzero(keep), n[keep] / n.sum(), color="grey")
            used |= keep
        ax.set(title=f"{part} {column}".strip(), ylabel="object recall accuracy",
               ylim=(0, 1.02))
        share.set(xlabel="lag (steps since the last visit)", ylabel="share of recalls")
        share.set_xticks(np.flatnonzero(used), [labels[i] for i in np.flatnonzero(used)],
                         fontsize=7)
    fig.suptitle(f"{table.title} ({table.scale} scale)", fontsize=9)
    finish(fig, axes[0], path)


def mean_ci(values, digits: int = 2) -> str:
    """'mean ± half-width of the 95% t interval' of the values (the APE and GridPE tables'
    statistic), ``digits`` decimals; one value: its mean alone."""
    return mean_spread(values, "ci95", digits)


def recorded_configs(record):
    """(model dict, train dict) of a run's record as the current library reads them: a field
    or option added since the record was written takes its default (so the record of a run
    that the new field does not change still matches); None when they no longer parse."""
    try:
        return (ModelConfig.from_dict(record["model"]).to_dict(),
                TrainConfig.from_dict(record["train"]).to_dict())
    except (ValueError, TypeError, KeyError):
        return None
