"""The analysis notebook runs end to end (MAPFORMER_NOTEBOOK_SMALL=1, matplotlib Agg) and its
last cell prints the accuracy lines.

The kernel is this interpreter (a throwaway kernelspec whose argv is sys.executable -m
ipykernel_launcher), importing the same mapformer as this test process. nbclient, nbformat,
ipykernel and matplotlib come with the package's [test] extra."""
import json
import os
import re
import sys
from pathlib import Path

import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

import mapformer

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "mapformer_navigation.ipynb"
KERNEL = "mapformer-test-python"


def kernel_manager(tmp_path):
    """A KernelManager for a kernelspec that runs this interpreter with the small settings."""
    package_root = str(Path(mapformer.__file__).resolve().parents[1])
    path = os.pathsep.join([package_root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    spec_dir = tmp_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "mapformer test kernel", "language": "python",
        "env": {"MAPFORMER_NOTEBOOK_SMALL": "1", "MPLBACKEND": "Agg", "PYTHONPATH": path}}))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")],
                              ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def test_notebook_runs_small(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "the notebook must be saved without outputs"
    workdir = tmp_path / "run"
    workdir.mkdir()
    client = NotebookClient(nb, km=kernel_manager(tmp_path), timeout=600,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError on any failing cell
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    for name in ("mapwm", "rope"):
        match = re.search(rf"{name} accuracy: iid ([0-9.]+), ood_dense ([0-9.]+), "
                          rf"ood_sparse ([0-9.]+)", text)
        assert match, f"no {name} accuracy line in the last cell's output: {text!r}"
        values = [float(v) for v in match.groups()]
        assert all(0.0 <= v <= 1.0 for v in values), values
    # the small run actually executed the analysis cells (their printed summaries)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs if o.output_type == "stream")
    assert "mean |Delta|: actions" in printed and "mean |v|: actions" in printed
