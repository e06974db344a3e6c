"""TDB's Table 1 (Dedieu et al. 2024, 2D aliased rooms) as table specs: TestAccu, ImpFallback,
RatioSP and NormGED of a vanilla transformer, an LSTM, TDB(S, M) and TDB(1, enc, 1), several
seeds (a new room per seed). Beyond the paper, the row ``mapwm_angles``: a MapWM transformer
trained as the vanilla one, its map extracted from its path-integrated angles
(:func:`mapformer.cogmap.evaluate_angle_map`: k-means of the angles into as many places as
TDB has codes); and the table "1-torus": the same rows in the same rooms with their edges
joined (no walls, as the MapFormer paper's grids).

    python -m mapformer reproduce tdb 1 --scale cpu --seeds 3      # or paper, tiny
    python -m mapformer reproduce tdb 1 --rows tdb_s3_m1 --executor pool --workers 2
    python -m mapformer reproduce tdb 1-torus --rows mapwm_angles --seeds 2
    python -m mapformer reproduce tdb 1 --render-only --records results/records/tdb-legacy

Every model trains through :func:`mapformer.train.train` (TDB is its model kind "tdb") on the
task "rooms" (:class:`mapformer.tasks.rooms.RoomsTask`): the seed's room, a fixed pool of
training walks, step s's batch drawn from it by ``default_rng([seed, s])``, AdamW at a
constant learning rate, no weight decay, gradients clipped at 1, TDB's teacher following its
student by EMA after every step; the room's test walks are the evaluation set (TestAccu, the
next-observation accuracy over every test position with a next observation). A run's record
holds the room the seed used (its observation grid and patches), the seeds of the room, the
walks, the batches and the rollouts, the training log and the planning metrics. A run checkpoints (the library's checkpoint, every
tenth of its steps) into ``$MAPFORMER_RUNS/<run id>/`` (default ``runs/``,
:func:`mapformer.experiments.runs.run_directory`) and a rerun resumes from there (a trained
run is evaluated without retraining); ``python -m mapformer map runs/<run
id>/checkpoint.npz`` draws its map beside the room.

Scales (the paper: 15 x 20 room, O = 4, one 4 x 4 patch twice, walks of 400, 2048 training
walks, 25k steps of batch 32, width 256, 4 layers, 8 heads, K = 1000 codes):
- ``paper``: those settings (a GPU's job: about 1.6e16 flop a run);
- ``cpu``: the reduction keeping the paper's ratios: 10 x 15 room, 3 x 3 patch, walks of
  200, width 128, 2 layers, K = 500, 2048 training walks, batch 32, 3000 steps; dead codes
  restarted every 200 steps (without it small runs were seen to collapse onto a few codes);
  the transformer and the LSTM plan the first 16 test walks only (a problem costs about 15
  CPU seconds);
- ``small``: the room the paper's training ratios fit at a cpu's budget: a 6 x 8 room (48
  cells), walks of 100, K = 160 codes, 4000 steps (the paper's 83 steps and 3.3 codes per cell;
  ``cpu`` has 20 steps per cell), otherwise as ``cpu``;
- ``tiny``: a 6 x 8 room and walks of 60, for a smoke test (numbers mean nothing).

Beyond Table 1: table "3" (noise in the training walks, :func:`noise_table`) and the views
of Table 1's records in :mod:`mapformer.reproduce.tdb_training` (table "4", TrainingAbove98
from the training logs; "1-by-timestep", the paper's Figs. 9-11).

Deviations (all said in mapformer/tdb.py): RoPE in place of Transformer-XL positions; the M
codebooks of row ``tdb_s3_m4`` quantise d_model / M channels each (a product quantiser),
those of ``tdb_s3_m4_full`` the whole width each, as the paper's Sec. 3.5; the enc loss is averaged over positions (the
paper sums it). The transformer and the LSTM plan by appendix D's random rollouts with tail
evaluation (``rollouts`` a problem, 100 as the paper; mapformer/rollouts.py), by incremental
decoding (the transformer's KV cache, the LSTM's state: ``Transformer.decode``), and the tail
holds C - 1 observations (the walk ends at x_{N-1}, counting from 0). Measured by
``benchmarks/rollout_decoding.py`` (one thread, untrained models, 10 rollouts of one
cpu-scale problem, a loaded machine): the rollouts 0.14 s transformer, 0.09 s LSTM CPU time
(38x and 83x less than recomputing every prefix), the whole planner with the tail evaluation
of every rollout at every length (an untrained model's worst case) 1.9 s and 1.4 s (5.6x and
10x less); ``plan_problems`` K plans the first K test walks only (:func:`table`'s options).

``results/records/tdb-legacy`` holds the records of the harness this replaced
(benchmarks/reproduce_tdb_table1.py, its own training loop), converted by
:func:`convert_legacy` (``python -m mapformer.reproduce.tdb FILE.json ... --records DIR``):
the same configs as today's spec runs, but another training stream (that loop drew every
batch from one generator, ``default_rng([seed, 3])``, where the library's loop draws step
s's from ``default_rng([seed, s])``), so a rerun on today's loop gives other numbers.
"""
import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .. import cogmap, rollouts as rollout_planner
from ..experiments.records import RecordStore, unknown_provenance
from ..experiments.runs import CLOCK, Run, json_safe, run_directory
from ..experiments.tables import Table
from ..models import ModelConfig
from ..tasks import rooms
from ..tdb import TDBConfig
from ..train import MODEL_KINDS, TrainConfig, model_kind, train
from . import tdb_ginc, tdb_training

KIND = "mapformer.reproduce.tdb:execute"
ORACLE_KIND = "mapformer.reproduce.tdb:execute_oracle"
COLUMNS = ("TestAccu", "ImpFallback", "RatioSP", "NormGED")
METRIC = "test"  # each column's value is read at record["metrics"][column]["test"]

# the paper's Table 1: TestAccu, ImpFallback, RatioSP, NormGED (None: not reported)
PAPER = {"transformer": (99.00, 29.53, 16.82, None), "lstm": (98.85, 31.97, 16.81, None),
         "tdb_s1_m1": (98.94, 6.61, 1.00, 0.532), "tdb_s1_enc_m1": (98.74, 99.20, 1.00, 0.118),
         "tdb_s3_m1": (99.06, 99.55, 1.00, 0.124), "tdb_s3_m4": (99.00, 96.59, 1.00, 0.186)}
PAPER["tdb_s3_m4_full"] = PAPER["tdb_s3_m4"]  # the paper's TDB(3, 4) is this reading
# the paper's Table 3: per noise level, (TestAccu, ImpFallback) as (mean, spread)
PAPER_3 = {"0.10": {"transformer": ((98.88, 0.04), (29.50, 1.42)),
                    "tdb_s3_m1": ((99.08, 0.01), (99.49, 0.20))},
           "0.15": {"transformer": ((98.45, 0.05), (22.66, 1.27)),
                    "tdb_s3_m1": ((98.85, 0.03), (98.84, 0.37))},
           "0.20": {"transformer": ((97.58, 0.10), (19.87, 0.65)),
                    "tdb_s3_m1": ((98.30, 0.06), (94.18, 1.37))},
           "0.25": {"transformer": ((95.98, 0.16), (15.83, 1.08)),
                    "tdb_s3_m1": ((96.98, 0.13), (83.70, 3.21))},
           "0.30": {"transformer": ((91.92, 0.33), (8.11, 1.02)),
                    "tdb_s3_m1": ((93.92, 0.33), (58.20, 2.80))}}
NOISE_WALKS = 8192  # Table 3's training pool: the paper's "8092" walks, 4 x Table 1's
# the paper's Table 7 (10 aliased cubes of edge 6, O = 12)
PAPER_7 = {"transformer": (99.76, 43.82, 22.74, None), "lstm": (99.76, 43.82, 22.74, None),
           "tdb_s1_enc_m1": (99.36, 99.07, 1.02, 0.334), "tdb_s3_m1": (99.76, 99.05, 1.03, 0.304)}
CUBE_ROWS = ("transformer", "lstm", "tdb_s1_enc_m1", "tdb_s3_m1")
# Table 7's cube per scale: (edge E, O, codes K, steps). paper: the paper's cube (216 cells);
# small: edge 3 (54 cells) with the paper's 18 cells per symbol (O = 3), its 3.3 codes and 83
# steps per cell, otherwise as scale small
CUBES = {"paper": (6, 12, 1000, 25000), "small": (3, 3, 180, 4500)}


@dataclass(frozen=True)
class Scale:
    """What one scale trains and plans: the room (its seed replaced by the run's), the
    models' width, heads, depth, TDB's codes and heads' hidden width, the training pool and
    test walks, batch, steps, learning rate, the context C (plans go from position C to
    N - C), TDB's dead-code restarts, and the rollout planner's problems (0: every test walk)
    and rollouts a problem."""

    room: rooms.RoomsConfig
    d_model: int
    n_heads: int
    n_layers: int
    codes: int
    head_hidden: int
    train_walks: int
    test_walks: int
    batch: int
    iterations: int
    lr: float
    context: int
    restart_dead: int = 0
    plan_problems: int = 0
    rollouts: int = 100


SCALES = {
    "paper": Scale(rooms.RoomsConfig(15, 20, 4, 4, 400), 256, 8, 4, 1000, 512, 2048, 2048, 32,
                   25000, 1e-3, 50),
    "cpu": Scale(rooms.RoomsConfig(10, 15, 4, 3, 200), 128, 4, 2, 500, 256, 2048, 256, 32,
                 3000, 1e-3, 25, restart_dead=200, plan_problems=16),
    "small": Scale(rooms.RoomsConfig(6, 8, 4, 3, 100), 128, 4, 2, 160, 256, 2048, 256, 32,
                   4000, 1e-3, 12, restart_dead=200, plan_problems=16),
    "tiny": Scale(rooms.RoomsConfig(6, 8, 4, 3, 60), 32, 2, 1, 64, 32, 64, 16, 8, 20, 1e-3, 8),
}
SCALE_NOTES = {
    "paper": "15 x 20 room, 4 x 4 patch twice, walks of 400, 2048 training walks, 25,000 "
             "steps of batch 32, width 256, 4 layers, 8 heads, K = 1000 codes; every test "
             "walk planned",
    "cpu": "10 x 15 room, 3 x 3 patch twice, walks of 200, 2048 training walks, 3000 steps of "
           "batch 32, width 128, 2 layers, 4 heads, K = 500 codes, dead codes restarted every "
           "200 steps; ImpFallback and RatioSP over the 256 test walks' problems (transformer "
           "and LSTM: rollouts on the first 16)",
    "small": "6 x 8 room (48 cells), 3 x 3 patch twice, walks of 100, 2048 training walks, "
             "4000 steps of batch 32, width 128, 2 layers, 4 heads, K = 160 codes, dead codes "
             "restarted every 200 steps: the paper's steps per cell (83) and codes per cell "
             "(3.3); ImpFallback and RatioSP over the 256 test walks' problems (transformer "
             "and LSTM: rollouts on the first 16)",
    "tiny": "6 x 8 room, walks of 60, 20 steps: a smoke test, the numbers mean nothing",
}

# TDB rows: (S, M, enc, codebook_width). TDB(3, 4) in two readings: "tdb_s3_m4" cuts the
# output into 4 slices of d_model / 4, one per codebook (a product quantiser: the code keeps
# d_model); "tdb_s3_m4_full" gives every codebook the whole output and concatenates the 4
# codes (the paper's Sec. 3.5)
ROWS = {"transformer": None, "lstm": None, "tdb_s1_m1": (1, 1, False, "split"),
        "tdb_s1_enc_m1": (1, 1, True, "split"), "tdb_s3_m1": (3, 1, False, "split"),
        "tdb_s3_m4": (3, 4, False, "split"), "tdb_s3_m4_full": (3, 4, False, "full"),
        "mapwm_angles": None, "tdb_s1_m4_full": (1, 4, False, "full"),
        "tdb_s1_enc_m4_full": (1, 4, True, "full")}
TABLE1_ROWS = tuple(ROWS)[:8]  # Table 1's (and 1-torus'); the last two are Table 8's
# the paper's Table 8 (O = 12 in the 15 x 20 room); its M = 4 rows are the "full" reading
PAPER_8 = {"transformer": (99.75, 29.89, 17.45, None), "lstm": (99.75, 29.89, 17.45, None),
           "tdb_s1_m1": (89.46, 17.31, 1.00, 0.265), "tdb_s1_m4_full": (99.75, 59.37, 1.00, 0.033),
           "tdb_s1_enc_m1": (92.57, 58.21, 1.00, 0.145),
           "tdb_s1_enc_m4_full": (99.71, 96.58, 1.01, 0.157),
           "tdb_s3_m1": (99.33, 97.09, 1.00, 0.157), "tdb_s3_m4_full": (99.73, 99.75, 1.01, 0.160)}
TABLE_NAMES = ("1", "1-torus", "1-rollout-oracle", "3", "7", "8", *tdb_training.TABLE_NAMES,
               *tdb_ginc.TABLE_NAMES)
TOPOLOGIES = {"1": "room", "1-torus": "torus"}
# the rooms of table "1-rollout-oracle": the scales whose rooms (and walks) it plans in
ORACLE_ROWS = ("small", "cpu", "paper")
ORACLE_COLUMNS = ("ImpFallback", "RatioSP")


def model_config(row, scale):
    """The model config of ``row`` at ``scale``: a TDBConfig, or a Transformer's ModelConfig
    (RoPE; the LSTM without positions; MapWM with omega spanning the room's longer side, as
    omega_grid does a torus's)."""
    n_obs = scale.room.n_obs
    if ROWS[row] is not None:
        steps, m, enc, width = ROWS[row]
        return TDBConfig(n_obs=n_obs, d_model=scale.d_model, n_heads=scale.n_heads,
                         n_layers=scale.n_layers, steps=steps, codebooks=m, codes=scale.codes,
                         head_hidden=scale.head_hidden, restart_dead=scale.restart_dead,
                         enc=enc, codebook_width=width)
    if row == "mapwm_angles":
        return ModelConfig.preset(
            "mapwm", n_obs + rooms.N_ACTIONS, d_model=scale.d_model, n_heads=scale.n_heads,
            n_layers=scale.n_layers, mlp_ratio=2,
            omega_grid=float(max(scale.room.height, scale.room.width)))
    mixer, positional = ("lstm", "none") if row == "lstm" else ("attention", "rope")
    return ModelConfig(vocab_size=n_obs + rooms.N_ACTIONS, d_model=scale.d_model,
                       n_heads=scale.n_heads, n_layers=scale.n_layers, mlp_ratio=2,
                       mixer=mixer, positional=positional)


def build_model(row, scale, seed=0, backend="c"):
    """An untrained model of ``row`` at ``scale`` (benchmarks/rollout_decoding.py's)."""
    config = model_config(row, scale)
    return model_kind(config).build(config, seed=seed, backend=backend)


def train_config(scale, seed, topology="room", noise=0.0):
    """The TrainConfig of a run at ``scale``: the rooms task in the seed's room (``noise``:
    the share of the training pool's observations replaced at random, Table 3's)."""
    r = scale.room
    every = max(1, scale.iterations // 10)
    return TrainConfig(
        task="rooms", steps=r.steps, task_options=dict(
            height=r.height, width=r.width, n_obs=r.n_obs, patch=r.patch, topology=topology,
            walks=scale.train_walks, context=scale.context, **({"noise": noise} if noise
                                                              else {})),
        sequences=scale.iterations * scale.batch, batch_size=scale.batch,
        loss_positions="observations", lr=scale.lr, weight_decay=0.0, clip=1.0,
        schedule="constant", seed=seed, eval_sequences=scale.test_walks,
        eval_batch_size=scale.batch, log_every=every, checkpoint_every=every)


def planner(row):
    """How ``row``'s planning metrics are measured: 'codes' (TDB's map), 'angles' (MapWM's
    angle map) or 'rollouts' (random rollouts, appendix D)."""
    return "codes" if ROWS[row] is not None else (
        "angles" if row == "mapwm_angles" else "rollouts")


def tdb_run(row, scale, seed, topology="room", noise=0.0):
    """The Run of ``row`` at ``scale`` (a :class:`Scale`) for ``seed`` in a ``topology``
    room, ``noise`` in its training pool."""
    config = model_config(row, scale)
    extra = {"row": row, "model_kind": model_kind(config).name, "planner": planner(row)}
    if extra["planner"] == "rollouts":
        extra.update(rollouts=scale.rollouts, plan_problems=scale.plan_problems)
    elif extra["planner"] == "angles":
        extra["angle_places"] = scale.codes  # as many places as TDB has codes
    return Run.of(config, train_config(scale, seed, topology, noise), kind=KIND, **extra)


def room_record(task):
    """The room a run's task generated: its config (with the seed), the observation grid
    (a list of rows) and the aliased patches' corners."""
    room = rooms.make_room(task.room)
    return {"config": asdict(task.room), "obs": room.obs.tolist(),
            "patches": None if room.patches is None else [list(p) for p in room.patches]}


def seeds_record(task, run):
    """The seeds of what a run drew (NumPy Generators)."""
    seed = task.room.seed
    out = {"room": f"mapformer.tasks.rooms.make_room: default_rng([{seed}, 0x600D])",
           "training_walks": [seed, 1], "test_walks": [seed, 2],
           "batches": f"step s: default_rng([{seed}, s])", "model": seed}
    if run.extra["planner"] in ("rollouts", "oracle"):
        out["rollouts"] = f"problem w: default_rng([[{seed}, 4], w])"
    return out


def plan(run, model, task, test_walks):
    """The planning metrics of a trained ``model`` (see :func:`planner`)."""
    meta, context = task.map_meta(test_walks), task.planning_context
    how = run.extra["planner"]
    if how == "codes":
        return cogmap.evaluate_map(model, meta, context, by_timestep=True)[2]
    config, room, train_walks, tests = cogmap.walks_of(meta)
    if how == "angles":
        places = run.extra["angle_places"]
        metrics = cogmap.evaluate_angle_map(model, config, room, train_walks, tests, context,
                                            places)[1]
        return {**metrics, "angle_places": places}
    k = run.extra["plan_problems"] or len(tests.obs)
    problems = rooms.Walks(tests.obs[:k], tests.actions[:k], tests.pos[:k])
    return rollout_planner.evaluate_rollouts(
        rollout_planner.greedy_decoder(model, config.n_obs), problems, room, config.n_obs,
        context, run.extra["rollouts"], seed=[task.room.seed, 4])


def execute(run):
    """Kind "mapformer.reproduce.tdb:execute": train run.model (its kind
    run.extra["model_kind"]) on run.train's rooms task with :func:`mapformer.train.train`
    (checkpointed and resumed in :func:`mapformer.experiments.runs.run_directory`), then
    TestAccu (100 x the accuracy on the test walks) and the planning metrics. Returns the
    record's result: "metrics" {column: {"test": value}} (NaN where the row has none: the
    map-free rows' NormGED), "evaluation" (every planning number), "eval" (train's
    evaluation), "room" (:func:`room_record`), "seeds", the final loss, steps, sequences, the
    training log (no clock readings) and wall_s."""
    t0 = time.perf_counter()
    kind = MODEL_KINDS[run.extra["model_kind"]]
    config, train_cfg = kind.config.from_dict(run.model), TrainConfig.from_dict(run.train)
    task = train_cfg.task_config()
    out_dir = run_directory(run)
    resume = None
    if (out_dir / "checkpoint.npz").is_file():
        resume = out_dir / "checkpoint.npz"
    result = train(config, train_cfg, out_dir=out_dir, resume=resume, progress=False,
                   log=lambda *a: None)
    evaluation = {"TestAccu": 100.0 * result["eval"]["iid"]["accuracy"],
                  **plan(run, result["model"], task, train_cfg.eval_sequences)}
    return json_safe({
        "metrics": {c: {METRIC: evaluation.get(c, math.nan)} for c in COLUMNS},
        "evaluation": evaluation, "eval": result["eval"], "room": room_record(task),
        "seeds": seeds_record(task, run), "final_train_loss": result["loss"],
        "steps": result["steps"], "sequences": result["sequences"],
        "log": [{k: v for k, v in entry.items() if k not in CLOCK}
                for entry in result["log"]],
        "wall_s": time.perf_counter() - t0})


def oracle_run(row, seed, rollouts=100, test_walks=None):
    """The Run of table "1-rollout-oracle"'s row (a scale of :data:`SCALES`) for ``seed``:
    the scale's room and test walks, planned by ``rollouts`` random rollouts judged by the room
    itself (:func:`mapformer.rollouts.room_oracle`), no model trained (the run names the
    scale's LSTM only as the model whose rollouts these bound)."""
    at = SCALES[row]
    if test_walks is not None:
        at = replace(at, test_walks=test_walks)
    return Run.of(model_config("lstm", at), train_config(at, seed), kind=ORACLE_KIND,
                  row=row, planner="oracle", rollouts=rollouts)


def execute_oracle(run):
    """Kind "mapformer.reproduce.tdb:execute_oracle": ImpFallback and RatioSP of random
    rollouts with the room's own predictions (:func:`mapformer.rollouts.evaluate_rollouts`
    with "oracle") on every test walk of run.train's room (problem w's rollouts drawn from
    [[seed, 4], w], as the trained rows'): what the map-free rows could plan at best."""
    t0 = time.perf_counter()
    train_cfg = TrainConfig.from_dict(run.train)
    task = train_cfg.task_config()
    room, walks = rooms.make_room(task.room), rooms.evaluation_walks(
        task, train_cfg.eval_sequences)
    evaluation = rollout_planner.evaluate_rollouts(
        "oracle", walks, room, task.room.n_symbols, task.planning_context,
        run.extra["rollouts"], seed=[task.room.seed, 4])
    return json_safe({"metrics": {c: {METRIC: evaluation.get(c, math.nan)}
                                  for c in ORACLE_COLUMNS},
                      "evaluation": evaluation, "room": room_record(task),
                      "seeds": seeds_record(task, run), "wall_s": time.perf_counter() - t0})


def oracle_table(eval_sequences=None, rollouts=None):
    """Table "1-rollout-oracle": beyond the paper, the rollout planner's best in each scale's
    room (:func:`oracle_run`): how often 100 random rollouts find a path shorter than the
    fallback when every prediction is right, room by room."""
    count = rollouts or 100
    note = (f"{count} random rollouts a problem judged by the room itself (no model: every "
            "prediction right), in the rooms and test walks of the scales small (6 x 8, walks "
            "of 100), cpu (10 x 15, 200) and paper (15 x 20, 400); a seed is a room; "
            "ImpFallback and RatioSP over each room's test walks' problems")
    return Table("tdb", "1-rollout-oracle", "The rollout planner's best by room size: random "
                 "rollouts with the room's own predictions (beyond the paper)",
                 "the rooms of small, cpu and paper", note,
                 ("",), ORACLE_ROWS, ORACLE_COLUMNS, (METRIC,),
                 lambda part, row, seed: oracle_run(row, seed, count, eval_sequences), {})


def overridden(scale, sequences=None, eval_sequences=None, rollouts=None, plan_problems=None):
    """(the :class:`Scale` ``scale`` with the options given, {option: value} of those given):
    ``sequences`` rounded up to whole batches."""
    at = SCALES[scale]
    changes = {k: v for k, v in (("test_walks", eval_sequences), ("rollouts", rollouts),
                                 ("plan_problems", plan_problems)) if v is not None}
    if sequences:
        changes["iterations"] = -(-sequences // at.batch)
    return replace(at, **changes), changes


def table(name, scale="cpu", sequences=None, eval_sequences=None, rollouts=None,
          plan_problems=None):
    """TDB table ``name`` at ``scale`` (a key of :data:`SCALES`): "1", "1-torus" (the same
    rooms with their edges joined), "3" (noise in the training pool), "7" (the cube), a view
    of Table 1's runs (:mod:`mapformer.reproduce.tdb_training`: "4", "1-by-timestep") or
    GINC's "9" (:mod:`mapformer.reproduce.tdb_ginc`, its own scales); ``sequences``
    overrides the training sequences
    (rounded up to whole batches; then it is not a reproduction, and the note says so),
    ``eval_sequences`` the test walks, ``rollouts`` and ``plan_problems`` the rollout
    planner's (the transformer's and LSTM's rows)."""
    if name not in TABLE_NAMES:
        raise ValueError(f"TDB has tables {', '.join(TABLE_NAMES)}, not {name!r}")
    if name in tdb_ginc.TABLE_NAMES:
        if rollouts or plan_problems:
            raise ValueError(f"table {name} plans nothing: it takes no rollouts or "
                             "plan_problems")
        return tdb_ginc.table(name, scale, sequences, eval_sequences)
    if name == "1-rollout-oracle":
        if scale != "cpu" or sequences or plan_problems:
            raise ValueError("table 1-rollout-oracle plans in the rooms of every scale and "
                             "trains nothing: it takes no scale, sequences or plan_problems")
        return oracle_table(eval_sequences, rollouts)
    if scale not in SCALES:
        raise ValueError(f"table {name} has scales {sorted(SCALES)}, not {scale!r}")
    if name in tdb_training.TABLE_NAMES:
        room = SCALES[scale].room
        return tdb_training.view(name, table("1", scale, sequences, eval_sequences, rollouts,
                                             plan_problems), room.height * room.width)
    if name == "3":
        return noise_table(scale, sequences, eval_sequences, rollouts, plan_problems)
    if name == "7":
        return cube_table(scale, sequences, eval_sequences, rollouts, plan_problems)
    if name == "8":
        return symbols_table(scale, sequences, eval_sequences, rollouts, plan_problems)
    at, changes = overridden(scale, sequences, eval_sequences, rollouts, plan_problems)
    topology = TOPOLOGIES[name]
    note = SCALE_NOTES.get(scale, scale) + ("; nan: a number the row has not (the rollout "
                                            "rows' NormGED: no map; RatioSP without a plan "
                                            "that reached its goal)") + (
        f"; overridden: {', '.join(f'{k} {v}' for k, v in changes.items())}" if changes
        else "")

    def make_run(part, row, seed):
        return tdb_run(row, at, seed, topology)

    title = ("TDB Table 1: next-observation accuracy and planning in 2D aliased rooms"
             if name == "1" else "TDB Table 1's rooms with their edges joined (a torus; "
             "beyond the paper)")
    return Table("tdb", name, title, scale, note, ("",), TABLE1_ROWS, COLUMNS, (METRIC,),
                 make_run, {"": PAPER} if name == "1" else {})


def noise_table(scale, sequences=None, eval_sequences=None, rollouts=None, plan_problems=None):
    """Table 3: the transformer and TDB(3, 1) trained on a pool of :data:`NOISE_WALKS` walks
    whose observations are replaced at random with probability p (a part per p of the
    paper's), tested on clean walks; otherwise Table 1 at ``scale`` (and its options)."""
    base = table("1", scale, sequences, eval_sequences, rollouts, plan_problems)
    at = replace(overridden(scale, sequences, eval_sequences, rollouts, plan_problems)[0],
                 train_walks=NOISE_WALKS)

    def make_run(part, row, seed):
        return tdb_run(row, at, seed, noise=float(part))

    return replace(base, name="3", title="TDB Table 3: observation noise in the training walks",
                   note=base.note + f"; {NOISE_WALKS} training walks, each observation "
                   "replaced with probability p (the part) by a uniform draw of the O symbols "
                   "(possibly itself), the test walks clean",
                   parts=tuple(PAPER_3), rows=("transformer", "tdb_s3_m1"),
                   columns=("TestAccu", "ImpFallback"), make_run=make_run, reference=PAPER_3,
                   default_rows=None)


def symbols_table(scale, sequences=None, eval_sequences=None, rollouts=None,
                  plan_problems=None):
    """Table 8: Table 1's room at ``scale`` with O = 12 observation symbols (the paper's O; at
    scale small 4 cells a symbol where the paper's room has 25), its rows and TDB(1, 4) and
    TDB(1, enc, 4), the M = 4 rows with the paper's full-width codebooks."""
    base = table("1", scale, sequences, eval_sequences, rollouts, plan_problems)
    at = overridden(scale, sequences, eval_sequences, rollouts, plan_problems)[0]
    at = replace(at, room=replace(at.room, n_obs=12))

    def make_run(part, row, seed):
        return tdb_run(row, at, seed)

    return replace(base, name="8", title="TDB Table 8: 12 observation symbols",
                   note="O = 12 observation symbols (Table 1: 4); " + base.note,
                   rows=tuple(PAPER_8),
                   make_run=make_run, reference={"": PAPER_8})


def cube_table(scale, sequences=None, eval_sequences=None, rollouts=None, plan_problems=None):
    """Table 7: the aliased cube (:func:`mapformer.tasks.rooms.make_room`, topology "cube":
    a walk on the faces' cells of an E x E x E cube, every cell's symbol drawn from O, no
    patch), at the scales of :data:`CUBES`; otherwise Table 1 at ``scale``."""
    if scale not in CUBES:
        raise ValueError(f"table 7 has scales {sorted(CUBES)}, not {scale!r}")
    edge, n_obs, codes, steps = CUBES[scale]
    at = overridden(scale, sequences, eval_sequences, rollouts, plan_problems)[0]
    at = replace(at, room=replace(at.room, height=edge, width=edge, n_obs=n_obs, patch=0),
                 codes=codes, iterations=steps if not sequences else at.iterations)
    base = table("1", scale, sequences, eval_sequences, rollouts, plan_problems)

    def make_run(part, row, seed):
        return tdb_run(row, at, seed, "cube")

    return replace(base, name="7", title="TDB Table 7: the aliased cube",
                   note=f"cube of edge {edge} ({6 * edge * edge} cells, "
                   f"{6 * edge * edge // n_obs} a symbol), O = {n_obs}, walks of "
                   f"{at.room.steps}, {at.train_walks} training walks, {at.iterations} steps "
                   f"of batch {at.batch}, width {at.d_model}, {at.n_layers} layers, "
                   f"{at.n_heads} heads, K = {codes} codes ("
                   f"{codes / (6 * edge * edge):.1f} and {at.iterations / (6 * edge * edge):.0f} "
                   "steps a cell), " + (f"dead codes restarted every {at.restart_dead} "
                                         "steps" if at.restart_dead else "no restarts")
                   + f"; ImpFallback and RatioSP over the {at.test_walks} test walks' "
                   "problems" + (f" (transformer and LSTM: rollouts on the first "
                                 f"{at.plan_problems})" if at.plan_problems else ""),
                   rows=CUBE_ROWS, make_run=make_run, reference={"": PAPER_7})


# ---- the harness this replaced: its records converted ------------------------------------
def legacy_scale(old):
    """The :class:`Scale` a benchmarks/reproduce_tdb_table1.py record ``old`` ran at: its
    "scale" (the room as a template, seed 0) with the options it took on the command line
    (--restart-dead; --plan-problems, read from the problems its rollout rows planned;
    --rollouts)."""
    s = dict(old["scale"])
    room = rooms.RoomsConfig(**{**s.pop("room"), "seed": 0, "topology": "room"})
    scale = Scale(room=room, **s, restart_dead=old.get("restart_dead", 0))
    if planner(old["row"]) == "rollouts":
        problems = old["problems"]
        scale = replace(scale, rollouts=old["rollouts"],
                        plan_problems=0 if problems >= scale.test_walks else problems)
    return scale


def convert_legacy(path):
    """(record, whether its run is today's spec run) of one file written by
    benchmarks/reproduce_tdb_table1.py (``<row>_seed<k>.json``; a folder whose name ends in
    ``_torus`` held the torus runs, which the file itself does not say). The run is the one
    the table spec makes for the row and seed at the scale whose settings the file records
    (else, at none: the run of the recorded settings). Its provenance says it is unknown and
    comes from the old loop; the room is regenerated from the seed by today's generator (the
    file held only the room's template, seed 0)."""
    path = Path(path)
    old = json.loads(path.read_text())
    topology = "torus" if path.parent.name.endswith("_torus") else "room"
    scale = legacy_scale(old)
    row, seed = old["row"], old["seed"]
    run = tdb_run(row, scale, seed, topology)
    name = next(k for k, v in TOPOLOGIES.items() if v == topology)
    same = any(table(name, s).make_run("", row, seed).id == run.id for s in SCALES)
    if planner(row) == "angles" and old.get("angle_places") != scale.codes:
        raise ValueError(f"{path}: angle_places {old.get('angle_places')} is not the scale's "
                         f"codes ({scale.codes}), which the spec's runs use")
    task = TrainConfig.from_dict(run.train).task_config()
    seeds = {**seeds_record(task, run),
             "batches": f"the old loop: one generator default_rng([{seed}, 3]) for every step"}
    evaluation = {k: v for k, v in old.items()
                  if k not in ("row", "seed", "scale", "train_s", "plan_s", "restart_dead")}
    record = {
        "id": run.id, "run": run.to_dict(),
        "metrics": {c: {METRIC: old.get(c, math.nan)} for c in COLUMNS},
        "evaluation": evaluation, "room": room_record(task), "seeds": seeds,
        "wall_s": old["train_s"] + old.get("plan_s", 0.0),
        "provenance": unknown_provenance(
            path, "benchmarks/reproduce_tdb_table1.py",
            "it trained in a loop of its own: the same configs as this run's, but its batches "
            "came from one generator default_rng([seed, 3]) over the whole run "
            "(mapformer.train draws step s's from default_rng([seed, s])), so this run on "
            "today's loop is another training stream and gives other numbers; wall_s is its "
            "training (and rollout planning) time; the room and seeds are regenerated from "
            "the seed by today's mapformer.tasks.rooms (the file held the room's template, "
            "seed 0)",
            loop="benchmarks/reproduce_tdb_table1.py (the old loop, not mapformer.train)")}
    return json_safe(record), same


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="convert benchmarks/reproduce_tdb_table1.py's records (<row>_seed<k>.json; "
                    "a folder ending in _torus: the torus runs) to experiment records")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--records", default="results/records/tdb-legacy")
    args = parser.parse_args(argv)
    store = RecordStore(args.records)
    matching = 0
    for path in args.files:
        record, same = convert_legacy(path)
        store.put(record)
        matching += same
    print(f"{len(args.files)} records in {store.directory}, {matching} of today's spec runs, "
          f"{len(args.files) - matching} of settings the specs no longer make")


if __name__ == "__main__":
    main()
