"""Execute the notebooks at their documented configuration and store their outputs in place.

    python notebooks/run_all.py                       # every notebook, one at a time
    python notebooks/run_all.py quickstart tdb_maps   # some of them

Each notebook runs in a fresh kernel of this interpreter (importing the mapformer of this
repository), in a temporary working directory (the runs' checkpoints are not kept), with
MAPFORMER_NOTEBOOK_SMALL unset (the notebook's full setting, as its first cell documents it),
matplotlib's inline backend (figures stored as PNG) and tqdm's bars off (TQDM_DISABLE: no
progress text in the stored outputs; a notebook that asks for a bar explicitly has its bar's
lines removed from the stored stderr). Cells are stored without timing metadata, so that a rerun
changes only what the notebook computes. The documentation shows these outputs
(docs/tutorials/ links to the notebooks); tests/test_notebook.py runs every notebook again
at its small setting. Needs the package's [test] or [notebooks] extra (nbclient, ipykernel,
matplotlib)."""
import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KERNEL = "mapformer-notebooks"
BAR = re.compile(r"^\s*\d+%\|")  # a tqdm progress line (a notebook that asks for a bar)


def without_bars(nb):
    """``nb`` with tqdm's progress lines removed from its stderr outputs (and an output left
    empty by that removed): a bar records when the cells ran, not what they computed."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.outputs:
            if out.output_type == "stream" and out.name == "stderr":
                lines = [piece for line in out.text.split("\n") for piece in line.split("\r")]
                text = "\n".join(p for p in lines if p.strip() and not BAR.match(p))
                if not text:
                    continue
                out.text = text + "\n"
            kept.append(out)
        cell.outputs = kept
    return nb


def kernel_manager(spec_root):
    """A KernelManager for a kernelspec running this interpreter at the full settings."""
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    spec_dir = Path(spec_root) / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    env = {"PYTHONPATH": path, "TQDM_DISABLE": "1",  # no bars, and no warning about widgets:
           "PYTHONWARNINGS": "ignore:IProgress not found",
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "mapformer notebooks", "language": "python", "env": env}))
    specs = KernelSpecManager(kernel_dirs=[str(Path(spec_root) / "kernels")],
                              ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def run(path, timeout=1800):
    """Execute the notebook at ``path`` and write it back with its outputs; returns seconds."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    env = os.environ.pop("MAPFORMER_NOTEBOOK_SMALL", None)
    try:
        with tempfile.TemporaryDirectory() as work:
            client = NotebookClient(nb, km=kernel_manager(work), timeout=timeout,
                                    record_timing=False,
                                    resources={"metadata": {"path": work}})
            start = time.perf_counter()
            client.execute()
            seconds = time.perf_counter() - start
    finally:
        if env is not None:
            os.environ["MAPFORMER_NOTEBOOK_SMALL"] = env
    nb.metadata.pop("widgets", None)
    nbformat.write(without_bars(nb), path)
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks by name (default: all)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = ([HERE / (n if n.endswith(".ipynb") else n + ".ipynb") for n in args.names]
             or sorted(HERE.glob("*.ipynb")))
    for path in paths:
        print(f"{path.name}: {run(path, args.timeout):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
