"""TDB's Table 9 and Fig. 4 (left) (Dedieu et al. 2024, section 4.4, appendix K): in-context
accuracy on GINC prompts of n examples of k symbols (:mod:`mapformer.tasks.ginc`) of an LSTM,
a vanilla transformer, TDB(3, 4) and TDB(5, 1), trained on GINC's documents with one dummy
action after every symbol (the rooms' token layout; the paper says only "the same models"),
batch 24.

    python -m mapformer reproduce tdb 9 --scale cpu --seeds 1 --executor pool --workers 2

A cell of the table is the accuracy on one (k, n) prompt set, its label the argmax of the
true concept's next-symbol probability; a set whose prompts do not fit the training window
is not scored ('-'). The paper's header names TDB(3, 4) where its Fig. 4 and text discuss
TDB(1, 4); its row here is TDB(3, 4) with the paper's full-width codebooks.

Scales: ``paper``: 1000 documents of 10,240 symbols, windows of 1024 (Xie et al.'s),
width 256, 4 layers, K = 1000, 25,000 steps (a GPU's job); ``cpu``: 100 documents, windows
of 256 symbols (prompts up to k = 3, n = 32 ... k = 10, n = 16 fit), width 128, 2 layers,
K = 500, 10,000 steps; ``tiny``: a smoke test.
"""
import math
import time
from dataclasses import dataclass

from ..experiments.runs import CLOCK, Run, json_safe
from ..experiments.tables import Table
from ..models import ModelConfig
from ..tasks import ginc
from ..tdb import TDBConfig
from ..train import MODEL_KINDS, TrainConfig, model_kind, train

KIND = "mapformer.reproduce.tdb_ginc:execute"
TABLE_NAMES = ("9",)
METRIC = "test"
COLUMNS = tuple(f"k{k} n{n}" for k in ginc.PROMPT_LENGTHS for n in ginc.EXAMPLE_COUNTS)
ROWS = {"lstm": None, "transformer": None, "tdb_s3_m4_full": (3, 4, "full"),
        "tdb_s5_m1": (5, 1, "split")}

# the paper's Table 9: per row, per k, the accuracy at n = 0, 1, 2, 4, 8, 16, 32, 64
_PAPER_9 = {
    "lstm": {3: (.426, .369, .387, .394, .386, .390, .380, .377),
             5: (.692, .742, .754, .749, .761, .756, .767, .758),
             8: (.849, .869, .869, .877, .873, .875, .862, .883),
             10: (.878, .889, .878, .902, .881, .882, .889, .890)},
    "transformer": {3: (.502, .488, .538, .553, .595, .631, .633, .651),
                    5: (.805, .822, .831, .841, .847, .871, .871, .880),
                    8: (.881, .888, .886, .897, .897, .916, .909, .920),
                    10: (.888, .898, .901, .904, .906, .908, .918, .911)},
    "tdb_s3_m4_full": {3: (.426, .464, .554, .588, .618, .655, .670, .676),
                       5: (.777, .853, .857, .905, .901, .922, .926, .924),
                       8: (.895, .930, .930, .933, .935, .942, .948, .952),
                       10: (.915, .930, .938, .936, .947, .934, .946, .941)},
    "tdb_s5_m1": {3: (.284, .369, .443, .526, .549, .574, .618, .646),
                  5: (.656, .768, .802, .872, .882, .908, .915, .917),
                  8: (.816, .899, .917, .936, .940, .950, .956, .955),
                  10: (.858, .926, .935, .945, .956, .947, .960, .956)}}
PAPER = {row: tuple(by_k[k][i] for k in ginc.PROMPT_LENGTHS
                    for i in range(len(ginc.EXAMPLE_COUNTS)))
         for row, by_k in _PAPER_9.items()}


@dataclass(frozen=True)
class Scale:
    """The corpus (documents, their length, the training window), the models' width, heads,
    depth, TDB's codes and heads' hidden width, batch, steps, learning rate and the prompts
    per (k, n) set."""

    documents: int
    length: int
    window: int
    d_model: int
    n_heads: int
    n_layers: int
    codes: int
    head_hidden: int
    batch: int
    iterations: int
    lr: float
    prompts: int


SCALES = {"paper": Scale(1000, 10240, 1024, 256, 8, 4, 1000, 512, 24, 25000, 1e-3, 2500),
          "cpu": Scale(100, 10240, 256, 128, 4, 2, 500, 256, 24, 10000, 1e-3, 500),
          "tiny": Scale(4, 256, 32, 32, 2, 1, 16, 16, 4, 4, 1e-3, 8)}


def model_config(row, scale):
    """A TDBConfig (one dummy action) or the Transformer's / LSTM's ModelConfig."""
    vocab = ginc.GincConfig().n_symbols
    if ROWS[row] is not None:
        steps, m, width = ROWS[row]
        return TDBConfig(n_obs=vocab, n_actions=1, d_model=scale.d_model,
                         n_heads=scale.n_heads, n_layers=scale.n_layers, steps=steps,
                         codebooks=m, codes=scale.codes, head_hidden=scale.head_hidden,
                         codebook_width=width)
    mixer, positional = ("lstm", "none") if row == "lstm" else ("attention", "rope")
    return ModelConfig(vocab_size=vocab + 1, d_model=scale.d_model, n_heads=scale.n_heads,
                       n_layers=scale.n_layers, mlp_ratio=2, mixer=mixer,
                       positional=positional)


def ginc_run(row, scale, seed):
    """The Run of ``row`` at ``scale`` for ``seed`` (the model's and the batches'; the
    mixture is the paper's, seed 1111, for every run)."""
    every = max(1, scale.iterations // 10)
    train_config = TrainConfig(
        task="ginc", task_options=dict(documents=scale.documents, length=scale.length,
                                       window=scale.window),
        loss_positions="observations", sequences=scale.iterations * scale.batch,
        batch_size=scale.batch, lr=scale.lr, weight_decay=0.0, clip=1.0, schedule="constant",
        seed=seed, eval_sequences=scale.prompts, eval_batch_size=32, log_every=every)
    config = model_config(row, scale)
    return Run.of(config, train_config, kind=KIND, row=row,
                  model_kind=model_kind(config).name)


def execute(run):
    """Kind "mapformer.reproduce.tdb_ginc:execute": train run.model on GINC's documents and
    read each prompt set's accuracy: "metrics" {"k{k} n{n}": {"test": accuracy}} (NaN for a
    set that does not fit the window), "eval" (every set's evaluation), the log and wall_s."""
    t0 = time.perf_counter()
    kind = MODEL_KINDS[run.extra["model_kind"]]
    result = train(kind.config.from_dict(run.model), TrainConfig.from_dict(run.train),
                   progress=False, log=lambda *a: None)
    metrics = {}
    for column in COLUMNS:
        k, n = column.split()
        found = result["eval"].get(f"{k}_{n}")
        metrics[column] = {METRIC: found["accuracy"] if found else math.nan}
    return json_safe({"metrics": metrics, "eval": result["eval"],
                      "final_train_loss": result["loss"], "steps": result["steps"],
                      "sequences": result["sequences"],
                      "log": [{k: v for k, v in entry.items() if k not in CLOCK}
                              for entry in result["log"]],
                      "wall_s": time.perf_counter() - t0})


def table(name, scale="cpu", sequences=None, eval_sequences=None):
    """Table 9 at ``scale`` (:data:`SCALES`); ``sequences`` overrides the training sequences,
    ``eval_sequences`` the prompts per set."""
    if name not in TABLE_NAMES:
        raise ValueError(f"TDB's GINC tables are {', '.join(TABLE_NAMES)}, not {name!r}")
    if scale not in SCALES:
        raise ValueError(f"table 9 has scales {sorted(SCALES)}, not {scale!r}")
    at = SCALES[scale]
    changes = {}
    if sequences:
        changes["iterations"] = -(-sequences // at.batch)
    if eval_sequences:
        changes["prompts"] = eval_sequences
    at = Scale(**{**at.__dict__, **changes})
    note = (f"{at.documents} documents of {at.length} symbols from 5 of 10 HMMs (the paper's "
            f"mixture), windows of {at.window} symbols, {at.iterations} steps of batch "
            f"{at.batch}, width {at.d_model}, {at.n_layers} layers, {at.n_heads} heads, TDB's "
            f"K = {at.codes}; {at.prompts} prompts a set; nan: a set whose prompts exceed the "
            "window") + (f"; overridden: {', '.join(f'{k} {v}' for k, v in changes.items())}"
                         if changes else "")
    return Table("tdb", "9", "TDB Table 9: in-context accuracy on GINC by example length k "
                 "and examples n", scale, note, ("",), tuple(ROWS), COLUMNS, (METRIC,),
                 lambda part, row, seed: ginc_run(row, at, seed), {"": PAPER}, digits=3)
