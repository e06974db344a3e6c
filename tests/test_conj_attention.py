"""Conjunctive attention (MapEM): the float64 reference against finite differences and against
independent formulations, then the C op (forward and backward, all three modes) against the
reference on every kernel set the CPU runs (conftest's `kernel` fixture), each result within
twice the error of the same math in float32 NumPy (FlashAttention's criterion,
conftest.assert_float32_accurate: a bound that follows the problem, e.g. the size of the
logits, not one CPU), sum mode against the plain attention op, and the binding's argument
checks, input immutability and reference counts."""
import sys
import threading

import numpy as np
import pytest

from conftest import (assert_array_argument_checked, assert_float32_accurate,
                      assert_same_bits_for_thread_counts, assert_scale_checked, expect_error,
                      kernel_fuses_multiply_add, matmul32, numerical_grad, randn,
                      raises_naming)
from mapformer import _C
from mapformer import reference as ref

MODES = ["score_product", "softmax_product", "sum"]
TS = [1, 7, 97, 257]
BH = [(1, 1), (2, 3)]
DS = [16, 64, 128]
NAMES = ["qx", "kx", "qp", "kp", "v"]


def make(rng, B, T, H, D):
    """qx, kx, qp, kp, v, dout (B, T, H, D) float32 standard normals."""
    return [randn(rng, B, T, H, D) for _ in range(6)]


# ---- the reference ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_reference_backward_matches_finite_differences(rng, mode):
    """Central differences of L = sum(out * dout) with respect to each of the five inputs, in
    float64, at a small size (two heads, a head dim that is not even, so nothing in the
    reference depends on the C op's constraints)."""
    B, T, H, D = 1, 5, 2, 3
    x = [rng.standard_normal((B, T, H, D)) for _ in range(6)]
    dout = x.pop()
    grads = ref.conj_attention_backward(dout, *x, mode=mode, scale=0.7)
    for i, name in enumerate(NAMES):
        num = numerical_grad(
            lambda: float((ref.conj_attention_forward(*x, mode=mode, scale=0.7)[0] * dout).sum()),
            x[i])
        np.testing.assert_allclose(grads[i], num, rtol=1e-6, atol=1e-8, err_msg=name)


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def _loop_forward(qx, kx, qp, kp, v, mode, scale):
    """Each mode written out row by row, straight from its definition (an oracle for the
    reference's forward that shares none of its code)."""
    B, T, H, D = qx.shape
    out = np.zeros((B, T, H, D))
    for b in range(B):
        for h in range(H):
            for i in range(T):
                sx = np.array([qx[b, i, h] @ kx[b, j, h] for j in range(i + 1)])
                sp = np.array([qp[b, i, h] @ kp[b, j, h] for j in range(i + 1)])
                if mode == "score_product":
                    a = _softmax(scale * sx * sp)
                elif mode == "softmax_product":
                    a = _softmax(scale * sx) * _softmax(scale * sp)
                else:
                    a = _softmax(scale * (sx + sp))
                out[b, i, h] = a @ v[b, : i + 1, h]
    return out


@pytest.mark.parametrize("mode", MODES)
def test_reference_forward_matches_loops(rng, mode):
    x = [rng.standard_normal((2, 6, 2, 4)) for _ in range(5)]
    out, lse = ref.conj_attention_forward(*x, mode=mode, scale=0.6)
    np.testing.assert_allclose(out, _loop_forward(*x, mode, 0.6), rtol=1e-12, atol=1e-12)
    assert lse.shape == ((2 if mode == "softmax_product" else 1), 2, 2, 6)


def test_reference_score_product_is_attention_on_conjunctions(rng):
    """The paper's equivalence (sec. 3.5.1, TEM-t): with g = vec(x p^T), g_i . g_j = sX_ij sP_ij,
    so score_product is plain attention between the conjunctions."""
    B, T, H, D = 2, 7, 2, 3
    qx, kx, qp, kp, v = (rng.standard_normal((B, T, H, D)) for _ in range(5))
    conj = lambda x, p: np.einsum("bthd,bthe->bthde", x, p).reshape(B, T, H, D * D)  # noqa
    out, lse = ref.conj_attention_forward(qx, kx, qp, kp, v, scale=0.4)
    aout, alse = ref.attention_forward(conj(qx, qp), conj(kx, kp), v, scale=0.4)
    np.testing.assert_allclose(out, aout, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse[0], alse, rtol=1e-12, atol=1e-12)


def test_reference_softmax_product_rows_sum_below_one(rng):
    """A = AX * AP: rows sum to at most 1, and exactly 1 only on the first row (one key)."""
    x = [rng.standard_normal((1, 9, 1, 4)) for _ in range(4)]
    ones = np.ones((1, 9, 1, 4))
    out, _ = ref.conj_attention_forward(*x, ones, mode="softmax_product")
    row_sums = out[0, :, 0, 0]
    assert abs(row_sums[0] - 1) < 1e-12 and np.all(row_sums[1:] < 1 - 1e-6)


def test_reference_rejects_unknown_mode(rng):
    x = [rng.standard_normal((1, 3, 1, 4)) for _ in range(6)]
    with raises_naming(ValueError, "mode"):
        ref.conj_attention_forward(*x[:5], mode="product")
    with raises_naming(ValueError, "mode"):
        ref.conj_attention_backward(*x, mode="sums")


# ---- the C op against the reference ---------------------------------------------------------

def conj_float32(qx, kx, qp, kp, v, dout, mode, scale=None, fused=True, mask="causal",
                 prefix=None):
    """The op's computation in float32 NumPy, full T x T matrices: the forward, then the
    backward from what the forward saves (out and the float32 lse, from which it recomputes
    the probabilities, as the op does): out, lse, dqx, dkx, dqp, dkp, dv; products as
    conftest.matmul32 with `fused`. Its error against the float64 reference is the error
    float32 arithmetic makes on this problem. mask, prefix: the keys each query sees."""
    f32 = np.float32
    B, T, D = qx.shape[0], qx.shape[1], qx.shape[3]
    scale = f32(1 / np.sqrt(D) if scale is None else scale)
    heads = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    t = lambda x: x.transpose(0, 1, 3, 2)  # noqa: E731
    mm = lambda a, b: matmul32(a, b, fused)  # noqa: E731
    qx, kx, qp, kp, v, dout = (heads(x) for x in (qx, kx, qp, kp, v, dout))
    sx, sp = mm(qx, t(kx)), mm(qp, t(kp))
    causal = ref.attention_mask(B, T, mask, prefix)

    def softmax(z):
        z = np.where(causal, z, f32(-np.inf))
        m = z.max(-1, keepdims=True)
        e = np.exp(z - m)
        total = e.sum(-1, keepdims=True)
        return e / total, m + np.log(total)

    def recomputed(z, lse):  # the backward's probabilities, from the saved lse
        return np.exp(np.where(causal, z - lse, f32(-np.inf)))

    if mode == "softmax_product":
        zx, zp = scale * sx, scale * sp
        (ax, lse_x), (ap, lse_p) = softmax(zx), softmax(zp)
        out, lse = mm(ax * ap, v), np.stack([lse_x[..., 0], lse_p[..., 0]])
        ax, ap = recomputed(zx, lse_x), recomputed(zp, lse_p)
        a = ax * ap
    else:
        z = scale * sx * sp if mode == "score_product" else scale * (sx + sp)
        a, lse = softmax(z)
        out = mm(a, v)
        a, lse = recomputed(z, lse), lse[None, ..., 0]
    da, dv_ = mm(dout, t(v)), (dout * out).sum(-1, keepdims=True)
    if mode == "softmax_product":
        dsx, dsp = scale * (a * da - ax * dv_), scale * (a * da - ap * dv_)
    else:
        ds = a * (da - dv_) * scale
        dsx, dsp = (ds * sp, ds * sx) if mode == "score_product" else (ds, ds)
    return (heads(out), lse, heads(mm(dsx, kx)), heads(mm(t(dsx), qx)), heads(mm(dsp, kp)),
            heads(mm(t(dsp), qp)), heads(mm(t(a), dout)))


def conj_magnitudes(qx, kx, qp, kp, v, dout, mode, scale=None, mask="causal", prefix=None):
    """For out, dqx, dkx, dqp, dkp, dv: the size of the terms float32 rounds on the way to
    each result, the reference's formulas in float64 with every term's absolute value (the
    score gradients' terms, e.g. scale A dA and scale A Dv, cancel exactly for a query with one
    key)."""
    B, T, D = qx.shape[0], qx.shape[1], qx.shape[3]
    scale = 1 / np.sqrt(D) if scale is None else scale
    heads = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3), np.float64)  # noqa
    t = lambda x: x.transpose(0, 1, 3, 2)  # noqa: E731
    qx, kx, qp, kp, v, dout = (heads(x) for x in (qx, kx, qp, kp, v, dout))
    sx, sp = qx @ t(kx), qp @ t(kp)
    causal = ref.attention_mask(B, T, mask, prefix)

    def softmax(z):
        z = np.where(causal, z, -np.inf)
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    if mode == "softmax_product":
        ax, ap = softmax(scale * sx), softmax(scale * sp)
        a = ax * ap
    else:
        a = softmax(scale * sx * sp if mode == "score_product" else scale * (sx + sp))
    da, dv_ = np.abs(dout @ t(v)), np.abs((dout * (a @ v)).sum(-1, keepdims=True))
    if mode == "softmax_product":
        mx, mp = abs(scale) * (a * da + ax * dv_), abs(scale) * (a * da + ap * dv_)
    else:
        m = abs(scale) * a * (da + dv_)
        mx, mp = (m * np.abs(sp), m * np.abs(sx)) if mode == "score_product" else (m, m)
    return [x.transpose(0, 2, 1, 3) for x in (a @ np.abs(v), mx @ np.abs(kx),
                                              t(mx) @ np.abs(qx), mp @ np.abs(kp),
                                              t(mp) @ np.abs(qp), t(a) @ np.abs(dout))]


def check(mode, qx, kx, qp, kp, v, dout, scale=None, mask="causal", prefix=None):
    """C forward and backward against the reference, each result within twice float32
    NumPy's error (plus a few ulps); inputs must come back unchanged. mask, prefix: the
    op's."""
    m = dict(mask=mask, prefix=prefix)
    inputs = (qx, kx, qp, kp, v, dout)
    before = [a.copy() for a in inputs]
    out, lse = _C.conj_attention_forward(qx, kx, qp, kp, v, mode, scale, **m)
    B, T, H, D = qx.shape
    M = 2 if mode == "softmax_product" else 1
    assert out.dtype == np.float32 and out.shape == (B, T, H, D) and out.flags.c_contiguous
    assert lse.dtype == np.float32 and lse.shape == (M, B, H, T) and lse.flags.c_contiguous
    lse_before, out_before = lse.copy(), out.copy()
    grads = _C.conj_attention_backward(dout, qx, kx, qp, kp, v, out, lse, mode, scale, **m)
    for g in grads:
        assert g.dtype == np.float32 and g.shape == (B, T, H, D) and g.flags.c_contiguous
    want = (*ref.conj_attention_forward(qx, kx, qp, kp, v, mode, scale, **m),
            *ref.conj_attention_backward(dout, qx, kx, qp, kp, v, mode, scale, **m))
    base = conj_float32(qx, kx, qp, kp, v, dout, mode, scale,
                        kernel_fuses_multiply_add(_C.kernels()), **m)
    mout, *mgrads = conj_magnitudes(qx, kx, qp, kp, v, dout, mode, scale, **m)
    for got, w, b, mag, name in zip((out, lse, *grads), want, base, (mout, None, *mgrads),
                                    ("out", "lse", "dqx", "dkx", "dqp", "dkp", "dv")):
        assert_float32_accurate(got, w, b, name, mag)
    for a, a0 in zip(inputs, before):
        assert np.array_equal(a, a0)
    assert np.array_equal(lse, lse_before) and np.array_equal(out, out_before)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("B,H", BH)
@pytest.mark.parametrize("D", DS)
def test_matches_reference(rng, kernel, mode, B, T, H, D):
    check(mode, *make(rng, B, T, H, D))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("B,T,H,D", [(1, 130, 1, 18), (2, 65, 2, 34), (1, 200, 1, 50),
                                     (1, 64, 1, 96), (1, 600, 1, 16)])
def test_more_shapes(rng, kernel, mode, B, T, H, D):
    """Head dims that are not multiples of 16, block edges, many blocks."""
    check(mode, *make(rng, B, T, H, D))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scale", [0.3, -0.2])
def test_custom_scale(rng, kernel, mode, scale):
    check(mode, *make(rng, 2, 97, 2, 32), scale=scale)


@pytest.mark.parametrize("mode,big", [("score_product", 1.5), ("softmax_product", 5.0),
                                      ("sum", 6.0)])
def test_large_logits_stay_finite(rng, kernel, mode, big):
    """Inputs scaled by `big` give logits (and lse) of 100 to 400, past exp's float32 range
    (88.7): the online softmax must not overflow. score_product's logits are quadratic in
    the inputs, hence its smaller factor."""
    qx, kx, qp, kp, v, dout = make(rng, 1, 150, 1, 64)
    _, lse = _C.conj_attention_forward(qx * big, kx * big, qp * big, kp * big, v, mode)
    assert np.all(np.isfinite(lse)) and np.abs(lse).max() > 89
    check(mode, qx * big, kx * big, qp * big, kp * big, v, dout)


@pytest.mark.parametrize("mode", MODES)
def test_default_mode_scale_and_keywords(rng, kernel, mode):
    qx, kx, qp, kp, v, dout = make(rng, 1, 33, 2, 32)
    out, lse = _C.conj_attention_forward(qx=qx, kx=kx, qp=qp, kp=kp, v=v, mode=mode)
    out2, lse2 = _C.conj_attention_forward(qx, kx, qp, kp, v, mode, 1 / np.sqrt(32))
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
    g = _C.conj_attention_backward(dout=dout, qx=qx, kx=kx, qp=qp, kp=kp, v=v, out=out,
                                   lse=lse, mode=mode)
    g2 = _C.conj_attention_backward(dout, qx, kx, qp, kp, v, out, lse, mode, 1 / np.sqrt(32))
    for a, b in zip(g, g2):
        assert np.array_equal(a, b)
    if mode == "score_product":  # the default
        out3, lse3 = _C.conj_attention_forward(qx, kx, qp, kp, v)
        assert np.array_equal(out, out3) and np.array_equal(lse, lse3)
        g3 = _C.conj_attention_backward(dout, qx, kx, qp, kp, v, out, lse)
        for a, b in zip(g, g3):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("D", [16, 32, 64])
def test_sum_mode_is_attention_on_concatenations(rng, kernel, D):
    """sum mode = the plain attention op on [qx, qp], [kx, kp] (head dim 2D), same scale: both
    C ops within twice float32 NumPy's error of sum mode's float64 reference."""
    qx, kx, qp, kp, v, dout = make(rng, 2, 97, 2, D)
    v2 = np.concatenate([v, v], axis=3)  # attention needs v with the head dim of q
    dout2 = np.concatenate([dout, np.zeros_like(dout)], axis=3)
    cat = lambda a, b: np.ascontiguousarray(np.concatenate([a, b], axis=3))  # noqa: E731
    scale = 1 / np.sqrt(D)
    aout, alse = _C.attention_forward(cat(qx, qp), cat(kx, kp), v2, scale)
    dq, dk, dv2 = _C.attention_backward(dout2, cat(qx, qp), cat(kx, kp), v2, aout, alse, scale)
    want = (*ref.conj_attention_forward(qx, kx, qp, kp, v, "sum", scale),
            *ref.conj_attention_backward(dout, qx, kx, qp, kp, v, "sum", scale))
    base = conj_float32(qx, kx, qp, kp, v, dout, "sum", scale,
                        kernel_fuses_multiply_add(_C.kernels()))
    mout, *mgrads = conj_magnitudes(qx, kx, qp, kp, v, dout, "sum", scale)
    got = (aout[..., :D], alse[None], dq[..., :D], dk[..., :D], dq[..., D:], dk[..., D:],
           dv2[..., :D])
    for g, w, b, mag, name in zip(got, want, base, (mout, None, *mgrads),
                                  ("out", "lse", "dqx", "dkx", "dqp", "dkp", "dv")):
        assert_float32_accurate(g, w, b, name, mag)


def test_same_bits_for_any_thread_count(tmp_path):
    """Every mode's forward and backward on every kernel set give the same bits on 1 and 2
    OpenMP threads (each task writes only its own rows; the size is past the op's one-thread
    threshold)."""
    assert_same_bits_for_thread_counts(tmp_path, """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(7)
x = [rng.standard_normal((2, 130, 3, 40)).astype(np.float32) for _ in range(6)]
results = {}
for kset in _C.kernel_sets():
    _C.set_kernels(kset)
    for mode in ("score_product", "softmax_product", "sum"):
        out, lse = _C.conj_attention_forward(*x[:5], mode)
        grads = _C.conj_attention_backward(x[5], *x[:5], out, lse, mode)
        for name, y in zip(("out", "lse", "dqx", "dkx", "dqp", "dkp", "dv"), (out, lse, *grads)):
            results[kset + "_" + mode + "_" + name] = y
np.savez(sys.argv[1], **results)
""")


def test_modes_differ(rng):
    """The three modes are three different ops (a mix-up of mode numbers would pass the
    reference comparisons only if the reference had the same mix-up)."""
    x = make(rng, 1, 20, 1, 16)[:5]
    outs = [_C.conj_attention_forward(*x, mode=m)[0] for m in MODES]
    for i in range(3):
        for j in range(i):
            assert np.abs(outs[i] - outs[j]).max() > 1e-2


def test_threads_agree(rng, kernel):
    """Calls from several Python threads at once (the GIL is released) give the same result."""
    x = make(rng, 2, 97, 2, 64)
    want = {}
    for mode in MODES:
        out, lse = _C.conj_attention_forward(*x[:5], mode=mode)
        want[mode] = (out, lse, _C.conj_attention_backward(x[5], *x[:5], out, lse, mode))
    results = [None] * 6

    def work(i):
        mode = MODES[i % 3]
        out, lse = _C.conj_attention_forward(*x[:5], mode=mode)
        results[i] = (mode, out, lse, _C.conj_attention_backward(x[5], *x[:5], out, lse, mode))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for mode, out, lse, g in results:
        wout, wlse, wg = want[mode]
        assert np.array_equal(out, wout) and np.array_equal(lse, wlse)
        for a, b in zip(g, wg):
            assert np.array_equal(a, b)


# ---- bad input ---------------------------------------------------------------------------

SHAPE = (2, 9, 2, 16)


def good(rng, mode="score_product"):
    qx, kx, qp, kp, v, dout = make(rng, *SHAPE)
    out, lse = _C.conj_attention_forward(qx, kx, qp, kp, v, mode)
    return dict(dout=dout, qx=qx, kx=kx, qp=qp, kp=kp, v=v, out=out, lse=lse, mode=mode)


def call_forward(a, **override):
    args = {name: a[name] for name in NAMES + ["mode"]}
    args.update(override)
    return _C.conj_attention_forward(**args)


def call_backward(a, **override):
    args = dict(a)
    args.update(override)
    return _C.conj_attention_backward(**args)


ARGUMENTS = ([("forward", name) for name in NAMES]
             + [("backward", name) for name in ["dout", "qx", "kx", "qp", "kp", "v", "out", "lse"]])


@pytest.mark.parametrize("which, name", ARGUMENTS)
def test_bad_arrays(rng, which, name):
    a = good(rng)
    call = call_forward if which == "forward" else call_backward

    def call_with(value):
        return call(a, **{name: value})

    # qx fixes the shape; the others must match it
    assert_array_argument_checked(call_with, name, a[name], sizes=name != "qx")


@pytest.mark.parametrize("mode", MODES)
def test_lse_must_match_mode(rng, mode):
    """lse is (2, B, H, T) for softmax_product and (1, B, H, T) otherwise; one from another
    mode is refused, naming lse and the shape it must have."""
    a = good(rng, mode)
    other = "sum" if mode == "softmax_product" else "softmax_product"
    wrong = good(rng, other)["lse"]
    want = r"\(2, B, H, T\)" if mode == "softmax_product" else r"\(1, B, H, T\)"
    with pytest.raises(ValueError, match=r"^lse must have shape " + want):
        call_backward(a, lse=wrong)
    with raises_naming(ValueError, "lse"):
        call_backward(a, lse=a["lse"][0])  # 3 axes, as the plain attention op's lse


@pytest.mark.parametrize("bad", ["product", "Sum", "", "score_product "])
def test_unknown_mode(rng, bad):
    a = good(rng)
    with pytest.raises(ValueError, match=r"^mode must be one of 'score_product', "
                                         r"'softmax_product', 'sum', got"):
        call_forward(a, mode=bad)
    with raises_naming(ValueError, "mode"):
        call_backward(a, mode=bad)


@pytest.mark.parametrize("bad", [0, 1.0, None, b"sum", ["sum"]])
def test_mode_not_a_string(rng, bad):
    a = good(rng)
    with raises_naming(TypeError, "mode"):
        call_forward(a, mode=bad)
    with raises_naming(TypeError, "mode"):
        call_backward(a, mode=bad)


@pytest.mark.parametrize("D", [15, 17, 8, 14, 130, 256])
def test_bad_head_dim(rng, D):
    x = make(rng, 1, 5, 1, D)
    with pytest.raises(ValueError, match=r"^head dim D .*even and in \[16, 128\], got %d" % D):
        _C.conj_attention_forward(*x[:5])
    lse = np.zeros((1, 1, 1, 5), np.float32)
    with pytest.raises(ValueError, match=r"^head dim D"):
        _C.conj_attention_backward(x[5], *x[:5], x[0], lse)


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_bad_scale(rng, which):
    a = good(rng)
    call = call_forward if which == "forward" else call_backward
    assert_scale_checked(lambda scale: call(a, scale=scale))


def test_missing_and_unknown_arguments(rng):
    a = good(rng)
    with pytest.raises(TypeError):
        _C.conj_attention_forward(a["qx"], a["kx"], a["qp"], a["kp"])
    with pytest.raises(TypeError):
        _C.conj_attention_forward(a["qx"], a["kx"], a["qp"], a["kp"], a["v"], bias=None)
    with pytest.raises(TypeError):
        _C.conj_attention_backward(a["dout"], a["qx"], a["kx"], a["qp"], a["kp"], a["v"],
                                   a["out"])


def test_no_reference_leaks(rng):
    """1000 calls, good and bad, leave the reference counts of every argument unchanged, and
    the results are owned by the caller alone."""
    a = good(rng)
    b = good(rng, "softmax_product")
    arrays = [x for x in a.values() if isinstance(x, np.ndarray)] + [b["lse"], b["out"]]
    mode_obj = "softmax_product"
    counts = [sys.getrefcount(x) for x in arrays + [mode_obj]]
    bad_lse = a["lse"].astype(np.float64)
    bad_q = a["qx"][:, :, :, :15].copy()
    for _ in range(1000):
        out, lse = call_forward(a)
        dqx, dkx, dqp, dkp, dv = call_backward(a)
        out2, lse2 = call_forward(b, mode=mode_obj)
        dqx2, dkx2, dqp2, dkp2, dv2 = call_backward(b, mode=mode_obj)
        for bad in ({"lse": bad_lse}, {"qx": bad_q}, {"scale": float("nan")},
                    {"mode": "nope"}, {"mode": 3}, {"lse": b["lse"]}):
            expect_error(call_backward, a, **bad)
        expect_error(call_forward, a, v=bad_q)
        expect_error(call_forward, a, qx=bad_q)
        expect_error(call_forward, a, mode="nope")
    del bad  # the last dict of bad arguments holds b["lse"]
    assert [sys.getrefcount(x) for x in arrays + [mode_obj]] == counts
    # each result is held by its name here and by getrefcount's argument, nothing else
    assert sys.getrefcount(out) == 2 and sys.getrefcount(lse) == 2
    assert sys.getrefcount(out2) == 2 and sys.getrefcount(lse2) == 2
    assert sys.getrefcount(dqx) == 2 and sys.getrefcount(dkx) == 2
    assert sys.getrefcount(dqp) == 2 and sys.getrefcount(dkp) == 2 and sys.getrefcount(dv) == 2
    assert sys.getrefcount(dqx2) == 2 and sys.getrefcount(dv2) == 2
