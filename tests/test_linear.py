"""C linear op (y = x W^T + b) against the float64 reference, and its argument checks."""

import numpy as np
import pytest

from conftest import assert_close, assert_same_bits_for_thread_counts, raises_naming, randn
from mapformer import _C
from mapformer import reference as ref

NS = [1, 7, 97, 257]
WIDTHS = [(16, 64), (64, 33), (128, 16), (33, 128)]  # (Cin, Cout)


def make(rng, N, Cin, Cout):
    x = randn(rng, N, Cin)
    weight = randn(rng, Cout, Cin, scale=Cin**-0.5)
    bias = randn(rng, Cout)
    dy = randn(rng, N, Cout)
    return x, weight, bias, dy


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("Cin,Cout", WIDTHS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_forward(rng, kernel, N, Cin, Cout, with_bias):
    x, weight, bias, _ = make(rng, N, Cin, Cout)
    b = bias if with_bias else None
    before = (x.copy(), weight.copy(), bias.copy())
    y = _C.linear_forward(x, weight, b) if with_bias else _C.linear_forward(x, weight)
    assert y.dtype == np.float32 and y.shape == (N, Cout) and y.flags.c_contiguous
    # each output is an sgemm dot product over Cin: float32 error scales with sum |terms|,
    # not with |y|, so cancelling outputs need "reduction"
    assert_close(y, ref.linear_forward(x, weight, b), "reduction", "y")
    for a, a0 in zip((x, weight, bias), before):
        assert np.array_equal(a, a0)


@pytest.mark.parametrize("N", NS + [4096])
@pytest.mark.parametrize("Cin,Cout", WIDTHS + [(20, 130)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_new_dx(rng, kernel, N, Cin, Cout, with_bias):
    x, weight, _, dy = make(rng, N, Cin, Cout)
    dw0 = randn(rng, Cout, Cin)  # nonzero prefill: parameter gradients accumulate
    db0 = randn(rng, Cout)
    dweight, dbias = dw0.copy(), (db0.copy() if with_bias else None)
    before = (dy.copy(), x.copy(), weight.copy())
    dx = _C.linear_backward(dy, x, weight, dweight, dbias)
    rdx, rdw, rdb = ref.linear_backward(dy, x, weight, has_bias=with_bias)
    assert dx.dtype == np.float32 and dx.shape == (N, Cin)
    assert_close(dx, rdx, "reduction", "dx")  # sgemm dot products over Cout
    # dweight sums N rows of products, dbias N rows (in double in C)
    assert_close(dweight, dw0 + rdw, "gradient", "dweight")
    if with_bias:
        assert_close(dbias, db0 + rdb, "reduction", "dbias")
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
    rdx, rdw, rdb = ref.linear_backward(dy, x, weight)
    assert_close(dx, dx0 + rdx, "reduction", "dx (+=)")
    assert_close(dweight, dw0 + rdw, "gradient", "dweight")
    assert_close(dbias, db0 + rdb, "reduction", "dbias")
    # a second call adds again
    _C.linear_backward(dy, x, weight, dweight, dbias, dx)
    assert_close(dx, dx0 + 2 * rdx, "reduction", "dx (2 calls)")
    assert_close(dweight, dw0 + 2 * rdw, "gradient", "dweight (2 calls)")
    assert_close(dbias, db0 + 2 * rdb, "reduction", "dbias (2 calls)")


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
    _C.linear_backward(dy, x, weight, buf[:Cout * Cin].reshape(Cout, Cin), buf[Cout * Cin:])
    rdx, rdw, rdb = ref.linear_backward(dy, x, weight)
    assert_close(buf[:Cout * Cin].reshape(Cout, Cin), rdw, "gradient", "dweight view")
    assert_close(buf[Cout * Cin:], rdb, "reduction", "dbias view")


def test_same_bits_for_any_thread_count(tmp_path):
    """Row blocks and the chunks of dweight's sums depend on N only, and the block and chunk
    sums are combined in order, so every output has the same bits on 1, 2 and 3 threads."""
    script = (
        "import sys\nimport numpy as np\nfrom mapformer import _C\n"
        "r = np.random.default_rng(3)\n"
        "f = lambda *s: r.standard_normal(s).astype(np.float32)\n"
        "x, w, b, dy = f(3000, 40), f(130, 40), f(130), f(3000, 130)\n"
        "y = _C.linear_forward(x, w, b)\n"
        "dw, db = np.zeros((130, 40), np.float32), np.zeros(130, np.float32)\n"
        "dx = _C.linear_backward(dy, x, w, dw, db)\n"
        "np.savez(sys.argv[1], y=y, dx=dx, db=db, dw=dw)\n")
    assert_same_bits_for_thread_counts(tmp_path, script, (1, 2, 3))


@pytest.mark.parametrize("N", [1, 300])
def test_large_weight(rng, N):
    """A weight of more than 2^18 floats is multiplied in one split sgemm instead of row block
    by row block; bias fill, dbias block sums and dx accumulation must still hold."""
    Cin, Cout = 520, 513
    x, weight, bias, dy = make(rng, N, Cin, Cout)
    assert_close(_C.linear_forward(x, weight, bias), ref.linear_forward(x, weight, bias),
                 "reduction", "y")
    assert_close(_C.linear_forward(x, weight), ref.linear_forward(x, weight), "reduction",
                 "y (no bias)")
    dx0, dw0, db0 = randn(rng, N, Cin), randn(rng, Cout, Cin), randn(rng, Cout)
    dx, dweight, dbias = dx0.copy(), dw0.copy(), db0.copy()
    _C.linear_backward(dy, x, weight, dweight, dbias, dx)
    rdx, rdw, rdb = ref.linear_backward(dy, x, weight)
    assert_close(dx, dx0 + rdx, "reduction", "dx (+=)")
    assert_close(dweight, dw0 + rdw, "gradient", "dweight")
    assert_close(dbias, db0 + rdb, "reduction", "dbias")
    assert_close(_C.linear_backward(dy, x, weight, dweight), rdx, "reduction", "dx")
