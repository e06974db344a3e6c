"""The model option gelu (tanh | erf) of every model's MLP: the exact GELU reaches the C ops
(ModelConfig options, the command line's --gelu, checkpoints), the C model matches the NumPy
backend's float64 model with it, and the default tanh keeps the previous bits."""
import numpy as np
import pytest

from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import navigation
from mapformer.train import TrainConfig, load_checkpoint, train

TASK = navigation.NavigationConfig(dims=2, steps=9, grid_size=4, p_empty=0.3, n_objects=5)
TINY = dict(d_model=32, n_heads=2, n_layers=2, omega_grid=4.0)
TRAIN = ["--dims", "1", "--steps", "6", "--grid-size", "4", "--n-objects", "3",
         "--sequences", "8", "--batch-size", "8", "--eval-sequences", "2", "--d-model", "32",
         "--n-heads", "2", "--no-progress", "--json"]


def loss_and_grads(config, backend, data=None):
    model = Transformer(config, seed=3, backend=backend)
    if data is not None:
        model.params.data[:] = data
    batch = navigation.generate(TASK, 3, np.random.default_rng(7))
    loss = model.loss(batch.tokens, batch.targets, batch.mask)
    model.backward()
    return model, loss, {name: p.grad.copy() for name, p in model.params.params.items()}


def test_erf_model_matches_numpy_backend(kernel):
    config = ModelConfig.preset("mapwm", TASK.vocab_size, gelu="erf", **TINY)
    assert config.options["gelu"] == "erf"
    c_model, c_loss, c_grads = loss_and_grads(config, "c")
    assert all(block.mlp.approximate == "none" for block in c_model.blocks)
    ref_model, ref_loss, ref_grads = loss_and_grads(config, "numpy", c_model.params.data)
    assert c_loss == pytest.approx(ref_loss, rel=2e-5)
    np.testing.assert_allclose(c_model.logits, ref_model.logits, rtol=1e-4, atol=2e-5)
    for name, want in ref_grads.items():  # as tests/test_model_golden.py
        scale = np.abs(want).max()
        np.testing.assert_allclose(c_grads[name], want, rtol=1e-3, atol=1e-3 * scale + 1e-7,
                                   err_msg=name)
    # the exact GELU is a different model than the tanh one (same parameters) ...
    tanh = ModelConfig.preset("mapwm", TASK.vocab_size, **TINY)
    _, ref_tanh_loss, ref_tanh_grads = loss_and_grads(tanh, "numpy", c_model.params.data)
    assert abs(ref_tanh_loss - ref_loss) > 1e-7
    # ... and naming the default gives the previous bits
    _, loss0, grads0 = loss_and_grads(tanh, "c")
    _, loss1, grads1 = loss_and_grads(ModelConfig.preset("mapwm", TASK.vocab_size, gelu="tanh",
                                                         **TINY), "c")
    assert loss0 == loss1 and all(np.array_equal(grads0[k], grads1[k]) for k in grads0)


def test_api_and_cli_train_a_step_with_erf(tmp_path):
    from mapformer.__main__ import main
    train_config = TrainConfig(dims=1, steps=6, grid_size=4, n_objects=3, sequences=8,
                               batch_size=8, eval_sequences=2)
    config = ModelConfig.for_task("mapwm", train_config.task_config(), d_model=32, n_heads=2,
                                  gelu="erf")
    result = train(config, train_config, out_dir=tmp_path / "api", progress=False,
                   log=lambda *a: None)
    assert result["steps"] == 1 and np.isfinite(result["loss"])
    model = load_checkpoint(tmp_path / "api" / "checkpoint.npz")[0]
    assert model.config == config and model.config.options["gelu"] == "erf"
    assert model.blocks[0].mlp.approximate == "none"
    assert np.array_equal(model.params.data, result["model"].params.data)
    main(["train", *TRAIN, "--gelu", "erf", "--out", str(tmp_path / "cli")])
    cli_model = load_checkpoint(tmp_path / "cli" / "checkpoint.npz")[0]
    assert cli_model.config == config  # the same run from the command line
    assert np.array_equal(cli_model.params.data, model.params.data)
    with pytest.raises(SystemExit):
        main(["train", *TRAIN, "--gelu", "exact", "--out", str(tmp_path / "bad")])
    with pytest.raises(ValueError, match="gelu must be one of"):
        ModelConfig(vocab_size=20, options={"gelu": "none"})
