"""C AdamW, global norm, gradient clipping and the EMA update against the float64 reference,
and their argument checks."""
import numpy as np
import pytest

from conftest import (assert_close, assert_float32_accurate, assert_same_bits_for_thread_counts,
                      raises_naming, randn)
from mapformer import _C
from mapformer import reference as ref

PS = [1, 7, 97, 257, 100003]  # 100003 spans several OpenMP chunks with a ragged tail


def state(rng, P):
    params, m, v = randn(rng, P), np.zeros(P, np.float32), np.zeros(P, np.float32)
    mask = rng.random(P) < 0.6
    return params, m, v, mask


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("hp", [
    dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1),
    dict(lr=3e-3, beta1=0.0, beta2=0.5, eps=1e-3, weight_decay=0.0),
])
def test_adamw_ten_steps(rng, P, hp):
    params, m, v, mask = state(rng, P)
    rp, rm, rv = params.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    mask0 = mask.copy()
    for step in range(1, 11):
        grads = randn(rng, P, scale=0.5)
        grads0 = grads.copy()
        assert _C.adamw_step(params, grads, m, v, mask, step=step, **hp) is None
        rp, rm, rv = ref.adamw_step(rp, grads, rm, rv, mask, step=step, **hp)
        assert np.array_equal(grads, grads0) and np.array_equal(mask, mask0)
        # float32 state against a float64 run: a few ulps per step, ten steps
        assert_close(params, rp, "reduction", f"params (step {step})")
        assert_close(m, rm, "reduction", f"m (step {step})")
        assert_close(v, rv, "reduction", f"v (step {step})")


def test_adamw_defaults_and_decay_mask(rng):
    P = 50
    params, m, v, _ = state(rng, P)
    mask = np.zeros(P, bool)
    mask[::2] = True
    grads = np.zeros(P, np.float32)  # only the decay moves the parameters
    p0 = params.copy()
    _C.adamw_step(params, grads, m, v, mask, lr=0.1, step=1, weight_decay=0.5)
    assert np.array_equal(params[1::2], p0[1::2])
    assert_close(params[::2], p0[::2] * (1 - 0.1 * 0.5), "default", "decayed params")
    # NumPy scalars are accepted for lr (as for the other float arguments)
    _C.adamw_step(params, grads, m, v, mask, lr=np.float32(0.1), step=np.int64(2))
    # defaults beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0
    params, m, v, mask = state(rng, P)
    grads = randn(rng, P)
    rp, rm, rv = ref.adamw_step(params, grads, m, v, mask, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    _C.adamw_step(params, grads, m, v, mask, lr=1e-3, step=1)
    assert_close(params, rp, "default", "params")
    assert_close(m, rm, "default", "m")
    assert_close(v, rv, "default", "v")


def test_adamw_bad_inputs(rng):
    P = 8
    params, m, v, mask = state(rng, P)
    grads = randn(rng, P)
    arrays = dict(params=params, grads=grads, m=m, v=v, decay_mask=mask)
    snapshot = {k: a.copy() for k, a in arrays.items()}
    scalars = dict(lr=1e-3, step=1)
    readonly = np.zeros(P, np.float32)
    readonly.flags.writeable = False
    cases = [
        ("params", params.astype(np.float64), TypeError),
        ("grads", grads.astype(np.float16), TypeError),
        ("m", m.astype(np.float64), TypeError),
        ("v", v.tolist(), TypeError),
        ("decay_mask", mask.astype(np.uint8), TypeError),
        ("decay_mask", mask.astype(np.float32), TypeError),
        ("params", params.reshape(2, 4), ValueError),
        ("params", np.zeros(0, np.float32), ValueError),
        ("params", readonly, ValueError),
        ("grads", randn(rng, P + 1), ValueError),
        ("grads", randn(rng, 2 * P)[::2], ValueError),
        ("m", np.zeros(P - 1, np.float32), ValueError),
        ("m", readonly, ValueError),
        ("v", np.zeros((P, 1), np.float32), ValueError),
        ("v", readonly, ValueError),
        ("v", m, ValueError),  # shares memory with m
        ("grads", params, ValueError),  # shares memory with params
        ("decay_mask", mask[:-1].copy(), ValueError),
        ("lr", float("nan"), ValueError),
        ("lr", float("inf"), ValueError),
        ("lr", -1e-3, ValueError),
        ("lr", "0.1", TypeError),
        ("lr", None, TypeError),
        ("beta1", 1.0, ValueError),
        ("beta1", -0.1, ValueError),
        ("beta1", float("nan"), ValueError),
        ("beta2", 1.0, ValueError),
        ("beta2", 1 - 1e-9, ValueError),  # 1.0 in float32: bias correction 1 - 1^t = 0
        ("beta2", float("inf"), ValueError),
        ("eps", 0.0, ValueError),
        ("eps", -1e-8, ValueError),
        ("eps", float("nan"), ValueError),
        ("eps", float("inf"), ValueError),
        ("eps", 1e-50, ValueError),  # 0 in float32
        ("weight_decay", -0.1, ValueError),
        ("weight_decay", float("nan"), ValueError),
        ("weight_decay", 1e39, ValueError),  # inf in float32
        ("step", 0, ValueError),
        ("step", -3, ValueError),
        ("step", 1.0, TypeError),
        ("step", True, TypeError),
    ]
    for name, bad, exc in cases:
        kw = {**arrays, **scalars, name: bad}
        if name in ("v",) and bad is m:
            with raises_naming(exc, "m"):  # m is checked against v: names m first
                _C.adamw_step(**kw)
            continue
        if name == "grads" and bad is params:
            with raises_naming(exc, "params"):
                _C.adamw_step(**kw)
            continue
        with raises_naming(exc, name):
            _C.adamw_step(**kw)
    for k, a in arrays.items():
        assert np.array_equal(a, snapshot[k]), k
    with pytest.raises(TypeError, match="lr"):
        _C.adamw_step(params, grads, m, v, mask, step=1)
    with pytest.raises(TypeError, match="step"):
        _C.adamw_step(params, grads, m, v, mask, lr=1e-3)
    with pytest.raises(TypeError):  # lr is keyword-only
        _C.adamw_step(params, grads, m, v, mask, 1e-3, 1)


@pytest.mark.parametrize("P", PS)
def test_global_norm(rng, P):
    x = randn(rng, P, scale=3.0)
    x0 = x.copy()
    norm = _C.global_norm(x)
    assert isinstance(norm, float)
    # squares of float32 values are exact in double: only the summation order differs
    assert abs(norm - ref.global_norm(x)) <= 1e-12 * ref.global_norm(x)
    assert np.array_equal(x, x0)
    assert _C.global_norm(x=np.zeros(P, np.float32)) == 0.0


def test_global_norm_same_bits_for_any_thread_count(tmp_path):
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "x = np.random.default_rng(0).standard_normal(1234567).astype(np.float32)\n"
        "np.savez(sys.argv[1], np.float64(_C.global_norm(x)))\n"), threads=(1, 3))


@pytest.mark.parametrize("P", PS)
def test_clip_grad_norm(rng, P):
    grads = randn(rng, P)
    norm0 = ref.global_norm(grads)
    # below max_norm (and max_norm = inf): untouched, the norm is returned
    for max_norm in (2 * norm0 + 1.0, float("inf")):
        g = grads.copy()
        norm = _C.clip_grad_norm(g, max_norm)
        assert abs(norm - norm0) <= 1e-12 * norm0 and np.array_equal(g, grads)
    # above: scaled to max_norm / (norm + 1e-6)
    max_norm = norm0 / 4 if P > 1 else abs(float(grads[0])) / 4
    g = grads.copy()
    norm = _C.clip_grad_norm(grads=g, max_norm=max_norm)
    rg, rnorm = ref.clip_grad_norm(grads, max_norm)
    assert abs(norm - rnorm) <= 1e-12 * rnorm
    assert_close(g, rg, "default", "clipped grads")
    assert abs(ref.global_norm(g) - max_norm) <= 1e-5 * max_norm


def test_clip_non_finite_norm_leaves_grads(rng):
    for bad in (np.nan, np.inf):
        g = randn(rng, 100)
        g[17] = bad
        g0 = g.copy()
        norm = _C.clip_grad_norm(g, 1.0)
        assert not np.isfinite(norm)
        assert np.array_equal(g, g0, equal_nan=True)


def test_norm_bad_inputs(rng):
    readonly = np.ones(4, np.float32)
    readonly.flags.writeable = False
    for fn, extra in ((_C.global_norm, {}), (_C.clip_grad_norm, {"max_norm": 1.0})):
        name = "x" if fn is _C.global_norm else "grads"
        for bad, exc in ((np.ones(4), TypeError), ([1.0, 2.0], TypeError),
                         (np.ones((2, 2), np.float32), ValueError),
                         (np.ones(0, np.float32), ValueError),
                         (np.ones(8, np.float32)[::2], ValueError)):
            with raises_naming(exc, name):
                fn(**{name: bad}, **extra)
    with raises_naming(ValueError, "grads"):
        _C.clip_grad_norm(readonly, 1.0)
    g = randn(rng, 4)
    g0 = g.copy()
    for max_norm in (0.0, -1.0, float("nan"), -float("inf"), 1e-50):
        with raises_naming(ValueError, "max_norm"):
            _C.clip_grad_norm(g, max_norm)
    with pytest.raises(TypeError):
        _C.clip_grad_norm(g, "1")
    assert np.array_equal(g, g0)


@pytest.mark.parametrize("P", PS)
@pytest.mark.parametrize("decay", [0.0, 0.5, 0.99, 0.999999])
def test_ema_update(rng, P, decay):
    target, source = randn(rng, P), randn(rng, P, scale=3.0)
    t0, s0 = target.copy(), source.copy()
    assert _C.ema_update(target, source, decay) is None
    assert np.array_equal(source, s0)
    want = ref.ema_update(t0, s0, decay)
    # two float32 products and a sum: float32 NumPy's error (decay and 1 - decay rounded to
    # float32 as the op rounds them) at most twice over
    a = np.float32(decay)
    baseline = a * t0 + np.float32(1.0 - float(a)) * s0
    assert_float32_accurate(target, want, baseline, "target",
                            magnitude=np.abs(t0) + np.abs(s0))
    if decay == 0.0:
        assert np.array_equal(target, s0)
    again = t0.copy()
    _C.ema_update(target=again, source=s0, decay=np.float32(decay))
    assert np.array_equal(again, target)


def test_ema_update_same_bits_for_any_thread_count(tmp_path):
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(0)\n"
        "t = rng.standard_normal(1234567).astype(np.float32)\n"
        "_C.ema_update(t, rng.standard_normal(t.size).astype(np.float32), 0.99)\n"
        "np.savez(sys.argv[1], t)\n"), threads=(1, 3))


def test_ema_update_bad_inputs(rng):
    P = 8
    target, source = randn(rng, P), randn(rng, P)
    t0 = target.copy()
    readonly = np.zeros(P, np.float32)
    readonly.flags.writeable = False
    cases = [
        ("target", target.astype(np.float64), TypeError),
        ("target", target.tolist(), TypeError),
        ("target", target.reshape(2, 4), ValueError),
        ("target", np.zeros(0, np.float32), ValueError),
        ("target", randn(rng, 2 * P)[::2], ValueError),
        ("target", readonly, ValueError),
        ("source", source.astype(np.float16), TypeError),
        ("source", randn(rng, P + 1), ValueError),
        ("source", source.reshape(P, 1), ValueError),
        ("source", randn(rng, 2 * P)[::2], ValueError),
        ("decay", 1.0, ValueError),
        ("decay", 1 - 1e-9, ValueError),  # 1.0 in float32
        ("decay", -0.1, ValueError),
        ("decay", float("nan"), ValueError),
        ("decay", float("inf"), ValueError),
        ("decay", "0.9", TypeError),
        ("decay", None, TypeError),
    ]
    for name, bad, exc in cases:
        with raises_naming(exc, name):
            _C.ema_update(**{"target": target, "source": source, "decay": 0.9, name: bad})
    buf = randn(rng, P + 1)
    with raises_naming(ValueError, "target"):  # shares memory with source
        _C.ema_update(buf[:P], buf[1:], 0.9)
    with raises_naming(ValueError, "target"):
        _C.ema_update(target, target, 0.9)
    assert np.array_equal(target, t0)
