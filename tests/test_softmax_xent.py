"""C masked softmax cross-entropy against the float64 reference, and its argument checks."""
import numpy as np
import pytest

from conftest import assert_close, raises_naming, randn
from mapformer import _C
from mapformer import reference as ref

NS = [1, 7, 97, 257, 2000]  # 2000 rows of V = 33 span several OpenMP chunks
VS = [1, 5, 16, 33, 130]


def make(rng, N, V, scale=3.0):
    logits = randn(rng, N, V, scale=scale)
    targets = rng.integers(0, V, N).astype(np.int32)
    mask = (rng.random(N) < 0.7).astype(np.float32) * rng.choice([1.0, 0.5], N).astype(np.float32)
    mask[0] = 1.0  # sum(mask) > 0
    return logits, targets, mask


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("V", VS)
def test_forward_backward(rng, N, V):
    logits, targets, mask = make(rng, N, V)
    before = (logits.copy(), targets.copy(), mask.copy())
    losses, loss = _C.softmax_xent_forward(logits, targets, mask)
    rlosses, rloss = ref.softmax_xent_forward(logits, targets, mask)
    assert losses.shape == (N,) and losses.dtype == np.float32 and isinstance(loss, float)
    # log-sum-exp over V terms and a difference of logits: float32 error ~ eps * |logits|
    assert_close(losses, rlosses, "reduction", "losses")
    assert_close(loss, rloss, "reduction", "loss")
    scale = 1.0 / float(mask.sum())
    dlogits = _C.softmax_xent_backward(logits, targets, mask, scale)
    assert dlogits.shape == (N, V) and dlogits.dtype == np.float32
    assert_close(dlogits, ref.softmax_xent_backward(logits, targets, mask, scale), "default",
                 "dlogits")
    for a, a0 in zip((logits, targets, mask), before):
        assert np.array_equal(a, a0)
    # masked rows: gradient exactly zero
    assert not dlogits[mask == 0].any()


def test_large_logits_are_stable(rng):
    N, V = 64, 50
    logits, targets, mask = make(rng, N, V, scale=1000.0)
    logits[0, :] = 80.0
    logits[1, :] = -1e4
    logits[1, targets[1]] = 1e4  # p(target) = 1: loss 0, gradient 0
    losses, loss = _C.softmax_xent_forward(logits, targets, mask)
    rlosses, rloss = ref.softmax_xent_forward(logits, targets, mask)
    assert np.all(np.isfinite(losses)) and losses[1] == 0.0
    assert_close(losses, rlosses, "reduction", "losses")
    assert_close(loss, rloss, "reduction", "loss")
    assert_close(losses[0], np.log(V), "default", "uniform row")
    dl = _C.softmax_xent_backward(logits, targets, mask, 0.25)
    assert_close(dl, ref.softmax_xent_backward(logits, targets, mask, 0.25), "default", "dlogits")


def test_zero_mask_and_scale(rng):
    logits, targets, _ = make(rng, 9, 7)
    mask = np.zeros(9, np.float32)
    losses, loss = _C.softmax_xent_forward(logits, targets, mask)
    assert loss == 0.0
    assert_close(losses, ref.softmax_xent_forward(logits, targets, mask)[0], "reduction", "losses")
    assert not _C.softmax_xent_backward(logits, targets, mask, 1.0).any()
    mask = np.ones(9, np.float32)
    for scale in (0.0, -2.0, 3.5):
        dl = _C.softmax_xent_backward(logits=logits, targets=targets, mask=mask, scale=scale)
        assert_close(dl, ref.softmax_xent_backward(logits, targets, mask, scale), "default",
                     f"dlogits (scale={scale})")


def test_nan_logits_give_nan_rows(rng):
    logits, targets, mask = make(rng, 5, 8)
    mask[:] = 1.0
    logits[2, 3] = np.nan
    losses, loss = _C.softmax_xent_forward(logits, targets, mask)
    assert np.isnan(losses[2]) and np.isnan(loss)
    assert np.all(np.isfinite(np.delete(losses, 2)))
    dl = _C.softmax_xent_backward(logits, targets, mask, 1.0)
    assert np.all(np.isnan(dl[2])) and np.all(np.isfinite(np.delete(dl, 2, axis=0)))


def test_bad_inputs(rng):
    N, V = 6, 5
    logits, targets, mask = make(rng, N, V)
    ok = dict(logits=logits, targets=targets, mask=mask)
    cases = [
        ("logits", logits.astype(np.float64), TypeError),
        ("logits", logits.tolist(), TypeError),
        ("targets", targets.astype(np.int64), TypeError),
        ("targets", targets.astype(np.float32), TypeError),
        ("mask", mask.astype(np.float64), TypeError),
        ("mask", mask.astype(bool), TypeError),
        ("logits", logits.ravel(), ValueError),
        ("logits", np.zeros((N, 0), np.float32), ValueError),  # V = 0
        ("logits", np.zeros((0, V), np.float32), ValueError),  # N = 0
        ("logits", randn(rng, N, 2 * V)[:, ::2], ValueError),
        ("targets", targets[:-1].copy(), ValueError),
        ("targets", targets.reshape(2, 3), ValueError),
        ("targets", np.arange(2 * N, dtype=np.int32)[::2], ValueError),
        ("mask", mask[:-1].copy(), ValueError),
        ("mask", np.ones((N, 1), np.float32), ValueError),
    ]
    for bad_id in (-1, V, 2**31 - 1):
        t = targets.copy()
        t[3] = bad_id
        cases.append(("targets", t, ValueError))
    for name, bad, exc in cases:
        with raises_naming(exc, name):
            _C.softmax_xent_forward(**{**ok, name: bad})
        with raises_naming(exc, name):
            _C.softmax_xent_backward(**{**ok, name: bad}, scale=1.0)
    with pytest.raises(ValueError, match=r"^targets\[3\]"):
        t = targets.copy()
        t[3] = V
        _C.softmax_xent_forward(logits, t, mask)
    for scale in (float("nan"), float("inf"), -float("inf"), 1e39):
        with raises_naming(ValueError, "scale"):
            _C.softmax_xent_backward(logits, targets, mask, scale)
    with pytest.raises(TypeError):
        _C.softmax_xent_backward(logits, targets, mask, "1")
