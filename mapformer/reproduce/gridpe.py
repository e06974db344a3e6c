"""GridPE (Li et al., "GridPE: Unifying positional encoding in transformers with a grid
cell-inspired framework"): its analyses and its variants against the baselines, as table
specs (:func:`table`)::

    python -m mapformer reproduce gridpe fig3 --seeds 1
    OMP_NUM_THREADS=1 python -m mapformer reproduce gridpe navigation --scale cpu --seeds 3 \\
        --rows gridpe_rotate,gridpe_complex,gridpe_merge,gridpe_deep,learned_abs,sinusoidal,rope_axial
    python -m mapformer reproduce gridpe grid_transpose --scale cpu --seeds 3 \\
        --executor pool --workers 2

Records go to ``results/records/gridpe`` (``--records``), fig3's plot to
``results/figures/gridpe-fig3-SCALE.png`` (``--plot``). The records of the script this module
replaced (``benchmarks/reproduce_gridpe.py``, its files in ``results/gridpe/cpu/``) are
converted, by :func:`legacy_records`, into ``results/records/gridpe-legacy``: render them with
``--records results/records/gridpe-legacy --render-only``.

Three parts:

1. ``fig3``, the distance decay of the code (the paper's Fig. 3): the inner product of two
   unit GridPE codes (one head's frequency vectors: n + 1 = 3 directions at 120 degrees, S
   scales of ratio e^(1/2)) as a function of their displacement over a square area, as a
   surface and the profile along the x axis, and the kernel averaged over rings of radius 0,
   1, 2, 4, ... (:func:`mapformer.schemes.gridpe.code_kernel`). The paper does not state its
   area or code size; here [-32, 32]^2 and a head of 96 (48 planes, S = 16) at cpu and paper
   scale. With it, 2., the optimal scale ratio: the paper's neuron count N(r) = c r^n ln R /
   ln r (its eqs. 9-11, :func:`mapformer.schemes.gridpe.neuron_count`) minimised over a grid
   of ratios for n = 1, 2, 3 and two resolutions R; the minimiser must be e^(1/n) (the run
   fails otherwise; tests/test_gridpe_schemes.py checks it too). Both are one deterministic
   run of kind ``mapformer.reproduce.gridpe:execute_analysis`` (its area, points per side and
   planes in ``Run.extra``; the same run whatever ``--seeds``): its record holds the ring
   means (metrics ``fig3``: ``r=0``, ``r=1``, ...), the minimisers (metrics ``ratios``:
   ``n=1 R=10``, ...), the profile (``profile_x``, ``profile``); the plot (:func:`plot_fig3`)
   recomputes the surface from the record's parameters and draws the record's profile.
3. The variants against the baselines on MapFormer's 2D navigation (table ``navigation``)
   with the generator's true coordinates given to the schemes that read them
   (``navigation.token_coordinates``: an oracle, the upper bound for MapWM, which infers
   position from the actions): recall accuracy on the iid, ood_dense and ood_sparse sets,
   mean and 95% CI over seeds. Rows: ``gridpe_rotate``, ``gridpe_complex``, ``gridpe_merge``,
   ``gridpe_deep`` (``gridpe_variant``), ``learned_abs`` (the token index: ViT's table),
   ``sinusoidal`` (nD, on the coordinates), ``rope_axial`` (on the coordinates): the old
   script's default set (:data:`DEFAULT_ROWS`); then ``ape_grid`` (coordinates),
   ``ape_grid_decay`` (with APE's logit decay 0.98^floor(Euclidean distance),
   ``ape_decay``), ``gridpe_rotate_index`` (gridpe on the token index, ``coord_source``
   'index': the scheme without the oracle), ``mapwm`` (no coordinates: MapFormer's model),
   ``rope`` (the token index). Every table has every row of :data:`ROWS` (each builds and
   trains on every task), its task's default rows first (:data:`TASKS`): without ``--rows``
   the command runs all 12, ``--rows`` chooses (the layer has no default subset; the old
   script ran a task's default rows unless told otherwise, and the commands above name
   them). The old script also took any registered scheme as a row: a table here has only
   the named rows (add one to :data:`ROWS`).

Tasks (one table each): ``navigation`` as above; ``digits`` and ``digits16``
(:mod:`mapformer.tasks.digits`: scikit-learn's 8x8 digits as 64 pixel tokens with their (row,
column), or pasted at random offsets on a 16x16 canvas; a non-causal classifier with mean
pooling, the tasks' own defaults), the paper's Acc@1, Acc@5 and loss columns
(:data:`IMAGE_METRICS`: ``accuracy``, ``accuracy_top5``, ``loss``) on the test (``iid``) and
dev splits (all 360 / 180 images at cpu and paper scale), default rows IMAGE_ROWS
(navigation's and ``ape_grid``); tables ``digits-fig4`` and ``digits16-fig4`` are the same
runs with both sets also evaluated 19 times through training (:data:`CURVE_POINTS`;
``--plot`` draws the dev curves, the paper's Fig. 4: :func:`plot_fig4`).
They stand in for the paper's ImageNet-100 (PVT and ViT: not available offline, days on this
CPU). ``grid_transpose``, ``grid_rotate90``, ``grid_flip`` and ``grid_copy``
(:mod:`mapformer.tasks.grid2d`: a random grid of 20 symbols, sides 4 to 6, and its transpose /
clockwise rotation / row flip / copy, written row by row with newlines, every token at its
(row, column) on the page, the target below the source) are prefix LMs (``attn_mask`` prefix
for every row, TASK_OPTIONS), default rows GRID_ROWS (``rope`` on the token index,
``rope_axial``, ``ape_grid``, ``gridpe_rotate`` and 2D ``sinusoidal`` on the page
coordinates), accuracy and exact match (``sequence_accuracy``: every target token right,
teacher-forced) on the test split (``iid``) and on larger grids (``ood_large``, sides 7 to
9). A task is an entry of TASKS: a function of the scale giving its TrainConfig fields, its
default rows and its evaluation sets; the rest is task-agnostic. Each note names the rows that read the task's coordinates (the old script's
"coordinates" column).

Scales:
- ``paper``: the MapFormer paper's 2D presets (128 steps, grid 64, p_empty 0.5; OOD-dense and
  OOD-sparse its presets), 2 layers, d_model 128, 2 heads of 64, batch 128, 200,000 sequences,
  the library's default training (AdamW 3e-4, linear decay). Not run here.
- ``cpu``: Table 2's cpu navigation (32 steps, grid 16, p_empty 0.5; OOD sets by the paper's
  ratios), 2 layers, d_model 64, 2 heads of 32 (GridPE's 16 planes per head: 5 scales of 3
  directions), batch 64, 2,000 steps (128,000 sequences), lr 1e-3 (the library's linear
  decay), 256 sequences per evaluation set. Chosen for the time budget, not tuned.
- ``tiny``: 8 steps, grid 4, d_model 32, 20 steps of batch 16, 32 sequences per set: proves
  the pipeline (seconds per run), measures nothing.

Threads: the old script set one OpenMP and one OpenBLAS thread unless OMP_NUM_THREADS /
OPENBLAS_NUM_THREADS were set (faster at these sizes on the shared machine); the command
runs with the environment's: ``OMP_NUM_THREADS=1`` serially, or ``--executor pool`` (one
thread per worker by default).

Time estimate (cpu scale; the old script's, the configs are the same): medians of 20 training
steps (forward and backward, batch 64) with one thread on the shared 2-core machine under
heavy load (load average 8-10): gridpe_rotate 0.129 s, gridpe_complex 0.303 s (its attention
is twice as wide), gridpe_merge 0.126 s, gridpe_deep 0.155 s, learned_abs 0.122 s, sinusoidal
0.126 s, rope_axial 0.131 s (other rows: ape_grid 0.164 s, mapwm 0.124 s); a 30-step run
gave the same per step, evaluation included. The default 7 rows take 1.09 s per step
together, so 3 seeds x 2,000 steps is about 6,600 s: about 1.8 hours for the navigation table
(21 runs); fig3 takes seconds; less on a quieter machine. The image tasks, from 20-step runs
(load average 5-8): digits about 0.11 s per step (gridpe_complex 0.25 s), so its 8 rows x 3
seeds x 2,000 steps about 1.7 hours; digits16 (256 tokens) about 0.6 s per step
(gridpe_complex 1.3 s), about 9 hours at 2,000 steps: run it with ``--sequences 32000`` (500
steps, about 2.3 hours; the converted records are of such runs) or fewer rows. The grid
tasks (batch 64 of up to 84 tokens, prefix mask), medians of 6 training steps with one thread
at load average 2: rope, rope_axial, gridpe_rotate and sinusoidal 0.075 s, ape_grid 0.098 s,
0.40 s per step for the 5 rows, so 3 seeds x 2,000 steps is at least 2,400 s: 40 minutes per
grid task (15 runs), more under load; 300-step runs took 0.084-0.15 s per step with optimizer
and evaluation (load average 3-5), so about 45-70 minutes per task; ``--sequences 96000``
(1,500 steps) keeps a task near 40 minutes. The rows beyond a task's default add to these.
"""
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..experiments.records import unknown_provenance
from ..experiments.runs import Run
from ..experiments.tables import Table
from ..experiments.tables import overridden as overridden_note
from ..models import ModelConfig
from ..schemes import SCHEMES
from ..schemes.gridpe import code_kernel, gridpe_frequencies, neuron_count
from ..train import TrainConfig
from .mapformer import recorded_configs
from .plots import finish, pyplot


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


# the digits tables with the validation curves of the paper's Fig. 4 (the image tasks'
# runs evaluated every CURVE_POINTS-th of the training, the record's evals; the final
# evaluation the last point): the task's table but for that, their runs their own
CURVE_TABLES = {"digits-fig4": "digits", "digits16-fig4": "digits16"}
CURVE_POINTS = 20


def curve_every(sequences, scale):
    """The steps between a curve table's evaluations: a CURVE_POINTS-th of the training."""
    return max(sequences // scale.batch_size // CURVE_POINTS, 1)


def grid_fields(operation):
    """TrainConfig fields of a 2D grid transduction (:mod:`mapformer.tasks.grid2d`): sides
    4 to 6 at cpu and paper scale (the task's default), 2 to 4 at tiny (mean side 3; the old
    script's docstring said 3 to 5)."""
    def fields(scale):
        return dict(task=f"grid_{operation}", grid_side=3 if scale.nav_grid < 8 else 5)
    return fields


GRID_OPERATIONS = ("transpose", "rotate90", "flip", "copy")

# task -> (TrainConfig fields of a scale, its default rows, its evaluation sets)
TASKS = {"navigation": (navigation_fields, DEFAULT_ROWS, ("iid", "ood_dense", "ood_sparse")),
         "digits": (digits_fields(8), IMAGE_ROWS, ("iid", "dev")),
         "digits16": (digits_fields(16), IMAGE_ROWS, ("iid", "dev")),
         **{f"grid_{op}": (grid_fields(op), GRID_ROWS, ("iid", "ood_large"))
            for op in GRID_OPERATIONS}}
# task -> model options every row of it takes: the grid transductions are prefix LMs (the
# source and separator read bidirectionally, the target causally)
TASK_OPTIONS = {f"grid_{op}": {"attn_mask": "prefix"} for op in GRID_OPERATIONS}

TABLE_NAMES = ("fig3", "dims", *TASKS, *CURVE_TABLES)

TITLES = {"navigation": "GridPE's variants on 2D forced navigation: recall accuracy",
          "digits": "GridPE's variants on digits (8x8 pixels; for the paper's ImageNet-100): "
                    "test and dev accuracy",
          "digits16": "GridPE's variants on digits16 (the 8x8 digit at a random offset on a "
                      "16x16 canvas): test and dev accuracy",
          "digits-fig4": "Table 1's columns (Acc@1, Acc@5, loss) and Fig. 4's validation "
                         "curves on digits (8x8 pixels; for the paper's ImageNet-100)",
          "digits16-fig4": "Table 1's columns (Acc@1, Acc@5, loss) and Fig. 4's validation "
                           "curves on digits16 (the 8x8 digit at a random offset on a 16x16 "
                           "canvas)",
          **{f"grid_{op}": f"GridPE's variants on grid_{op} (a prefix LM on the page's 2D "
                           "coordinates): token accuracy and exact match"
             for op in GRID_OPERATIONS},
          "fig3": "Fig. 3: the GridPE code's kernel averaged over rings of radius r (the "
                  "optimal ratios in the record and the plot)",
          "dims": "Eqs. 11-15: the optimal scale ratio e^(1/n) of an n-dimensional space and "
                  "the least encoding dimension whose base-10000 sinusoidal ratio is below it"}


def row_of(name):
    """The Row of a table row's name (a key of :data:`ROWS` whose scheme is registered)."""
    if name in ROWS and ROWS[name].scheme in SCHEMES.entries:
        return ROWS[name]
    raise ValueError(f"unknown row {name!r}: the rows are {sorted(ROWS)}")


def task_rows(task):
    """The rows of ``task``'s table: its default rows (the old script's), then the other rows
    of :data:`ROWS` (every one builds and trains on every task)."""
    default = TASKS[task][1]
    return default + tuple(r for r in ROWS if r not in default)


def configs(task, row, scale, seed, sequences, eval_sequences=None, curves=False):
    """(ModelConfig, TrainConfig) of one run (the old script's, ``eval_sequences`` None and
    ``curves`` False); ``eval_sequences`` overrides the sequences (images, grids) per
    evaluation set; ``curves``: the sets are also evaluated every :data:`CURVE_POINTS`-th of
    the training (which leaves the training as it is: the same final record)."""
    fields = dict(sequences=sequences, batch_size=scale.batch_size, lr=scale.lr, seed=seed,
                  eval_sequences=scale.eval_sequences, log_every=100)
    fields = {**fields, **TASKS[task][0](scale)}
    if curves:
        fields["eval_every"] = curve_every(sequences, scale)
    if eval_sequences is not None:
        fields["eval_sequences"] = eval_sequences
    train_config = TrainConfig(**fields)
    model_config = ModelConfig.for_task(
        row.preset, train_config.task_config(), positional=row.scheme, d_model=scale.d_model,
        n_heads=scale.n_heads, n_layers=scale.n_layers,
        **{**TASK_OPTIONS.get(task, {}), **dict(row.options)})
    return model_config, train_config


def gridpe_run(task, name, scale, seed, sequences, eval_sequences=None, curves=False):
    """The run of one (task, row, seed): trained on the task, evaluated on its own sets
    (TrainConfig.eval_tasks), through training too with ``curves``."""
    return Run.of(*configs(task, row_of(name), scale, seed, sequences, eval_sequences, curves))


# ---- fig3: the code's distance decay, the optimal ratio ----------------------------------
def radii(area):
    """The rings' radii: 0 and the powers of 2 up to ``area``."""
    return [0] + [2 ** k for k in range(int(math.log2(area)) + 1)]


def decay_surface(area, points, planes):
    """The kernel of one head's code (2D, ``planes`` planes, the library's default scales and
    omega_max) on the square grid of ``points`` per side over [-area, area]^2: (axis (P,),
    surface (P, P) [y, x]), and the ring averages {radius: value} (64 points a ring)."""
    f = gridpe_frequencies(1, planes, 2)[0]
    axis = np.linspace(-area, area, points)
    xx, yy = np.meshgrid(axis, axis)
    surface = code_kernel(np.stack([xx, yy], -1), f)
    angles = np.linspace(0, 2 * math.pi, 64, endpoint=False)
    circle = np.stack([np.cos(angles), np.sin(angles)], -1)
    rings = {r: float(code_kernel(r * circle, f).mean()) for r in radii(area)}
    return axis, surface, rings


RESOLUTIONS = (10.0, 1e4)


def optimal_ratios():
    """{n: {resolution: argmin over r of N(r)}} on a grid of step 5e-5; each must be e^(1/n)
    to the grid's step (an AssertionError otherwise)."""
    r = np.linspace(1.05, 4.0, 59001)
    found = {}
    for n in (1, 2, 3):
        found[n] = {}
        for resolution in RESOLUTIONS:
            best = float(r[np.argmin(neuron_count(r, n, resolution))])
            if abs(best - math.exp(1 / n)) >= 1e-4:
                raise AssertionError(f"N(r) least at {best} for n = {n}, R = {resolution:g}, "
                                     f"not e^(1/n) = {math.exp(1 / n)}")
            found[n][resolution] = best
    return found


PE_BASE = 10000.0  # the Transformer's sinusoidal base, eq. 12


def minimum_dimensions(base=PE_BASE, dims=(1, 2, 3)):
    """Eqs. 12-15: a sinusoidal code of dimension d has adjacent scale ratio base^(2/d) (eq.
    12); it is unambiguous in n dimensions when that is at most the optimal ratio e^(1/n)
    (eq. 13), i.e. d >= 2 n ln(base) (eqs. 14-15). {"n=N": {"optimal_ratio": e^(1/n),
    "min_dim_real": 2 n ln(base), "min_dim": the least even integer d with base^(2/d) <=
    e^(1/n)}}."""
    out = {}
    for n in dims:
        bound = 2 * n * math.log(base)
        d = 2 * math.ceil(bound / 2)
        if base ** (2 / d) > math.exp(1 / n) * (1 + 1e-12):  # the bound, checked directly
            raise AssertionError(f"d = {d} misses eq. 13 for n = {n}")
        out[f"n={n}"] = {"optimal_ratio": math.exp(1 / n), "min_dim_real": bound,
                         "min_dim": d}
    return out


def sinusoidal_ratios(dims=(128, 512), base=PE_BASE):
    """Eq. 12's adjacent scale ratio base^(2/d) of the sinusoidal code: {"d=D": ratio}."""
    return {f"d={d}": base ** (2 / d) for d in dims}


def execute_analysis(run):
    """Kind "mapformer.reproduce.gridpe:execute_analysis": fig3's ring means and profile for
    run.extra's area, points and planes, and the neuron count's minimisers. Returns
    {"metrics": {"fig3": {"r=R": ring mean}, "ratios": {"n=N R=RES": argmin}, "eq12": {"d=D":
    sinusoidal ratio}, "n=N": minimum_dimensions' figures}, "profile_x",
    "profile" (the kernel at d_y = 0), "expected_ratios" {"n=N": e^(1/n)}, "wall_s"}."""
    t0 = time.perf_counter()
    extra = run.extra
    axis, surface, rings = decay_surface(extra["area"], extra["points"], extra["planes"])
    ratios = optimal_ratios()
    return {"metrics": {"fig3": {f"r={r}": v for r, v in rings.items()},
                        "ratios": {f"n={n} R={res:g}": v for n, d in ratios.items()
                                   for res, v in d.items()},
                        "eq12": sinusoidal_ratios(), **minimum_dimensions()},
            "profile_x": axis.tolist(), "profile": surface[len(axis) // 2].tolist(),
            "expected_ratios": {f"n={n}": math.exp(1 / n) for n in ratios},
            "wall_s": time.perf_counter() - t0}


def fig3_run(scale):
    """The one run of fig3 at ``scale`` (deterministic: no seed)."""
    return Run(model={}, train={}, kind="mapformer.reproduce.gridpe:execute_analysis",
               extra={"area": scale.area, "points": scale.points, "planes": scale.planes})


def plot_fig3(table, store, seeds, path):
    """fig3 from its record: the kernel's surface (recomputed from the record's area, points
    and planes; a ValueError when it no longer gives the record's profile) and the record's
    profile at d_y = 0, the minimisers of N(r) in the legend."""
    records = table.records(store, max(seeds, 1))
    if not records:
        raise ValueError(f"no record of gridpe fig3 at scale {table.scale} in "
                         f"{store.directory}: run it (without --render-only) first")
    record = next(iter(records.values()))
    extra = record["run"]["extra"]
    axis, surface, _ = decay_surface(extra["area"], extra["points"], extra["planes"])
    profile = np.asarray(record["profile"])
    if not np.allclose(surface[len(axis) // 2], profile, rtol=0, atol=1e-9):
        raise ValueError(f"the record {record['id']}'s profile is not today's code_kernel's: "
                         "rerun fig3 (--force)")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    extent = (axis[0], axis[-1], axis[0], axis[-1])
    im = a.imshow(surface, origin="lower", extent=extent, cmap="viridis")
    a.set(title=f"GridPE code ({extra['planes']} planes): <g(0), g(d)> / K", xlabel="d_x",
          ylabel="d_y")
    fig.colorbar(im, ax=a)
    ratios = record["metrics"]["ratios"]
    label = "argmin N(r): " + ", ".join(
        f"n={n} {ratios[f'n={n} R={RESOLUTIONS[0]:g}']:.4f}" for n in (1, 2, 3))
    b.plot(record["profile_x"], profile, label=label)
    b.set(title="profile at d_y = 0", xlabel="d_x", ylabel="kernel")
    b.legend(fontsize=8, loc="lower center")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the tables ---------------------------------------------------------------------------
def task_note(task, scale, sequences, eval_sequences, overridden):
    """The note of ``task``'s table: the task, model and training at ``scale``, the rows
    that read the task's coordinates."""
    _, train = configs(task, ROWS["rope"], scale, 0, sequences, eval_sequences)
    steps = sequences // scale.batch_size
    if task == "navigation":
        what = (f"{scale.nav_steps} steps, grid {scale.nav_grid}, p_empty 0.5 (OOD sets by "
                "the paper's ratios)")
    elif task.startswith("digits"):
        what = "non-causal classifier, mean pooling, the pixels' (row, column)"
    else:
        sets = train.eval_tasks()
        what = (f"prefix LM, grids of sides {sets['iid'].min_side}-{sets['iid'].max_side} "
                f"(ood_large: {sets['ood_large'].min_side}-{sets['ood_large'].max_side}), "
                "page coordinates")
    reads = [r for r in task_rows(task)
             if configs(task, row_of(r), scale, 0, sequences, eval_sequences)[0]
             .options.get("coord_source") == "task"]
    per = "images at most" if task.startswith("digits") else "sequences"
    return (f"{what}; {scale.n_layers} layers, d_model {scale.d_model}, {scale.n_heads} heads "
            f"of {scale.d_model // scale.n_heads}; "
            f"{steps:,} steps of batch {scale.batch_size} ({sequences:,} sequences), lr "
            f"{scale.lr:g}; {train.eval_sequences} {per} per set; the task's true "
            f"coordinates read by {', '.join(reads)}"
            + (overridden_note(sequences) if overridden else ""))


def table(name, scale="cpu", sequences=None, eval_sequences=None):
    """GridPE's table ``name`` (:data:`TABLE_NAMES`: "fig3", "dims", a task of :data:`TASKS`
    or one of :data:`CURVE_TABLES`) at
    ``scale``; ``sequences`` overrides the scale's training sequences (then it is not a
    reproduction, and the note says so), ``eval_sequences`` the sequences per evaluation
    set."""
    if name not in TABLE_NAMES:
        raise ValueError(f"GridPE has tables {', '.join(TABLE_NAMES)}, not {name!r}")
    if scale not in SCALES:
        raise ValueError(f"table {name} has scales {sorted(SCALES)}, not {scale!r}")
    at = SCALES[scale]
    if name == "fig3":
        run = fig3_run(at)
        note = (f"one head of {at.planes} planes ({at.planes // 3} scales of 3 directions, "
                f"ratio e^(1/2), omega_max pi) over [-{at.area}, {at.area}]^2; deterministic: "
                "one run whatever the seeds")
        return Table("gridpe", name, TITLES[name], scale, note, ("",), ("GridPE code",),
                     ("fig3",), tuple(f"r={r}" for r in radii(at.area)),
                     lambda part, row, seed: run, statistic="ci95", digits=3, plot=plot_fig3)
    if name == "dims":
        run = fig3_run(at)
        return Table("gridpe", name, TITLES[name], scale, "computed in fig3's run (its record)",
                     ("",), ("base 10000",), tuple(f"n={n}" for n in (1, 2, 3)),
                     ("optimal_ratio", "min_dim_real", "min_dim"),
                     lambda part, row, seed: run, statistic="ci95", digits=2)
    n = sequences or at.steps * at.batch_size
    task, curves = CURVE_TABLES.get(name, name), name in CURVE_TABLES
    note = task_note(task, at, n, eval_sequences, sequences is not None) + (
        f"; both sets evaluated every {curve_every(n, at)} steps "
        "(the curves)" if curves else "")

    def make_run(part, row, seed):
        return gridpe_run(task, row, at, seed, n, eval_sequences, curves)

    metrics = ("accuracy", "sequence_accuracy") if task in TASK_OPTIONS else \
        IMAGE_METRICS if task.startswith("digits") else ("accuracy",)
    return Table("gridpe", name, TITLES[name], scale, note, ("",), task_rows(task),
                 TASKS[task][2], metrics, make_run, statistic="ci95", digits=3,
                 default_rows=tuple(TASKS[task][1]), plot=plot_fig4 if curves else None)


IMAGE_METRICS = ("accuracy", "accuracy_top5", "loss")  # the paper's Acc@1, Acc@5, loss


def plot_fig4(table, store, seeds, path):
    """The paper's Fig. 4 on a digits table: dev accuracy and dev loss through training (the
    records' ``evals``, the final evaluation as the last point), the seeds' mean per row and
    their spread (min to max) shaded; records without evaluations through training (the old
    script's) are left out."""
    plt = pyplot()
    found = table.records(store, seeds)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for row in table.rows:
        curves = [[(e["step"], e["eval"]["dev"]) for e in r["evals"]]
                  + [(r["steps"], r["metrics"]["dev"])]
                  for (_, label, _), r in found.items() if label == row and r.get("evals")]
        if not curves:
            continue
        steps = [step for step, _ in curves[0]]
        for ax, metric in zip(axes, ("accuracy", "loss")):
            values = np.array([[e[metric] for _, e in c] for c in curves])
            line, = ax.plot(steps, values.mean(axis=0), label=f"{row} (n={len(curves)})")
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), alpha=0.15,
                            color=line.get_color())
    if not axes[0].lines:
        raise ValueError(f"no record of gridpe {table.name} at scale {table.scale} in "
                         f"{store.directory} has evaluations through training: run it first")
    axes[0].set(title=f"{table.name}: dev accuracy (Fig. 4)", xlabel="optimizer step",
                ylabel="accuracy")
    axes[1].set(title=f"{table.name}: dev loss", xlabel="optimizer step",
                ylabel="cross-entropy")
    finish(fig, axes, path)


# ---- the old script's records -------------------------------------------------------------
def legacy_records(directory, scale=None):
    """[(record, whether its run is today's spec run)] of the JSON files the old script
    (benchmarks/reproduce_gridpe.py) wrote to ``directory`` (``<task>-<row>-seed<k>.json``;
    analysis.json, fig3's, is not a run: fig3 is rerun on the layer). ``scale``: the
    directory's name by default. The run is the table spec's for (task, row, seed) at the
    record's training sequences when the recorded configs equal the spec's (read as the
    current library reads them, :func:`mapformer.reproduce.mapformer.recorded_configs`),
    else the recorded configs themselves (evaluated on the train config's own sets, as the
    script did); metrics: the record's evaluations whole."""
    directory = Path(directory)
    scale = scale or directory.name
    at = SCALES[scale]
    out = []
    for path in sorted(directory.glob("*-seed*.json")):
        old = json.loads(path.read_text())
        task, row, seed = old["task"], old["row"], old["seed"]
        run = None
        if task in TASKS and row in task_rows(task):
            default = at.steps * at.batch_size
            sequences = old["train"]["sequences"]
            spec = table(task, scale, sequences=None if sequences == default else sequences)
            run = spec.make_run("", row, seed)
        same = run is not None and recorded_configs(old) == (run.model, run.train)
        if not same:
            run = Run(model=old["model"], train=old["train"], evals=run.evals if run else {})
        out.append(({"id": run.id, "run": run.to_dict(), "metrics": old["eval"],
                     "wall_s": old["wall_s"], "final_train_loss": old["final_train_loss"],
                     "steps": old["steps"],
                     "provenance": unknown_provenance(path,
                                                      "benchmarks/reproduce_gridpe.py")},
                    same))
    return out
