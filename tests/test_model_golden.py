"""Golden test of the whole model: the C path (float32) against a pure NumPy reference model
(the same architecture on mapformer.reference's float64 ops) over 10 AdamW steps, and the
reference model's gradients against finite differences (which checks the layer plumbing).

Each step of the reference starts from the C model's state (parameters and Adam moments), so
that every step compares the two paths' arithmetic rather than how far two trajectories have
drifted apart: Adam divides each gradient by its running scale, so float32 rounding of a
near-zero gradient entry moves that parameter by up to lr, and such moves compound."""
import numpy as np
import pytest

from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import navigation
from mapformer.train import AdamW, TrainConfig, learning_rate

TASK = navigation.NavigationConfig(dims=2, steps=9, grid_size=4, p_empty=0.3, n_objects=5)


SCHEMES = ["mapwm", "rope", "cope", "tape", "mapem_os", "mapem_s", "mapem_o"]
PATH = {"omega_grid": 4.0}
OPTIONS = {"mapwm": PATH, "mapem_os": PATH, "mapem_s": PATH, "cope": {"cope_positions": 12}}


def tiny_config(model):
    return ModelConfig.preset(model, TASK.vocab_size, d_model=32, n_heads=2, n_layers=2,
                              **OPTIONS.get(model, {}))


def twin_models(positional):
    """A C model and a NumPy model starting from the same float32 parameters."""
    c_model = Transformer(tiny_config(positional), seed=3, backend="c")
    ref_model = Transformer(tiny_config(positional), seed=3, backend="numpy")
    ref_model.params.data[:] = c_model.params.data
    return c_model, ref_model


@pytest.mark.parametrize("positional", SCHEMES)
def test_ten_adamw_steps_match_numpy_reference(positional, kernel):
    c_model, ref_model = twin_models(positional)
    train_config = TrainConfig(dims=2, sequences=30, batch_size=3, lr=3e-3, weight_decay=0.05)
    c_opt, ref_opt = AdamW(c_model, train_config), AdamW(ref_model, train_config)
    names_checked = 0
    for step in range(10):
        for dst, src in ((ref_model.params.data, c_model.params.data), (ref_opt.m, c_opt.m),
                         (ref_opt.v, c_opt.v)):
            dst[:] = src
        batch = navigation.generate(TASK, 3, np.random.default_rng([7, step]))
        c_loss = c_model.loss(batch.tokens, batch.targets, batch.mask)
        ref_loss = ref_model.loss(batch.tokens, batch.targets, batch.mask)
        assert c_loss == pytest.approx(ref_loss, rel=2e-5), f"loss at step {step}"
        np.testing.assert_allclose(c_model.logits, ref_model.logits, rtol=1e-4, atol=2e-5,
                                   err_msg=f"logits at step {step}")
        c_model.backward()
        ref_model.backward()
        for name, p in ref_model.params.params.items():
            got, want = c_model.params.params[name].grad, p.grad
            # float32 vs float64 over a few hundred terms: relative to the tensor's scale
            scale = np.abs(want).max()
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale + 1e-7,
                                       err_msg=f"gradient of {name} at step {step}")
            names_checked += 1
        lr = learning_rate(train_config, step)
        c_norm, ref_norm = c_opt.step(lr), ref_opt.step(lr)
        assert c_norm == pytest.approx(ref_norm, rel=1e-4)
        # Adam moves every entry by ~lr whatever its gradient's size, so where a gradient is
        # ~0 float32 rounding can change the move: allow 10% of one step's movement
        np.testing.assert_allclose(c_model.params.data, ref_model.params.data, rtol=1e-3,
                                   atol=0.1 * train_config.lr, err_msg=f"update at {step}")
    assert names_checked == 10 * len(ref_model.params.params)
    # the parameters moved: the steps were real
    assert np.abs(c_model.params.data - Transformer(tiny_config(positional), seed=3)
                  .params.data).max() > 1e-3


@pytest.mark.parametrize("positional", SCHEMES)
def test_reference_model_gradients_match_finite_differences(positional):
    model = Transformer(tiny_config(positional), seed=5, backend="numpy")
    batch = navigation.generate(TASK, 2, np.random.default_rng(11))
    batch.mask[:, ::3] = True  # more positions in the loss
    model.loss(batch.tokens, batch.targets, batch.mask)
    model.backward()
    grad = model.params.grad.copy()
    rng = np.random.default_rng(0)
    index = list(rng.choice(model.params.size, 150, replace=False))
    for name, p in model.params.params.items():  # every tensor, first and last entry
        index += [p.offset, p.offset + p.size - 1]
    eps = 1e-6
    for i in index:
        old = model.params.data[i]
        model.params.data[i] = old + eps
        up = model.loss(batch.tokens, batch.targets, batch.mask)
        model.params.data[i] = old - eps
        down = model.loss(batch.tokens, batch.targets, batch.mask)
        model.params.data[i] = old
        numeric = (up - down) / (2 * eps)
        assert abs(numeric - grad[i]) <= 1e-6 + 1e-4 * abs(numeric), (
            f"parameter index {i}: analytic {grad[i]!r} vs numeric {numeric!r}")
