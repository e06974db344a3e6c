"""C fused MLP op (linear, GELU, linear in row blocks) against the float64 reference and
against the separate C ops, and its argument checks."""
import numpy as np
import pytest

from conftest import (assert_close, assert_no_leaks, assert_same_bits_for_thread_counts,
                      expect_error, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

# 513 and 1000 rows span several 256-row blocks with a ragged last one
NS = [1, 7, 97, 257, 513]
WIDTHS = [(16, 64), (33, 20), (8, 131)]  # (C, F)


def make(rng, N, C, F):
    x = randn(rng, N, C)
    w_fc = randn(rng, F, C, scale=C**-0.5)
    b_fc = randn(rng, F, scale=0.5)
    w_proj = randn(rng, C, F, scale=F**-0.5)
    b_proj = randn(rng, C)
    dy = randn(rng, N, C)
    return x, w_fc, b_fc, w_proj, b_proj, dy


def grads(rng, C, F):
    """Nonzero prefilled parameter gradients (they accumulate): dw_fc, db_fc, dw_proj, db_proj."""
    return [randn(rng, F, C), randn(rng, F), randn(rng, C, F), randn(rng, C)]


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("C,F", WIDTHS)
def test_forward(rng, kernel, N, C, F):
    x, w_fc, b_fc, w_proj, b_proj, _ = make(rng, N, C, F)
    inputs = (x, w_fc, b_fc, w_proj, b_proj)
    before = [a.copy() for a in inputs]
    y, h = _C.mlp_forward(*inputs)
    for a, shape in ((y, (N, C)), (h, (N, F))):
        assert a.dtype == np.float32 and a.shape == shape and a.flags.c_contiguous
    ry, rh = ref.mlp_forward(*inputs)
    # h and y are dot products (over C, then F)
    assert_close(h, rh, "reduction", "h")
    assert_close(y, ry, "reduction", "y")
    for a, a0 in zip(inputs, before):
        assert np.array_equal(a, a0)


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("C,F", WIDTHS)
def test_backward(rng, kernel, N, C, F):
    x, w_fc, b_fc, w_proj, b_proj, dy = make(rng, N, C, F)
    _, h = _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    g0 = grads(rng, C, F)
    out = [a.copy() for a in g0]
    inputs = (dy, x, h, w_fc, w_proj)
    before = [a.copy() for a in inputs]
    dx = _C.mlp_backward(*inputs, *out)
    assert dx.dtype == np.float32 and dx.shape == (N, C) and dx.flags.c_contiguous
    rdx, *rgrads = ref.mlp_backward(dy, x, h, w_fc, w_proj)
    # dx chains two sgemm reductions (over C, then F); the weight gradients sum N rows of
    # products, the bias gradients N rows (in double in C)
    assert_close(dx, rdx, "gradient", "dx")
    for name, kind, got, start, expected in zip(("dw_fc", "db_fc", "dw_proj", "db_proj"),
                                                ("gradient", "reduction") * 2, out, g0, rgrads):
        assert_close(got, start + expected, kind, name)
    for a, a0 in zip(inputs, before):
        assert np.array_equal(a, a0)
    # keywords, and a second call adds the parameter gradients again
    dx2 = _C.mlp_backward(dy=dy, x=x, h=h, w_fc=w_fc, w_proj=w_proj, dw_fc=out[0],
                          db_fc=out[1], dw_proj=out[2], db_proj=out[3])
    assert np.array_equal(dx2, dx)
    for name, kind, got, start, expected in zip(("dw_fc", "db_fc", "dw_proj", "db_proj"),
                                                ("gradient", "reduction") * 2, out, g0, rgrads):
        assert_close(got, start + 2 * expected, kind, name + " (2 calls)")


# (N, C, F): one block; several 256-row blocks with a ragged last one; row and column tails of
# the kernel's tiles; weights of 2 x 2^17 floats, in fewer chunks than blocks, with h large
# enough for the pool's aligned buffers (non-temporal stores)
@pytest.mark.parametrize("N, C, F", [(7, 24, 96), (1000, 24, 96), (513, 33, 20),
                                     (3000, 192, 768), (5000, 192, 768)])
def test_matches_separate_ops(rng, kernel, N, C, F):
    """The fused op computes what linear, gelu, linear compute one after the other, to the
    bit: the same row blocks, chunks and products, and GELU's operations in the same order
    (on the AVX-512 path, in the product's registers)."""
    x, w_fc, b_fc, w_proj, b_proj, dy = make(rng, N, C, F)
    y, h = _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    h1 = _C.linear_forward(x, w_fc, b_fc)
    g1 = _C.gelu_forward(h1)
    assert np.array_equal(h, h1)
    assert np.array_equal(y, _C.linear_forward(g1, w_proj, b_proj))
    fused = [np.zeros((F, C), np.float32), np.zeros(F, np.float32),
             np.zeros((C, F), np.float32), np.zeros(C, np.float32)]
    dx = _C.mlp_backward(dy, x, h, w_fc, w_proj, *fused)
    sep = [np.zeros_like(a) for a in fused]
    dg = _C.linear_backward(dy, g1, w_proj, sep[2], sep[3])
    dx1 = _C.linear_backward(_C.gelu_backward(dg, h), x, w_fc, sep[0], sep[1])
    assert np.array_equal(dx, dx1)
    for name, a, b in zip(("dw_fc", "db_fc", "dw_proj", "db_proj"), fused, sep):
        assert np.array_equal(a, b), name


def test_same_bits_for_any_thread_count(tmp_path):
    """Row blocks and the chunks of the weight gradients' sums depend on N, C and F only, and
    the block and chunk sums are combined in order, so every output has the same bits on 1, 2
    and 3 threads."""
    script = (
        "import sys\nimport numpy as np\nfrom mapformer import _C\n"
        "r = np.random.default_rng(5)\n"
        "f = lambda *s: r.standard_normal(s).astype(np.float32)\n"
        "out = {}\n"
        "for N, C, F in ((1000, 24, 96), (5000, 192, 768)):\n"
        "    x, wf, bf, wp, bp, dy = f(N, C), f(F, C), f(F), f(C, F), f(C), f(N, C)\n"
        "    y, h = _C.mlp_forward(x, wf, bf, wp, bp)\n"
        "    gr = [np.zeros((F, C), np.float32), np.zeros(F, np.float32),\n"
        "          np.zeros((C, F), np.float32), np.zeros(C, np.float32)]\n"
        "    dx = _C.mlp_backward(dy, x, h, wf, wp, *gr)\n"
        "    for name, a in zip(('y', 'h', 'dx', 'dwf', 'dbf', 'dwp', 'dbp'), (y, h, dx, *gr)):\n"
        "        out[f'{name}{C}'] = a\n"
        "np.savez(sys.argv[1], **out)\n")
    assert_same_bits_for_thread_counts(tmp_path, script, (1, 2, 3))


def test_forward_bad_inputs(rng):
    x, w_fc, b_fc, w_proj, b_proj, _ = make(rng, 5, 8, 12)
    ok = dict(x=x, w_fc=w_fc, b_fc=b_fc, w_proj=w_proj, b_proj=b_proj)
    cases = [
        ("x", x.astype(np.float64), TypeError),
        ("x", x.tolist(), TypeError),
        ("w_fc", w_fc.astype(np.float16), TypeError),
        ("b_fc", b_fc.astype(np.float64), TypeError),
        ("w_proj", w_proj.astype(np.int32), TypeError),
        ("b_proj", b_proj.astype(np.float64), TypeError),
        ("x", x[0], ValueError),  # ndim
        ("x", np.zeros((0, 8), np.float32), ValueError),  # empty axis
        ("x", np.asfortranarray(randn(rng, 5, 8)), ValueError),  # layout
        ("x", randn(rng, 5, 16)[:, ::2], ValueError),  # strided
        ("w_fc", randn(rng, 12, 9), ValueError),  # C mismatch
        ("b_fc", randn(rng, 13), ValueError),  # F mismatch
        ("b_fc", None, TypeError),  # required
        ("w_proj", randn(rng, 12, 8), ValueError),  # transposed
        ("w_proj", randn(rng, 8, 13), ValueError),
        ("b_proj", randn(rng, 9), ValueError),
    ]
    for name, bad, exc in cases:
        with raises_naming(exc, name):
            _C.mlp_forward(**{**ok, name: bad})


def test_backward_bad_inputs(rng):
    N, C, F = 5, 8, 12
    x, w_fc, b_fc, w_proj, b_proj, dy = make(rng, N, C, F)
    _, h = _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    dw_fc, db_fc = np.zeros((F, C), np.float32), np.zeros(F, np.float32)
    dw_proj, db_proj = np.zeros((C, F), np.float32), np.zeros(C, np.float32)
    ok = dict(dy=dy, x=x, h=h, w_fc=w_fc, w_proj=w_proj, dw_fc=dw_fc, db_fc=db_fc,
              dw_proj=dw_proj, db_proj=db_proj)
    readonly = np.zeros((F, C), np.float32)
    readonly.flags.writeable = False
    cases = [
        ("dy", dy.astype(np.float64), TypeError),
        ("x", x.astype(np.int32), TypeError),
        ("h", h.astype(np.float64), TypeError),
        ("h", h.tolist(), TypeError),
        ("w_fc", w_fc.astype(np.float64), TypeError),
        ("w_proj", w_proj.astype(np.float64), TypeError),
        ("dw_fc", dw_fc.astype(np.float64), TypeError),
        ("db_fc", db_fc.astype(np.float64), TypeError),
        ("dw_proj", dw_proj.astype(np.float64), TypeError),
        ("db_proj", db_proj.astype(np.float64), TypeError),
        ("dy", dy[0], ValueError),
        ("dy", np.zeros((5, 0), np.float32), ValueError),
        ("x", randn(rng, 6, C), ValueError),  # N mismatch
        ("x", randn(rng, N, C + 1), ValueError),  # C mismatch
        ("h", randn(rng, N, F + 1), ValueError),  # F mismatch
        ("h", randn(rng, N + 1, F), ValueError),
        ("h", randn(rng, N, F - 1), ValueError),
        ("h", np.asfortranarray(randn(rng, N, F)), ValueError),
        ("w_fc", randn(rng, C, F), ValueError),  # transposed
        ("w_proj", randn(rng, F, C), ValueError),
        ("dw_fc", np.zeros((C, F), np.float32), ValueError),
        ("dw_fc", readonly, ValueError),
        ("db_fc", np.zeros(F + 1, np.float32), ValueError),
        ("dw_proj", np.zeros((C, 2 * F), np.float32)[:, ::2], ValueError),
        ("db_proj", np.zeros((C, 1), np.float32), ValueError),
    ]
    for name, bad, exc in cases:
        with raises_naming(exc, name):
            _C.mlp_backward(**{**ok, name: bad})
    for a in (dw_fc, db_fc, dw_proj, db_proj):
        assert not a.any()


def test_backward_overlap_rejected(rng):
    N, C, F = 6, 6, 6  # square, so gradient, weight and activation shapes coincide
    x, w_fc, b_fc, w_proj, b_proj, dy = make(rng, N, C, F)
    _, h = _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    buf = np.zeros(2 * F * C + F + C, np.float32)
    dw_fc, dw_proj = buf[:F * C].reshape(F, C), buf[F * C:2 * F * C].reshape(C, F)
    db_fc, db_proj = buf[2 * F * C:2 * F * C + F], buf[2 * F * C + F:]
    ok = dict(dy=dy, x=x, h=h, w_fc=w_fc, w_proj=w_proj, dw_fc=dw_fc, db_fc=db_fc,
              dw_proj=dw_proj, db_proj=db_proj)
    with raises_naming(ValueError, "dw_fc"):  # a gradient written over its own weight
        _C.mlp_backward(**{**ok, "dw_fc": w_fc})
    with raises_naming(ValueError, "dw_proj"):  # over an input that dw_fc's sgemm reads
        _C.mlp_backward(**{**ok, "dw_proj": x})
    with raises_naming(ValueError, "dw_fc"):  # two gradients sharing memory
        _C.mlp_backward(**{**ok, "dw_proj": buf[1:F * C + 1].reshape(C, F)})
    assert not buf.any()
    # disjoint views into one flat buffer, as the model's gradients are, are fine
    _C.mlp_backward(**ok)
    _, rdw_fc, rdb_fc, rdw_proj, rdb_proj = ref.mlp_backward(dy, x, h, w_fc, w_proj)
    assert_close(dw_fc, rdw_fc, "gradient", "dw_fc view")
    assert_close(db_fc, rdb_fc, "reduction", "db_fc view")
    assert_close(dw_proj, rdw_proj, "gradient", "dw_proj view")
    assert_close(db_proj, rdb_proj, "reduction", "db_proj view")


def test_no_leaks(rng):
    """Results and errors alike leave reference counts and resident memory flat."""
    N, C, F = 9, 8, 12
    x, w_fc, b_fc, w_proj, b_proj, dy = make(rng, N, C, F)
    dw_fc, db_fc = np.zeros((F, C), np.float32), np.zeros(F, np.float32)
    dw_proj, db_proj = np.zeros((C, F), np.float32), np.zeros(C, np.float32)
    bad = randn(rng, N, C + 1)

    def calls():
        _, h = _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
        _C.mlp_backward(dy, x, h, w_fc, w_proj, dw_fc, db_fc, dw_proj, db_proj)
        expect_error(_C.mlp_forward, bad, w_fc, b_fc, w_proj, b_proj)
        expect_error(_C.mlp_backward, dy, x, h, w_fc, w_proj, dw_fc, db_fc, dw_proj, bad)

    assert_no_leaks(calls, (x, w_fc, b_fc, w_proj, b_proj, dy, dw_fc, db_fc, dw_proj, db_proj,
                            bad))
