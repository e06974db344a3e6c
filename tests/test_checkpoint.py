"""Training state (issue 13): checkpoints are atomic, never hold non-finite values, are
validated field by field when read (corrupt files give one clear message), resume is exact
with dropout on; ids beyond int32, negative mask weights and a task with nothing to score are
refused; the command line ends expected errors in one line, never a traceback."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import subprocess_env
from mapformer.models import ModelConfig, Transformer
from mapformer.train import (CheckpointError, TrainConfig, load_checkpoint, save_checkpoint,
                             temp_path, train)

TINY_TASK = dict(dims=1, steps=12, grid_size=6, p_empty=0.5, n_objects=5)
QUIET = dict(progress=False, log=lambda *a: None)


def tiny(dropout=0.0, **train_fields):
    train_config = TrainConfig(**{**TINY_TASK, "sequences": 64, "batch_size": 16,
                                  "eval_sequences": 8, **train_fields})
    model_config = ModelConfig.preset("mapwm", train_config.task_config().vocab_size,
                                      d_model=32, n_heads=2, omega_grid=6.0, dropout=dropout)
    return model_config, train_config


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of a 4-step run, and its arrays and meta."""
    path = tmp_path_factory.mktemp("saved") / "checkpoint.npz"
    train(*tiny(), out_dir=path.parent, **QUIET)
    with np.load(path) as f:
        arrays = dict(f)
    return path, arrays, json.loads(str(arrays["meta"]))


def rewrite(tmp_path, arrays, meta=None, **changes):
    path = tmp_path / "edited.npz"
    arrays = {**arrays, **changes}
    if meta is not None:
        arrays["meta"] = json.dumps(meta)
    np.savez(path, **arrays)
    return path


# ---- what load_checkpoint refuses, naming the field ----------------------------------------

@pytest.mark.parametrize("name, value, words", [
    ("m", np.zeros(1, np.float32), "m must be float32 of shape"),
    ("v", None, "v must be float32 of shape"),            # float64
    ("params", None, "params holds non-finite values"),   # a NaN
    ("v", -1.0, "v (AdamW's second moment) must be >= 0"),
])
def test_inconsistent_arrays_are_refused_naming_the_field(saved, tmp_path, name, value, words):
    _, arrays, _ = saved
    a = arrays[name].copy()
    if name == "v" and value is None:
        a = a.astype(np.float64)
    elif name == "params":
        a[5] = np.nan
    elif isinstance(value, float):
        a[3] = value
    else:
        a = value
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_checkpoint(rewrite(tmp_path, arrays, **{name: a}))


@pytest.mark.parametrize("step", [10**9, -1, 2.5, True])
def test_step_out_of_range_is_refused(saved, tmp_path, step):
    _, arrays, meta = saved
    with pytest.raises(CheckpointError, match="step"):
        load_checkpoint(rewrite(tmp_path, arrays, {**meta, "step": step}))


def test_bad_dropout_state_and_configs_are_refused(saved, tmp_path):
    _, arrays, meta = saved
    with pytest.raises(CheckpointError, match="dropout_rng"):
        load_checkpoint(rewrite(tmp_path, arrays, {**meta, "dropout_rng": {"bit_generator": 3}}))
    with pytest.raises(CheckpointError, match="configuration"):
        load_checkpoint(rewrite(tmp_path, arrays, {**meta, "train": {"lr": -1.0}}))


def corrupt_versions(path, tmp_path):
    data = path.read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data[:len(data) // 2])
    flipped = bytearray(data)
    start = data.index(b"params.npy")  # a byte inside the (stored, uncompressed) parameters
    flipped[start + 400] ^= 0xFF
    bad_crc = tmp_path / "bad_crc.npz"
    bad_crc.write_bytes(bytes(flipped))
    text = tmp_path / "text.npz"
    text.write_text("this is not a checkpoint\n")
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    return [truncated, bad_crc, text, empty]


def test_corrupt_files_give_one_clear_message(saved, tmp_path):
    for bad in corrupt_versions(saved[0], tmp_path):
        with pytest.raises(CheckpointError, match=r"is not a readable checkpoint") as info:
            load_checkpoint(bad)
        assert str(bad) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        load_checkpoint(tmp_path / "missing.npz")


# ---- writing ----------------------------------------------------------------------------

def test_non_finite_state_is_never_written(saved, tmp_path):
    model, optimizer, train_config, step = load_checkpoint(saved[0])
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, model, optimizer, train_config, step)
    before = path.read_bytes()
    p = model.params.params["head.weight"]
    model.params.data[p.offset + 1] = np.inf
    with pytest.raises(FloatingPointError, match=r"step 4: the parameter 'head.weight'"):
        save_checkpoint(path, model, optimizer, train_config, step)
    model.params.data[p.offset + 1] = 0.0
    optimizer.v[p.offset] = np.nan
    with pytest.raises(FloatingPointError, match=r"second moment \(v\) of 'head.weight'"):
        save_checkpoint(path, model, optimizer, train_config, step)
    assert path.read_bytes() == before and not temp_path(path).exists()


def test_diverging_run_keeps_the_last_good_checkpoint(tmp_path):
    """lr 1e3 diverges within a few steps: the run stops naming the step, and the checkpoint
    on disk is the last finite one (it had been overwritten with NaN parameters)."""
    model_config, train_config = tiny(lr=1e3, checkpoint_every=1, sequences=160, batch_size=8)
    with pytest.raises(FloatingPointError, match=r"training diverged at step (\d+)") as info:
        train(model_config, train_config, out_dir=tmp_path, **QUIET)
    failed = int(re.search(r"step (\d+)", str(info.value)).group(1))
    _, _, _, step = load_checkpoint(tmp_path / "checkpoint.npz")  # finite, or it would raise
    assert step < failed


def test_write_interrupted_keeps_the_old_checkpoint_and_no_temp(saved, tmp_path, monkeypatch):
    model, optimizer, train_config, step = load_checkpoint(saved[0])
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, model, optimizer, train_config, step)
    before = path.read_bytes()

    def killed(file, **arrays):
        file.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, model, optimizer, train_config, step)
    assert path.read_bytes() == before and not temp_path(path).exists()


def test_stale_temp_file_is_removed_on_start(tmp_path):
    stale = temp_path(tmp_path / "checkpoint.npz")
    stale.write_bytes(b"\0" * 1000)  # what a kill during the write left
    lines = []
    train(*tiny(sequences=16), out_dir=tmp_path, progress=False, log=lines.append)
    assert not stale.exists() and any("removed" in line for line in lines)
    load_checkpoint(tmp_path / "checkpoint.npz")


def test_resume_is_exact_with_dropout(tmp_path):
    """Stopped after step 2 of 6 with dropout 0.2 and resumed: the same bits as a run never
    stopped (the dropout generator's state is in the checkpoint; it differed by 1e-4)."""
    model_config, train_config = tiny(dropout=0.2, checkpoint_every=2, eval_every=2,
                                      sequences=96)
    whole = train(model_config, train_config, out_dir=tmp_path / "whole", **QUIET)
    calls = []

    def crash_at_second_eval(*args):  # the two start lines, the step-2 eval, the step-4 one
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(model_config, train_config, out_dir=tmp_path / "cut", progress=False,
              log=crash_at_second_eval)
    checkpoint = tmp_path / "cut" / "checkpoint.npz"
    assert load_checkpoint(checkpoint)[3] == 2
    resumed = train(model_config, train_config, resume=checkpoint, **QUIET)
    np.testing.assert_array_equal(resumed["model"].params.data, whole["model"].params.data)


# ---- inputs the loss refuses ---------------------------------------------------------------

def test_ids_beyond_int32_and_negative_mask_weights_are_refused():
    model = Transformer(ModelConfig(vocab_size=7, d_model=16, n_heads=1, positional="rope"))
    tokens = np.ones((2, 3), np.int64)
    targets, mask = np.ones((2, 3), np.int64), np.ones((2, 3), bool)
    for name in ("tokens", "targets"):
        args = {"tokens": tokens.copy(), "targets": targets.copy(), "mask": mask}
        args[name][1, 2] = 2**40  # a cast to int32 would make it 0, a valid id
        with pytest.raises(ValueError, match=rf"^{name}\[1, 2\] = 1099511627776 does not fit"):
            model.loss(**args)
    weights = np.ones((2, 3), np.float32)
    for bad in (-0.5, np.nan, np.inf):
        weights[0, 1] = bad
        with pytest.raises(ValueError, match=r"^mask\[0, 1\] = .* must be a finite weight"):
            model.loss(tokens, targets, weights)
    assert np.isfinite(model.loss(tokens, targets, np.abs(weights.clip(0, 1))))


def test_c_loss_refuses_negative_mask_weights():
    from mapformer import _C
    logits, targets = np.zeros((3, 4), np.float32), np.zeros(3, np.int32)
    for op in (lambda m: _C.softmax_xent_forward(logits, targets, m),
               lambda m: _C.softmax_xent_backward(logits, targets, m, 1.0)):
        with pytest.raises(ValueError, match=r"^mask\[2\] = -1 must be a finite weight >= 0"):
            op(np.array([1, 1, -1], np.float32))


def test_task_with_no_scored_position_is_refused(tmp_path):
    model_config, train_config = tiny(steps=1, sequences=16)
    with pytest.raises(ValueError, match="no position to score"):
        train(model_config, train_config, out_dir=tmp_path, **QUIET)
    assert not (tmp_path / "checkpoint.npz").exists()


# ---- the command line -------------------------------------------------------------------

def cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "mapformer", *argv], env=subprocess_env(1),
                          capture_output=True, text=True, cwd=cwd)


def test_cli_errors_are_one_line_without_traceback(saved, tmp_path):
    nan = tmp_path / "nan.npz"
    params = saved[1]["params"].copy()
    params[0] = np.nan
    np.savez(nan, **{**saved[1], "params": params})
    tiny_flags = ["--dims", "1", "--grid-size", "4", "--d-model", "32", "--n-heads", "2",
                  "--eval-sequences", "8", "--no-progress"]
    cases = [  # (argv, exit status, words of the message)
        (["eval", str(nan)], 2, "params holds non-finite values"),
        (["eval", str(tmp_path / "missing.npz")], 2, "no such checkpoint file"),
        (["eval", str(corrupt_versions(saved[0], tmp_path)[2])], 2, "not a readable"),
        (["train", "--batch-size", str(10**23), "--sequences", "8", *tiny_flags], 2,
         "batch_size"),
        (["train", "--steps", "1", "--sequences", "16", "--batch-size", "8", *tiny_flags], 2,
         "no position to score"),
        (["train", "--steps", "8", "--lr", "1e3", "--sequences", "160", "--batch-size", "8",
          "--checkpoint-every", "1", "--out", str(tmp_path / "run"), *tiny_flags], 1,
         "training diverged at step"),
    ]
    for argv, status, words in cases:
        done = cli(*argv, cwd=tmp_path)
        assert done.returncode == status, (argv, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("python -m mapformer: error: ") and words in last, done.stderr
    load_checkpoint(tmp_path / "run" / "checkpoint.npz")  # the diverged run's last good one


KEEP_WRITING = """
import sys
from mapformer.train import load_checkpoint, save_checkpoint
model, optimizer, config, step = load_checkpoint(sys.argv[1])
print("writing", flush=True)
while True:
    save_checkpoint(sys.argv[2], model, optimizer, config, step)
"""


def test_kill_during_writes_leaves_a_loadable_checkpoint(saved, tmp_path):
    """A child rewrites the checkpoint in a loop and is killed (SIGKILL) at three moments:
    each time the checkpoint loads (the kill lands before, during or after a write; a stale
    temporary file may stay, and the next run removes it)."""
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(saved[0].read_bytes())
    for delay in (0.05, 0.2, 0.45):
        child = subprocess.Popen([sys.executable, "-c", KEEP_WRITING, str(saved[0]), str(path)],
                                 env=subprocess_env(1), stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "writing"
        try:
            child.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            child.kill()
        child.wait()
        child.stdout.close()
        assert child.returncode == -9
        load_checkpoint(path)
