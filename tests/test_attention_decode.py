"""The C op attention_decode_forward (csrc/ops/attention_decode.c): a block of Tq new queries
on the keys of Tk >= Tq positions, the last Tq rows of causal attention (incremental
decoding), against the float64 reference; it is the rows of attention_forward; scratch,
threads and bad input. Forward only: decoding needs no gradient."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import (assert_array_argument_checked, assert_float32_accurate,
                      assert_no_leaks, assert_refuses_bad_versions,
                      assert_same_bits_for_thread_counts, assert_scale_checked, expect_error,
                      matmul32, raises_naming, randn, subprocess_env)
from mapformer import _C
from mapformer import reference as ref

# (B, Tq, Tk, H, D): one query on one key, a single new query, blocks, the whole sequence,
# head dims that are not whole vectors, prime lengths
SHAPES = [(1, 1, 1, 1, 16), (2, 1, 97, 3, 18), (1, 2, 7, 2, 64), (2, 5, 5, 1, 128),
          (1, 3, 131, 2, 34), (3, 7, 41, 1, 50), (1, 13, 257, 2, 96)]


def make(rng, B, Tq, Tk, H, D, scale=1.0):
    """q (B, Tq, H, D), k, v (B, Tk, H, D) float32 standard normals (q, k times scale)."""
    return randn(rng, B, Tq, H, D, scale=scale), randn(rng, B, Tk, H, D, scale=scale), \
        randn(rng, B, Tk, H, D)


def decode_float32(q, k, v, scale=None):
    """The op's computation in float32 NumPy (scores, max, exponentials, sum, weighted sum),
    its products as the op makes them (conftest.matmul32 unfused: every product rounded, then
    added in order over the inner axis): out, lse; its error against the float64 reference is
    float32's on this problem."""
    f32 = np.float32
    Tq, Tk, D = q.shape[1], k.shape[1], q.shape[3]
    scale = f32(1 / np.sqrt(D) if scale is None else scale)
    heads = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    qh, kh, vh = heads(q), heads(k), heads(v)
    s = matmul32(qh, kh.transpose(0, 1, 3, 2), fused=False) * scale
    s = np.where(np.arange(Tk) <= np.arange(Tk - Tq, Tk)[:, None], s, f32(-np.inf))
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    out = matmul32(e, vh, fused=False) / total
    return heads(out), (m + np.log(total))[..., 0]


def check(q, k, v, scale=None):
    """C against the reference within twice float32 NumPy's error (plus a few ulps of the
    terms' magnitudes); inputs unchanged."""
    before = [a.copy() for a in (q, k, v)]
    out, lse = _C.attention_decode_forward(q, k, v, scale)
    B, Tq, H, D = q.shape
    assert out.dtype == np.float32 and out.shape == (B, Tq, H, D) and out.flags.c_contiguous
    assert lse.dtype == np.float32 and lse.shape == (B, H, Tq) and lse.flags.c_contiguous
    want_out, want_lse = ref.attention_decode_forward(q, k, v, scale)
    base_out, base_lse = decode_float32(q, k, v, scale)
    # out's terms: probabilities (summing to 1) times |v|
    assert_float32_accurate(out, want_out, base_out, "out", np.abs(v).max())
    assert_float32_accurate(lse, want_lse, base_lse, "lse")
    for a, a0 in zip((q, k, v), before):
        assert np.array_equal(a, a0)
    return out, lse


@pytest.mark.parametrize("B,Tq,Tk,H,D", SHAPES)
def test_matches_reference(rng, B, Tq, Tk, H, D):
    check(*make(rng, B, Tq, Tk, H, D))


@pytest.mark.parametrize("scale", [0.3, -0.2, 1.0])
def test_custom_scale(rng, scale):
    check(*make(rng, 2, 3, 29, 2, 32), scale=scale)


def test_large_logits_stay_finite(rng):
    """Scores of a few hundred (lse past exp's float32 range): the max is subtracted first."""
    q, k, v = make(rng, 1, 4, 150, 1, 64, scale=8.0)
    _, lse = check(q, k, v)
    assert np.all(np.isfinite(lse)) and np.abs(lse).max() > 89


@pytest.mark.parametrize("Tq", [1, 4, 23])
def test_reference_is_the_last_rows_of_causal_attention(rng, Tq):
    """float64: the reference's block is attention_forward's last Tq rows (to rounding)."""
    q, k, v = make(rng, 2, 23, 23, 2, 16)
    full_out, full_lse = ref.attention_forward(q, k, v)
    out, lse = ref.attention_decode_forward(q[:, 23 - Tq:], k, v)
    np.testing.assert_allclose(out, full_out[:, 23 - Tq:], rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, full_lse[..., 23 - Tq:], rtol=0, atol=1e-12)


def test_blocks_extend_a_cache_as_attention_forward(rng):
    """Decoding a sequence block by block (keys so far, then the block's queries) gives
    attention_forward's rows on the whole sequence, within float32's error of both against
    the reference."""
    q, k, v = make(rng, 2, 40, 40, 2, 32)
    full_out, full_lse = _C.attention_forward(q, k, v)
    want_out, want_lse = ref.attention_forward(q, k, v)
    start = 0
    for size in (1, 7, 2, 13, 1, 16):
        end = start + size
        out, lse = _C.attention_decode_forward(q[:, start:end].copy(), k[:, :end].copy(),
                                               v[:, :end].copy())
        for got, full, want, name in ((out, full_out[:, start:end], want_out[:, start:end],
                                       "out"),
                                      (lse, full_lse[..., start:end], want_lse[..., start:end],
                                       "lse")):
            err = np.abs(got - want).max()
            assert err <= 2 * np.abs(full - want).max() + 8 * 2.0**-24 * np.abs(want).max() \
                + 1e-6, (name, start, err)
        start = end
    assert start == 40


def test_keys_within_a_longer_cache(rng):
    """k, v with room to grow (Tmax positions, the first `keys` valid): the same bits as the
    valid positions alone, whatever lies past them; the reference agrees."""
    q, k, v = make(rng, 2, 3, 40, 2, 18)
    want = _C.attention_decode_forward(q, k[:, :29].copy(), v[:, :29].copy())
    k[:, 29:], v[:, 29:] = np.nan, np.inf
    got = _C.attention_decode_forward(q, k, v, None, 29)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert np.array_equal(_C.attention_decode_forward(q, k, v, keys=40)[1],
                          _C.attention_decode_forward(q, k, v)[1], equal_nan=True)
    ref_out, ref_lse = ref.attention_decode_forward(q, k, v, keys=29)
    assert_float32_accurate(got[0], ref_out, decode_float32(q, k[:, :29], v[:, :29])[0], "out",
                            np.abs(v[:, :29]).max())


def test_bad_keys(rng):
    a = good(rng)  # Tq = 3, Tmax = 9
    for keys, exc, name in ((10, ValueError, "keys"), (0, ValueError, "keys"),
                            (-1, ValueError, "keys"), (2, ValueError, "q"),
                            (2.0, TypeError, "keys"), (True, TypeError, "keys"),
                            ("3", TypeError, "keys")):
        with raises_naming(exc, name):
            call(a, keys=keys)
    assert call(a, keys=3)[0].shape == (2, 3, 2, 16)


def test_keyword_arguments_and_default_scale(rng):
    q, k, v = make(rng, 1, 3, 33, 2, 32)
    out, lse = _C.attention_decode_forward(q=q, k=k, v=v)
    out2, lse2 = _C.attention_decode_forward(q, k, v, scale=1 / np.sqrt(32))
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)


def test_same_bits_for_any_thread_count(tmp_path):
    """Each head is one thread's task: the same bits on 1 and 2 OpenMP threads (the size is
    past the op's one-thread threshold)."""
    assert_same_bits_for_thread_counts(tmp_path, """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(7)
q = rng.standard_normal((4, 8, 2, 40)).astype(np.float32)
k, v = (rng.standard_normal((4, 700, 2, 40)).astype(np.float32) for _ in range(2))
out, lse = _C.attention_decode_forward(q, k, v)
np.savez(sys.argv[1], out=out, lse=lse)
""")


def test_scratch_contract(tmp_path):
    """Through ctypes on 2 OpenMP threads: with attention_decode_forward_scratch_floats floats
    or half of them (one thread's share), the binding's bits; less than a share, misaligned
    or missing scratch, an output over an input, Tq > Tk or Tk > Tmax is MF_EINVAL, nothing
    written."""
    script = tmp_path / "scratch.py"
    script.write_text("""
import ctypes
import numpy as np
from mapformer import _C

F = ctypes.POINTER(ctypes.c_float)


class Params(ctypes.Structure):  # MfAttentionDecodeParams
    _fields_ = [(name, F) for name in ("out", "lse", "q", "k", "v")] + \\
               [(name, ctypes.c_int64) for name in ("B", "Tq", "Tk", "Tmax", "H", "D")] + \\
               [("scale", ctypes.c_float), ("scratch", F), ("scratch_floats", ctypes.c_int64)]


lib = ctypes.CDLL(_C.__file__)
op, floats = lib.attention_decode_forward, lib.attention_decode_forward_scratch_floats
op.argtypes = floats.argtypes = [ctypes.POINTER(Params)]
floats.restype = ctypes.c_int64
ptr = lambda a: a.ctypes.data_as(F)  # noqa: E731
rng = np.random.default_rng(3)
B, Tq, Tk, H, D = 4, 8, 700, 2, 40  # past the one-thread threshold
q = rng.standard_normal((B, Tq, H, D)).astype(np.float32)
k, v = (rng.standard_normal((B, Tk, H, D)).astype(np.float32) for _ in range(2))
want_out, want_lse = _C.attention_decode_forward(q, k, v)
out = np.full((B, Tq, H, D), 7.0, np.float32)
lse = np.full((B, H, Tq), 7.0, np.float32)
p = Params(B=B, Tq=Tq, Tk=Tk, Tmax=Tk, H=H, D=D, scale=1 / np.sqrt(D), q=ptr(q), k=ptr(k),
           v=ptr(v), out=ptr(out), lse=ptr(lse))
n = floats(ctypes.byref(p))
assert n > 0 and n % 2 == 0, n  # two threads' shares
buf = np.empty(n + 32, np.float32)
start = (-buf.ctypes.data // 4) % 16  # the first 64-byte aligned float
for count, shift, status in ((16, 0, 1), (n, 1, 1), (n, 0, 0), (n // 2, 0, 0)):
    out[...] = 7.0
    lse[...] = 7.0
    p.scratch, p.scratch_floats = ptr(buf[start + shift:]), count
    assert op(ctypes.byref(p)) == status, (count, shift)
    if status == 0:
        assert np.array_equal(out, want_out) and np.array_equal(lse, want_lse), count
    else:
        assert np.all(out == 7.0) and np.all(lse == 7.0), (count, shift)
out[...] = 7.0
p.scratch = None
assert op(ctypes.byref(p)) == 1
p.scratch = ptr(buf[start:])
p.Tq = Tk + 1
assert floats(ctypes.byref(p)) == 0 and op(ctypes.byref(p)) == 1
p.Tq = Tq
p.Tk = Tk + 1  # more keys than k holds
assert floats(ctypes.byref(p)) == 0 and op(ctypes.byref(p)) == 1
p.Tk = Tk
p.out = p.k  # an output over an input
assert op(ctypes.byref(p)) == 1
assert np.all(out == 7.0)
print("ok")
""")
    out = subprocess.run([sys.executable, str(script)], env=subprocess_env(2), check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "ok"


# ---- bad input ---------------------------------------------------------------------------

def good(rng):
    q, k, v = make(rng, 2, 3, 9, 2, 16)
    return dict(q=q, k=k, v=v)


def call(a, **override):
    return _C.attention_decode_forward(**{**a, **override})


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_bad_arrays(rng, name):
    """q fixes B, Tq, H, D and k fixes Tk: every other axis must match."""
    a = good(rng)
    if name == "k":  # k's axis 1 (Tk) is its own: a longer k is a valid call
        assert_refuses_bad_versions(lambda value: call(a, k=value), "k", a["k"])
        for axis in (0, 2, 3):
            shape = list(a["k"].shape)
            shape[axis] += 1
            with raises_naming(ValueError, "k"):
                call(a, k=np.zeros(shape, np.float32))
    else:
        assert_array_argument_checked(lambda value: call(a, **{name: value}), name, a[name],
                                      sizes=name != "q")


def test_more_queries_than_keys(rng):
    a = good(rng)
    with raises_naming(ValueError, "q"):
        call(a, q=randn(rng, 2, 10, 2, 16))
    out, _ = call(a, q=randn(rng, 2, 9, 2, 16))  # Tq = Tk: the whole sequence
    assert out.shape == (2, 9, 2, 16)


@pytest.mark.parametrize("D", [15, 17, 8, 14, 130, 256])
def test_bad_head_dim(rng, D):
    q, k, v = make(rng, 1, 2, 5, 1, D)
    with pytest.raises(ValueError, match=r"^head dim D .*even and in \[16, 128\], got %d" % D):
        _C.attention_decode_forward(q, k, v)


def test_bad_scale(rng):
    a = good(rng)
    assert_scale_checked(lambda scale: call(a, scale=scale))


def test_missing_and_unknown_arguments(rng):
    a = good(rng)
    with pytest.raises(TypeError):
        _C.attention_decode_forward(a["q"], a["k"])
    with pytest.raises(TypeError):
        _C.attention_decode_forward(a["q"], a["k"], a["v"], bias=None)


def test_no_leaks(rng):
    """Good and bad calls leave every argument's reference count and the memory as they were."""
    a = good(rng)
    bad_q = a["q"][..., :15].copy()

    def calls():
        call(a)
        expect_error(call, a, q=bad_q)
        expect_error(call, a, v=bad_q)
        expect_error(call, a, scale=float("nan"))
    assert_no_leaks(calls, list(a.values()) + [bad_q], rounds=300)
