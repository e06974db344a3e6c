"""Reproduce GridPE's analyses and compare its variants (Li et al., "GridPE: Unifying positional
encoding in transformers with a grid cell-inspired framework"):

    python benchmarks/reproduce_gridpe.py --scale cpu --seeds 3
    python benchmarks/reproduce_gridpe.py --scale cpu --rows gridpe_rotate,rope_axial,mapwm
    python benchmarks/reproduce_gridpe.py --scale cpu --seeds 3 --tasks grid_transpose

Three parts, each written to ``results/gridpe/<scale>/`` (``--out``):

1. The distance decay of the code (the paper's Fig. 3): the inner product of two unit GridPE
   codes (one head's frequency vectors: n + 1 = 3 directions at 120 degrees, S scales of ratio
   e^(1/2)) as a function of their displacement over a square area, as a surface and the
   profile along the x axis: ``fig3_decay.png`` and, in ``analysis.json``, the profile and the
   kernel averaged over rings of radius 0, 1, 2, 4, ... (:func:`mapformer.schemes.gridpe.
   code_kernel`). The paper does not state its area or code size; here [-32, 32]^2 and a head
   of 96 (48 planes, S = 16) at cpu and paper scale.
2. The optimal scale ratio: the paper's neuron count N(r) = c r^n ln R / ln r (its eqs. 9-11,
   :func:`mapformer.schemes.gridpe.neuron_count`) minimised over a grid of ratios for n = 1, 2,
   3 and two resolutions R; the minimiser must be e^(1/n) (asserted here, and in
   tests/test_gridpe_schemes.py).
3. The variants against the baselines on MapFormer's 2D navigation with the generator's true
   coordinates given to the schemes that read them (``navigation.token_coordinates``: an
   oracle, the upper bound for MapWM, which infers position from the actions): test recall
   accuracy on the iid, ood_dense and ood_sparse sets, mean and 95% CI over seeds. Rows
   (``--rows``): ``gridpe_rotate``, ``gridpe_complex``, ``gridpe_merge``, ``gridpe_deep``
   (``--gridpe-variant``), ``learned_abs`` (the token index: ViT's table), ``sinusoidal`` (nD,
   on the coordinates), ``rope_axial`` (on the coordinates) by default; also ``ape_grid``
   (coordinates), ``ape_grid_decay`` (with APE's logit decay 0.98^floor(Euclidean distance),
   ``ape_decay``), ``gridpe_rotate_index`` (gridpe on the token index, ``coord_source``
   'index': the scheme without the oracle), ``mapwm`` (no coordinates: MapFormer's model),
   ``rope`` (the token index), or any registered scheme by name. Each (task, row, seed) is written as JSON to
   ``<task>-<row>-seed<k>.json`` as soon as it finishes, and a rerun skips the runs found
   there with the same configs (an interrupted table resumes).

Tasks (``--tasks``, default ``navigation``): ``navigation`` as above; ``digits`` and
``digits16`` (:mod:`mapformer.tasks.digits`: scikit-learn's 8x8 digits as 64 pixel tokens with
their (row, column), or pasted at random offsets on a 16x16 canvas; a non-causal classifier
with mean pooling, the tasks' own defaults), accuracy on the test (``iid``) and dev splits
(all 360 / 180 images at cpu and paper scale), rows IMAGE_ROWS (the default rows and
``ape_grid``). They stand in for the paper's ImageNet-100 (PVT and ViT: not available
offline, days on this CPU). ``grid_transpose``, ``grid_rotate90``, ``grid_flip`` and
``grid_copy`` (:mod:`mapformer.tasks.grid2d`: a random grid of 20 symbols, sides 4 to 6, and
its transpose / clockwise rotation / row flip / copy, written row by row with newlines, every
token at its (row, column) on the page, the target below the source) are prefix LMs
(``attn_mask`` prefix for every row, TASK_OPTIONS), rows GRID_ROWS (``rope`` on the token
index, ``rope_axial``, ``ape_grid``, ``gridpe_rotate`` and 2D ``sinusoidal`` on the page
coordinates), accuracy and exact match (every target token right, teacher-forced) on the test
split (``iid``) and on larger grids (``ood_large``, sides 7 to 9). A task is an entry of
TASKS: a function of the scale giving its TrainConfig fields, its default rows and its
evaluation sets; the rest of the script is task-agnostic.

Scales:
- ``paper``: the MapFormer paper's 2D presets (128 steps, grid 64, p_empty 0.5; OOD-dense and
  OOD-sparse its presets), 2 layers, d_model 128, 2 heads of 64, batch 128, 200,000 sequences,
  the library's default training (AdamW 3e-4, linear decay). Not run here.
- ``cpu``: Table 2's cpu navigation (32 steps, grid 16, p_empty 0.5; OOD sets by the paper's
  ratios), 2 layers, d_model 64, 2 heads of 32 (GridPE's 16 planes per head: 5 scales of 3
  directions), batch 64, 2,000 steps (128,000 sequences), lr 1e-3 (the library's linear
  decay), 256 sequences per evaluation set. Chosen for the time budget, not tuned.
- ``tiny``: 8 steps, grid 4, d_model 24, 20 steps of batch 16, 32 sequences per set: proves
  the script (seconds per run), measures nothing.

Threads: one OpenMP and one OpenBLAS thread unless OMP_NUM_THREADS / OPENBLAS_NUM_THREADS are
set (faster at these sizes on the shared machine, as reproduce_ape.py found).

Time estimate (cpu scale): medians of 20 training steps (forward and backward, batch 64) with
one thread on the shared 2-core machine under heavy load (load average 8-10): gridpe_rotate
0.129 s, gridpe_complex 0.303 s (its attention is twice as wide), gridpe_merge 0.126 s,
gridpe_deep 0.155 s, learned_abs 0.122 s, sinusoidal 0.126 s, rope_axial 0.131 s (optional
rows: ape_grid 0.164 s, mapwm 0.124 s); a 30-step run of the script gave the same per step,
evaluation included. The default 7 rows take 1.09 s per step together, so 3 seeds x 2,000
steps is about 6,600 s: about 1.8 hours for the navigation table (21 runs), plus a few
seconds for the analyses; less on a quieter machine. The image tasks, from 20-step runs of
the script (load average 5-8): digits about 0.11 s per step (gridpe_complex 0.25 s), so its
8 rows x 3 seeds x 2,000 steps about 1.7 hours; digits16 (256 tokens) about 0.6 s per step
(gridpe_complex 1.3 s), about 9 hours at 2,000 steps: run it with ``--sequences 32000`` (500
steps, about 2.3 hours) or fewer rows. The grid tasks (batch 64 of up to 84 tokens, prefix
mask), medians of 6 training steps with one thread at load average 2: rope, rope_axial,
gridpe_rotate and sinusoidal 0.075 s, ape_grid 0.098 s, 0.40 s per step for the 5 rows, so 3
seeds x 2,000 steps is at least 2,400 s: 40 minutes per grid task (15 runs), more under
load; the script's own 300-step runs took 0.084-0.15 s per step with optimizer and
evaluation (load average 3-5), so about 45-70 minutes per task; ``--sequences 96000`` (1,500
steps) keeps a task near 40 minutes. Not run at full size here; ``--scale tiny`` proves the
script.
"""
import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before NumPy and the core load
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mapformer.models import ModelConfig  # noqa: E402
from mapformer.schemes import SCHEMES  # noqa: E402
from mapformer.schemes.gridpe import (code_kernel, gridpe_frequencies,  # noqa: E402
                                      neuron_count)
from mapformer.reproduce.mapformer import mean_ci, train_or_load, write_json  # noqa: E402
from mapformer.train import TrainConfig  # noqa: E402


@dataclass(frozen=True)
class Row:
    """A table row: the model preset, its positional scheme and options over their defaults."""

    scheme: str
    options: tuple = ()
    preset: str = "rope"


VARIANTS = ("rotate", "complex", "merge", "deep")
ROWS = {
    **{f"gridpe_{v}": Row("gridpe", (("gridpe_variant", v),)) for v in VARIANTS},
    "learned_abs": Row("learned_abs"),
    "sinusoidal": Row("sinusoidal"),
    "rope_axial": Row("rope_axial"),
    "ape_grid": Row("ape_grid"),
    "ape_grid_decay": Row("ape_grid", (("ape_decay", 0.98),)),
    "gridpe_rotate_index": Row("gridpe", (("gridpe_variant", "rotate"),
                                          ("coord_source", "index"), ("coord_dims", 1))),
    "mapwm": Row("mapwm", preset="mapwm"),
    "rope": Row("rope"),
}
DEFAULT_ROWS = ("gridpe_rotate", "gridpe_complex", "gridpe_merge", "gridpe_deep", "learned_abs",
                "sinusoidal", "rope_axial")
IMAGE_ROWS = DEFAULT_ROWS + ("ape_grid",)  # the digits tasks' default rows
GRID_ROWS = ("rope", "rope_axial", "ape_grid", "gridpe_rotate", "sinusoidal")  # grid tasks'


@dataclass(frozen=True)
class Scale:
    d_model: int
    n_heads: int
    n_layers: int
    batch_size: int
    steps: int
    lr: float
    eval_sequences: int
    nav_steps: int  # navigation: steps per sequence, grid side
    nav_grid: int
    area: int  # Fig. 3: the square [-area, area]^2, its points per side, the head's planes
    points: int
    planes: int


SCALES = {
    "paper": Scale(128, 2, 2, 128, 200_000 // 128, 3e-4, 1000, 128, 64, 32, 257, 48),
    "cpu": Scale(64, 2, 2, 64, 2000, 1e-3, 256, 32, 16, 32, 129, 48),
    "tiny": Scale(32, 2, 2, 16, 20, 1e-3, 32, 8, 4, 8, 33, 12),
}


def navigation_fields(scale):
    """TrainConfig fields of 2D navigation at this scale (OOD sets by the paper's ratios)."""
    return dict(task="navigation", dims=2, steps=scale.nav_steps, grid_size=scale.nav_grid,
                p_empty=0.5)


def digits_fields(canvas):
    """TrainConfig fields of the digits image task on a canvas of this side (8: the image,
    16: pasted at random offsets); the tasks' own model defaults (non-causal attention, mean
    pooling, 2D pixel coordinates) come with them."""
    def fields(scale):  # the whole test split (360 images) at cpu and paper scale
        return dict(task="digits" if canvas == 8 else f"digits{canvas}",
                    eval_sequences=360 if scale.eval_sequences >= 256 else scale.eval_sequences)
    return fields


def grid_fields(operation):
    """TrainConfig fields of a 2D grid transduction (:mod:`mapformer.tasks.grid2d`): sides
    4 to 6 at cpu and paper scale (the task's default), 3 to 5 at tiny."""
    def fields(scale):
        return dict(task=f"grid_{operation}", grid_side=3 if scale.nav_grid < 8 else 5)
    return fields


# task -> (TrainConfig fields of a scale, its default rows, its evaluation sets)
TASKS = {"navigation": (navigation_fields, DEFAULT_ROWS, ("iid", "ood_dense", "ood_sparse")),
         "digits": (digits_fields(8), IMAGE_ROWS, ("iid", "dev")),
         "digits16": (digits_fields(16), IMAGE_ROWS, ("iid", "dev")),
         **{f"grid_{op}": (grid_fields(op), GRID_ROWS, ("iid", "ood_large"))
            for op in ("transpose", "rotate90", "flip", "copy")}}
# task -> model options every row of it takes: the grid transductions are prefix LMs (the
# source and separator read bidirectionally, the target causally)
TASK_OPTIONS = {f"grid_{op}": {"attn_mask": "prefix"}
                for op in ("transpose", "rotate90", "flip", "copy")}


def row_of(name):
    """The Row of a --rows name: a named row, or a registered scheme with its defaults."""
    if name in ROWS and ROWS[name].scheme in SCHEMES.entries:
        return ROWS[name]
    if name in SCHEMES.entries:
        return Row(name)
    raise ValueError(f"unknown row {name!r}: the rows are {sorted(ROWS)} and the registered "
                     f"schemes {sorted(SCHEMES.entries)}")


def configs(task, row, scale, seed, sequences):
    """(ModelConfig, TrainConfig) of one run."""
    fields = dict(sequences=sequences, batch_size=scale.batch_size, lr=scale.lr, seed=seed,
                  eval_sequences=scale.eval_sequences, log_every=100)
    train_config = TrainConfig(**{**fields, **TASKS[task][0](scale)})
    model_config = ModelConfig.for_task(
        row.preset, train_config.task_config(), positional=row.scheme, d_model=scale.d_model,
        n_heads=scale.n_heads, n_layers=scale.n_layers,
        **{**TASK_OPTIONS.get(task, {}), **dict(row.options)})
    return model_config, train_config


def run(task, name, row, scale, seed, sequences, out_dir):
    """Train one (task, row, seed), or read it from out_dir when its JSON holds the same
    configs (:func:`mapformer.reproduce.train_or_load`); returns the record."""
    model_config, train_config = configs(task, row, scale, seed, sequences)
    return train_or_load(out_dir / f"{task}-{name}-seed{seed}.json", model_config,
                         train_config, task=task, row=name, seed=seed)



# ---- parts 1 and 2: the code's distance decay, the optimal ratio -------------------------
def decay_surface(scale):
    """The kernel of one head's code (2D, the library's default scales and omega_max) on the
    square grid: (axis (P,), surface (P, P) [y, x]), and the ring averages {radius: value}."""
    f = gridpe_frequencies(1, scale.planes, 2)[0]
    axis = np.linspace(-scale.area, scale.area, scale.points)
    xx, yy = np.meshgrid(axis, axis)
    surface = code_kernel(np.stack([xx, yy], -1), f)
    angles = np.linspace(0, 2 * math.pi, 64, endpoint=False)
    circle = np.stack([np.cos(angles), np.sin(angles)], -1)
    radii = [0] + [2 ** k for k in range(int(math.log2(scale.area)) + 1)]
    rings = {r: float(code_kernel(r * circle, f).mean()) for r in radii}
    return axis, surface, rings


def plot_decay(axis, surface, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    extent = (axis[0], axis[-1], axis[0], axis[-1])
    im = a.imshow(surface, origin="lower", extent=extent, cmap="viridis")
    a.set(title="GridPE code: <g(0), g(d)> / K", xlabel="d_x", ylabel="d_y")
    fig.colorbar(im, ax=a)
    b.plot(axis, surface[len(axis) // 2])
    b.set(title="profile at d_y = 0", xlabel="d_x", ylabel="kernel")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def optimal_ratios():
    """{n: {resolution: argmin over r of N(r)}} on a grid of step 5e-5; asserts each is
    e^(1/n) to the grid's step."""
    r = np.linspace(1.05, 4.0, 59001)
    found = {}
    for n in (1, 2, 3):
        found[n] = {}
        for resolution in (10.0, 1e4):
            best = float(r[np.argmin(neuron_count(r, n, resolution))])
            assert abs(best - math.exp(1 / n)) < 1e-4, (n, resolution, best)
            found[n][resolution] = best
    return found


def analyses(scale, out_dir):
    axis, surface, rings = decay_surface(scale)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_decay(axis, surface, out_dir / "fig3_decay.png")
    ratios = optimal_ratios()
    record = {"fig3": {"area": scale.area, "points": scale.points, "planes": scale.planes,
                       "profile_x": axis.tolist(),
                       "profile": surface[len(axis) // 2].tolist(),
                       "ring_means": {str(k): v for k, v in rings.items()}},
              "optimal_ratio": {str(n): {"e^(1/n)": math.exp(1 / n),
                                         **{f"argmin R={res:g}": v for res, v in d.items()}}
                                for n, d in ratios.items()}}
    write_json(out_dir / "analysis.json", record)
    print("Fig. 3: mean of the code's kernel over rings of radius "
          + ", ".join(f"{r}: {v:.3f}" for r, v in rings.items()))
    for n, d in ratios.items():
        print(f"n = {n}: N(r) least at " + ", ".join(f"{v:.4f} (R = {res:g})"
                                                    for res, v in d.items())
              + f"; e^(1/n) = {math.exp(1 / n):.4f}")
    return record


# ---- part 3: the table ---------------------------------------------------------------------
def format_table(records, task, names, scale_name):
    """Markdown: one line per row of ``task``, accuracy on each of its evaluation sets (and
    exact match, for the tasks that report it: the grid transductions)."""
    sets = TASKS[task][2]
    ours = [r for r in records if r["task"] == task]
    metrics = ["accuracy"] + (["sequence_accuracy"] if ours and "sequence_accuracy"
                              in ours[0]["eval"][sets[0]] else [])
    columns = [(s, m) for s in sets for m in metrics]
    lines = [f"**{task}, scale {scale_name}: " + " and ".join(
                 "exact match" if m == "sequence_accuracy" else m for m in metrics)
             + " (mean ± 95% CI over seeds); coordinates: the task's true ones given to the "
             "scheme**", "",
             "| row | coordinates | " + " | ".join(
                 s + (" exact" if m == "sequence_accuracy" else "") for s, m in columns)
             + " | seeds |",
             "|---|---|" + "---|" * len(columns) + "---|"]
    for name in names:
        runs = [r for r in ours if r["row"] == name]
        if not runs:
            continue
        reads = runs[0]["model"]["options"].get("coord_source") == "task"
        cells = [mean_ci([r["eval"][s][m] for r in runs], digits=3) for s, m in columns]
        lines.append(f"| {name} | {'yes' if reads else 'no'} | " + " | ".join(cells)
                     + f" | {len(runs)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per row (0, 1, ...)")
    parser.add_argument("--rows", default=None,
                        help="comma-separated rows: " + ", ".join(ROWS) + ", or any "
                        "registered scheme (default: navigation " + ", ".join(DEFAULT_ROWS)
                        + "; digits " + ", ".join(IMAGE_ROWS) + "; grid tasks "
                        + ", ".join(GRID_ROWS) + ")")
    parser.add_argument("--tasks", default="navigation",
                        help="comma-separated among " + ", ".join(TASKS)
                        + " (default: navigation)")
    parser.add_argument("--sequences", type=int, default=None,
                        help="override the scale's training sequences (not a reproduction)")
    parser.add_argument("--no-table", action="store_true", help="the analyses only")
    parser.add_argument("--out", default=None,
                        help="directory of the JSON and the plot (default results/gridpe/SCALE)")
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    sequences = args.sequences or scale.steps * scale.batch_size
    tasks = [t.strip() for t in args.tasks.split(",")]
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        parser.error(f"unknown tasks {bad}: the tasks are {list(TASKS)}")
    names = {t: [n.strip() for n in args.rows.split(",")] if args.rows else list(TASKS[t][1])
             for t in tasks}
    try:
        rows = {name: row_of(name) for t in tasks for name in names[t]}
    except ValueError as exc:
        parser.error(str(exc))
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    out_dir = Path(args.out or Path(__file__).resolve().parents[1] / "results" / "gridpe"
                   / args.scale)
    t0 = time.perf_counter()
    print(f"GridPE, scale {args.scale}: {scale}; JSON and plot in {out_dir}", flush=True)
    analyses(scale, out_dir)
    records = []
    for task in ([] if args.no_table else tasks):
        for name in names[task]:
            for seed in range(args.seeds):
                r = run(task, name, rows[name], scale, seed, sequences, out_dir)
                records.append(r)
                print(f"  {task} {name} seed {seed}: "
                      + "   ".join(f"{s} {r['eval'][s]['accuracy']:.3f}"
                                   + (f" (exact {r['eval'][s]['sequence_accuracy']:.3f})"
                                      if "sequence_accuracy" in r["eval"][s] else "")
                                   for s in TASKS[task][2])
                      + f"   ({r['wall_s']:.0f}s, {r['wall_s'] / r['steps']:.3f} s/step"
                      + (", from an earlier run)" if r.get("cached") else ")"), flush=True)
    for task in tasks if records else []:
        print()
        print(format_table(records, task, names[task], args.scale))
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")
    return records


if __name__ == "__main__":
    main()
