"""``rope_axial`` with trainable frequencies (``rope_trainable``, axial "RoPE tuned"): one omega
(H, NB) shared by the layers, its gradient against finite differences on 2D grid coordinates
and on the token index, the frozen scheme at initialisation, the C backend against the
float64 one, and a training step that moves omega."""
import numpy as np
import pytest

from conftest import assert_param_gradients
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import grid2d
from mapformer.train import TrainConfig, train

OMEGA = "blocks.0.mixer.scheme.omega"
TASK = grid2d.GridConfig(operation="transpose", mean_side=3, spread=1, n_symbols=5)


def model_of(trainable, backend, coord_dims=2, seed=0):
    config = ModelConfig(vocab_size=TASK.vocab_size, d_model=32, n_heads=2, n_layers=2,
                         positional="rope_axial",
                         options={"rope_trainable": trainable, "coord_dims": coord_dims,
                                  "attn_mask": "prefix"})
    return Transformer(config, seed=seed, backend=backend)


def batch_loss(model, batch, coordinates):
    return lambda: model.loss(batch.tokens, batch.targets, batch.mask, coordinates,
                              grid2d.attention_prefix(batch))


@pytest.mark.parametrize("coord_dims", [2, 1])
def test_omega_gradient_matches_finite_differences(coord_dims):
    """coord_dims 2: the page coordinates (each pair's gradient from its own axis);
    1: no coordinates, the token index."""
    model = model_of(True, "numpy", coord_dims)
    assert [n for n in model.params.params if "scheme" in n] == [OMEGA]
    omega = model.params.params[OMEGA]
    omega.value[...] = np.random.default_rng(3).uniform(0.05, 1.5, omega.shape)
    batch = grid2d.generate(TASK, 2, rng=1)
    coordinates = grid2d.token_coordinates(batch) if coord_dims == 2 else None
    # central differences at eps = 1e-6 of a loss ~2 carry ~4e-10 of rounding
    assert_param_gradients(model, batch_loss(model, batch, coordinates), [omega], atol=2e-9,
                           least=1e-5)


@pytest.mark.parametrize("backend,tol", [("numpy", 1e-12), ("c", 1e-5)])
def test_starts_as_frozen_rope_axial(backend, tol):
    frozen, tuned = model_of(False, backend, seed=4), model_of(True, backend, seed=4)
    assert not [n for n in frozen.params.params if "scheme" in n]
    omega = tuned.params.params[OMEGA]
    f = 10000.0 ** (-np.arange(4) / 4)  # 8 pairs a head: 4 per axis
    np.testing.assert_allclose(omega.value, np.tile(np.concatenate([f, f]), (2, 1)), rtol=1e-7)
    batch = grid2d.generate(TASK, 2, rng=2)
    xy = grid2d.token_coordinates(batch)
    prefix = grid2d.attention_prefix(batch)
    np.testing.assert_allclose(tuned.forward(batch.tokens, xy, prefix),
                               frozen.forward(batch.tokens, xy, prefix), rtol=tol, atol=tol)
    assert tuned.blocks[1].mixer.scheme.omega is tuned.blocks[0].mixer.scheme.omega


def test_c_backend_matches_numpy():
    batch = grid2d.generate(TASK, 3, rng=5)
    xy = grid2d.token_coordinates(batch)
    out = {}
    for backend in ("numpy", "c"):
        model = model_of(True, backend, seed=6)
        loss = batch_loss(model, batch, xy)()
        model.backward()
        out[backend] = loss, model.params.params[OMEGA].grad.copy()
    assert out["c"][0] == pytest.approx(out["numpy"][0], rel=1e-5)
    scale = np.abs(out["numpy"][1]).max()
    np.testing.assert_allclose(out["c"][1], out["numpy"][1], rtol=1e-3, atol=1e-3 * scale)


def test_training_moves_omega_and_keeps_it_axial():
    train_config = TrainConfig(task="grid_transpose", grid_side=3, sequences=32, batch_size=16,
                               lr=1e-2, eval_sequences=8)
    cfg = ModelConfig.for_task("rope", train_config.task_config(), d_model=32, n_heads=2,
                               positional="rope_axial", rope_trainable=True)
    model = train(cfg, train_config, progress=False, log=lambda *a: None)["model"]
    scheme = model.blocks[0].mixer.scheme
    initial = scheme.frequencies.sum(axis=-1)
    assert np.abs(scheme.omega.value - initial).max() > 1e-4
    weight = model.ops.to_numpy(scheme.weight).reshape(2, 8, 2)
    assert not weight[:, :4, 1].any() and not weight[:, 4:, 0].any()  # each pair: one axis
    np.testing.assert_allclose(weight.sum(-1), scheme.omega.value, rtol=1e-6)
