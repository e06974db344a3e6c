"""C causal attention (forward and backward) against the float64 reference, and its argument
checks. Every case runs on both kernels: the CPU's own (the AVX-512 microkernels where the CPU
has them) and the portable sgemm path that CPUs without AVX-512 take
(MAPFORMER_KERNELS=blas)."""
import sys
import threading

import numpy as np
import pytest

from conftest import (assert_close, assert_array_argument_checked,
                      assert_scale_checked, expect_error, randn)
from mapformer import _C
from mapformer import reference as ref

TS = [1, 7, 97, 257]
BH = [(1, 1), (2, 3)]
DS = [16, 64, 128]


def make(rng, B, T, H, D):
    """q, k, v, dout (B, T, H, D) float32 standard normals."""
    return [randn(rng, B, T, H, D) for _ in range(4)]


def check(q, k, v, dout, scale=None):
    """C forward and backward against the reference; inputs must come back unchanged."""
    before = [a.copy() for a in (q, k, v, dout)]
    out, lse = _C.attention_forward(q, k, v, scale)
    B, T, H, D = q.shape
    assert out.dtype == np.float32 and out.shape == (B, T, H, D) and out.flags.c_contiguous
    assert lse.dtype == np.float32 and lse.shape == (B, H, T) and lse.flags.c_contiguous
    rout, rlse = ref.attention_forward(q, k, v, scale)
    # out sums T probabilities times values, lse a sum of T exponentials
    assert_close(out, rout, "reduction", "out")
    assert_close(lse, rlse, "reduction", "lse")
    lse_before = lse.copy()
    dq, dk, dv = _C.attention_backward(dout, q, k, v, out, lse, scale)
    for g in (dq, dk, dv):
        assert g.dtype == np.float32 and g.shape == (B, T, H, D) and g.flags.c_contiguous
    rdq, rdk, rdv = ref.attention_backward(dout, q, k, v, scale)
    # each gradient sums over T keys (or queries) of products that are sums over D
    assert_close(dq, rdq, "gradient", "dq")
    assert_close(dk, rdk, "gradient", "dk")
    assert_close(dv, rdv, "gradient", "dv")
    for a, a0 in zip((q, k, v, dout), before):
        assert np.array_equal(a, a0)
    assert np.array_equal(lse, lse_before)


@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("B,H", BH)
@pytest.mark.parametrize("D", DS)
def test_matches_reference(rng, kernel, B, T, H, D):
    check(*make(rng, B, T, H, D))


@pytest.mark.parametrize("B,T,H,D", [(1, 97, 3, 64), (2, 7, 1, 128), (1, 130, 1, 18),
                                     (2, 65, 2, 34), (1, 200, 1, 50), (1, 64, 1, 96),
                                     (1, 600, 1, 16)])
def test_more_shapes(rng, kernel, B, T, H, D):
    """Mixed B/H, head dims that are not multiples of 16, block edges, many blocks."""
    check(*make(rng, B, T, H, D))


@pytest.mark.parametrize("scale", [0.3, -0.2, 1.0])
def test_custom_scale(rng, kernel, scale):
    check(*make(rng, 2, 97, 2, 64), scale=scale)


def test_keyword_arguments_and_default_scale(rng, kernel):
    q, k, v, dout = make(rng, 1, 33, 2, 32)
    out, lse = _C.attention_forward(q=q, k=k, v=v)
    out2, lse2 = _C.attention_forward(q, k, v, scale=1 / np.sqrt(32))
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
    g = _C.attention_backward(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    g2 = _C.attention_backward(dout, q, k, v, out, lse, 1 / np.sqrt(32))
    for a, b in zip(g, g2):
        assert np.array_equal(a, b)


def test_large_logits_stay_finite(rng, kernel):
    """Scores of a few hundred: the online softmax must not overflow."""
    q, k, v, dout = make(rng, 1, 150, 1, 64)
    check(q * 8, k * 8, v, dout)


def test_error_within_twice_float32_numpy(rng, kernel):
    """The kernel's error against float64 is at most about twice that of the same math done
    in float32 NumPy (flash-attention's criterion), plus float32 rounding of the result."""
    q, k, v, dout = make(rng, 2, 257, 2, 64)
    scale = np.float32(1 / 8)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    s = np.where(np.tril(np.ones((257, 257), dtype=bool)), s, np.float32(-np.inf))
    p = np.exp(s - s.max(-1, keepdims=True))
    o32 = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), v)
    rout, _ = ref.attention_forward(q, k, v)
    out, _ = _C.attention_forward(q, k, v)
    err_c, err_np = np.abs(out - rout).max(), np.abs(o32 - rout).max()
    assert err_c <= 2 * err_np + 1e-6, (err_c, err_np)


def test_threads_agree(rng, kernel):
    """Calls from several Python threads at once (the GIL is released) give the same result."""
    q, k, v, dout = make(rng, 2, 97, 2, 64)
    want_out, want_lse = _C.attention_forward(q, k, v)
    want_g = _C.attention_backward(dout, q, k, v, want_out, want_lse)
    results = [None] * 4

    def work(i):
        out, lse = _C.attention_forward(q, k, v)
        results[i] = (out, lse, _C.attention_backward(dout, q, k, v, out, lse))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out, lse, g in results:
        assert np.array_equal(out, want_out) and np.array_equal(lse, want_lse)
        for a, b in zip(g, want_g):
            assert np.array_equal(a, b)


# ---- bad input ---------------------------------------------------------------------------

SHAPE = (2, 9, 2, 16)


def good(rng):
    q, k, v, dout = make(rng, *SHAPE)
    out, lse = _C.attention_forward(q, k, v)
    return dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)


def call_forward(a, **override):
    args = dict(q=a["q"], k=a["k"], v=a["v"])
    args.update(override)
    return _C.attention_forward(**args)


def call_backward(a, **override):
    args = dict(a)
    args.update(override)
    return _C.attention_backward(**args)


ARGUMENTS = ([("forward", name) for name in ["q", "k", "v"]]
             + [("backward", name) for name in ["dout", "q", "k", "v", "out", "lse"]])


@pytest.mark.parametrize("which, name", ARGUMENTS)
def test_bad_arrays(rng, which, name):
    a = good(rng)
    call = call_forward if which == "forward" else call_backward

    def call_with(value):
        return call(a, **{name: value})

    # q fixes the shape; the others must match it
    assert_array_argument_checked(call_with, name, a[name], sizes=name != "q")


@pytest.mark.parametrize("D", [15, 17, 8, 14, 130, 256])
def test_bad_head_dim(rng, D):
    q, k, v, dout = make(rng, 1, 5, 1, D)
    with pytest.raises(ValueError, match=r"^head dim D .*even and in \[16, 128\], got %d" % D):
        _C.attention_forward(q, k, v)
    lse = np.zeros((1, 1, 5), np.float32)
    with pytest.raises(ValueError, match=r"^head dim D"):
        _C.attention_backward(dout, q, k, v, q, lse)


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_bad_scale(rng, which):
    a = good(rng)
    call = call_forward if which == "forward" else call_backward
    assert_scale_checked(lambda scale: call(a, scale=scale))


def test_missing_and_unknown_arguments(rng):
    a = good(rng)
    with pytest.raises(TypeError):
        _C.attention_forward(a["q"], a["k"])
    with pytest.raises(TypeError):
        _C.attention_forward(a["q"], a["k"], a["v"], bias=None)
    with pytest.raises(TypeError):
        _C.attention_backward(a["dout"], a["q"], a["k"], a["v"], a["out"])


def test_no_reference_leaks(rng):
    """1000 calls, good and bad, leave the reference counts of every argument unchanged, and
    the results are owned by the caller alone."""
    a = good(rng)
    arrays = list(a.values())
    counts = [sys.getrefcount(x) for x in arrays]
    bad_lse = a["lse"].astype(np.float64)
    bad_q = a["q"][:, :, :, :15].copy()
    for _ in range(1000):
        out, lse = call_forward(a)
        dq, dk, dv = call_backward(a)
        for bad in ({"lse": bad_lse}, {"q": bad_q}, {"scale": float("nan")}):
            expect_error(call_backward, a, **bad)
        expect_error(call_forward, a, v=bad_q)
        expect_error(call_forward, a, q=bad_q)
    assert [sys.getrefcount(x) for x in arrays] == counts
    # each result is held by its name here and by getrefcount's argument, nothing else
    assert sys.getrefcount(out) == 2 and sys.getrefcount(lse) == 2
    assert sys.getrefcount(dq) == 2 and sys.getrefcount(dk) == 2 and sys.getrefcount(dv) == 2
