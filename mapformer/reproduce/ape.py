"""APE's table (a), synthetic rows, and table (b), tree transduction (Kogkalidis et al.,
NeurIPS 2024, section 4, appendix 9), and a causal-against-prefix-LM comparison, as table
specs (:func:`table`): tasks x positional schemes over seeds, test perplexity beside the
paper's.

    python -m mapformer reproduce ape a --scale cpu --seeds 3              # table (a)
    python -m mapformer reproduce ape a --seeds 3 --rows rope,ape_seq
    python -m mapformer reproduce ape b --scale cpu --seeds 3              # table (b)
    python -m mapformer reproduce ape b --rows ape_tree,rope_tuned --executor pool --workers 2
    python -m mapformer reproduce ape masks --scale tiny --seeds 1         # causal vs prefix
    python -m mapformer reproduce ape a --render-only --records results/records/ape-legacy

Tables: "a": parts copy, repeat, reverse; columns ``iid`` (the test split) and ``ood_long``;
"b": parts "task order" (``tree_copy breadth`` ... ``tree_ops depth``, 8 of them); columns
``iid`` and ``dev``; "masks": rope and ape_seq causal against the same as prefix LMs, at the
``tiny`` scale (800 steps, one seed: the first table of docs/reproduction/ape.md's masks) or
at ``cpu`` (table (a)'s runs, the same records). Metrics: ``perplexity`` on the target tokens (the
paper's; its figure beside it, mean ± 95% CI over its 3 runs) and ``sequence_accuracy``
(exact match: every target token right, teacher-forced); cells are mean ± 95% t interval
over seeds. Every run is evaluated on all of its task's sets (``iid``, ``dev``, and
``ood_long`` for the sequence tasks), whichever the table shows.

Rows (``--rows`` chooses which run; a row without records renders '-'): table (a)
``sinusoidal``, ``learned_abs`` (the paper's "Absolute"), ``rope`` ("RoPE frozen"),
``rope_tuned`` (``rope_trainable``, "RoPE tuned"), ``ape_seq`` ("APE w/ init": RoPE's
rotations at the start), ``ape_seq_no_init`` ("APE w/o init"), ``ape_seq_decay``,
``ape_seq_no_init_decay``, ``none``,
and the prefix-LM rows ``rope_prefix``, ``ape_seq_prefix``, ``none_prefix`` (each printed
beside its causal row's paper figure, as the paper has no prefix LM); table (b) the same
sequential rows but the prefix ones (every row there is a prefix LM already) and
``ape_tree`` ("APE tree"), ``ape_tree_no_init`` ("APE tree w/o init"), ``ape_tree_decay``,
``ape_tree_no_init_decay``.
Every row runs the attention mixer. The paper's decay of the logits (0.98^distance, its public
code's) is not applied by the plain rows: ``ape_seq_decay`` (0.98^|i - j|; under the tree
tasks' prefix LM through the attention's per-pair factor) and ``ape_tree_decay``
(0.98^(tree distance)) add it (``ape_decay``), and the ``*_no_init_decay`` rows add it to the
no-init ones: the paper applies it to every APE run (section 4: "When using APE, we [...]
scale the dot-product score"), so its "w/ init" and "w/o init" columns are these rows.
Records go to ``results/records/ape/`` (one per run id), and a rerun executes only the runs
without one (so an interrupted table resumes).

Formulation (:mod:`mapformer.tasks.transduction`): one causal decoder over ``source SEP
target``, loss and metrics on the target tokens, where the paper trains an encoder-decoder
(bidirectional encoder, cross-attention) with teacher forcing. The ``*_prefix`` rows run the
same decoder as a prefix LM (``attn_mask=prefix``: source and separator read
bidirectionally, the target causally), the nearest the library comes to the paper's
bidirectional encoder without cross-attention. ``ood_long``: sources twice as long as in
training (length generalisation, not in the paper).

Scales of table (a) (and "masks"):
- ``paper``: the paper's data (mean source length 100, spread 10, 20 symbols, 6000 training
  sequences, data seed 42) and training (AdamW, weight decay 0.01, batch 64, 400 epochs =
  37,500 steps, lr 5e-4 after 5 epochs of linear warmup, cosine decay; dropout 0.1) on a
  decoder of 4 layers (the paper's 2 encoder + 2 decoder layers), d_model 512, 8 heads,
  feed-forward 4x (the public code's 2048); test sets of 2000 sequences. Days on this CPU.
- ``cpu``: mean source length 32 (spread 3.2), the same 6000 training sequences and data
  seed; 2 layers, d_model 64, 2 heads of 32, batch 32, 4000 steps (128,000 sequences, 21
  epochs), lr 1e-3 with 50 warmup steps (the paper's 5/400), cosine, no dropout; 2000
  sequences per evaluation set (the paper's test set; the records before 2026-12-04's third
  sitting have 256: ``--eval-sequences 256`` finds them). Chosen for the time budget, not
  tuned.
- ``tiny`` ("masks" only): the cpu scale at 800 steps (25,600 sequences, a fifth) and 128
  sequences per evaluation set.

Table (b) (:mod:`mapformer.tasks.trees`): tree copy, rotation, C3 reduction and tree
operations, each with a breadth-first and a depth-first target, so 8 parts; every row runs as
a prefix LM (``attn_mask=prefix``: the source tree bidirectional, the target causal in its
output order, which is the paper's decoder mask; see the module's doc) unless the row sets
attn_mask. ``ape_tree`` reads the tokens' heap numbers (source and target trees), every other
row the token index (the paper's sequential baselines see flattened token lists). Its paper
figure: the paper's "APE seq" for our ape_seq, "APE tree" for ape_tree. Its Relative column
stands beside two rows, ``relative`` (Shaw et al.'s reading: the offset's embedding in keys and
values, scaled, clipped at the task's sequence length) and ``relative_ape_code`` (the APE
code's: keys only, unscaled, clipped at the scale's mean depth, its window seq_len_mu; in
table (a) at the mean length); its Tree-SQ column beside ``tree_sq`` (Shiv and Quirk's code on
the heap numbers, depth the task's deepest node). Our RoPE is the correct one (the paper's
public RoPE baseline rotates across heads, research note 1.8), so its RoPE cells need not
match. Scales: ``paper``: depth int(N(7, 1)) trees and the training of table (a)'s paper
scale; ``cpu``: mean depth 5 (depths 3..7, about 17 nodes on average, at most 63), 6000
training trees, 2 layers, d_model 64, 2 heads of 32, batch 32, 900 steps (28,800 trees, 4.8
epochs; the paper trains 400), lr 1e-3 with 11 warmup steps (the paper's 5/400), cosine, no
dropout, 2000 evaluation trees (256 in the records before 2026-12-04's third sitting).

Time estimates (cpu scale, one OpenMP thread; the harness before this layer measured them).
Table (b): a training step on the shared 2-core machine at load average 4 (100-step runs,
evaluation included): 0.05-0.07 s (sinusoidal, rope_tuned, ape_seq), 0.11-0.14 s (ape_tree,
whose table of 2^(levels + 1) maps, 256 or 512 for rotation, is built every step); with the
rows sinusoidal, rope_tuned, ape_seq, ape_tree about 0.08 s per step on average, so a run is
about 75 s and their 96 runs (4 tasks x 2 orders x 4 rows x 3 seeds) about 2 hours (under
heavier load, 0.09 s and 0.22 s per step were measured: about 3 hours; the 96 runs took 64
min at load average about 2). At 300 steps (a third of the cpu scale, one seed) tree_rotate
depth-first reached test perplexity 9.6 (rope_tuned) and 8.0 (ape_tree), far from the paper's
2.60 and 1.01: 900 steps may well be too few to separate the rows; ``--sequences`` raises it
(then it is not a reproduction, and the table's note says so). Table (a): medians of 25
training steps: copy 0.033-0.038 s, repeat 0.056-0.062 s, reverse 0.032-0.036 s (rope,
ape_seq, none alike); the evaluation of a run (three sets of 256) 0.5-1.4 s. A seed of all
three tasks is then about 4000 x 0.13 s = 9 minutes per row, and 36 runs (3 tasks x 4 rows x
3 seeds) about 1.75 hours.

Threads: at this size one thread is faster: on the shared 2-core machine (load average 2.5-3
from other jobs) a cpu-scale training step (batch 32, rope) took 0.038 s (median of 25) with
one thread and 0.44 s with two, whose OpenMP barriers wait on a busy core. Run serially with
``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1``, or ``--executor pool --workers 2`` (one thread
per worker by default).

Records of the harness before this layer (``benchmarks/reproduce_ape.py``, removed; one JSON
per (task, order, row, seed) in ``results/ape_table_a/cpu``, ``results/ape_table_b/cpu`` and
``results/ape_masks_tiny``) are in ``results/records/ape-legacy/``, converted by
:func:`legacy_records` (``python -m mapformer.reproduce.ape OLD_DIR ... --records DIR``),
their provenance unknown (§ in the tables).
"""
import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..experiments.records import RecordStore, unknown_provenance
from ..experiments.runs import Run
from ..experiments.tables import Table, overridden
from ..models import ModelConfig
from ..tasks import transduction, trees
from ..train import TrainConfig
from .mapformer import recorded_configs

TASKS = transduction.OPERATIONS  # copy, repeat, reverse
TREE_TASKS = tuple(trees.TASK_NAMES)  # tree_copy, tree_rotate, tree_c3, tree_ops
COLUMNS = ("Sinusoidal", "Absolute", "Relative", "RoPE frozen", "RoPE tuned", "APE w/ init",
           "APE w/o init")
PAPER = {  # table (a), perplexity, mean and 95% CI over 3 runs (research note, section 2.5)
    "copy": dict(zip(COLUMNS, [(1.01, 0.00), (1.11, 0.00), (1.00, 0.00), (1.00, 0.00),
                               (1.00, 0.00), (1.00, 0.00), (1.00, 0.00)])),
    "repeat": dict(zip(COLUMNS, [(1.85, 0.15), (3.66, 0.06), (1.44, 0.16), (1.08, 0.12),
                                 (1.00, 0.00), (1.00, 0.00), (1.02, 0.00)])),
    "reverse": dict(zip(COLUMNS, [(3.92, 0.99), (4.62, 0.67), (4.08, 1.12), (1.09, 0.02),
                                  (1.01, 0.00), (1.01, 0.00), (1.03, 0.02)])),
}


@dataclass(frozen=True)
class Row:
    """A table row: the positional scheme, options over its defaults, and the paper's column
    it stands beside (None: no counterpart)."""

    scheme: str
    options: tuple = ()
    paper: str = None


ROWS = {
    "sinusoidal": Row("sinusoidal", paper="Sinusoidal"),
    "learned_abs": Row("learned_abs", paper="Absolute"),
    "rope": Row("rope", paper="RoPE frozen"),
    "rope_tuned": Row("rope", (("rope_trainable", True),), paper="RoPE tuned"),
    "ape_seq": Row("ape_seq", paper="APE w/ init"),
    "ape_seq_no_init": Row("ape_seq", (("ape_no_init", True),), paper="APE w/o init"),
    "ape_tree": Row("ape_tree", paper="APE tree"),
    "ape_tree_no_init": Row("ape_tree", (("ape_no_init", True),), paper="APE tree w/o init"),
    # the paper's public code's logit decay, 0.98^distance (ape_decay)
    "ape_seq_decay": Row("ape_seq", (("ape_decay", 0.98),), paper="APE w/ init"),
    "ape_tree_decay": Row("ape_tree", (("ape_decay", 0.98),), paper="APE tree"),
    "ape_seq_no_init_decay": Row("ape_seq", (("ape_decay", 0.98), ("ape_no_init", True)),
                                 paper="APE w/o init"),
    "ape_tree_no_init_decay": Row("ape_tree", (("ape_decay", 0.98), ("ape_no_init", True)),
                                  paper="APE tree w/o init"),
    # Shaw et al.'s relative positions, two readings (mapformer.schemes.relative): the
    # paper's (keys and values, scaled; clipped at the task's sequence length: nothing
    # clipped) and the APE code's Relative baseline (keys only, unscaled, clipped at the
    # scale's mean length or tree depth, as its window = seq_len_mu)
    "relative": Row("relative", paper="Relative"),
    "relative_ape_code": Row("relative", (("rel_reading", "ape_code"),), paper="Relative"),
    # Shiv and Quirk's tree code on the heap numbers (mapformer.schemes.tree_sq), table (b)
    "tree_sq": Row("tree_sq", paper="Tree-SQ"),
    "none": Row("none"),
    "rope_prefix": Row("rope", (("attn_mask", "prefix"),), paper="RoPE frozen"),
    "ape_seq_prefix": Row("ape_seq", (("attn_mask", "prefix"),), paper="APE w/ init"),
    "none_prefix": Row("none", (("attn_mask", "prefix"),)),
}


B_COLUMNS = ("Sinusoidal", "Tree-SQ", "Absolute", "Relative", "RoPE frozen", "RoPE tuned",
             "APE seq", "APE seq w/o init", "APE tree", "APE tree w/o init")
B_CELLS = {  # table (b), perplexity, mean and 95% CI over 3 runs, per column of B_COLUMNS
    ("tree_copy", "breadth"): [(1.06, .01), (1.29, .01), (6.64, .12), (1.01, .00), (1.42, .58),
                               (1.00, .00), (1.00, .00), (1.00, .00), (1.01, .00), (1.07, .00)],
    ("tree_copy", "depth"): [(5.68, .63), (1.07, .00), (7.02, .17), (6.12, .06), (2.46, .59),
                             (1.70, .05), (1.63, .06), (2.36, .63), (1.00, .00), (1.04, .08)],
    ("tree_rotate", "breadth"): [(6.93, .38), (2.60, .16), (7.77, .15), (6.00, .25),
                                 (4.58, .30), (4.07, .34), (2.95, .08), (5.18, .10),
                                 (1.05, .01), (1.44, .15)],
    ("tree_rotate", "depth"): [(7.13, .35), (1.87, .24), (7.24, .20), (7.72, .28), (4.97, 1.79),
                               (2.60, .11), (2.48, .27), (5.72, 1.23), (1.01, .00), (1.27, .15)],
    ("tree_c3", "breadth"): [(2.66, .10), (2.27, .59), (2.77, .21), (1.70, .07), (1.55, .34),
                             (1.08, .02), (1.07, .01), (1.45, .08), (1.00, .00), (1.05, .10)],
    ("tree_c3", "depth"): [(2.78, .08), (2.29, .24), (2.79, .22), (2.43, .04), (2.15, .22),
                           (1.90, .22), (1.83, .02), (2.29, .06), (1.00, .00), (1.00, .00)],
    ("tree_ops", "breadth"): [(20.53, 7.11), (19.18, 3.23), (37.78, .72), (2.36, .02),
                              (2.53, .08), (2.55, .05), (2.30, .03), (1.75, .74), (2.24, .06),
                              (2.42, .01)],
    ("tree_ops", "depth"): [(64.86, 6.41), (16.41, 6.14), (48.91, 5.83), (16.86, 1.27),
                            (33.54, 9.04), (20.87, .33), (20.05, .36), (29.26, 9.15),
                            (1.83, .02), (1.86, .01)],
}
PAPER_B = {key: dict(zip(B_COLUMNS, cells)) for key, cells in B_CELLS.items()}
B_NAMES = {"APE w/ init": "APE seq", "APE w/o init": "APE seq w/o init"}  # a's names -> b's


@dataclass(frozen=True)
class Scale:
    mean_length: int
    d_model: int
    n_heads: int
    n_layers: int
    dropout: float
    batch_size: int
    steps: int
    lr: float
    warmup_steps: int
    eval_sequences: int
    mean_depth: int = None  # table (b): the trees' mean depth

    @property
    def sequences(self):
        return self.steps * self.batch_size


SCALES = {
    "paper": Scale(100, 512, 8, 4, 0.1, 64, 37_500, 5e-4, 469, 2000),
    "cpu": Scale(32, 64, 2, 2, 0.0, 32, 4000, 1e-3, 50, 2000),
}
TREE_SCALES = {
    "paper": Scale(None, 512, 8, 4, 0.1, 64, 37_500, 5e-4, 469, 2000, mean_depth=7),
    "cpu": Scale(None, 64, 2, 2, 0.0, 32, 900, 1e-3, 11, 2000, mean_depth=5),
}
MASK_SCALES = {**SCALES, "tiny": replace(SCALES["cpu"], steps=800, eval_sequences=128)}

TABLE_NAMES = ("a", "b", "masks", "a-plateau")
TABLES = {
    "a": {"title": "APE table (a), sequence transduction", "columns": ("iid", "ood_long"),
          "scales": SCALES, "parts": {"cpu": TASKS, "paper": TASKS},
          "rows": ("sinusoidal", "learned_abs", "relative", "relative_ape_code", "rope",
                   "rope_tuned", "ape_seq", "ape_seq_no_init", "ape_seq_decay",
                   "ape_seq_no_init_decay", "none", "rope_prefix", "ape_seq_prefix",
                   "none_prefix")},
    "b": {"title": "APE table (b), tree transduction", "columns": ("iid", "dev"),
          "scales": TREE_SCALES,
          "parts": {s: tuple(f"{t} {o}" for t in TREE_TASKS for o in trees.ORDERS)
                    for s in TREE_SCALES},
          "rows": ("sinusoidal", "tree_sq", "learned_abs", "relative", "relative_ape_code",
                   "rope", "rope_tuned", "ape_seq", "ape_seq_no_init", "ape_seq_decay",
                   "ape_seq_no_init_decay", "ape_tree", "ape_tree_no_init", "ape_tree_decay",
                   "ape_tree_no_init_decay", "none")},
    "masks": {"title": "APE sequence transduction, causal decoder against prefix LM",
              "columns": ("iid", "ood_long"), "scales": MASK_SCALES,
              "parts": {"tiny": ("copy", "reverse"), "cpu": TASKS, "paper": TASKS},
              "rows": ("rope", "rope_prefix", "ape_seq", "ape_seq_prefix")},
}
METRICS = ("perplexity", "sequence_accuracy")
# the paper's count (its section 4: "across the 13 setups considered, APE is the uncontested
# top performer in 8, ranks among the best in 3, and falls within the confidence margin of the
# top performer in one"): APE's rows against the other encodings, causal rows only (the
# prefix-LM rows and `none` have no paper column of their own)
_RIVALS = ("sinusoidal", "learned_abs", "relative", "relative_ape_code", "rope", "rope_tuned")
CONTESTS = {
    "a": ("APE", ("ape_seq", "ape_seq_no_init", "ape_seq_decay", "ape_seq_no_init_decay"),
          _RIVALS),
    "b": ("APE", ("ape_seq", "ape_seq_no_init", "ape_seq_decay", "ape_seq_no_init_decay",
                  "ape_tree", "ape_tree_no_init", "ape_tree_decay", "ape_tree_no_init_decay"),
          _RIVALS + ("tree_sq",)),
}


def configs(task, row, scale, seed, sequences, order=None):
    """(ModelConfig, TrainConfig) of one run (``order``: a tree task's target order; the tree
    tasks run as a prefix LM unless the row sets attn_mask)."""
    tree = task in TREE_TASKS
    train_config = TrainConfig(task=task, mean_length=None if tree else scale.mean_length,
                               tree_depth=scale.mean_depth if tree else None,
                               tree_order=order if tree else None, sequences=sequences,
                               batch_size=scale.batch_size, lr=scale.lr, weight_decay=0.01,
                               schedule="cosine", warmup_steps=scale.warmup_steps, seed=seed,
                               eval_sequences=scale.eval_sequences, eval_batch_size=64,
                               log_every=50)
    options = {**({"attn_mask": "prefix"} if tree else {}), **dict(row.options)}
    if options.get("rel_reading") == "ape_code":  # the APE code's window, seq_len_mu
        options.setdefault("rel_window", scale.mean_depth if tree else scale.mean_length)
    model_config = ModelConfig.for_task(
        "rope", train_config.task_config(), positional=row.scheme, d_model=scale.d_model,
        n_heads=scale.n_heads, n_layers=scale.n_layers, dropout=scale.dropout, **options)
    return model_config, train_config


def ape_run(part, row, scale, seed, sequences):
    """The run of ``row`` (a Row) on ``part`` (a task, or "task order" for a tree task) of
    ``scale`` at ``seed``: :func:`configs`, evaluated on every set of its task (``iid``,
    ``dev``, and ``ood_long`` for the sequence tasks: TrainConfig.eval_tasks)."""
    task, _, order = part.partition(" ")
    model_config, train_config = configs(task, row, scale, seed, sequences, order or None)
    return Run.of(model_config, train_config, train_config.eval_tasks())


def reference(name, rows):
    """The paper's perplexities of table ``name`` ({part: {row: (figure at iid, None)}}): each
    row's paper column (b's names for b), none for a row without one."""
    spec = TABLES[name]
    out = {}
    for part in {p for parts in spec["parts"].values() for p in parts}:
        task, _, order = part.partition(" ")
        for label in rows:
            column = ROWS[label].paper
            if name == "b":
                cells = PAPER_B[task, order]
                column = B_NAMES.get(column, column)
            else:
                cells = PAPER[task]
            if column in cells:
                out.setdefault(part, {})[label] = (cells[column], None)
    return out


def check_count(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{name} must be a positive integer (None: the scale's), got "
                         f"{value!r}")


ESCAPE_LOSS = 0.1  # a logged training loss below it: the run has left the loss plateau


def escape_step(record, threshold=ESCAPE_LOSS):
    """The first logged training step (every 50th) whose batch loss is below ``threshold``
    (None if the run never gets there): where a run leaves the plateau at ~0.5-1.0 nats per
    target token on which an unlearned reversal sits."""
    return next((entry["step"] for entry in record.get("log", ())
                 if entry["loss"] < threshold), None)


def derive_plateau(record):
    """The "a-plateau" columns of a table (a) record: ``escape_ksteps``, :func:`escape_step`
    in thousands of steps (None: never, so the cell averages the seeds that escape and n
    counts them), ``escaped`` (1 or 0) and the final ``perplexity`` on iid (the table's
    own). A record without a training log (the legacy ones) has neither reading."""
    step, logged = escape_step(record), bool(record.get("log"))
    return {"train": {"escape_ksteps": None if step is None else step / 1000,
                      "escaped": float(step is not None) if logged else None,
                      "perplexity": record["metrics"]["iid"]["perplexity"]}}


def plateau_view(base):
    """Table (a)'s records by training step: when each run's training loss leaves the plateau
    (:func:`escape_step`), whether it does within the budget, and where it ends."""
    return replace(
        base, name="a-plateau", title="APE table (a) by training step: leaving the loss "
        "plateau", columns=("train",), metrics=("escape_ksteps", "escaped", "perplexity"),
        derive=derive_plateau, reference={}, reference_metrics=None, contest=None,
        note=base.note + f"; escape_ksteps: the first logged step (every 50th) whose "
        f"batch loss is below {ESCAPE_LOSS}, in thousands, over the seeds that reach it (n: "
        "how many); "
        "escaped: the share of seeds that do within the budget; perplexity: iid's, as in "
        "table (a)")


def table(name, scale="cpu", sequences=None, eval_sequences=None):
    """APE table ``name`` ("a", "b", "masks", or "a-plateau": table (a)'s records by
    training step, :func:`plateau_view`) at ``scale``; ``sequences`` overrides the scale's
    training sequences (then it is not a reproduction, and the note says so),
    ``eval_sequences`` its sequences per evaluation set (default: the scale's, 2000 at cpu
    as in the paper)."""
    if name not in TABLE_NAMES:
        raise ValueError(f"APE has tables {', '.join(TABLE_NAMES)}, not {name!r}")
    if name == "a-plateau":
        return plateau_view(table("a", scale, sequences, eval_sequences))
    spec = TABLES[name]
    if scale not in spec["scales"]:
        raise ValueError(f"table {name} has scales {sorted(spec['scales'])}, not {scale!r}")
    check_count("sequences", sequences)
    check_count("eval_sequences", eval_sequences)
    at = spec["scales"][scale]
    if eval_sequences is not None:
        at = replace(at, eval_sequences=eval_sequences)
    n = sequences if sequences is not None else at.sequences
    rows = spec["rows"]
    shape = (f"mean depth {at.mean_depth}" if name == "b"
             else f"mean source length {at.mean_length}")
    note = (f"{shape}; {at.n_layers} layers, d_model {at.d_model}, {at.n_heads} heads; "
            f"{at.steps} steps of batch {at.batch_size} ({at.sequences:,} sequences), lr "
            f"{at.lr:g}, {at.warmup_steps} warmup steps, cosine; {at.eval_sequences} sequences "
            "per evaluation set; a decoder, " + ("every row a prefix LM" if name == "b" else
                                                  "causal, *_prefix rows a prefix LM")
            + ", not the paper's encoder-decoder")
    note += overridden(sequences)

    def make_run(part, label, seed):
        return ape_run(part, ROWS[label], at, seed, n)

    return Table("ape", name, spec["title"], scale, note, tuple(spec["parts"][scale]), rows,
                 spec["columns"], METRICS, make_run, reference(name, rows),
                 statistic="ci95", reference_metrics=("perplexity",), digits=2,
                 contest=CONTESTS.get(name))


def legacy_records(directory):
    """[(record, whether its run is the current spec's)] of the old harness's JSON files in
    ``directory`` (benchmarks/reproduce_ape.py: {task, order, row, seed, model, train, eval,
    final_train_loss, wall_s, steps} per file). The run is the spec's for (part, row, seed)
    at the scale whose configs equal the recorded ones (read as today's library reads them,
    :func:`~mapformer.reproduce.mapformer.recorded_configs`; the recorded training and
    evaluation sequences as overrides where they are not the scale's), else the recorded
    configs themselves with the spec's evaluation sets."""
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        old = json.loads(path.read_text())
        task = old["task"]
        tree = task in TREE_TASKS
        part = f"{task} {old['order']}" if tree else task
        row = ROWS.get(old["row"], Row(old["row"]))
        recorded = recorded_configs(old)
        run, same = None, False
        for at in (TREE_SCALES if tree else MASK_SCALES).values():
            at = replace(at, eval_sequences=old["train"]["eval_sequences"])
            candidate = ape_run(part, row, at, old["seed"], old["train"]["sequences"])
            if recorded == (candidate.model, candidate.train):
                run, same = candidate, True
                break
            run = run or candidate
        if not same:
            run = Run(model=old["model"], train=old["train"], evals=run.evals)
        out.append(({"id": run.id, "run": run.to_dict(), "metrics": old["eval"],
                     "wall_s": old["wall_s"], "final_train_loss": old["final_train_loss"],
                     "steps": old["steps"],
                     "provenance": unknown_provenance(path, "benchmarks/reproduce_ape.py")},
                    same))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description="convert benchmarks/reproduce_ape.py's "
                                     "JSON files into records of the experiment layer")
    parser.add_argument("directories", nargs="+")
    parser.add_argument("--records", default="results/records/ape-legacy")
    args = parser.parse_args(argv)
    store = RecordStore(args.records)
    for directory in args.directories:
        converted = legacy_records(directory)
        for record, _ in converted:
            store.put(record)
        matching = sum(same for _, same in converted)
        print(f"{directory}: {len(converted)} records, {matching} of today's spec runs, "
              f"{len(converted) - matching} of configs the specs no longer make")


if __name__ == "__main__":
    main()
