"""Reproduce APE's table (a), synthetic rows, and table (b), tree transduction (Kogkalidis
et al., NeurIPS 2024, section 4, appendix 9): tasks x positional schemes, over seeds, the test
perplexity printed beside the paper's.

    python benchmarks/reproduce_ape.py --scale cpu --seeds 3                  # table (a)
    python benchmarks/reproduce_ape.py --scale cpu --seeds 3 --tasks reverse --rows rope,ape_seq
    python benchmarks/reproduce_ape.py --scale cpu --seeds 3 --tables b       # table (b)
    python benchmarks/reproduce_ape.py --tasks tree_rotate --orders depth --rows ape_tree,rope_tuned

Rows (``--rows``, comma-separated): the named rows of ROWS (``sinusoidal``, ``learned_abs``,
``rope``, ``rope_tuned``, ``ape_seq``, ``ape_seq_no_init``, ``ape_seq_decay``, ``none``, and
the prefix-LM rows ``rope_prefix``, ``ape_seq_prefix``, ``none_prefix``; ``ape_tree``,
``ape_tree_no_init``, ``ape_tree_decay`` for table (b)) or any registered positional
scheme's name (so later baselines plug in), each run with the attention mixer. Default:
sinusoidal, rope, ape_seq, none (table a); sinusoidal, rope_tuned, ape_seq, ape_tree (table b).
Our ``learned_abs`` is the paper's
"Absolute", ``rope`` its "RoPE frozen", ``rope_tuned`` (``rope_trainable``) "RoPE tuned",
``ape_seq`` its "APE w/ init" (RoPE's rotations at the start), ``ape_seq_no_init`` "APE w/o
init"; the paper's decay of the logits (0.98^distance) is not applied by these rows: the
rows ``ape_seq_decay`` (0.98^|i - j|; under the tree tasks' prefix LM through the attention's
per-pair factor) and ``ape_tree_decay`` (0.98^(tree distance)) add it (``ape_decay``). Each
(task, row, seed) is
written as JSON to ``results/ape_table_a/<scale>/<task>-<row>-seed<k>.json`` as soon as it
finishes, and a rerun skips the runs found there with the same configs (so an interrupted
table resumes).

Formulation (:mod:`mapformer.tasks.transduction`): one causal decoder over ``source SEP
target``, loss and metrics on the target tokens, where the paper trains an encoder-decoder
(bidirectional encoder, cross-attention) with teacher forcing. The ``*_prefix`` rows run the
same decoder as a prefix LM (``attn_mask=prefix``: source and separator read
bidirectionally, the target causally), the nearest the library comes to the paper's
bidirectional encoder without cross-attention. Metrics: perplexity on the target tokens of the test
split (the paper's), exact match (every target token right, teacher-forced), both also on the
``ood_long`` set (sources twice as long as in training: length generalisation, not in the
paper).

Scales:
- ``paper``: the paper's data (mean source length 100, spread 10, 20 symbols, 6000 training
  sequences, data seed 42) and training (AdamW, weight decay 0.01, batch 64, 400 epochs =
  37,500 steps, lr 5e-4 after 5 epochs of linear warmup, cosine decay; dropout 0.1) on a
  decoder of 4 layers (the paper's 2 encoder + 2 decoder layers), d_model 512, 8 heads,
  feed-forward 4x (the public code's 2048); test sets of 2000 sequences. Days on this CPU.
- ``cpu``: mean source length 32 (spread 3.2), the same 6000 training sequences and data
  seed; 2 layers, d_model 64, 2 heads of 32, batch 32, 4000 steps (128,000 sequences, 21
  epochs), lr 1e-3 with 50 warmup steps (the paper's 5/400), cosine, no dropout; 256
  sequences per evaluation set. Chosen for the time budget, not tuned.

Table (b) (``--tables b``, or tree tasks in ``--tasks``; :mod:`mapformer.tasks.trees`):
tree copy, rotation, C3 reduction and tree operations, each with a breadth-first and a
depth-first target (``--orders``), so 8 columns; every row runs as a prefix LM
(``attn_mask=prefix``: the source tree bidirectional, the target causal in its output order,
which is the paper's decoder mask; see the module's doc) unless the row sets attn_mask.
``ape_tree`` reads the tokens' heap numbers (source and target trees), every other row the
token index (the paper's sequential baselines see flattened token lists). JSON per (task,
order, row, seed) in ``results/ape_table_b/<scale>/<task>-<order>-<row>-seed<k>.json``.
Printed: test perplexity beside the paper's cell (its "APE seq" for our ape_seq, "APE tree"
for ape_tree), exact match, and both on the dev split. Not run: the paper's Tree-SQ and
Relative columns (no such schemes here); our RoPE is the correct one (the paper's public
RoPE baseline rotates across heads, research note 1.8), so its RoPE cells need not match.
Scales: ``paper``: depth int(N(7, 1)) trees and the training of table (a)'s paper scale;
``cpu``: mean depth 5 (depths 3..7, about 17 nodes on average, at most 63), 6000 training
trees, 2 layers, d_model 64, 2 heads of 32, batch 32, 900 steps (28,800 trees, 4.8 epochs;
the paper trains 400), lr 1e-3 with 11 warmup steps (the paper's 5/400), cosine, no dropout,
256 evaluation trees. Time estimate (cpu): a training step measured on this shared 2-core
machine at load average 4 with one thread (100-step runs, evaluation included): 0.05-0.07
s (sinusoidal, rope_tuned, ape_seq), 0.11-0.14 s (ape_tree, whose table of 2^(levels + 1)
maps, 256 or 512 for rotation, is built every step); with the default rows about 0.08 s per
step on average, so a run is about 75 s and the table's 96 runs (4 tasks x 2 orders x 4 rows
x 3 seeds) about 2 hours (under heavier load, 0.09 s and 0.22 s per step were measured: about
3 hours). Not run at full size here; a tiny run proves the script. At 300 steps (a third of
the cpu scale, one seed) tree_rotate depth-first reached test perplexity 9.6 (rope_tuned) and
8.0 (ape_tree), far from the paper's 2.60 and 1.01: 900 steps may well be too few to separate
the rows; ``--sequences`` raises it.

Threads: the script runs with one OpenMP and one OpenBLAS thread unless OMP_NUM_THREADS /
OPENBLAS_NUM_THREADS are set. At this size one thread is faster: on the shared 2-core
machine (load average 2.5-3 from other jobs) a cpu-scale training step (batch 32, rope) took
0.038 s (median of 25) with one thread and 0.44 s with two, whose OpenMP barriers wait on a
busy core.

Time estimate (cpu scale): medians of 25 training steps with one thread, the same machine
and load: copy 0.033-0.038 s, repeat 0.056-0.062 s, reverse 0.032-0.036 s (rope, ape_seq,
none alike); the evaluation of a run (three sets of 256) 0.5-1.4 s. A seed of all three
tasks is then about 4000 x 0.13 s = 9 minutes per row, and the table's 36 runs (3 tasks x 4
rows x 3 seeds) about 1.75 hours. Not run at full
size here; a tiny run proves the script.
"""
import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before NumPy and the core load
    os.environ.setdefault(_name, "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mapformer.models import ModelConfig  # noqa: E402
from mapformer.schemes import SCHEMES  # noqa: E402
from mapformer.tasks import transduction, trees  # noqa: E402
from mapformer.reproduce.mapformer import mean_ci, train_or_load  # noqa: E402
from mapformer.train import TrainConfig  # noqa: E402

TASKS = transduction.OPERATIONS
TREE_TASKS = tuple(trees.TASK_NAMES)  # tree_copy, tree_rotate, tree_c3, tree_ops
TABLE_TASKS = {"a": TASKS, "b": TREE_TASKS}
DEFAULT_ROWS = {"a": ["sinusoidal", "rope", "ape_seq", "none"],
                "b": ["sinusoidal", "rope_tuned", "ape_seq", "ape_tree"]}
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
    "none": Row("none"),
    "rope_prefix": Row("rope", (("attn_mask", "prefix"),), paper="RoPE frozen"),
    "ape_seq_prefix": Row("ape_seq", (("attn_mask", "prefix"),), paper="APE w/ init"),
    "none_prefix": Row("none", (("attn_mask", "prefix"),)),
}
PAPER_COLUMN = {"relative": "Relative"}  # a scheme that may be registered later


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


SCALES = {
    "paper": Scale(100, 512, 8, 4, 0.1, 64, 37_500, 5e-4, 469, 2000),
    "cpu": Scale(32, 64, 2, 2, 0.0, 32, 4000, 1e-3, 50, 256),
}
TREE_SCALES = {
    "paper": Scale(None, 512, 8, 4, 0.1, 64, 37_500, 5e-4, 469, 2000, mean_depth=7),
    "cpu": Scale(None, 64, 2, 2, 0.0, 32, 900, 1e-3, 11, 256, mean_depth=5),
}


def row_of(name):
    """The Row of a --rows name: a named row, or a registered scheme with its defaults."""
    if name in ROWS and ROWS[name].scheme in SCHEMES.entries:
        return ROWS[name]
    if name in SCHEMES.entries:
        return Row(name, paper=PAPER_COLUMN.get(name))
    raise ValueError(f"unknown row {name!r}: the rows are the registered schemes "
                     f"{sorted(SCHEMES.entries)} and {sorted(ROWS)} (when their scheme is "
                     "registered)")


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
    model_config = ModelConfig.for_task(
        "rope", train_config.task_config(), positional=row.scheme, d_model=scale.d_model,
        n_heads=scale.n_heads, n_layers=scale.n_layers, dropout=scale.dropout, **options)
    return model_config, train_config


def run(task, name, row, scale, seed, sequences, out_dir, order=None):
    """Train one (task, row, seed) (and order, for a tree task), or read it from out_dir when
    its JSON holds the same configs (:func:`mapformer.reproduce.train_or_load`); returns the
    record."""
    model_config, train_config = configs(task, row, scale, seed, sequences, order)
    tag = task if order is None else f"{task}-{order}"
    return train_or_load(out_dir / f"{tag}-{name}-seed{seed}.json", model_config,
                         train_config, task=task, order=order, row=name, seed=seed)


def format_table(records, tasks, names, scale_name):
    """Markdown: one line per (task, row): test perplexity beside the paper's, exact match,
    and both on ood_long."""
    lines = [f"**APE table (a), synthetic rows, scale {scale_name}: perplexity on the target "
             "tokens (paper in parentheses: mean ± 95% CI over 3 runs), exact match; "
             "measured mean ± 95% CI over seeds**", "",
             "| task | row | test perplexity (paper) | test exact match | ood_long perplexity "
             "| ood_long exact match | seeds |", "|---|---|---|---|---|---|---|"]
    for task in tasks:
        for name in names:
            runs = [r for r in records if (r["task"], r["row"]) == (task, name)]
            if not runs:
                continue
            column = row_of(name).paper
            ref = PAPER[task].get(column) if column else None
            cells = [mean_ci([r["eval"][s][m] for r in runs])
                     for s in ("iid", "ood_long") for m in ("perplexity", "sequence_accuracy")]
            cells[0] += f" ({ref[0]:.2f} ± {ref[1]:.2f} {column})" if ref else " (-)"
            lines.append(f"| {task} | {name} | " + " | ".join(cells) + f" | {len(runs)} |")
    return "\n".join(lines)


def format_table_b(records, tasks, orders, names, scale_name):
    """Markdown: one line per (task, order, row): test perplexity beside the paper's, exact
    match, and both on the dev split."""
    lines = [f"**APE table (b), tree transduction, scale {scale_name}: perplexity on the target "
             "tokens (paper in parentheses: mean ± 95% CI over 3 runs), exact match; "
             "measured mean ± 95% CI over seeds**", "",
             "| task | order | row | test perplexity (paper) | test exact match | dev perplexity "
             "| dev exact match | seeds |", "|---|---|---|---|---|---|---|---|"]
    for task in tasks:
        for order in orders:
            for name in names:
                runs = [r for r in records if (r["task"], r["order"], r["row"]) == (task, order,
                                                                                     name)]
                if not runs:
                    continue
                column = row_of(name).paper
                column = B_NAMES.get(column, column)
                ref = PAPER_B[task, order].get(column) if column else None
                cells = [mean_ci([r["eval"][s][m] for r in runs])
                         for s in ("iid", "dev") for m in ("perplexity", "sequence_accuracy")]
                cells[0] += f" ({ref[0]:.2f} ± {ref[1]:.2f} {column})" if ref else " (-)"
                lines.append(f"| {task} | {order} | {name} | " + " | ".join(cells)
                             + f" | {len(runs)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per row (0, 1, ...)")
    parser.add_argument("--rows", default=None,
                        help="comma-separated rows: " + ", ".join(ROWS) + ", or any "
                        "registered scheme (default: sinusoidal, rope, ape_seq, none)")
    parser.add_argument("--tables", default="a",
                        help="comma-separated tables: a (sequence transduction), b (tree "
                        "transduction) (default: a)")
    parser.add_argument("--tasks", default=None,
                        help="comma-separated among copy, repeat, reverse (table a) and "
                        "tree_copy, tree_rotate, tree_c3, tree_ops (table b) (default: every "
                        "task of --tables)")
    parser.add_argument("--orders", default="breadth,depth",
                        help="the tree tasks' target orders, comma-separated among breadth, "
                        "depth (default: both)")
    parser.add_argument("--sequences", type=int, default=None,
                        help="override the scale's training sequences (not a reproduction)")
    parser.add_argument("--eval-sequences", type=int, default=None,
                        help="override the scale's sequences per evaluation set")
    parser.add_argument("--out", default=None,
                        help="directory of the per-run JSON (default results/ape_table_a/SCALE "
                        "and results/ape_table_b/SCALE)")
    args = parser.parse_args(argv)
    tables = [t.strip() for t in args.tables.split(",")]
    if any(t not in TABLE_TASKS for t in tables):
        parser.error(f"--tables must list a and/or b, got {args.tables!r}")
    tasks = ([t.strip() for t in args.tasks.split(",")] if args.tasks
             else [t for table in tables for t in TABLE_TASKS[table]])
    bad = [t for t in tasks if t not in TASKS + TREE_TASKS]
    if bad:
        parser.error(f"unknown tasks {bad}: the tasks are {list(TASKS + TREE_TASKS)}")
    orders = [o.strip() for o in args.orders.split(",")]
    if any(o not in trees.ORDERS for o in orders):
        parser.error(f"--orders must list breadth and/or depth, got {args.orders!r}")
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    parts = [(table, [t for t in tasks if t in TABLE_TASKS[table]]) for table in ("a", "b")]
    records, t0 = [], time.perf_counter()
    for table, part_tasks in parts:
        if not part_tasks:
            continue
        scale = (SCALES if table == "a" else TREE_SCALES)[args.scale]
        if args.eval_sequences:
            scale = Scale(**{**scale.__dict__, "eval_sequences": args.eval_sequences})
        sequences = args.sequences or scale.steps * scale.batch_size
        names = ([n.strip() for n in args.rows.split(",")] if args.rows
                 else DEFAULT_ROWS[table])
        try:
            rows = {name: row_of(name) for name in names}
        except ValueError as exc:
            parser.error(str(exc))
        out_dir = Path(args.out or Path(__file__).resolve().parents[1] / "results"
                       / f"ape_table_{table}" / args.scale)
        print(f"APE table ({table}), scale {args.scale}: {scale}; {sequences} training "
              f"sequences per run; JSON in {out_dir}", flush=True)
        held = "ood_long" if table == "a" else "dev"
        part = []
        for task in part_tasks:
            for order in (orders if table == "b" else [None]):
                for name, row in rows.items():
                    for seed in range(args.seeds):
                        r = run(task, name, row, scale, seed, sequences, out_dir, order)
                        part.append(r)
                        print(f"  {task}{'' if order is None else ' ' + order} {name} seed "
                              f"{seed}: test perplexity {r['eval']['iid']['perplexity']:.3f} "
                              f"exact {r['eval']['iid']['sequence_accuracy']:.3f}   {held} "
                              f"perplexity {r['eval'][held]['perplexity']:.3f} exact "
                              f"{r['eval'][held]['sequence_accuracy']:.3f}   "
                              f"({r['wall_s']:.0f}s, {r['wall_s'] / r['steps']:.3f} s/step"
                              + (", from an earlier run)" if r.get("cached") else ")"),
                              flush=True)
        print()
        print(format_table(part, part_tasks, list(rows), args.scale) if table == "a" else
              format_table_b(part, part_tasks, orders, list(rows), args.scale))
        print()
        records += part
    print(f"total {time.perf_counter() - t0:.0f}s")
    return records


if __name__ == "__main__":
    main()
