"""What every benchmark that feeds the performance pages does at its end: print its figures as
one JSON line and, given a path (``--json FILE``), write them there with the command that
produced them and the run's provenance (commit and dirty flag, CPU, kernel set, threads,
OpenBLAS: :func:`mapformer.experiments.records.provenance`). docs/gen_pages.py renders such
files; a file whose provenance says ``dirty: true`` came from uncommitted code.

Importing it puts the checkout that holds it first on ``sys.path``: a benchmark measures the
checkout's mapformer (its build in place), never an installed copy of another commit.

A row of a timing table (bench_ops.py's, bench_vq_lstm.py's, bench_attention_factor.py's) is
{"family", "name", "sizes": {name: value}, "c_ms", and where measured "c_gbps", "c_gflops",
"numpy_ms", "speedup" (NumPy over C), ...}: the ``op-bench`` directive renders them."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))


def add_json_option(parser):
    """The ``--json FILE`` option every such benchmark takes (its value: :func:`emit`'s
    ``json_path``)."""
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the printed figures here, with the command and the "
                             "run's provenance (commit, CPU, kernel set, threads); "
                             "docs/gen_pages.py renders such files")


def emit(figures, json_path=None):
    """Print ``figures`` (JSON values) as one line; with ``json_path``, also write them there,
    indented, with "command" (this process's command line) and "provenance" added."""
    print(json.dumps(figures))
    if json_path:
        from mapformer.experiments.records import provenance

        script = Path(sys.argv[0])
        where = f"benchmarks/{script.name}" if script.parent.name == "benchmarks" else str(script)
        figures = {**figures, "command": " ".join(["python", where, *sys.argv[1:]]),
                   "provenance": provenance()}
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(figures, indent=1) + "\n")
    return figures
