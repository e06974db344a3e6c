"""C causal attention (forward and backward) against the float64 reference, and its argument
checks. Every case runs on every kernel set the CPU runs (conftest's `kernel` fixture:
'avx512' where the CPU has it, 'avx2', 'portable' and the OpenBLAS tiles 'blas'), and every
result must be as accurate as float32 arithmetic allows: its error against the float64
reference at most twice that of the same math in float32 NumPy (FlashAttention's criterion,
conftest.assert_float32_accurate), a bound that follows the problem (long sums, large
logits) instead of one CPU."""
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import (assert_array_argument_checked, assert_float32_accurate,
                      assert_same_bits_for_thread_counts, assert_scale_checked, expect_error,
                      kernel_fuses_multiply_add, matmul32, randn, subprocess_env)
from mapformer import _C
from mapformer import reference as ref

TS = [1, 7, 97, 257]
BH = [(1, 1), (2, 3)]
DS = [16, 64, 128]


def make(rng, B, T, H, D):
    """q, k, v, dout (B, T, H, D) float32 standard normals."""
    return [randn(rng, B, T, H, D) for _ in range(4)]


def attention_float32(q, k, v, dout, scale=None, fused=True, mask="causal", prefix=None):
    """The op's computation in float32 NumPy, full T x T matrices: the forward, then the
    backward from what the forward saves (out and the float32 lse, from which it recomputes
    the probabilities, as the op does): out, lse, dq, dk, dv; products as conftest.matmul32
    with `fused`. Its error against the float64 reference is the error float32 arithmetic
    makes on this problem. mask, prefix: the keys each query sees (reference.attention_mask)."""
    f32 = np.float32
    B, T, D = q.shape[0], q.shape[1], q.shape[3]
    scale = f32(1 / np.sqrt(D) if scale is None else scale)
    heads = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    t = lambda x: x.transpose(0, 1, 3, 2)  # noqa: E731
    mm = lambda a, b: matmul32(a, b, fused)  # noqa: E731
    qh, kh, vh, dh = (heads(x) for x in (q, k, v, dout))
    causal = ref.attention_mask(B, T, mask, prefix)
    s = np.where(causal, mm(qh, t(kh)) * scale, f32(-np.inf))
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    out, lse = mm(e / total, vh), m + np.log(total)
    p = np.where(causal, np.exp(s - lse), f32(0))
    ds = p * (mm(dh, t(vh)) - (dh * out).sum(-1, keepdims=True)) * scale
    return (heads(out), lse[..., 0], heads(mm(ds, kh)), heads(mm(t(ds), qh)),
            heads(mm(t(p), dh)))


def attention_magnitudes(q, k, v, dout, scale=None, mask="causal", prefix=None):
    """For out, lse, dq, dk, dv: the size of the terms float32 rounds on the way to each
    result, the reference's formulas in float64 with every term's absolute value (dS's terms
    are scale A dA and scale A Dv, which cancel exactly for a query with one key)."""
    B, T, D = q.shape[0], q.shape[1], q.shape[3]
    scale = 1 / np.sqrt(D) if scale is None else scale
    heads = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3), np.float64)  # noqa
    t = lambda x: x.transpose(0, 1, 3, 2)  # noqa: E731
    qh, kh, vh, dh = (heads(x) for x in (q, k, v, dout))
    s = np.where(ref.attention_mask(B, T, mask, prefix), qh @ t(kh) * scale, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    a = e / e.sum(-1, keepdims=True)
    big = abs(scale) * a * (np.abs(dh @ t(vh)) + np.abs((dh * (a @ vh)).sum(-1, keepdims=True)))
    return [x.transpose(0, 2, 1, 3) for x in (a @ np.abs(vh), big @ np.abs(kh),
                                              t(big) @ np.abs(qh), t(a) @ np.abs(dh))]


def check(q, k, v, dout, scale=None, mask="causal", prefix=None):
    """C forward and backward against the reference, each result within twice float32
    NumPy's error (plus a few ulps); inputs must come back unchanged. mask, prefix: the
    op's."""
    m = dict(mask=mask, prefix=prefix)
    before = [a.copy() for a in (q, k, v, dout)]
    out, lse = _C.attention_forward(q, k, v, scale, **m)
    B, T, H, D = q.shape
    assert out.dtype == np.float32 and out.shape == (B, T, H, D) and out.flags.c_contiguous
    assert lse.dtype == np.float32 and lse.shape == (B, H, T) and lse.flags.c_contiguous
    lse_before = lse.copy()
    dq, dk, dv = _C.attention_backward(dout, q, k, v, out, lse, scale, **m)
    for g in (dq, dk, dv):
        assert g.dtype == np.float32 and g.shape == (B, T, H, D) and g.flags.c_contiguous
    want = (*ref.attention_forward(q, k, v, scale, **m),
            *ref.attention_backward(dout, q, k, v, scale, **m))
    base = attention_float32(q, k, v, dout, scale, kernel_fuses_multiply_add(_C.kernels()), **m)
    mout, mdq, mdk, mdv = attention_magnitudes(q, k, v, dout, scale, **m)
    for got, w, b, mag, name in zip((out, lse, dq, dk, dv), want, base,
                                    (mout, None, mdq, mdk, mdv), ("out", "lse", "dq", "dk", "dv")):
        assert_float32_accurate(got, w, b, name, mag)
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
    """Scores of a few hundred (lse past exp's float32 range, 88.7): the online softmax must
    not overflow, and the results stay within float32's error at that magnitude."""
    q, k, v, dout = make(rng, 1, 150, 1, 64)
    _, lse = _C.attention_forward(q * 8, k * 8, v)
    assert np.all(np.isfinite(lse)) and np.abs(lse).max() > 89
    check(q * 8, k * 8, v, dout)


def test_same_bits_for_any_thread_count(tmp_path):
    """Forward and backward on every kernel set give the same bits on 1 and 2 OpenMP threads
    (each task writes only its own rows; the size is past the op's one-thread threshold)."""
    assert_same_bits_for_thread_counts(tmp_path, """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(7)
q, k, v, dout = (rng.standard_normal((2, 130, 3, 40)).astype(np.float32) for _ in range(4))
results = {}
for kset in _C.kernel_sets():
    _C.set_kernels(kset)
    out, lse = _C.attention_forward(q, k, v)
    grads = _C.attention_backward(dout, q, k, v, out, lse)
    for name, x in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads)):
        results[kset + "_" + name] = x
np.savez(sys.argv[1], **results)
""")


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


def test_scratch_contract(tmp_path):
    """The C op's scratch (mapformer.h, params.h), called through ctypes on 2 OpenMP threads,
    on every kernel set: with <op>_scratch_floats floats, or with half of them (one thread's
    share: the op runs on as many threads as its scratch serves), the same bits as the
    binding's; less than a share, a misaligned or missing scratch, or an output that overlaps
    an input is MF_EINVAL, and nothing is written."""
    script = tmp_path / "scratch.py"
    script.write_text("""
import ctypes
import numpy as np
from mapformer import _C

F = ctypes.POINTER(ctypes.c_float)


class Params(ctypes.Structure):  # MfAttentionParams
    _fields_ = [(name, F) for name in ("out", "lse", "dq", "dk", "dv", "q", "k", "v", "dout",
                                        "o", "lse_in")] + \\
               [(name, ctypes.c_int64) for name in "BTHD"] + \\
               [("scale", ctypes.c_float), ("mask", ctypes.c_int),
                ("prefix", ctypes.POINTER(ctypes.c_int32)), ("scratch", F),
                ("scratch_floats", ctypes.c_int64),
                ("pos_ids", ctypes.POINTER(ctypes.c_int32)), ("pair_factor", F),
                ("npos", ctypes.c_int64)]


lib = ctypes.CDLL(_C.__file__)
for name in ("attention_forward", "attention_backward"):
    getattr(lib, name).argtypes = [ctypes.POINTER(Params)]
    getattr(lib, name + "_scratch_floats").argtypes = [ctypes.POINTER(Params)]
    getattr(lib, name + "_scratch_floats").restype = ctypes.c_int64
ptr = lambda a: a.ctypes.data_as(F)  # noqa: E731
rng = np.random.default_rng(3)
B, T, H, D = 2, 130, 3, 40  # past the one-thread threshold
q, k, v, dout = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(4))
for kset in _C.kernel_sets():
    _C.set_kernels(kset)
    want_out, want_lse = _C.attention_forward(q, k, v)
    want = _C.attention_backward(dout, q, k, v, want_out, want_lse)
    for backward in (0, 1):
        name = "attention_backward" if backward else "attention_forward"
        op, floats = getattr(lib, name), getattr(lib, name + "_scratch_floats")
        res = [np.full((B, T, H, D), 7.0, np.float32) for _ in range(3)]
        lse = np.full((B, H, T), 7.0, np.float32)
        p = Params(B=B, T=T, H=H, D=D, scale=1 / np.sqrt(D), q=ptr(q), k=ptr(k), v=ptr(v))
        if backward:
            p.dq, p.dk, p.dv = (ptr(x) for x in res)
            p.dout, p.o, p.lse_in = ptr(dout), ptr(want_out), ptr(want_lse)
        else:
            p.out, p.lse = ptr(res[0]), ptr(lse)
        n = floats(ctypes.byref(p))
        assert n > 0 and n % 2 == 0, n  # two threads' shares
        buf = np.empty(n + 32, np.float32)
        start = (-buf.ctypes.data // 4) % 16  # the first 64-byte aligned float
        for count, shift, status in ((16, 0, 1), (n, 1, 1), (n, 0, 0), (n // 2, 0, 0)):
            p.scratch, p.scratch_floats = ptr(buf[start + shift:]), count
            assert op(ctypes.byref(p)) == status, (kset, name, count, shift)
            got = (res if backward else [res[0], lse])
            if status == 0:
                for a, b in zip(got, want if backward else (want_out, want_lse)):
                    assert np.array_equal(a, b), (kset, name, count)
            else:
                assert all(np.all(a == 7.0) for a in got), (kset, name, count, shift)
        p.scratch_floats = n
        p.scratch = None
        assert op(ctypes.byref(p)) == 1
        p.scratch = ptr(buf[start:])
        if backward:
            p.dq = p.dout  # an output over an input
        else:
            p.out = p.q
        assert op(ctypes.byref(p)) == 1
print("ok")
""")
    out = subprocess.run([sys.executable, str(script)], env=subprocess_env(2), check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "ok"


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
