"""Training state (issue 13): checkpoints are atomic, never hold non-finite values, are
validated field by field when read (corrupt files give one clear message; the config is
checked against the arrays before the model is built), resume is exact with dropout on; ids
beyond int32, negative mask weights and a task with nothing to score are refused; the
command line ends expected errors in one line, never a traceback (out of memory, a C core
that does not load and --import included)."""
import json
import os
import re
import resource
import subprocess
import sys

import numpy as np
import pytest

from conftest import subprocess_env
from mapformer.__main__ import main
from mapformer.models import ModelConfig, Transformer
from mapformer.train import (CheckpointError, TrainConfig, evaluate, load_checkpoint,
                             save_checkpoint, temp_path, train)

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


def test_bare_npy_is_refused(saved, tmp_path):
    """np.load gives a bare .npy as an array, not a context manager (it was a TypeError)."""
    path = tmp_path / "params.npy"
    np.save(path, saved[1]["params"])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == f"{path} is not a checkpoint: a bare array, not an .npz"


def test_config_is_checked_against_the_arrays_before_the_model_is_built(saved, tmp_path):
    """A config edited to ask for a 192 GiB model (d_model 65536) is refused from the stored
    arrays' size, not built (it allocated 192 GiB); a smaller edit names both counts."""
    _, arrays, meta = saved
    size = arrays["params"].shape[0]
    vocab = meta["model"]["vocab_size"]
    huge = rewrite(tmp_path, arrays, {**meta, "model": {**meta["model"], "d_model": 65536,
                                                         "n_heads": 512}})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(huge)
    assert str(info.value) == (
        f"{huge}: the saved configuration does not describe the {size} parameters that params "
        f"holds: the parameters reach {vocab * 65536} at 'embed.weight' ({vocab}, 65536), past "
        f"{size}")
    narrower = {**meta["model"], "mlp_ratio": 1}
    fewer = Transformer(ModelConfig.from_dict(narrower), backend="numpy").params.size
    assert fewer < size
    path = rewrite(tmp_path, arrays, {**meta, "model": narrower})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (f"{path}: params must be float32 of shape ({fewer},) (the "
                               "parameters the saved config describes), got float32 of shape "
                               f"({size},)")


def test_a_task_vocabulary_beyond_the_model_is_named(saved, tmp_path):
    """A run whose task has more tokens than the model: the mismatch, not a token index."""
    _, arrays, meta = saved
    path = rewrite(tmp_path, arrays, {**meta, "train": {**meta["train"], "n_objects": 50}})
    model, _, train_config, _ = load_checkpoint(path)
    task_vocab = train_config.task_config().vocab_size
    message = (f"iid: the task's vocabulary ({task_vocab}) exceeds the model's "
               f"({model.config.vocab_size})")
    with pytest.raises(ValueError) as info:
        evaluate(model, train_config.eval_tasks(), 4)
    assert str(info.value) == message and task_vocab > model.config.vocab_size
    with pytest.raises(ValueError, match=r"^sequences must be >= 1, got 0$"):
        evaluate(model, TrainConfig(**TINY_TASK).eval_tasks(), 0)


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

TINY_FLAGS = ["--dims", "1", "--grid-size", "4", "--d-model", "32", "--n-heads", "2",
              "--eval-sequences", "8", "--no-progress"]


def cli(*argv, cwd, env=None, **run):
    return subprocess.run([sys.executable, "-m", "mapformer", *argv],
                          env=env or subprocess_env(1), capture_output=True, text=True, cwd=cwd,
                          **run)


def test_cli_errors_are_one_line_without_traceback(saved, tmp_path):
    nan = tmp_path / "nan.npz"
    params = saved[1]["params"].copy()
    params[0] = np.nan
    np.savez(nan, **{**saved[1], "params": params})
    tiny_flags = TINY_FLAGS
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


def main_error(capsys, *argv):
    """The lines main(argv) writes on stderr, where it must exit with status 2."""
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    assert info.value.code == 2
    return capsys.readouterr().err.splitlines()


def error_of(call, *args):
    """The message of the ValueError ``call(*args)`` raises."""
    with pytest.raises(ValueError) as info:
        call(*args)
    return str(info.value)


def test_eval_refuses_in_one_line(saved, tmp_path, capsys):
    """A bare .npy, a config that asks for a 192 GiB model and a task vocabulary beyond the
    model's: each the Python API's message, on one line."""
    _, arrays, meta = saved
    npy = tmp_path / "params.npy"
    np.save(npy, arrays["params"])
    huge = tmp_path / "huge.npz"
    rewrite(tmp_path, arrays, {**meta, "model": {**meta["model"], "d_model": 65536,
                                                  "n_heads": 512}}).rename(huge)
    vocab = rewrite(tmp_path, arrays, {**meta, "train": {**meta["train"], "n_objects": 50}})
    model, _, train_config, _ = load_checkpoint(vocab)
    for path, message in [
            (npy, error_of(load_checkpoint, npy)), (huge, error_of(load_checkpoint, huge)),
            (vocab, error_of(evaluate, model, train_config.eval_tasks(), 4))]:
        assert main_error(capsys, "eval", path) == [f"python -m mapformer: error: {message}"]


@pytest.mark.parametrize("argv, line", [
    (["eval", "x.npz", "--sequences", "0"],
     "python -m mapformer eval: error: argument --sequences: must be an integer >= 1, got 0"),
    (["eval", "x.npz", "--sequences", "-3"],
     "python -m mapformer eval: error: argument --sequences: must be an integer >= 1, got -3"),
    (["map", "x.npz", "--angle-places", "0"],
     "python -m mapformer map: error: argument --angle-places: must be an integer >= 1, got 0"),
])
def test_zero_is_refused_not_read_as_the_default(capsys, argv, line):
    """eval --sequences 0 evaluated the default number of sequences."""
    lines = main_error(capsys, *argv)
    assert lines[0].startswith(f"usage: python -m mapformer {argv[0]} ") and lines[-1] == line


def test_out_dir_whose_checkpoint_is_a_directory_is_refused_before_training(tmp_path,
                                                                             capsys):
    """It failed only after training, when the checkpoint was renamed over the directory."""
    (tmp_path / "checkpoint.npz").mkdir()
    message = (f"out_dir: {tmp_path / 'checkpoint.npz'} is not a file, so the checkpoint "
               "cannot be written there")
    lines = []
    with pytest.raises(ValueError) as info:
        train(*tiny(), out_dir=tmp_path, progress=False, log=lines.append)
    assert str(info.value) == message and lines == []
    assert main_error(capsys, "train", "--steps", "8", "--sequences", "8", "--batch-size", "8",
                      *TINY_FLAGS, "--out", tmp_path) == [f"python -m mapformer: error: {message}"]
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("sizes", [["--batch-size", "200000", "--sequences", "200000"],
                                   ["--steps", "100000000", "--batch-size", "8"]])
def test_out_of_memory_is_one_line_saying_what_to_lower(tmp_path, sizes):
    """Under a 1 GiB address-space limit (a normal run of this size takes about 0.3 GiB), a
    batch of 200000 walks or a walk of 10^8 steps: it was a MemoryError traceback."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = cli("train", "--steps", "8", "--sequences", "8", *TINY_FLAGS, *sizes, cwd=tmp_path,
               preexec_fn=limit)
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(
        r"python -m mapformer: error: out of memory \((MemoryError|Unable to allocate .*)\): "
        r"lower the batch size \(--batch-size, --eval-batch-size\), the sequence length "
        r"\(--steps, --mean-length, \.\.\.\) or the model \(--d-model, --n-layers\)\n",
        done.stderr), done.stderr


@pytest.mark.parametrize("variable, value, message", [
    ("MAPFORMER_KERNELS", "garbage", r"the environment variable MAPFORMER_KERNELS must name a "
     r"kernel set this CPU runs: .*, got 'garbage'"),
    ("MAPFORMER_POOL_MB", "abc", r"MAPFORMER_POOL_MB must be a whole number of megabytes in "
     r"\[0, 2\*\*40\], got 'abc'"),
])
def test_a_c_core_that_does_not_load_is_one_line(tmp_path, variable, value, message):
    """An environment the C core refuses: an ImportError in Python, one line here (it was a
    traceback)."""
    env = {**subprocess_env(1), variable: value}
    done = cli("info", cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert re.fullmatch(f"python -m mapformer: error: {message}\n", done.stderr), done.stderr
    python = subprocess.run([sys.executable, "-c", "import mapformer.train"], env=env,
                            capture_output=True, text=True, cwd=tmp_path)
    assert python.returncode == 1
    assert re.fullmatch(f"ImportError: {message}", python.stderr.splitlines()[-1])


@pytest.mark.parametrize("argv, status, last, imported", [
    (["info", "--import", "marker"], 2,
     "python -m mapformer: error: unrecognized arguments: --import marker", False),
    (["train", "--out", "--import", "marker"], 2,
     "python -m mapformer train: error: argument --out: expected one argument", False),
    (["--import", "marker", "eval"], 2,
     "python -m mapformer eval: error: the following arguments are required: checkpoint",
     False),
    (["--imp", "marker", "info"], 2, "python -m mapformer: error: argument command: invalid "
     "choice: 'marker' (choose from 'train', 'eval', 'info', 'plot', 'map', 'reproduce')", False),
    (["--import", "marker", "--import=nowhere_such_module", "info"], 2,
     "python -m mapformer: error: --import nowhere_such_module: ModuleNotFoundError: No module "
     "named 'nowhere_such_module'", True),
    (["--import", "raising", "info"], 2,
     "python -m mapformer: error: --import raising: RuntimeError: raised on import", False),
    (["--import", "marker", "info"], 0, None, True),
])
def test_import_runs_only_from_its_place_once_the_line_parses(tmp_path, argv, status, last,
                                                              imported):
    """--import MODULE is documented before the command: after the command, as another flag's
    missing value or on a line refused without it, the module is never run; a missing or
    raising module is one line."""
    (tmp_path / "marker.py").write_text("open('imported', 'w').close()\n")
    (tmp_path / "raising.py").write_text("raise RuntimeError('raised on import')\n")
    env = subprocess_env(1)
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    done = cli(*argv, cwd=tmp_path, env=env)
    assert done.returncode == status, done.stderr
    assert (tmp_path / "imported").exists() == imported
    if last is None:
        assert done.stdout.startswith("mapformer ")
    else:
        lines = done.stderr.splitlines()
        assert lines[-1] == last and (len(lines) == 1 or lines[0].startswith("usage: ")), lines


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
