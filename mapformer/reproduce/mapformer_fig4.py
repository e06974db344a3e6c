"""The MapFormer paper's Fig. 4 (section 5.3, "EM scales better than WM") and the data-efficiency
remark of section 10.3 as specs with plots drawn from the records:

    python -m mapformer reproduce mapformer fig4a --scale cpu --seeds 3   # head size
    python -m mapformer reproduce mapformer fig4b --scale cpu --seeds 3   # sequence length
    python -m mapformer reproduce mapformer fig4c --scale cpu --seeds 3   # objects
    python -m mapformer reproduce mapformer 5d-data --scale cpu --seeds 3 # 5D, sequences

Fig. 4 trains MapEM-s, MapEM-os and MapWM (1 layer, 2 heads, r = 2) on 2D forced navigation:
(a) at a fixed sequence length, the head size varied (the paper: l = 256, h 16 -> 128);
(b) at head size 48, the sequence length varied (the paper: 16 -> 384); (c) at head size 32
and length 16, the number of objects varied (the paper: 10 -> 10,000); (a) and (b) with 10
objects. Sequence lengths count steps (an action and an observation each), as the tables'
do. The paper gives the ranges, not the grids, the world sizes or the budget: our readings
are a grid of half the steps (the 2D preset's 128 steps on 64 cells; at least 8), p_empty 0.5,
the paper's 200K sequences at scale ``paper`` and 38,400 (600 steps of batch 64) at ``cpu``,
whose axes are thinned, not dropped: (a) l = 64, h 16, 32, 64, 128; (b) l 16, 32, 64, 128;
(c) objects 10, 100, 1,000, 10,000. Its claims: EM is more robust to head size and length,
MapEM-s most of all; WM fails with many objects.

``5d-data``: section 10.3 says that in 5D "EM models solve it with 6 times less training data"
than CoPE, which fits the training set but not the OOD sets. Table 4's 5D part (cpu: 16 steps,
grid 5) for MapEM-os, MapEM-s, MapWM and CoPE at 6,400 to 204,800 training sequences.
"""
from ..experiments.runs import Run
from ..experiments.tables import Table, overridden
from ..models import ModelConfig, options_of, preset_parts
from ..train import TrainConfig
from .plots import sweep

MODELS = {"MapEM-s": "mapem_s", "MapEM-os": "mapem_os", "MapWM": "mapwm"}
SCALES = {  # a: length, head sizes; b: head size, lengths; c: head size, length, objects
    "paper": dict(a_length=256, heads=(16, 32, 48, 64, 96, 128), b_head=48,
                  lengths=(16, 64, 128, 256, 384), c_head=32, c_length=16,
                  objects=(10, 100, 1000, 10000), sequences=200_000, batch=128),
    "cpu": dict(a_length=64, heads=(16, 32, 64, 128), b_head=48, lengths=(16, 32, 64, 128),
                c_head=32, c_length=16, objects=(10, 100, 1000, 10000), sequences=64 * 600,
                batch=64),
    "tiny": dict(a_length=8, heads=(16,), b_head=16, lengths=(8,), c_head=16, c_length=8,
                 objects=(10,), sequences=32, batch=16),
}
AXES = {"fig4a": ("head size", "head size (2 heads)"), "fig4b": ("length", "steps per sequence"),
        "fig4c": ("objects", "objects (vocabulary)")}
DATA_MODELS = {"MapEM-os": "mapem_os", "MapEM-s": "mapem_s", "MapWM": "mapwm",
               "CoPE (1L)": "cope"}
DATA_SEQUENCES = {"paper": (12_500, 25_000, 50_000, 100_000, 200_000, 400_000),
                  "cpu": (6_400, 12_800, 25_600, 51_200, 102_400, 204_800),
                  "tiny": (16, 32)}


def nav_run(preset, head, steps, objects, seed, sequences, batch, eval_sequences, dims=2,
            grid=None):
    """A 1-layer, 2-head run of ``preset`` on navigation of ``steps`` steps, grid ``grid``
    (default: half the steps, at least 8), ``objects`` objects, p_empty 0.5; OOD sets by the
    paper's ratios; r = dims where the preset has a rank."""
    grid = grid or max(8, steps // 2)
    train_config = TrainConfig(task="navigation", dims=dims, steps=steps, grid_size=grid,
                               p_empty=0.5, n_objects=objects, sequences=sequences,
                               batch_size=batch, seed=seed, eval_sequences=eval_sequences)
    options = {}
    if "delta_rank" in options_of(*preset_parts(preset)[:3]):
        options["delta_rank"] = dims
    model = ModelConfig.for_task(preset, train_config.task_config(), d_model=2 * head,
                                 n_heads=2, n_layers=1, **options)
    return Run.of(model, train_config)


def value(part):
    """The axis value a part stands for ("head size 32" -> 32)."""
    return int(part.rsplit(" ", 1)[1])


def table(name, scale="cpu", sequences=None, eval_sequences=None):
    """Fig. 4a/b/c ("fig4a", "fig4b", "fig4c") or the 5D data sweep ("5d-data")."""
    if scale not in SCALES:
        raise ValueError(f"Fig. 4 has scales {sorted(SCALES)}, not {scale!r}")
    s, eval_sequences = SCALES[scale], eval_sequences or 256
    if name == "5d-data":
        return data_table(scale, s, eval_sequences)
    n = sequences or s["sequences"]
    label, _ = AXES[name]
    values = {"fig4a": s["heads"], "fig4b": s["lengths"], "fig4c": s["objects"]}[name]
    parts = tuple(f"{label} {v}" for v in values)

    def make_run(part, row, seed):
        v = value(part)
        head, steps, objects = {"fig4a": (v, s["a_length"], 10),
                                "fig4b": (s["b_head"], v, 10),
                                "fig4c": (s["c_head"], s["c_length"], v)}[name]
        return nav_run(MODELS[row], head, steps, objects, seed, n, s["batch"], eval_sequences)

    fixed = {"fig4a": f"{s['a_length']} steps, 10 objects",
             "fig4b": f"head size {s['b_head']}, 10 objects",
             "fig4c": f"head size {s['c_head']}, {s['c_length']} steps"}[name]
    note = (f"2D navigation, {fixed}; grid half the steps (>= 8), p_empty 0.5; 1 layer, 2 "
            f"heads; {n:,} sequences of batch {s['batch']}" + overridden(sequences))
    title = {"fig4a": "Fig. 4a: accuracy against head size",
             "fig4b": "Fig. 4b: accuracy against sequence length",
             "fig4c": "Fig. 4c: accuracy against the number of objects"}[name]
    return Table("mapformer", name, title, scale, note, parts, tuple(MODELS),
                 ("iid", "ood_dense", "ood_sparse"), ("accuracy", "object_accuracy"), make_run,
                 digits=3, plot=plot_sweep)


def data_table(scale, s, eval_sequences):
    """Table 4's 5D part (cpu: 16 steps, grid 5) against training sequences."""
    part = dict(paper=(16, 5), cpu=(16, 5), tiny=(4, 3))[scale]
    parts = tuple(f"sequences {n}" for n in DATA_SEQUENCES[scale])

    def make_run(part_name, row, seed):
        grid_steps, grid = part
        return nav_run(DATA_MODELS[row], 32 if scale != "paper" else 64, grid_steps, 16, seed,
                       value(part_name), s["batch"], eval_sequences, dims=5, grid=grid)

    note = (f"5D navigation, {part[0]} steps, grid {part[1]} (OOD sets by the 2D ratios), 16 "
            f"objects; 1 layer, 2 heads of {32 if scale != 'paper' else 64}; batch "
            f"{s['batch']}; the training sequences per part")
    return Table("mapformer", "5d-data", "Section 10.3: 5D accuracy against training "
                 "sequences", scale, note, parts, tuple(DATA_MODELS),
                 ("iid", "ood_dense", "ood_sparse"), ("accuracy", "object_accuracy"), make_run,
                 digits=3, plot=plot_sweep)


def plot_sweep(table, store, seeds, path):
    """IID and OOD-sparse object-recall accuracy against the table's axis."""
    xlabel = {"5d-data": "training sequences", **{k: v[1] for k, v in AXES.items()}}[table.name]
    sweep(table, store, seeds, path, {p: value(p) for p in table.parts}, xlabel,
          (("iid", "object_accuracy"), ("ood_sparse", "object_accuracy")),
          title=table.title)


TABLE_NAMES = ("fig4a", "fig4b", "fig4c", "5d-data")
