"""Data-parallel training over MPI (mapformer.parallel; mpi4py on the mpich wheel): 2 ranks
with batch 8 give the parameters of one process with batch 8 to float32 tolerance after 20
steps, the ranks' parameters bit-identical; rank 0 alone writes the checkpoint and metrics,
and a checkpoint resumes on either K; the CLI flag, and the models it refuses."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import subprocess_env

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "dp_train.py"


def mpiexec():
    """The mpich wheel's mpiexec beside this interpreter (else the one on PATH)."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def run(ranks, *args):
    command = [sys.executable, str(SCRIPT), *args]
    if ranks > 1:
        command = [mpiexec(), "-n", str(ranks), *command, "--parallel"]
    return subprocess.run(command, env=subprocess_env(1), capture_output=True, text=True,
                          timeout=300, cwd=HERE)


def params(out, ranks, rank=0):
    return np.load(out / f"params_{ranks}_{rank}.npy")


def test_two_ranks_match_one_process_and_each_other(tmp_path):
    for ranks in (1, 2):
        done = run(ranks, "--out", str(tmp_path), "--checkpoints", str(tmp_path / f"k{ranks}"))
        assert done.returncode == 0, done.stderr[-3000:]
    one, first, second = params(tmp_path, 1), params(tmp_path, 2, 0), params(tmp_path, 2, 1)
    assert first.tobytes() == second.tobytes()  # one update on every rank
    assert not np.array_equal(one, params_at_init(tmp_path))
    np.testing.assert_allclose(first, one, rtol=1e-4, atol=1e-5)
    # rank 0 alone wrote the checkpoint and the metrics; their records match one process's
    lines = [json.loads(x) for x in (tmp_path / "k2" / "metrics.jsonl").read_text().splitlines()]
    want = [json.loads(x) for x in (tmp_path / "k1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [r["step"] for r in want]
    for got, expected in zip(lines, want):
        if "loss" in got:
            assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
            assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-9)
    assert (tmp_path / "k2" / "checkpoint.npz").is_file()


def params_at_init(tmp_path):
    code = ("import numpy as np; from mapformer.models import ModelConfig, Transformer; "
            "from mapformer.train import TrainConfig; "
            "c = TrainConfig(sequences=160, batch_size=8, steps=16, grid_size=8, seed=3); "
            "m = Transformer(ModelConfig.for_task('mapwm', c.task_config(), d_model=32, "
            "n_heads=2), seed=3); np.save('init.npy', m.params.data)")
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(1), cwd=tmp_path,
                   check=True)
    return np.load(tmp_path / "init.npy")


def test_checkpoint_resumes_on_either_k(tmp_path):
    """A K = 2 job aborted at step 10's evaluation (before that step's checkpoint: the one
    left is step 5's) resumes with K = 2, bit for bit the uninterrupted K = 2 run, and with
    K = 1, to float32 tolerance."""
    whole = tmp_path / "whole"
    whole.mkdir()
    assert run(2, "--out", str(whole)).returncode == 0
    stopped = run(2, "--out", str(tmp_path), "--checkpoints", str(tmp_path / "ck"),
                  "--stop-at", "10")
    assert stopped.returncode != 0 and not (tmp_path / "params_2_0.npy").exists()
    meta = json.loads(str(np.load(tmp_path / "ck" / "checkpoint.npz")["meta"]))
    assert meta["step"] == 5
    for ranks in (2, 1):
        shutil.copy(tmp_path / "ck" / "checkpoint.npz", tmp_path / f"from_{ranks}.npz")
        done = run(ranks, "--out", str(tmp_path), "--resume", str(tmp_path / f"from_{ranks}.npz"))
        assert done.returncode == 0, done.stderr[-3000:]
    assert params(tmp_path, 2).tobytes() == params(whole, 2).tobytes()
    assert params(tmp_path, 2, 1).tobytes() == params(whole, 2).tobytes()
    np.testing.assert_allclose(params(tmp_path, 1), params(whole, 2), rtol=1e-4, atol=1e-5)


def test_cli_data_parallel_and_what_it_refuses(tmp_path):
    common = [sys.executable, "-m", "mapformer", "train", "--data-parallel", "--steps", "16",
              "--grid-size", "8", "--d-model", "32", "--batch-size", "8", "--sequences", "32",
              "--eval-sequences", "4", "--no-progress", "--json"]
    env = subprocess_env(1)
    done = subprocess.run([mpiexec(), "-n", "2", *common], env=env, capture_output=True,
                          text=True, timeout=600, cwd=HERE.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert json.loads(lines[-1])["steps"] == 4  # 32 sequences of batch 8
    assert sum(x.startswith("training mapwm") for x in lines) == 1  # rank 0 alone prints
    assert sum(x.startswith("{") for x in lines) == 1
    for extra, word in ((["--dropout", "0.1"], "dropout"), (["--batch-size", "1"], "ranks")):
        bad = subprocess.run([mpiexec(), "-n", "2", *common, *extra], env=env,
                             capture_output=True, text=True, timeout=600, cwd=HERE.parent)
        assert bad.returncode != 0
        errors = [x for x in bad.stderr.splitlines() if x.startswith("python -m mapformer")]
        assert errors and word in errors[0] and "Traceback" not in bad.stderr
    assert os.path.exists(mpiexec())
