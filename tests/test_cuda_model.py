"""The model-level CUDA backend (mapformer.backend.cuda_backend): the Python layers, the
trainer, checkpoints and the command line on the CUDA kernels. Without a GPU the backend is
built from the kernels compiled for the CPU emulation of CUDA's model
(tests/cuda_emulation.py) with NumPy as its ``xp``: a RoPE transformer (embedding, layernorm,
linear, mlp, path_integration, rotary, attention, residual, softmax_xent, grad_norm, adamw:
every op with a kernel) must give the C backend's loss, logits, gradients and AdamW update,
and checkpoints must load across the two backends. On a GPU (CuPy and a CUDA build) the same
model runs on ``backend="cuda"``; that test alone skips without one."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import assert_close
from cuda_emulation import kernels as cuda_kernels
from mapformer import __main__ as cli
from mapformer import backend as backends
from mapformer import cuda
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import navigation
from mapformer.train import AdamW, TrainConfig, load_checkpoint, save_checkpoint, train

# 6 tokens a sequence, every position scored: the emulation runs a block's threads as real
# threads, so rows are what it pays for
TASK = dict(task="navigation", dims=2, steps=3, grid_size=4, p_empty=0.3, n_objects=5,
            loss_positions="all", ood_dense="steps=3", ood_sparse="steps=3")


@pytest.fixture(scope="module")
def kernels():
    return cuda_kernels().ops()


@pytest.fixture(scope="module")
def emulated(kernels):
    return backends.cuda_backend(kernels, np, np.asarray)


def config(train_config, n_layers=1, **values):
    return ModelConfig.for_task("rope", train_config.task_config(), d_model=32, n_heads=2,
                                n_layers=n_layers, **values)


def compare_steps(model, c_model, train_config, steps=2):
    """``steps`` training steps of ``model`` against the C model, each from the C model's
    state (parameters and AdamW moments): the loss, logits, every gradient, the gradient norm
    and the updated parameters agree to float32 tolerances."""
    opt, c_opt = AdamW(model, train_config), AdamW(c_model, train_config)
    to_numpy = model.ops.to_numpy
    task = train_config.task_config()
    for step in range(steps):
        for dst, src in ((model.params.data, c_model.params.data), (opt.m, c_opt.m),
                         (opt.v, c_opt.v)):
            dst[:] = model.ops.asarray(src)
        model.rng.bit_generator.state = c_model.rng.bit_generator.state  # dropout masks
        batch = navigation.generate(task, 2, np.random.default_rng([5, step]))
        mask = np.ones(batch.tokens.shape, bool)
        loss = model.loss(batch.tokens, batch.targets, mask)
        c_loss = c_model.loss(batch.tokens, batch.targets, mask)
        assert loss == pytest.approx(c_loss, rel=2e-5), f"loss at step {step}"
        assert_close(to_numpy(model.logits), c_model.logits, "reduction", f"logits {step}")
        model.backward()
        c_model.backward()
        for name, p in c_model.params.params.items():
            got = to_numpy(model.params.params[name].grad)
            scale = float(np.abs(p.grad).max())
            np.testing.assert_allclose(got, p.grad, rtol=1e-3, atol=1e-3 * scale + 1e-7,
                                       err_msg=f"gradient of {name} at step {step}")
        lr = 1e-2
        assert opt.step(lr) == pytest.approx(c_opt.step(lr), rel=1e-4), f"norm at {step}"
        # AdamW moves each entry by about lr times the sign of its gradient: the update agrees
        # to a fraction of lr wherever the gradient stands clear of float32 rounding (a
        # near-zero entry's sign is rounding's)
        for name, p in c_model.params.params.items():
            clear = np.abs(p.grad) > 1e-2 * np.abs(p.grad).max()
            np.testing.assert_allclose(to_numpy(model.params.params[name].value)[clear],
                                       p.value[clear], rtol=0, atol=1e-2 * lr,
                                       err_msg=f"{name} after step {step}")


def test_rope_model_steps_match_the_c_backend(emulated):
    train_config = TrainConfig(**TASK, sequences=4, batch_size=2, lr=1e-2)
    cfg = config(train_config, n_layers=2, dropout=0.1)
    model = Transformer(cfg, seed=4, backend=emulated)
    c_model = Transformer(cfg, seed=4, backend="c")
    assert model.ops is emulated and model.ops.name == "cuda"
    assert np.array_equal(model.ops.to_numpy(model.params.data), c_model.params.data)
    compare_steps(model, c_model, train_config)


def test_checkpoints_load_across_backends(emulated, tmp_path):
    """train() on the CUDA backend writes a host float32 checkpoint that the C backend loads
    bit for bit (and evaluates to the same loss); a C checkpoint loads on the CUDA backend."""
    train_config = TrainConfig(**TASK, sequences=4, batch_size=2, lr=1e-2, eval_sequences=2,
                               eval_batch_size=2)
    result = train(config(train_config), train_config, out_dir=tmp_path / "cuda",
                   progress=False, log=lambda *_: None, backend=emulated,
                   eval_tasks={"iid": train_config.task_config()})
    trained = result["model"]
    assert trained.ops is emulated and 0.0 <= result["eval"]["iid"]["accuracy"] <= 1.0
    path = tmp_path / "cuda" / "checkpoint.npz"
    c_model, c_opt, _, step = load_checkpoint(path, "c")
    assert step == 2 and c_model.ops is backends.C
    assert np.array_equal(c_model.params.data, trained.params.data)
    back, opt, _, _ = load_checkpoint(path, emulated)
    assert back.ops is emulated and np.array_equal(back.params.data, c_model.params.data)
    assert np.array_equal(opt.v, c_opt.v) and opt.step_count == c_opt.step_count == 2
    batch = navigation.generate(train_config.task_config(), 2, np.random.default_rng(9))
    mask = np.ones(batch.tokens.shape, bool)
    assert back.loss(batch.tokens, batch.targets, mask) == pytest.approx(
        c_model.loss(batch.tokens, batch.targets, mask), rel=2e-5)
    save_checkpoint(tmp_path / "c.npz", c_model, c_opt, train_config, step)
    again, _, _, _ = load_checkpoint(tmp_path / "c.npz", emulated)
    assert np.array_equal(again.params.data, c_model.params.data)


def assert_model_matches_c(cfg, emulated, rng, steps):
    """A model of ``cfg`` (vocabulary 9) on the emulated backend against the C backend, the
    same seed, on a batch of 2 x ``steps`` random tokens: the loss and every gradient."""
    tokens, targets = rng.integers(0, 9, (2, steps)), rng.integers(0, 9, (2, steps))
    mask = np.ones((2, steps), bool)
    model, c_model = Transformer(cfg, seed=1, backend=emulated), Transformer(cfg, seed=1)
    assert model.loss(tokens, targets, mask) == pytest.approx(
        c_model.loss(tokens, targets, mask), rel=2e-5)
    model.backward()
    c_model.backward()
    for name, p in c_model.params.params.items():
        np.testing.assert_allclose(model.params.params[name].grad, p.grad, rtol=1e-3,
                                   atol=1e-3 * float(np.abs(p.grad).max()) + 1e-7,
                                   err_msg=f"gradient of {name}")


@pytest.mark.parametrize("name,options", [("mamba", {}), ("mampa", {}),
                                          ("mampa", {"signed_angle": True, "zoh": True,
                                                     "mampa_alpha": True})])
def test_mamba_models_match_the_c_backend(emulated, rng, name, options):
    """Mamba and MAMPa (cuda/scan.cu's step: dt's bias and softplus inside the scan, the
    rotation sharing the step unless signed_angle) in a model: the C backend's loss and
    gradients."""
    cfg = ModelConfig.preset(name, 9, d_model=32, n_heads=2, d_state=6, **options)
    assert_model_matches_c(cfg, emulated, rng, steps=5)


def test_lstm_vq_model_matches_the_c_backend(emulated, rng):
    """The LSTM mixer and the VQ bottleneck (cuda/lstm.cu, cuda/vq.cu) in a model: the C
    backend's loss and gradients."""
    cfg = ModelConfig(vocab_size=9, d_model=32, n_heads=2, mixer="lstm", positional="none",
                      bottleneck="vq")
    assert_model_matches_c(cfg, emulated, rng, steps=3)


def test_command_line_backend_cuda(emulated, tmp_path, monkeypatch, capsys):
    """``train --backend cuda`` trains on the CUDA backend (here the emulated one, standing in
    for the GPU's) and ``eval --backend c`` reads its checkpoint."""
    monkeypatch.setitem(backends.BACKENDS, "cuda", emulated)
    flags = ["--task", "navigation", "--steps", "3", "--grid-size", "4", "--n-objects", "5",
             "--loss-positions", "all", "--ood-dense", "steps=3", "--ood-sparse", "steps=3",
             "--model", "rope", "--d-model", "32", "--n-heads", "2", "--sequences", "2",
             "--batch-size", "2", "--eval-sequences", "2", "--eval-batch-size", "2"]
    assert cli.main(["train", "--backend", "cuda", "--out", str(tmp_path), "--no-progress",
                     "--json", *flags]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli.main(["eval", str(tmp_path / "checkpoint.npz"), "--backend", "c", "--json",
                     "--sequences", "2"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["iid"]["accuracy"] == pytest.approx(trained["eval"]["iid"]["accuracy"])


def test_command_line_without_a_cuda_build_says_how_to_get_one(monkeypatch, capsys):
    def unavailable():
        raise RuntimeError("mapformer was built without CUDA: " + cuda.HOW_TO_BUILD)

    monkeypatch.delitem(backends.BACKENDS, "cuda", raising=False)
    monkeypatch.setattr(backends, "_gpu_backend", unavailable)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--backend", "cuda", "--sequences", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MAPFORMER_CUDA=on pip install" in err


def test_a_family_without_kernels_is_named(kernels):
    """A model calling an op whose kernel is missing gets MissingKernel naming the op and its
    family (here the rotary family taken out of the kernels); ops of families added to
    mapformer.cuda.ops later are picked up by name."""
    partial = SimpleNamespace(**{k: v for k, v in vars(kernels).items()
                                 if not k.startswith("rotary_")},
                              newfamily_forward=lambda x: x)
    ops = backends.cuda_backend(partial, np, np.asarray, ("a", "b"))
    assert ops.newfamily_forward(3) == 3
    model = Transformer(ModelConfig.preset("rope", 9, d_model=32, n_heads=2), backend=ops)
    tokens = np.zeros((1, 4), np.int32)
    with pytest.raises(backends.MissingKernel, match="rotary_forward .family 'rotary'.*a, b"):
        model.forward(tokens)
    with pytest.raises(AttributeError):
        ops.not_an_op  # noqa: B018


def test_gpu_model_matches_the_c_backend():
    """On a GPU: Transformer(cfg, backend='cuda') against the C backend (skips without one:
    no CUDA build, CuPy or device)."""
    try:
        ops = backends.get("cuda")
    except RuntimeError as error:
        pytest.skip(f"no GPU: {error}")
    train_config = TrainConfig(**TASK, sequences=4, batch_size=2, lr=1e-2)
    cfg = config(train_config, n_layers=2, dropout=0.1)
    compare_steps(Transformer(cfg, seed=4, backend="cuda"), Transformer(cfg, seed=4),
                  train_config)
    assert ops.xp.__name__ == "cupy"
