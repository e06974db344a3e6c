"""C layernorm op against the float64 reference, and its argument checks."""
import numpy as np
import pytest

from conftest import (assert_close, assert_same_bits_for_thread_counts, raises_naming,
                      randn)
from mapformer import _C
from mapformer import reference as ref

NS = [1, 7, 97, 257]
CS = [16, 64, 128, 33, 1]


def make(rng, N, C):
    x = randn(rng, N, C, scale=2.0) + np.float32(3.0)  # a mean far from 0 tests the centring
    weight = randn(rng, C) + np.float32(1.0)
    bias = randn(rng, C)
    dy = randn(rng, N, C)
    return x, weight, bias, dy


@pytest.mark.parametrize("N", NS + [4099])
@pytest.mark.parametrize("C", CS)
def test_forward(rng, N, C):
    x, weight, bias, _ = make(rng, N, C)
    before = (x.copy(), weight.copy(), bias.copy())
    y, mean, rstd = _C.layernorm_forward(x, weight, bias)
    ry, rmean, rrstd = ref.layernorm_forward(x, weight, bias)
    assert y.shape == (N, C) and mean.shape == (N,) and rstd.shape == (N,)
    assert y.dtype == mean.dtype == rstd.dtype == np.float32
    assert_close(mean, rmean, "default", "mean")
    assert_close(rstd, rrstd, "default", "rstd")
    # y = (x - mean) * rstd * w + b: |x - mean| cancels against a mean of 3, so y's float32
    # error is ~eps32 * |x| * rstd * |w|, relative to the terms and not to |y|
    assert_close(y, ry, "reduction", "y")
    for a, a0 in zip((x, weight, bias), before):
        assert np.array_equal(a, a0)


def test_forward_eps_and_constant_rows(rng):
    C = 33
    x = np.full((3, C), 2.5, np.float32)
    w, b = randn(rng, C), randn(rng, C)
    for eps in (1e-5, 0.1, 3):
        y, mean, rstd = _C.layernorm_forward(x, w, b, eps=eps)
        assert np.array_equal(mean, np.full(3, 2.5, np.float32))
        assert_close(rstd, np.full(3, 1 / np.sqrt(eps)), "default", "rstd")
        assert_close(y, np.broadcast_to(b, (3, C)), "default", "y")  # xhat = 0
    x = randn(rng, 5, C)
    y, mean, rstd = _C.layernorm_forward(x, w, b, 0.5)
    ry, rmean, rrstd = ref.layernorm_forward(x, w, b, eps=0.5)
    assert_close(rstd, rrstd, "default", "rstd (eps=0.5)")
    assert_close(y, ry, "reduction", "y (eps=0.5)")


@pytest.mark.parametrize("N", NS + [4099])
@pytest.mark.parametrize("C", CS)
@pytest.mark.parametrize("accumulate", [False, True])
def test_backward(rng, N, C, accumulate):
    x, weight, bias, dy = make(rng, N, C)
    _, mean, rstd = _C.layernorm_forward(x, weight, bias)
    dw0, db0 = randn(rng, C), randn(rng, C)  # nonzero prefill: parameter gradients accumulate
    dweight, dbias = dw0.copy(), db0.copy()
    dx0 = randn(rng, N, C) if accumulate else None
    dx = dx0.copy() if accumulate else None
    before = [a.copy() for a in (dy, x, mean, rstd, weight)]
    out = _C.layernorm_backward(dy, x, mean, rstd, weight, dweight, dbias, dx)
    if accumulate:
        assert out is dx
    else:
        assert out.shape == (N, C) and out.dtype == np.float32
    _, rmean, rrstd = ref.layernorm_forward(x, weight, bias)
    rdx, rdw, rdb = ref.layernorm_backward(dy, x, rmean, rrstd, weight)
    # dx subtracts row means of g and g * xhat from g: cancellation, so "reduction"
    assert_close(out, (dx0 if accumulate else 0) + rdx, "reduction", "dx")
    # sums over N rows (double in C, but each term dy * xhat is a float32 product)
    assert_close(dweight, dw0 + rdw, "reduction", "dweight")
    assert_close(dbias, db0 + rdb, "reduction", "dbias")
    for a, a0 in zip((dy, x, mean, rstd, weight), before):
        assert np.array_equal(a, a0)


def test_backward_keywords_and_second_call(rng):
    N, C = 9, 16
    x, weight, bias, dy = make(rng, N, C)
    _, mean, rstd = _C.layernorm_forward(x=x, weight=weight, bias=bias, eps=1e-5)
    dweight, dbias = np.zeros(C, np.float32), np.zeros(C, np.float32)
    dx = np.zeros((N, C), np.float32)
    for _ in range(2):
        _C.layernorm_backward(dy=dy, x=x, mean=mean, rstd=rstd, weight=weight, dweight=dweight,
                              dbias=dbias, dx=dx)
    _, rmean, rrstd = ref.layernorm_forward(x, weight, bias)
    rdx, rdw, rdb = ref.layernorm_backward(dy, x, rmean, rrstd, weight)
    assert_close(dx, 2 * rdx, "reduction", "dx (2 calls)")
    assert_close(dweight, 2 * rdw, "reduction", "dweight (2 calls)")
    assert_close(dbias, 2 * rdb, "reduction", "dbias (2 calls)")


def test_backward_same_bits_for_any_thread_count(tmp_path):
    """dweight/dbias are reduced over fixed row blocks combined in order: no dependence on
    OMP_NUM_THREADS."""
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "r = np.random.default_rng(0)\n"
        "x = r.standard_normal((3001, 40)).astype(np.float32)\n"
        "dy = r.standard_normal((3001, 40)).astype(np.float32)\n"
        "w, b = np.ones(40, np.float32), np.zeros(40, np.float32)\n"
        "y, m, s = _C.layernorm_forward(x, w, b)\n"
        "dw, db = np.zeros(40, np.float32), np.zeros(40, np.float32)\n"
        "dx = _C.layernorm_backward(dy, x, m, s, w, dw, db)\n"
        "np.savez(sys.argv[1], y, dx, dw, db)\n"), threads=(1, 3))


def test_forward_bad_inputs(rng):
    x, weight, bias, _ = make(rng, 5, 8)
    ok = dict(x=x, weight=weight, bias=bias)
    cases = [
        ("x", x.astype(np.float64), TypeError),
        ("x", None, TypeError),
        ("weight", weight.astype(np.float64), TypeError),
        ("bias", bias.astype(np.int32), TypeError),
        ("x", x.reshape(5, 2, 4), ValueError),
        ("x", np.zeros((5, 0), np.float32), ValueError),
        ("x", randn(rng, 5, 16)[:, ::2], ValueError),
        ("weight", randn(rng, 9), ValueError),
        ("weight", randn(rng, 1, 8), ValueError),
        ("bias", randn(rng, 7), ValueError),
        ("eps", 0.0, ValueError),
        ("eps", -1e-5, ValueError),
        ("eps", float("nan"), ValueError),
        ("eps", float("inf"), ValueError),
        ("eps", 1e-60, ValueError),  # 0 in float32
        ("eps", 1e60, ValueError),  # inf in float32
        ("eps", "small", TypeError),
    ]
    for name, bad, exc in cases:
        with raises_naming(exc, name) if exc is ValueError or name != "eps" else pytest.raises(exc):
            _C.layernorm_forward(**{**ok, name: bad})


def test_backward_bad_inputs(rng):
    N, C = 5, 8
    x, weight, bias, dy = make(rng, N, C)
    _, mean, rstd = _C.layernorm_forward(x, weight, bias)
    dweight, dbias, dx = np.zeros(C, np.float32), np.zeros(C, np.float32), np.zeros((N, C), np.float32)
    ok = dict(dy=dy, x=x, mean=mean, rstd=rstd, weight=weight, dweight=dweight, dbias=dbias, dx=dx)
    readonly = np.zeros(C, np.float32)
    readonly.flags.writeable = False
    cases = [
        ("dy", dy.astype(np.float64), TypeError),
        ("x", x.astype(np.float64), TypeError),
        ("mean", mean.astype(np.float64), TypeError),
        ("rstd", rstd.astype(np.float16), TypeError),
        ("weight", weight.astype(np.float64), TypeError),
        ("dweight", dweight.astype(np.float64), TypeError),
        ("dbias", [0.0] * C, TypeError),
        ("dx", dx.astype(np.float64), TypeError),
        ("dy", dy.ravel(), ValueError),
        ("dy", np.zeros((0, C), np.float32), ValueError),
        ("x", randn(rng, N + 1, C), ValueError),
        ("x", randn(rng, N, 2 * C)[:, ::2], ValueError),
        ("mean", randn(rng, N + 1), ValueError),
        ("rstd", randn(rng, N, 1), ValueError),
        ("weight", randn(rng, C + 1), ValueError),
        ("dweight", randn(rng, C - 1), ValueError),
        ("dweight", readonly, ValueError),
        ("dbias", readonly, ValueError),
        ("dbias", dweight, ValueError),  # shares memory with dweight
        ("dx", np.zeros((N, C + 1), np.float32), ValueError),
        ("dx", dy, ValueError),  # shares memory with dy
    ]
    for name, bad, exc in cases:
        with raises_naming(exc, name):
            _C.layernorm_backward(**{**ok, name: bad})
    assert not dweight.any() and not dbias.any() and not dx.any()
