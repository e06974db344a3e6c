"""The ``mamba`` and ``mampa`` mixers: the C model against the float64 NumPy model (loss and
every gradient), the NumPy model's gradients against finite differences for the block's own
parameters, options and their refusals, training through the Python API and the command line
(the loss falls, checkpoints round-trip)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import assert_close, numerical_grad, subprocess_env
from mapformer import reference as ref
from mapformer.models import ModelConfig, Transformer, forward_flops
from mapformer.train import TrainConfig, load_checkpoint, train

VARIANTS = [("mamba", {}), ("mamba", {"zoh": True}), ("mampa", {}),
            ("mampa", {"signed_angle": True, "zoh": True}), ("mampa", {"mampa_alpha": True}),
            ("mampa", {"mampa_alpha": True, "signed_angle": True, "zoh": True})]


def tiny(name, options, vocab=11):
    return ModelConfig.preset(name, vocab, d_model=32, n_heads=2, d_state=6, **options)


def batch(rng, vocab=11, shape=(2, 9)):
    return (rng.integers(0, vocab, shape), rng.integers(0, vocab, shape),
            rng.random(shape) < 0.7)


@pytest.mark.parametrize("name,options", VARIANTS)
def test_c_model_matches_the_numpy_model(name, options):
    """float32 C ops against the float64 reference ops, the same parameters: the loss and the
    whole gradient agree to float32's accuracy over a block (normwise 1e-4)."""
    config = tiny(name, options)
    data = batch(np.random.default_rng(0))
    c, ref = Transformer(config, seed=1, backend="c"), Transformer(config, seed=1,
                                                                    backend="numpy")
    assert abs(c.loss(*data) - ref.loss(*data)) < 1e-5
    c.backward()
    ref.backward()
    err = np.abs(c.params.grad - ref.params.grad).max()
    assert err <= 1e-4 * np.abs(ref.params.grad).max(), err
    for p in c.params.params:  # every parameter gets a gradient signal
        if not p.endswith(("scheme",)):
            assert np.any(ref.params.params[p].grad != 0), p


def test_delta_trace_is_the_forward_step():
    """The ``delta`` trace (the scan forms the steps inside): softplus of the forward's
    dt product plus the bias that forward read, (B, T, E), also after an optimizer has moved
    the bias."""
    model = Transformer(tiny("mamba", {}), seed=1)
    data = batch(np.random.default_rng(0))
    model.loss(*data)
    mixer = model.blocks[0].mixer
    bias = model.params.params["blocks.0.mixer.dt.bias"].value
    expected = ref.softplus_forward(mixer.dt_pre.astype(np.float64) + bias)
    bias += 1.0
    assert mixer.delta.shape == (2, 9, mixer.E)
    assert_close(mixer.delta, expected, "default", "delta")


@pytest.mark.parametrize("name,options", VARIANTS)
def test_numpy_model_gradients_by_finite_differences(name, options):
    """The block's parameters (a few entries of each), scaled up so the mixer dominates."""
    config = tiny(name, options)
    model = Transformer(config, seed=2, backend="numpy")
    out = model.params.params["blocks.0.mixer.out.weight"]
    out.value *= 50  # the 0.02-std init leaves the mixer's gradients near rounding level
    data = batch(np.random.default_rng(3), shape=(1, 7))
    model.loss(*data)
    model.backward()
    for pname, p in model.params.params.items():
        if ".mixer." not in pname:
            continue
        flat, grad = p.value.reshape(-1), p.grad.reshape(-1)
        idx = np.arange(min(4, flat.size))
        sub = flat[idx].copy()

        def loss():
            flat[idx] = sub
            return model.loss(*data)
        fd = numerical_grad(loss, sub)
        flat[idx] = sub
        assert_close(grad[idx], fd, "gradient", pname)


def test_options_and_refusals():
    config = ModelConfig.preset("mampa", 11, d_model=32, n_heads=2, d_state=8, expand=3,
                                dt_rank=5, signed_angle=True, mampa_alpha=True)
    model = Transformer(config)
    p = model.params.params
    assert p["blocks.0.mixer.omega"].shape == (96, 4)
    assert p["blocks.0.mixer.alpha_log"].shape == (96, 4)
    assert p["blocks.0.mixer.dt_angle.weight"].shape == (96, 5)
    assert p["blocks.0.mixer.conv_weight"].shape == (96, 4)
    delta0 = np.log1p(np.exp(p["blocks.0.mixer.dt.bias"].value))  # softplus of the bias
    assert delta0.min() >= 1e-3 * 0.999 and delta0.max() <= 1e-1 * 1.001
    np.testing.assert_allclose(np.exp(p["blocks.0.mixer.alpha_log"].value[5]), [1, 2, 3, 4],
                               rtol=1e-6)
    assert "blocks.0.mixer.alpha_log" not in Transformer(  # the default: no decay
        ModelConfig.preset("mampa", 11, d_model=32, n_heads=2)).params.params
    mamba = Transformer(ModelConfig.preset("mamba", 11, d_model=32, n_heads=2)).params.params
    np.testing.assert_allclose(np.exp(mamba["blocks.0.mixer.A_log"].value[0]),
                               np.arange(1, 17), rtol=1e-6)
    assert mamba["blocks.0.mixer.x_dt.weight"].shape == (2, 64)  # dt_rank ceil(32 / 16)
    assert not any(mamba["blocks.0.mixer." + n].decay for n in ("A_log", "D", "dt.bias"))
    with pytest.raises(ValueError, match="d_state must be even"):
        Transformer(ModelConfig.preset("mampa", 11, d_model=32, n_heads=2, d_state=5))
    with pytest.raises(ValueError, match="signed_angle"):
        ModelConfig.preset("mamba", 11, signed_angle=True)
    with pytest.raises(ValueError, match="mixer 'mamba' takes positional schemes"):
        ModelConfig(vocab_size=11, mixer="mamba", positional="mapwm")
    flops = forward_flops(config, 4, 10) - forward_flops(
        ModelConfig.preset("mampa", 11, d_model=32, n_heads=2, d_state=8, expand=3, dt_rank=5,
                           mampa_alpha=True), 4, 10)
    assert flops == 2 * 40 * 5 * 96  # the signed angle's projection


TASK = dict(dims=1, steps=10, grid_size=5, p_empty=0.5, n_objects=4)


@pytest.mark.parametrize("name", ["mamba", "mampa"])
def test_training_lowers_the_loss_and_checkpoints_round_trip(name, tmp_path):
    train_config = TrainConfig(**TASK, sequences=160, batch_size=16, eval_sequences=8, lr=3e-3,
                               eval_every=5, log_every=1)
    config = ModelConfig.preset(name, train_config.task_config().vocab_size, d_model=32,
                                n_heads=2, d_state=8)
    result = train(config, train_config, out_dir=tmp_path, progress=False, log=lambda *a: None)
    records = [json.loads(line) for line in
               (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 10 and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.1, losses
    model, _, _, step = load_checkpoint(tmp_path / "checkpoint.npz")
    assert step == 10 and model.config == config
    np.testing.assert_array_equal(model.params.data, result["model"].params.data)


def test_cli_trains_mampa_with_options(tmp_path):
    args = [sys.executable, "-m", "mapformer", "train", "--dims", "1", "--steps", "8",
            "--grid-size", "4", "--n-objects", "3", "--sequences", "32", "--batch-size", "16",
            "--eval-sequences", "4", "--d-model", "32", "--n-heads", "2", "--mixer", "mampa",
            "--positional", "none", "--signed-angle", "true", "--d-state", "4",
            "--out", str(tmp_path), "--no-progress", "--json"]
    run = subprocess.run(args, env=subprocess_env(1), capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["steps"] == 2
    model = load_checkpoint(tmp_path / "checkpoint.npz")[0]
    assert model.config.mixer == "mampa" and model.config.options["signed_angle"] is True
    assert model.config.options["omega_grid"] == 4.0  # MapWM's frequency init from the task
