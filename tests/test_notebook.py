"""Every notebook runs end to end (MAPFORMER_NOTEBOOK_SMALL=1, matplotlib Agg): the MapFormer
notebooks' last cells print the accuracy lines, tdb_maps.ipynb's its map metrics,
records.ipynb's the traced cell of Table 2, and their analysis cells print their summaries. The
committed notebooks carry the outputs of their full setting (notebooks/run_all.py writes them);
the small run here starts from a copy without outputs.

The kernel is this interpreter (a throwaway kernelspec whose argv is sys.executable -m
ipykernel_launcher), importing the same mapformer as this test process. nbclient, nbformat,
ipykernel and matplotlib come with the package's [test] extra."""
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

import mapformer

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KERNEL = "mapformer-test-python"
# notebook: what the cells must print besides the last cell's accuracy lines
SUMMARIES = {
    "mapformer_navigation.ipynb": ("mean |Delta|: actions", "mean |v|: actions"),
    "quickstart.ipynb": ("mean |Delta|: actions", "cosine of opposite actions",
                         "mapwm closure error", "rope closure error"),
    "tdb_maps.ipynb": ("aliased patches", "step 30: loss", "walk 0: "),
    "records.ipynb": ("records in results/records/mapformer", "mapwm seed 0"),
}


def check_accuracy_lines(text):
    for model in ("mapwm", "rope"):
        match = re.search(rf"{model} accuracy: iid ([0-9.]+), ood_dense ([0-9.]+), "
                          rf"ood_sparse ([0-9.]+)", text)
        assert match, f"no {model} accuracy line in the last cell's output: {text!r}"
        values = [float(v) for v in match.groups()]
        assert all(0.0 <= v <= 1.0 for v in values), values


def check_map_lines(text):
    match = re.search(r"TDB map: NormGED ([0-9.]+), ImpFallback ([0-9.]+)", text)
    assert match, f"no map metrics in the last cell's output: {text!r}"
    norm_ged, imp_fallback = (float(v) for v in match.groups())
    assert 0.0 <= norm_ged <= 1.0 and 0.0 <= imp_fallback <= 100.0
    assert re.search(r"true room: 30, 116\)", text), text  # the 5 x 6 room's graph


def check_traced_cell(text):
    match = re.search(r"Table 2 MapWM 2D ood_sparse object recalls: .*\(mean ([0-9.]+); paper "
                      r"([0-9.]+)\)", text)
    assert match, f"no traced cell in the last cell's output: {text!r}"
    assert 0.0 <= float(match.group(1)) <= 1.0 and float(match.group(2)) == 0.96


# notebook: the check of its last cell's printed output
LAST_CELL = {"mapformer_navigation.ipynb": check_accuracy_lines,
             "quickstart.ipynb": check_accuracy_lines, "tdb_maps.ipynb": check_map_lines,
             "records.ipynb": check_traced_cell}


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


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(SUMMARIES) == sorted(
        LAST_CELL)


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_notebook_is_committed_with_its_outputs(name):
    """Every code cell has the outputs of a full run (python notebooks/run_all.py NAME after
    editing a notebook), executed in order, and the last cell passes its check."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), \
        f"{name}: run python notebooks/run_all.py {name} (execution counts {counts})"
    text = "".join(o.get("text", "") for o in code[-1].outputs if o.output_type == "stream")
    LAST_CELL[name](text)


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_notebook_runs_small(tmp_path, name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:  # the committed outputs are the full run's: start without them
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    workdir = tmp_path / "run"
    workdir.mkdir()
    if name == "records.ipynb":  # it reads the repository's records: run it where it lives
        workdir = NOTEBOOKS
    client = NotebookClient(nb, km=kernel_manager(tmp_path), timeout=600,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError on any failing cell
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    LAST_CELL[name](text)
    # the small run actually executed the analysis cells (their printed summaries)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs if o.output_type == "stream")
    for summary in SUMMARIES[name]:
        assert summary in printed, f"{name} printed no {summary!r}"
