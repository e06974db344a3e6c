"""The exact GELU, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (approximate="none", PyTorch's
nn.GELU() default), in the C gelu and mlp ops: against float64 math.erfc on a dense grid,
against the separate ops on every kernel set, the reference against finite differences, and
the argument checks.

Tolerance of the elementwise op, from the problem: a few float32 roundings of the result
(16 u), plus the conditioning of x Phi(x) for negative x. Its relative condition number is
1 + x phi(x) / Phi(x), about 1 + x^2 for x << 0, and the kernel rounds x / sqrt(2) once
(simd.h's vnormal), so the bound is u (16 + 4 x^2) |y|; below float32's smallest normal the
result is a subnormal, good to its absolute spacing. Every test runs in both subnormal modes
of the ops: with subnormals kept (IEEE) the floor of the error is float32's smallest normal;
flushed (the default, csrc/ops/subnormals.c), a Phi(x) or phi(x) below it is zero, so the
floor is |x| + 1 smallest normals, and a subnormal x is read as zero."""
import math

import numpy as np
import pytest

from conftest import U32, assert_within, gamma, numerical_grad, raises_naming, randn
from mapformer import _C
from mapformer import reference as ref

TINY = float(np.finfo(np.float32).tiny)


@pytest.fixture(params=["flush", "keep"], autouse=True)
def floor(request):
    """The ops' subnormal mode for the test, and the floor of the error at float32 points x:
    TINY kept, (|x| + 1) TINY flushed."""
    before = _C.subnormals()
    _C.set_subnormals(request.param)
    yield (lambda x: TINY) if request.param == "keep" else (
        lambda x: (np.abs(np.asarray(x, np.float64)) + 1.0) * TINY)
    _C.set_subnormals(before)


def exact(x):
    """float64 Phi(x) and x phi(x) at the float32 points x, with math.erfc (no cancellation)."""
    x = x.astype(np.float64)
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x])
    return cdf, x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def grid():
    """A dense grid of [-14, 14] (gelu(-14) is below float32's normals), tiny and negative
    tiny x, and special points."""
    return np.concatenate([
        np.linspace(-14, 14, 140001), np.geomspace(1e-38, 1, 400), -np.geomspace(1e-38, 1, 400),
        [0.0, -0.0, 0.5, -0.75179, 1.0, -1.0, 1.2727, -1.2727, 100.0, -100.0, 3e38, -3e38],
    ]).astype(np.float32)


def test_dense_grid_against_math_erf(floor):
    x = grid()
    cdf, xpdf = exact(x)
    x64 = x.astype(np.float64)
    slack = U32 * (16 + 4 * x64 * x64)
    y = _C.gelu_forward(x, approximate="none")
    assert_within(y, x64 * cdf, slack * np.abs(x64 * cdf) + floor(x), "y")
    dy = np.ones_like(x)
    dx = _C.gelu_backward(dy, x, approximate="none")
    assert_within(dx, cdf + xpdf, slack * (np.abs(cdf) + np.abs(xpdf)) + floor(x), "dx")
    # the float64 reference is the same function
    assert_within(ref.gelu_forward(x, approximate="none"), x64 * cdf, 1e-15 * np.abs(x64 * cdf),
                  "reference y")
    assert_within(ref.gelu_backward(dy, x, approximate="none"), cdf + xpdf,
                  1e-14 * (np.abs(cdf) + np.abs(xpdf)), "reference dx")


def test_special_values():
    x = np.array([np.nan, np.inf, 0.0, -0.0, 200.0, -200.0, 1e-40], np.float32)
    y = _C.gelu_forward(x, approximate="none")
    assert np.isnan(y[0]) and y[1] == np.inf and y[2] == 0 and y[3] == 0
    assert y[4] == 200.0 and y[5] == 0
    assert y[6] == (np.float32(0.5e-40) if _C.subnormals() == "keep" else 0.0)
    dx = _C.gelu_backward(np.ones_like(x), x, approximate="none")
    assert np.isnan(dx[0]) and dx[2] == 0.5 and dx[3] == 0.5 and dx[4] == 1 and dx[5] == 0


@pytest.mark.parametrize("shape", [(1,), (7,), (97, 33), (3, 5, 7), (300007,)])
def test_shapes_and_default(rng, shape, floor):
    """approximate defaults to "tanh" (the same bits as before the choice), "none" is the
    exact GELU at every length (vector tails, several OpenMP chunks)."""
    x, dy = randn(rng, *shape, scale=3.0), randn(rng, *shape)
    assert np.array_equal(_C.gelu_forward(x, approximate="tanh"), _C.gelu_forward(x))
    assert np.array_equal(_C.gelu_backward(dy, x, approximate="tanh"), _C.gelu_backward(dy, x))
    y = _C.gelu_forward(x, approximate="none")
    x64 = x.astype(np.float64)
    slack = U32 * (16 + 4 * x64 * x64)
    ry = ref.gelu_forward(x, approximate="none")
    assert_within(y, ry, slack * np.abs(ry) + floor(x), "y")
    cdf, xpdf = (a.reshape(shape) for a in exact(x.reshape(-1)))
    dx = _C.gelu_backward(dy, x, approximate="none")
    rdx = ref.gelu_backward(dy, x, approximate="none")
    assert_within(dx, rdx, slack * np.abs(dy) * (np.abs(cdf) + np.abs(xpdf))
                  + np.abs(dy) * floor(x), "dx")
    assert not np.array_equal(y, _C.gelu_forward(x))  # the approximations differ


def test_reference_finite_differences(rng):
    x, W = rng.standard_normal((3, 11)) * 3, rng.standard_normal((3, 11))
    num = numerical_grad(lambda: (ref.gelu_forward(x, approximate="none") * W).sum(), x)
    assert_within(ref.gelu_backward(W, x, approximate="none"), num, 1e-7, "dx")
    N, C, F = 3, 4, 6
    xs, w_fc, b_fc = (rng.standard_normal(s) for s in ((N, C), (F, C), (F,)))
    w_proj, b_proj, Wy = (rng.standard_normal(s) for s in ((C, F), (C,), (N, C)))
    _, h = ref.mlp_forward(xs, w_fc, b_fc, w_proj, b_proj, approximate="none")
    got = ref.mlp_backward(Wy, xs, h, w_fc, w_proj, approximate="none")

    def loss():
        return (ref.mlp_forward(xs, w_fc, b_fc, w_proj, b_proj, approximate="none")[0]
                * Wy).sum()

    for name, a, g in zip(("x", "w_fc", "b_fc", "w_proj", "b_proj"),
                          (xs, w_fc, b_fc, w_proj, b_proj), got):
        assert_within(g, numerical_grad(loss, a), 1e-6, name)
    # and the exact GELU is not the tanh one (they differ by up to 4.7e-4, near x = -2.7)
    assert np.abs(ref.gelu_forward(x, approximate="none") - ref.gelu_forward(x)).max() > 1e-5


@pytest.mark.parametrize("N, C, F", [(7, 24, 96), (513, 33, 20), (300, 8, 131)])
def test_mlp_matches_separate_ops(rng, kernel, N, C, F):
    """With approximate="none" the fused op computes linear, exact gelu, linear to the bit
    (the product's registers give gelu.c's exact kernel's bits), forward and backward, on
    every kernel set; "tanh" is the default."""
    x = randn(rng, N, C)
    w_fc, b_fc = randn(rng, F, C, scale=C**-0.5), randn(rng, F, scale=0.5)
    w_proj, b_proj, dy = randn(rng, C, F, scale=F**-0.5), randn(rng, C), randn(rng, N, C)
    y, h = _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj, approximate="none")
    h1 = _C.linear_forward(x, w_fc, b_fc)
    g1 = _C.gelu_forward(h1, approximate="none")
    assert np.array_equal(h, h1)
    assert np.array_equal(y, _C.linear_forward(g1, w_proj, b_proj))
    y_tanh, _ = _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    assert np.array_equal(y_tanh, _C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj,
                                                 approximate="tanh")[0])
    assert not np.array_equal(y, y_tanh)
    fused = [np.zeros((F, C), np.float32), np.zeros(F, np.float32),
             np.zeros((C, F), np.float32), np.zeros(C, np.float32)]
    dx = _C.mlp_backward(dy, x, h, w_fc, w_proj, *fused, approximate="none")
    sep = [np.zeros_like(a) for a in fused]
    dg = _C.linear_backward(dy, g1, w_proj, sep[2], sep[3])
    dh = _C.gelu_backward(dg, h, approximate="none")
    assert np.array_equal(dx, _C.linear_backward(dh, x, w_fc, sep[0], sep[1]))
    for name, a, b in zip(("dw_fc", "db_fc", "dw_proj", "db_proj"), fused, sep):
        assert np.array_equal(a, b), name
    # and against the float64 reference: h's sums of C + 1 terms through gelu' (|gelu'| <=
    # 1.13), GELU's own error, then y's sums of F + 1 terms
    ry, rh = ref.mlp_forward(x, w_fc, b_fc, w_proj, b_proj, approximate="none")
    x64, wf, bf, wp, bp = (a.astype(np.float64) for a in (x, w_fc, b_fc, w_proj, b_proj))
    h_err = gamma(C + 1) * (np.abs(x64) @ np.abs(wf).T + np.abs(bf))
    g = np.abs(ref.gelu_forward(rh, approximate="none"))
    g_err = 1.13 * h_err + U32 * (16 + 4 * rh * rh) * g + TINY
    y_bound = g_err @ np.abs(wp).T + gamma(F + 1) * ((g + g_err) @ np.abs(wp).T + np.abs(bp))
    assert_within(y, ry, y_bound, "y")


def test_bad_approximate(rng):
    x = randn(rng, 4, 6)
    for fn, args in ((_C.gelu_forward, (x,)), (_C.gelu_backward, (x, x))):
        with raises_naming(ValueError, "approximate"):
            fn(*args, approximate="erf")
        with raises_naming(TypeError, "approximate"):
            fn(*args, approximate=1)
        with pytest.raises(TypeError):
            fn(*args, "none")  # keyword only
    w_fc, w_proj = randn(rng, 5, 6), randn(rng, 6, 5)
    with raises_naming(ValueError, "approximate"):
        _C.mlp_forward(x, w_fc, randn(rng, 5), w_proj, randn(rng, 6), approximate="exact")
    with pytest.raises(ValueError, match="approximate"):
        ref.gelu_forward(x, approximate="erf")
