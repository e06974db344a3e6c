"""C fused MLP op (linear, GELU, linear in row blocks) against the float64 reference and
against the separate C ops, on every kernel set, and its argument checks.

Tolerances follow from the problem: each product's rounding-error bound (conftest.gamma: a
float32 sum of n terms is within gamma(n) times the sum of their magnitudes), carried through
GELU by its derivative, plus GELU's own rounding (below), all in float64 from the inputs; and,
over arrays of 1024 elements or more, no worse than twice float32 NumPy's error on the same
math (conftest.assert_product_close)."""
import numpy as np
import pytest

from conftest import (U32, assert_no_leaks, assert_product_close,
                      assert_same_bits_for_thread_counts, assert_within, expect_error, gamma,
                      randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

GELU_K = np.sqrt(2 / np.pi)


def gelu_parts(h):
    """For h (float64): gelu(h), gelu'(h), the magnitude of gelu'(h)'s terms, and the relative
    error GELU's float32 evaluation may add (the exponential's argument t = -2u log2(e), about
    2.3 |h + 0.044715 h^3|, rounded to float32 moves exp(-2u) by ln(2) |t| u relatively, a few
    ulps for the polynomial's and the remaining operations' roundings; gelu.c's dense test
    bounds the rest by 4 ulps)."""
    u = GELU_K * (h + 0.044715 * h**3)
    with np.errstate(over="ignore"):
        e = np.exp(-2 * u)
        s = 1 / (1 + e)
    du = GELU_K * (1 + 3 * 0.044715 * h**2)
    cross = 2 * h * np.where(np.isinf(e), 0.0, e * s * s) * du
    t = np.abs(2 * u) / np.log(2)
    rel = U32 * (16 + 2 * np.log(2) * t)
    return h * s, s + cross, s + np.abs(cross), rel


def f32_gelu(h):
    """GELU in float32 NumPy, the baseline's operations"""
    return h / (np.float32(1) + np.exp(np.float32(-2 * GELU_K) * (h + np.float32(0.044715) * h**3)))


def f32_gelu_grad(h):
    t = np.tanh(np.float32(GELU_K) * (h + np.float32(0.044715) * h**3))
    du = np.float32(GELU_K) * (np.float32(1) + np.float32(3 * 0.044715) * h * h)
    return np.float32(0.5) * (1 + t) + np.float32(0.5) * h * (1 - t * t) * du


# 257 and 513 rows span several row blocks (128 or 256 rows, by kernel set), the last ragged
NS = [1, 7, 97, 257, 513]
# (C, F): F not a multiple of any vector width (column tails, GELU in the tail's registers),
# C odd, F over 256 (the products' passes over k)
WIDTHS = [(16, 64), (33, 20), (8, 131), (5, 300)]


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


def check_forward(y, h, x, w_fc, b_fc, w_proj, b_proj):
    """h = x w_fc^T + b_fc: sums of C products and the bias; y = gelu(h) w_proj^T + b_proj from
    the rounded h: h's error through gelu' (at most 1.13 in magnitude) and w_proj, GELU's own
    rounding, and the sums of F products and the bias"""
    x64, wf, bf, wp, bp = (a.astype(np.float64) for a in (x, w_fc, b_fc, w_proj, b_proj))
    C = x.shape[1]
    F = w_fc.shape[0]
    ry, rh = ref.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    h_mag = np.abs(x64) @ np.abs(wf).T + np.abs(bf)
    h32 = x @ w_fc.T + b_fc
    assert_product_close(h, rh, h_mag, C, h32, "h")
    g, _, _, rel = gelu_parts(rh)
    g_err = 1.13 * gamma(C + 2) * h_mag + np.abs(g) * rel
    y_mag = np.abs(g) @ np.abs(wp).T + np.abs(bp)
    bound = g_err @ np.abs(wp).T + gamma(F + 2) * (y_mag + g_err @ np.abs(wp).T)
    assert_within(y, ry, bound, "y")
    if y.size >= 1024:  # against float32 NumPy, as conftest.assert_product_close
        np_err = np.abs((f32_gelu(h32) @ w_proj.T + b_proj) - ry).max()
        err = np.abs(y - ry).max()
        assert err <= 2 * np_err + 4 * U32 * np.abs(ry).max(), (err, np_err)


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("C,F", WIDTHS)
def test_forward(rng, kernel, N, C, F):
    x, w_fc, b_fc, w_proj, b_proj, _ = make(rng, N, C, F)
    inputs = (x, w_fc, b_fc, w_proj, b_proj)
    before = [a.copy() for a in inputs]
    y, h = _C.mlp_forward(*inputs)
    for a, shape in ((y, (N, C)), (h, (N, F))):
        assert a.dtype == np.float32 and a.shape == shape and a.flags.c_contiguous
    check_forward(y, h, *inputs)
    for a, a0 in zip(inputs, before):
        assert np.array_equal(a, a0)


def check_backward(dx, grads, starts, dy, x, h, w_fc, w_proj, calls=1):
    """From the forward's h (an input here, exact): dg = dy w_proj, sums of C products;
    dh = dg gelu'(h), dg's error times |gelu'| plus gelu''s own rounding on its terms'
    magnitude; dx = dh w_fc (sums of F products, dh's error through w_fc); the weight
    gradients sum N rows of products (dw_proj's from gelu(h), GELU's own rounding carried),
    the bias gradients N rows in double; `calls` backward calls accumulated."""
    dy64, x64, wf, wp = (a.astype(np.float64) for a in (dy, x, w_fc, w_proj))
    C, F, N = x.shape[1], w_fc.shape[0], x.shape[0]
    rdx, rdw_fc, rdb_fc, rdw_proj, rdb_proj = ref.mlp_backward(dy, x, h, w_fc, w_proj)
    h64 = h.astype(np.float64)
    g, gp, gp_mag, rel = gelu_parts(h64)
    dg = dy64 @ wp
    dg_err = gamma(C + 2) * (np.abs(dy64) @ np.abs(wp))
    dh_err = dg_err * np.abs(gp) + np.abs(dg) * gp_mag * rel + U32 * np.abs(dg * gp)
    dh_mag = np.abs(dg * gp) + dh_err
    # float32 NumPy on the same math
    h32 = h
    dh32 = (dy @ w_proj) * f32_gelu_grad(h32)
    dx_bound = dh_err @ np.abs(wf) + gamma(F + 2) * (dh_mag @ np.abs(wf))
    assert_within(dx, rdx, dx_bound, "dx")
    if dx.size >= 1024:
        np_err = np.abs((dh32 @ w_fc) - rdx).max()
        err = np.abs(dx - rdx).max()
        assert err <= 2 * np_err + 4 * U32 * np.abs(rdx).max(), ("dx", err, np_err)
    g_err = np.abs(g) * rel
    for name, got, start, exact, mag, err in (
            ("dw_fc", grads[0], starts[0], rdw_fc, dh_mag.T @ np.abs(x64), dh_err.T @ np.abs(x64)),
            ("dw_proj", grads[2], starts[2], rdw_proj, np.abs(dy64).T @ (np.abs(g) + g_err),
             np.abs(dy64).T @ g_err)):
        s64 = start.astype(np.float64)
        bound = calls * err + gamma(calls * N + 2) * (calls * mag + np.abs(s64))
        assert_within(got, s64 + calls * exact, bound, name)
    for name, got, start, exact, mag, err in (
            ("db_fc", grads[1], starts[1], rdb_fc, dh_mag.sum(0), dh_err.sum(0)),
            ("db_proj", grads[3], starts[3], rdb_proj, np.abs(dy64).sum(0), 0.0)):
        s64 = start.astype(np.float64)
        bound = calls * err + gamma(2 * calls + 1) * (calls * mag + np.abs(s64))
        assert_within(got, s64 + calls * exact, bound, name)


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
    check_backward(dx, out, g0, dy, x, h, w_fc, w_proj)
    for a, a0 in zip(inputs, before):
        assert np.array_equal(a, a0)
    # keywords, and a second call adds the parameter gradients again
    dx2 = _C.mlp_backward(dy=dy, x=x, h=h, w_fc=w_fc, w_proj=w_proj, dw_fc=out[0],
                          db_fc=out[1], dw_proj=out[2], db_proj=out[3])
    assert np.array_equal(dx2, dx)
    check_backward(dx2, out, g0, dy, x, h, w_fc, w_proj, calls=2)


# (N, C, F): one block; several row blocks with a ragged last one; row and column tails of
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


def test_same_bits_for_any_thread_count(tmp_path, kernel, monkeypatch):
    """Row blocks and the chunks of the weight gradients' sums depend on N, C and F only (on
    each kernel set), and the block and chunk sums are combined in order, so every output has
    the same bits on 1, 2 and 3 threads."""
    monkeypatch.setenv("MAPFORMER_KERNELS", kernel)  # the child runs this kernel set
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
    dx = _C.mlp_backward(**ok)
    check_backward(dx, [dw_fc, db_fc, dw_proj, db_proj],
                   [np.zeros_like(a) for a in (dw_fc, db_fc, dw_proj, db_proj)], dy, x, h, w_fc,
                   w_proj)


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
