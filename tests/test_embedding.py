"""C embedding op against the float64 reference, and its argument checks."""
import sys

import numpy as np
import pytest

from conftest import assert_close, randn
from mapformer import _C
from mapformer import reference as ref

SIZES = [(1, 1, 1), (7, 3, 5), (97, 10, 64), (257, 50, 3), (4096, 13, 130)]


def tokens_for(rng, N, V):
    return rng.integers(0, V, N).astype(np.int32)


@pytest.mark.parametrize("N,V,C", SIZES)
def test_forward(rng, N, V, C):
    tokens, weight = tokens_for(rng, N, V), randn(rng, V, C)
    before = (tokens.copy(), weight.copy())
    out = _C.embedding_forward(tokens, weight)
    assert out.dtype == np.float32 and out.shape == (N, C)
    # a copy: exact
    assert np.array_equal(out, ref.embedding_forward(tokens, weight))
    assert np.array_equal(before[0], tokens) and np.array_equal(before[1], weight)


@pytest.mark.parametrize("N,V,C", SIZES)
def test_backward_accumulates(rng, N, V, C):
    tokens, dout = tokens_for(rng, N, V), randn(rng, N, C)
    tokens[: N // 2] = tokens[0]  # many duplicates of one id
    prefill = randn(rng, V, C)
    dweight = prefill.copy()
    before = (tokens.copy(), dout.copy())
    assert _C.embedding_backward(dweight, dout, tokens) is None
    expected = prefill + ref.embedding_backward(dout, tokens, V)
    # a row that N/2 tokens hit sums N/2 float32 terms
    assert_close(dweight, expected, "reduction" if N > 512 else "default", "dweight")
    assert np.array_equal(before[0], tokens) and np.array_equal(before[1], dout)
    # a second call adds again (+=, never =)
    _C.embedding_backward(dweight=dweight, dout=dout, tokens=tokens)
    expected2 = prefill + 2 * ref.embedding_backward(dout, tokens, V)
    assert_close(dweight, expected2, "reduction" if N > 512 else "default", "dweight (2 calls)")


def test_backward_untouched_rows(rng):
    V, C = 6, 4
    tokens = np.array([1, 1, 4], np.int32)
    dweight = np.full((V, C), 7.0, np.float32)
    _C.embedding_backward(dweight, np.ones((3, C), np.float32), tokens)
    assert np.array_equal(dweight[[0, 2, 3, 5]], np.full((4, C), 7.0))
    assert np.array_equal(dweight[1], np.full(C, 9.0))
    assert np.array_equal(dweight[4], np.full(C, 8.0))


@pytest.mark.parametrize("bad_id", [-1, 5, 2**31 - 1, -(2**31)])
def test_out_of_range_ids(rng, bad_id):
    V, C = 5, 3
    tokens = np.array([0, 4, bad_id, 1], np.int32)
    with pytest.raises(ValueError, match=r"tokens\[2\]"):
        _C.embedding_forward(tokens, randn(rng, V, C))
    dweight = np.zeros((V, C), np.float32)
    with pytest.raises(ValueError, match=r"tokens\[2\]"):
        _C.embedding_backward(dweight, randn(rng, 4, C), tokens)
    assert not dweight.any()  # nothing written before the check


def test_bad_dtypes(rng):
    V, C = 5, 3
    with pytest.raises(TypeError, match="tokens"):
        _C.embedding_forward(np.array([0, 1], np.int64), randn(rng, V, C))
    with pytest.raises(TypeError, match="weight"):
        _C.embedding_forward(np.array([0, 1], np.int32), randn(rng, V, C).astype(np.float64))
    with pytest.raises(TypeError, match="tokens"):
        _C.embedding_backward(np.zeros((V, C), np.float32), randn(rng, 2, C), np.array([0, 1]))
    with pytest.raises(TypeError, match="dout"):
        _C.embedding_backward(np.zeros((V, C), np.float32), np.zeros((2, C)),
                              np.array([0, 1], np.int32))
    with pytest.raises(TypeError, match="dweight"):
        _C.embedding_backward(np.zeros((V, C)), randn(rng, 2, C), np.array([0, 1], np.int32))
    with pytest.raises(TypeError, match="tokens"):
        _C.embedding_forward([0, 1], randn(rng, V, C))


def test_bad_shapes(rng):
    V, C = 5, 3
    tok = np.array([0, 1], np.int32)
    with pytest.raises(ValueError, match="tokens"):
        _C.embedding_forward(tok[None], randn(rng, V, C))
    with pytest.raises(ValueError, match="tokens"):
        _C.embedding_forward(np.zeros(0, np.int32), randn(rng, V, C))
    with pytest.raises(ValueError, match="weight"):
        _C.embedding_forward(tok, randn(rng, V, C)[:, ::2])
    with pytest.raises(ValueError, match="weight"):
        _C.embedding_forward(tok, np.zeros((V, 0), np.float32))
    with pytest.raises(ValueError, match="dout"):
        _C.embedding_backward(np.zeros((V, C), np.float32), randn(rng, 2, C + 1), tok)
    with pytest.raises(ValueError, match="tokens"):
        _C.embedding_backward(np.zeros((V, C), np.float32), randn(rng, 3, C), tok)
    with pytest.raises(ValueError, match="tokens"):
        _C.embedding_forward((np.arange(6, dtype=np.int32) % V)[::2], randn(rng, V, C))
    ro = np.zeros((V, C), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="dweight"):
        _C.embedding_backward(ro, randn(rng, 2, C), tok)


def test_no_reference_or_memory_leaks(rng):
    """32 KiB of output per call: 1000 leaked calls would grow RSS by ~32 MiB; the error path
    (an out-of-range id, found after the arrays were checked) must not leak either."""
    V, C, N = 16, 64, 128
    tokens, weight, dout = tokens_for(rng, N, V), randn(rng, V, C), randn(rng, N, C)
    dweight = np.zeros((V, C), np.float32)
    bad = tokens.copy()
    bad[-1] = V
    counts = [sys.getrefcount(a) for a in (tokens, weight, dout, dweight, bad)]

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def calls():
        _C.embedding_forward(tokens, weight)
        _C.embedding_backward(dweight, dout, tokens)
        with pytest.raises(ValueError):
            _C.embedding_forward(bad, weight)

    for _ in range(100):
        calls()
    start = rss()
    for _ in range(1000):
        calls()
    assert rss() - start < 16 << 20
    assert [sys.getrefcount(a) for a in (tokens, weight, dout, dweight, bad)] == counts
