"""Learning curves from metrics.jsonl: the records read back, the figure's lines hold them,
and the CLI writes the PNG."""
import json
import subprocess
import sys

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from conftest import subprocess_env  # noqa: E402
from mapformer.models import ModelConfig  # noqa: E402
from mapformer.plots import learning_curves, read_metrics  # noqa: E402
from mapformer.train import TrainConfig, train  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs (rope and mapwm) with evaluations every 2 steps."""
    root = tmp_path_factory.mktemp("runs")
    train_config = TrainConfig(dims=1, steps=8, grid_size=4, sequences=64, batch_size=16,
                               eval_every=2, log_every=1, eval_sequences=8)
    task = train_config.task_config()
    for name in ("rope", "mapwm"):
        train(ModelConfig.for_task(name, task, d_model=32, n_heads=2), train_config,
              out_dir=root / name, progress=False, log=lambda *a: None)
    return [root / "rope", root / "mapwm"]


def test_read_metrics_splits_training_and_evaluation_records(runs):
    train_records, evals = read_metrics(runs[0])
    assert [r["step"] for r in train_records] == [1, 2, 3, 4]
    assert [e["step"] for e in evals] == [2, 4]
    assert set(evals[-1]["eval"]) == {"iid", "ood_dense", "ood_sparse"}
    lines = (runs[0] / "metrics.jsonl").read_text().splitlines()
    (runs[0] / "metrics.jsonl").write_text("\n".join(lines + [lines[0]]) + "\n")
    again, _ = read_metrics(runs[0])  # a step logged twice (a resumed run) is kept once
    assert [r["step"] for r in again] == [1, 2, 3, 4]


def test_figure_holds_every_run_and_set(runs, tmp_path):
    fig = learning_curves(runs, out=tmp_path / "c.png", labels=["RoPE", "MapWM"])
    axes = fig.axes
    assert [a.get_title() for a in axes] == [
        "training loss", "training accuracy", "iid accuracy", "iid objects",
        "ood_dense accuracy", "ood_dense objects", "ood_sparse accuracy", "ood_sparse objects"]
    for run, loss_line in zip(runs, axes[0].get_lines()):
        records, evals = read_metrics(run)
        np.testing.assert_array_equal(loss_line.get_xdata(), [r["step"] for r in records])
        np.testing.assert_array_equal(loss_line.get_ydata(), [r["loss"] for r in records])
    # per run on a set panel: the accuracy line, then its floor
    mapwm_accuracy, mapwm_floor = axes[6].get_lines()[2:4]
    _, evals = read_metrics(runs[1])
    np.testing.assert_array_equal(mapwm_accuracy.get_ydata(),
                                  [e["eval"]["ood_sparse"]["accuracy"] for e in evals])
    np.testing.assert_array_equal(mapwm_floor.get_ydata(),
                                  [e["eval"]["ood_sparse"]["floor"] for e in evals])
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["RoPE", "MapWM"]
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_writes_a_png_and_names_bad_runs(runs, tmp_path):
    out = tmp_path / "curves.png"
    cmd = [sys.executable, "-m", "mapformer", "plot", *map(str, runs), "--out", str(out)]
    done = subprocess.run(cmd, env=subprocess_env(1), capture_output=True, text=True,
                          check=True)
    assert f"wrote {out}" in done.stdout and out.stat().st_size > 10_000
    missing = subprocess.run(cmd[:4] + [str(tmp_path / "nowhere")], env=subprocess_env(1),
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no metrics.jsonl" in missing.stderr
    labels = subprocess.run(cmd + ["--labels", "one"], env=subprocess_env(1),
                            capture_output=True, text=True)
    assert labels.returncode == 2 and "--labels has 1 labels for 2 runs" in labels.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\nnot json\n")
    corrupt = subprocess.run(cmd[:4] + [str(tmp_path / "bad")], env=subprocess_env(1),
                             capture_output=True, text=True)
    assert corrupt.returncode == 2 and "metrics.jsonl:2: not a JSON record" in corrupt.stderr
