"""C linear op (y = x W^T + b) against the float64 reference on every kernel set, and its
argument checks.

Tolerances follow from the problem (conftest.assert_product_close): each output is a float32
sum of Cin (forward, dx) or N (dweight) products plus a start value, within gamma(length + 2)
times the sum of the terms' magnitudes, and no worse than twice float32 NumPy's error on the
same math. The sizes are awkward on purpose: N not a multiple of any register tile's rows (1,
7, 97, 257: one block, a ragged last block), Cout not a multiple of any vector width (1, 3,
17, 33, 130: column tails of one vector or several), Cin odd, Cin over 256 (the kernel's
passes over k), and Cin under a register tile's width with Cout over it (8, 3: the weight
gradient computed transposed)."""

import numpy as np
import pytest

from conftest import (assert_product_close, assert_same_bits_for_thread_counts, gamma,
                      raises_naming, randn)
from mapformer import _C
from mapformer import reference as ref

NS = [1, 7, 97, 257]
WIDTHS = [(16, 64), (64, 33), (128, 16), (33, 128), (5, 1), (31, 3), (129, 17), (300, 33),
          (20, 130), (8, 67), (3, 40)]  # (Cin, Cout)


def make(rng, N, Cin, Cout):
    x = randn(rng, N, Cin)
    weight = randn(rng, Cout, Cin, scale=Cin**-0.5)
    bias = randn(rng, Cout)
    dy = randn(rng, N, Cout)
    return x, weight, bias, dy


def f64(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


def check_forward(y, x, weight, bias, name="y"):
    """y = x weight^T [+ bias]: sums of Cin products and the bias"""
    x64, w64 = f64(x, weight)
    magnitude = np.abs(x64) @ np.abs(w64).T
    np32 = x @ weight.T
    if bias is not None:
        magnitude = magnitude + np.abs(bias.astype(np.float64))
        np32 = np32 + bias
    assert_product_close(y, ref.linear_forward(x, weight, bias), magnitude, x.shape[1], np32,
                         name)


def check_backward(dx, dweight, dbias, dy, x, weight, dx0, dw0, db0, calls=1):
    """dx = dx0 + calls * dy weight (dx0 None: written), dweight = dw0 + calls * dy^T x,
    dbias = db0 + calls * (column sums of dy, in double in C)"""
    dy64, x64, w64 = f64(dy, x, weight)
    rdx, rdw, rdb = ref.linear_backward(dy, x, weight)
    start = 0.0 if dx0 is None else dx0.astype(np.float64)
    np_dx = (dy @ weight) * np.float32(calls) + (0 if dx0 is None else dx0)
    assert_product_close(dx, start + calls * rdx,
                         calls * np.abs(dy64) @ np.abs(w64) + np.abs(start),
                         calls * dy.shape[1], np_dx, "dx")
    dw_start = dw0.astype(np.float64)
    assert_product_close(dweight, dw_start + calls * rdw,
                         calls * np.abs(dy64).T @ np.abs(x64) + np.abs(dw_start),
                         calls * dy.shape[0], dw0 + np.float32(calls) * (dy.T @ x), "dweight")
    if dbias is not None:  # double sums of the rows, one float32 rounding a call
        db_start = db0.astype(np.float64)
        bound = gamma(2 * calls + 1) * (calls * np.abs(dy64).sum(0) + np.abs(db_start))
        err = np.abs(dbias.astype(np.float64) - (db_start + calls * rdb))
        assert np.all(err <= bound), f"dbias: max |err| {err.max():.3g}"


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("Cin,Cout", WIDTHS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_forward(rng, kernel, N, Cin, Cout, with_bias):
    x, weight, bias, _ = make(rng, N, Cin, Cout)
    b = bias if with_bias else None
    before = (x.copy(), weight.copy(), bias.copy())
    y = _C.linear_forward(x, weight, b) if with_bias else _C.linear_forward(x, weight)
    assert y.dtype == np.float32 and y.shape == (N, Cout) and y.flags.c_contiguous
    check_forward(y, x, weight, b)
    for a, a0 in zip((x, weight, bias), before):
        assert np.array_equal(a, a0)


@pytest.mark.parametrize("N", NS + [4096])
@pytest.mark.parametrize("Cin,Cout", WIDTHS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_new_dx(rng, kernel, N, Cin, Cout, with_bias):
    x, weight, _, dy = make(rng, N, Cin, Cout)
    dw0 = randn(rng, Cout, Cin)  # nonzero prefill: parameter gradients accumulate
    db0 = randn(rng, Cout)
    dweight, dbias = dw0.copy(), (db0.copy() if with_bias else None)
    before = (dy.copy(), x.copy(), weight.copy())
    dx = _C.linear_backward(dy, x, weight, dweight, dbias)
    assert dx.dtype == np.float32 and dx.shape == (N, Cin)
    check_backward(dx, dweight, dbias, dy, x, weight, None, dw0, db0)
    for a, a0 in zip((dy, x, weight), before):
        assert np.array_equal(a, a0)


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("Cin,Cout", WIDTHS)
def test_backward_accumulates_dx(rng, kernel, N, Cin, Cout):
    x, weight, _, dy = make(rng, N, Cin, Cout)
    dx0, dw0, db0 = randn(rng, N, Cin), randn(rng, Cout, Cin), randn(rng, Cout)
    dx, dweight, dbias = dx0.copy(), dw0.copy(), db0.copy()
    out = _C.linear_backward(dy=dy, x=x, weight=weight, dweight=dweight, dbias=dbias, dx=dx)
    assert out is dx  # accumulated in place and returned
    check_backward(dx, dweight, dbias, dy, x, weight, dx0, dw0, db0)
    # a second call adds again
    _C.linear_backward(dy, x, weight, dweight, dbias, dx)
    check_backward(dx, dweight, dbias, dy, x, weight, dx0, dw0, db0, calls=2)


def test_forward_bad_inputs(rng):
    x, weight, bias, _ = make(rng, 5, 8, 3)
    ok = dict(x=x, weight=weight, bias=bias)
    cases = [
        ("x", x.astype(np.float64), TypeError),
        ("x", x.tolist(), TypeError),
        ("weight", weight.astype(np.float16), TypeError),
        ("bias", bias.astype(np.float64), TypeError),
        ("x", x[0], ValueError),  # ndim
        ("x", np.zeros((0, 8), np.float32), ValueError),  # empty axis
        ("x", np.asfortranarray(randn(rng, 5, 8)), ValueError),  # layout
        ("x", randn(rng, 5, 16)[:, ::2], ValueError),  # strided
        ("weight", randn(rng, 3, 9), ValueError),  # Cin mismatch
        ("weight", randn(rng, 3, 8, 1), ValueError),
        ("bias", randn(rng, 4), ValueError),  # Cout mismatch
        ("bias", randn(rng, 3, 1), ValueError),
    ]
    for name, bad, exc in cases:
        with raises_naming(exc, name):
            _C.linear_forward(**{**ok, name: bad})


def test_backward_bad_inputs(rng):
    x, weight, _, dy = make(rng, 5, 8, 3)
    dweight, dbias, dx = np.zeros((3, 8), np.float32), np.zeros(3, np.float32), np.zeros((5, 8), np.float32)
    ok = dict(dy=dy, x=x, weight=weight, dweight=dweight, dbias=dbias, dx=dx)
    readonly = np.zeros((3, 8), np.float32)
    readonly.flags.writeable = False
    cases = [
        ("dy", dy.astype(np.float64), TypeError),
        ("x", x.astype(np.int32), TypeError),
        ("weight", weight.astype(np.float64), TypeError),
        ("dweight", dweight.astype(np.float64), TypeError),
        ("dbias", dbias.astype(np.float64), TypeError),
        ("dx", dx.astype(np.float64), TypeError),
        ("dy", dy[0], ValueError),
        ("dy", np.zeros((5, 0), np.float32), ValueError),
        ("x", randn(rng, 6, 8), ValueError),  # N mismatch
        ("weight", randn(rng, 3, 7), ValueError),
        ("weight", randn(rng, 8, 3), ValueError),  # transposed
        ("dweight", np.zeros((8, 3), np.float32), ValueError),
        ("dweight", readonly, ValueError),
        ("dweight", np.zeros((3, 16), np.float32)[:, ::2], ValueError),
        ("dbias", np.zeros(4, np.float32), ValueError),
        ("dx", np.zeros((5, 9), np.float32), ValueError),
        ("dx", np.zeros((5, 8), np.float32).T.copy().T, ValueError),  # Fortran order
        ("dx", dy, ValueError),  # wrong shape, and aliasing would be wrong anyway
    ]
    for name, bad, exc in cases:
        with raises_naming(exc, name):
            _C.linear_backward(**{**ok, name: bad})
    assert not dweight.any() and not dbias.any() and not dx.any()


def test_backward_overlap_rejected(rng):
    N, Cin, Cout = 4, 6, 6
    x, weight, _, dy = make(rng, N, Cin, Cout)
    dweight = np.zeros((Cout, Cin), np.float32)
    with raises_naming(ValueError, "dx"):  # dx would overwrite dy while sgemm reads it
        _C.linear_backward(dy, x, weight, dweight, None, dy)
    with raises_naming(ValueError, "dx"):  # dx written before dweight reads x
        _C.linear_backward(dy, x, weight, dweight, None, x)
    with raises_naming(ValueError, "dweight"):
        _C.linear_backward(dy, x, weight, weight, None)
    buf = np.zeros(Cout * Cin + Cout, np.float32)
    with raises_naming(ValueError, "dbias"):  # views into one buffer that overlap
        _C.linear_backward(dy, x, weight, buf[:Cout * Cin].reshape(Cout, Cin), buf[Cout * Cin - 1:-1])
    # disjoint views into one flat buffer are fine
    dx = _C.linear_backward(dy, x, weight, buf[:Cout * Cin].reshape(Cout, Cin), buf[Cout * Cin:])
    check_backward(dx, buf[:Cout * Cin].reshape(Cout, Cin), buf[Cout * Cin:], dy, x, weight,
                   None, np.zeros((Cout, Cin), np.float32), np.zeros(Cout, np.float32))


def test_same_bits_for_any_thread_count(tmp_path, kernel, monkeypatch):
    """Row blocks and the chunks of dweight's sums depend on N only (on each kernel set), and
    the block and chunk sums are combined in order, so every output has the same bits on 1, 2
    and 3 threads."""
    monkeypatch.setenv("MAPFORMER_KERNELS", kernel)  # the child runs this kernel set
    script = (
        "import sys\nimport numpy as np\nfrom mapformer import _C\n"
        "r = np.random.default_rng(3)\n"
        "f = lambda *s: r.standard_normal(s).astype(np.float32)\n"
        "x, w, b, dy = f(3000, 40), f(130, 40), f(130), f(3000, 130)\n"
        "y = _C.linear_forward(x, w, b)\n"
        "dw, db = np.zeros((130, 40), np.float32), np.zeros(130, np.float32)\n"
        "dx = _C.linear_backward(dy, x, w, dw, db)\n"
        "x8, w8, dw8 = f(3000, 8), f(130, 8), np.zeros((130, 8), np.float32)\n"
        "dx8 = _C.linear_backward(dy, x8, w8, dw8)\n"  # dweight computed transposed
        "np.savez(sys.argv[1], y=y, dx=dx, db=db, dw=dw, dx8=dx8, dw8=dw8)\n")
    assert_same_bits_for_thread_counts(tmp_path, script, (1, 2, 3))


@pytest.mark.parametrize("N", [1, 300])
def test_large_weight(rng, kernel, N):
    """A weight of more than 2^18 floats is multiplied in one split sgemm instead of row block
    by row block, on every kernel set; bias fill, dbias block sums and dx accumulation must
    still hold."""
    Cin, Cout = 520, 513
    x, weight, bias, dy = make(rng, N, Cin, Cout)
    check_forward(_C.linear_forward(x, weight, bias), x, weight, bias)
    check_forward(_C.linear_forward(x, weight), x, weight, None, "y (no bias)")
    dx0, dw0, db0 = randn(rng, N, Cin), randn(rng, Cout, Cin), randn(rng, Cout)
    dx, dweight, dbias = dx0.copy(), dw0.copy(), db0.copy()
    _C.linear_backward(dy, x, weight, dweight, dbias, dx)
    check_backward(dx, dweight, dbias, dy, x, weight, dx0, dw0, db0)
    dweight = dw0.copy()
    dx = _C.linear_backward(dy, x, weight, dweight)
    check_backward(dx, dweight, None, dy, x, weight, None, dw0, None)


def streamed_and_unstreamed(rng, N=8192 + 5, n=1000, C=128):
    """y and a written dx of N rows (N C > 2^20 floats: stored non-temporally, rows.h's
    MF_STREAM_FLOATS) and of their first n rows (n C < 2^20: not streamed; a ragged last row
    block), each checked against the reference: (y, y of the first n rows, dx, dx of those)."""
    x, weight, bias, _ = make(rng, N, 8, C)
    y = _C.linear_forward(x, weight, bias)
    check_forward(y, x, weight, bias)
    y_n = _C.linear_forward(x[:n], weight, bias)
    x, weight, _, dy = make(rng, N, C, 8)
    dw0 = np.zeros((8, C), np.float32)
    dweight = dw0.copy()
    dx = _C.linear_backward(dy, x, weight, dweight)
    check_backward(dx, dweight, None, dy, x, weight, None, dw0, None)
    dx_n = _C.linear_backward(dy[:n], x[:n], weight, dw0.copy())
    return y[:n], y_n, dx[:n], dx_n


@pytest.mark.parametrize("tiled", [k for k in _C.kernel_sets() if k != "blas"])
def test_streamed_outputs_same_bits(rng, tiled):
    """On the tiled kernel sets (gemm.h: each element the sum over k in order, whatever the
    row count) a row's values do not depend on N, so the first rows of a streamed output
    equal an unstreamed call's on those rows, bit for bit: the stores change no value."""
    before = _C.kernels()
    try:
        _C.set_kernels(tiled)
        y, y_n, dx, dx_n = streamed_and_unstreamed(rng)
    finally:
        _C.set_kernels(before)
    assert np.array_equal(y, y_n) and np.array_equal(dx, dx_n)


def test_blas_rows_close_whatever_the_row_count(rng):
    """The blas set ignores the stream hint, and OpenBLAS promises no bits across row counts:
    a row in the ragged tail of an M tile takes another kernel than in a full one (seen with
    its Haswell kernels, OPENBLAS_CORETYPE=Haswell: rows 996-999 of a 1,000-row call differ
    from an 8,197-row call's in the last bits). What holds is the product's accuracy: both
    calls checked against the reference, and the first rows within a few float32 ulps of
    each other."""
    before = _C.kernels()
    try:
        _C.set_kernels("blas")
        y, y_n, dx, dx_n = streamed_and_unstreamed(rng)
    finally:
        _C.set_kernels(before)
    np.testing.assert_allclose(y, y_n, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, dx_n, rtol=1e-5, atol=1e-6)
