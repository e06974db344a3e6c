"""``python -m mapformer reproduce PAPER TABLE``: a table's runs executed (those whose record
is missing) on an executor, then the table rendered from the records."""
import json
from pathlib import Path

from .. import reproduce
from .executors import make_executor
from .records import RecordStore
from .tables import run_all


def add_parser(sub, positive_int):
    """The ``reproduce`` subcommand on the CLI's subparsers."""
    rp = sub.add_parser("reproduce", help="run a paper's table (the runs whose record is "
                        "missing) on an executor, then print it from the records")
    rp.add_argument("paper", choices=sorted(reproduce.PAPERS))
    rp.add_argument("table", help="the table: " + "; ".join(
        f"{p}: {', '.join(reproduce.table_names(p))}" for p in reproduce.PAPERS))
    rp.add_argument("--scale", default="cpu", help="cpu: reduced for a 2-core CPU (the "
                    "default); paper: the paper's settings; some tables have more (tiny; "
                    "TDB's small)")
    rp.add_argument("--seeds", type=positive_int, default=3, help="seeds 0 .. N-1 (default 3)")
    rp.add_argument("--rows", default=None, help="comma-separated row labels to run (a comma "
                    "inside parentheses stays in its label: 'Mamba,MAMPa (decay, ZOH)'; "
                    "default: the table's default rows, most often all; the table shows every "
                    "row that has records)")
    rp.add_argument("--parts", default=None, help="comma-separated parts to run (e.g. a task "
                    "or 1D; default: all)")
    rp.add_argument("--sequences", type=positive_int, default=None,
                    help="override the scale's training sequences (not a reproduction)")
    rp.add_argument("--eval-sequences", type=positive_int, default=None,
                    help="sequences per evaluation set (default: the table's)")
    rp.add_argument("--records", default=None, help="directory of the run records (default: "
                    "results/records/PAPER)")
    rp.add_argument("--executor", default="serial", choices=("serial", "pool", "dask", "slurm"),
                    help="where the runs execute (default: serial, in this process)")
    rp.add_argument("--workers", type=positive_int, default=2,
                    help="pool / dask: worker processes, one run each at a time (default 2)")
    rp.add_argument("--threads", type=positive_int, default=None,
                    help="OpenMP threads per worker (default: 1 with several workers)")
    rp.add_argument("--scheduler", default=None, help="dask: a running scheduler's address "
                    "(tcp://HOST:PORT) instead of a local cluster")
    rp.add_argument("--jobs", type=positive_int, default=None, help="slurm: jobs (workers)")
    rp.add_argument("--partition", default=None, help="slurm: the partition")
    rp.add_argument("--force", action="store_true", help="rerun runs whose record exists")
    rp.add_argument("--render-only", action="store_true",
                    help="run nothing: render the table from the records there are")
    rp.add_argument("--json", default=None, metavar="FILE",
                    help="also write the table (cells' per-seed values and provenance) here")
    rp.add_argument("--plot", default=None, metavar="FILE", help="where a figure's plot goes "
                    "(default: results/figures/PAPER-TABLE-SCALE[-nSEQUENCES].png; tables without a plot "
                    "draw none)")
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    return rp


def split_labels(text):
    """Comma-separated labels, where a comma inside parentheses belongs to its label:
    "Mamba,MAMPa (decay, ZOH)" -> ["Mamba", "MAMPa (decay, ZOH)"]."""
    labels, depth, current = [], 0, ""
    for char in text:
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            labels.append(current.strip())
            current = ""
        else:
            current += char
    return labels + [current.strip()]


def run(args):
    """Execute and render; returns the exit status (1 when a run failed)."""
    table = reproduce.table(args.paper, args.table, args.scale, sequences=args.sequences,
                        eval_sequences=args.eval_sequences)
    rows = None
    if args.rows:
        rows = split_labels(args.rows)
        unknown = [r for r in rows if r not in table.rows]
        if unknown:
            raise ValueError(f"--rows: no row {unknown[0]!r} in table {args.table} (rows: "
                             f"{', '.join(table.rows)})")
    parts = None
    if args.parts:
        parts = split_labels(args.parts)
        unknown = [p for p in parts if p not in table.parts]
        if unknown:
            raise ValueError(f"--parts: no part {unknown[0]!r} in table {args.table} (parts: "
                             f"{', '.join(table.parts)})")
    store = RecordStore(args.records or Path("results", "records", args.paper))
    failed = []
    if not args.render_only:
        executor = make_executor(args.executor, args.workers, args.threads, args.scheduler,
                                 args.jobs, args.partition)
        try:
            summary = run_all(table.runs(args.seeds, rows, parts), store, executor, args.force,
                              progress=not args.no_progress)
        finally:
            executor.close()
        failed = summary["failed"]
        print(f"{summary['ran']} runs executed, {summary['held']} held in {store.directory}, "
              f"{len(failed)} failed")
        for run_id, error in failed:
            print(f"  run {run_id} failed: {error}")
    for metric in table.measured_metrics(store, args.seeds) or table.metrics[:1]:
        print()
        print(table.markdown(store, args.seeds, metric))
    if args.json:
        Path(args.json).write_text(json.dumps(table.to_json(store, args.seeds), indent=1))
    if table.plot is not None:
        name = f"{args.paper}-{args.table}-{args.scale}" + (
            f"-n{args.sequences}" if args.sequences else "")
        path = Path(args.plot or Path("results", "figures", name + ".png"))
        path.parent.mkdir(parents=True, exist_ok=True)
        table.plot(table, store, args.seeds, path)
        print(f"\nplot: {path}")
    return 1 if failed else 0
