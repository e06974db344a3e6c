"""The VQ bottleneck in a Block's slot and the LSTM mixer: the C model against the NumPy
reference model, the loss terms, code usage, dead-code restarts, no weight decay on
codebooks."""
import numpy as np
import pytest

from mapformer import codeusage
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import navigation

TASK = navigation.NavigationConfig(dims=2, steps=9, grid_size=4, p_empty=0.3, n_objects=5)
VQ = {"vq_codes": 16, "vq_codebooks": 2}


def config(**values):
    base = dict(d_model=32, n_heads=2, n_layers=2, positional="rope", bottleneck="vq")
    base.update(values)
    if base["bottleneck"] == "vq":
        base = {**VQ, **base}
    return ModelConfig.preset("rope", TASK.vocab_size, **base)


def twins(cfg):
    c_model = Transformer(cfg, seed=3, backend="c")
    ref_model = Transformer(cfg, seed=3, backend="numpy")
    ref_model.params.data[:] = c_model.params.data
    return c_model, ref_model


@pytest.mark.parametrize("values", [{}, {"vq_reduction": "sum", "vq_every_block": True},
                                    {"mixer": "lstm", "positional": "none",
                                     "bottleneck": "none"}])
def test_c_model_matches_numpy_reference(values):
    c_model, ref_model = twins(config(**values))
    batch = navigation.generate(TASK, 3, np.random.default_rng(7))
    c_loss = c_model.loss(batch.tokens, batch.targets, batch.mask)
    ref_loss = ref_model.loss(batch.tokens, batch.targets, batch.mask)
    assert c_loss == pytest.approx(ref_loss, rel=2e-5)
    c_model.backward()
    ref_model.backward()
    for name, p in ref_model.params.params.items():
        got, want = c_model.params.params[name].grad, p.grad
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale + 1e-7,
                                   err_msg=f"gradient of {name}")


def test_vq_loss_and_codebook_gradient():
    model = Transformer(config(), seed=1, backend="numpy")
    batch = navigation.generate(TASK, 2, np.random.default_rng(0))
    model.loss(batch.tokens, batch.targets, batch.mask)
    vq = model.blocks[-1].bottleneck
    assert not model.blocks[0].bottleneck.active and vq.active  # the last block only
    n = batch.tokens.size
    dist = ((vq.z - vq.codes) ** 2).sum()
    assert vq.aux_loss() == pytest.approx(1.25 * dist / (n * 16), rel=1e-12)  # mean, D = 16
    model.backward()
    cb = model.params.params["blocks.1.bottleneck.codebook"]
    assert cb.grad.shape == (2, 16, 16) and np.abs(cb.grad).max() > 0
    # the codebook takes no weight decay, the codes' neighbours do
    assert not model.params.decay_mask[cb.offset:cb.offset + cb.size].any()
    assert "blocks.1.bottleneck.codebook" not in [
        name for name, p in model.params.params.items() if p.decay]


def test_usage_and_dead_code_restarts():
    model = Transformer(config(vq_restart_dead=1), seed=1, backend="numpy")
    batch = navigation.generate(TASK, 2, np.random.default_rng(0))
    vq = model.blocks[-1].bottleneck
    vq.codebook.value[0, 5] = 1e3  # far from everything: dead
    model.loss(batch.tokens, batch.targets, batch.mask)
    usage = vq.usage()
    assert usage["dead"][0] >= 1 and usage["used"][0] + usage["dead"][0] == 16
    assert 1.0 <= usage["perplexity"][0] <= usage["used"][0]
    # restarted on a row of the batch's residual stream
    rows = vq.z[:, 0]
    assert np.min(np.abs(rows - vq.codebook.value[0, 5]).sum(-1)) == 0.0


def test_evaluation_forwards_leave_codebook_and_counts():
    """In evaluation mode (train(False)) a forward neither counts its codes nor restarts dead
    ones, so an evaluation cannot move the codebook; back in training it does both."""
    model = Transformer(config(vq_restart_dead=1), seed=1, backend="numpy")
    batch = navigation.generate(TASK, 2, np.random.default_rng(0))
    vq = model.blocks[-1].bottleneck
    vq.codebook.value[0, 5] = 1e3
    before = vq.codebook.value.copy()
    model.train(False)
    model.loss(batch.tokens, batch.targets, batch.mask)
    assert np.array_equal(vq.codebook.value, before)
    assert vq.counts.sum() == 0 and vq.forwards == 0
    model.train(True)
    model.loss(batch.tokens, batch.targets, batch.mask)
    assert vq.counts.sum() == vq.z.shape[0] * vq.M and vq.forwards == 1
    assert not np.array_equal(vq.codebook.value[0, 5], before[0, 5])


def test_code_usage_statistics():
    counts = codeusage.count_codes(np.array([[0, 1], [0, 1], [2, 1], [3, 1]]), 4)
    assert counts.tolist() == [[2, 0, 1, 1], [0, 4, 0, 0]]
    u = codeusage.usage(counts)
    assert u["dead"] == [1, 3] and u["used"] == [3, 1]
    assert u["perplexity"][1] == pytest.approx(1.0)
    assert u["perplexity"][0] == pytest.approx(np.exp(-(0.5 * np.log(0.5)
                                                        + 2 * 0.25 * np.log(0.25))))


def test_bad_options():
    with pytest.raises(ValueError, match="vq_codebooks"):
        Transformer(config(vq_codebooks=3), backend="numpy")
    with pytest.raises(ValueError, match="vq_reduction"):
        config(vq_reduction="median")
    with pytest.raises(ValueError, match="vq_width 'full'"):  # would widen the residual
        Transformer(config(vq_width="full"), backend="numpy")
    with pytest.raises(ValueError, match="vq_width"):
        config(vq_width="half")
