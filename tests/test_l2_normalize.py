"""C l2_normalize op (TDB's enc objective) against the float64 reference, forward and
backward on awkward widths and zero rows, the reference against finite differences, the same
bits for any thread count, and its argument checks."""
import numpy as np
import pytest

from conftest import (assert_array_argument_checked, assert_float32_accurate,
                      assert_same_bits_for_thread_counts, numerical_grad, raises_naming,
                      randn)
from mapformer import _C
from mapformer import reference as ref

NS = [1, 5, 97, 1000]
DS = [1, 3, 17, 129, 128]


def make(rng, N, D):
    """x (N, D) with every third row zero (when N > 1) and the rows' scales far apart, dy."""
    x = randn(rng, N, D) * np.float32(10.0) ** rng.integers(-3, 4, (N, 1)).astype(np.float32)
    if N > 1:
        x[::3] = 0.0
    return x, randn(rng, N, D)


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("D", DS)
def test_forward(rng, N, D):
    x, _ = make(rng, N, D)
    x0 = x.copy()
    y, norm = _C.l2_normalize_forward(x)
    assert y.shape == (N, D) and norm.shape == (N,) and y.dtype == norm.dtype == np.float32
    assert np.array_equal(x, x0)
    ry, rnorm = ref.l2_normalize_forward(x)
    y32, norm32 = ref.l2_normalize_forward(x, dtype=np.float32)
    assert_float32_accurate(y, ry, y32, "y")
    assert_float32_accurate(norm, rnorm, norm32, "norm")
    zero = ~x.any(-1)
    assert np.array_equal(y[zero], np.zeros_like(y[zero]))  # eps keeps zero rows finite
    assert np.array_equal(norm[zero], np.full(zero.sum(), np.sqrt(1e-12), np.float32))
    y2, _ = _C.l2_normalize_forward(x, eps=0.5)
    ry2, _ = ref.l2_normalize_forward(x, eps=0.5)
    assert_float32_accurate(y2, ry2, ref.l2_normalize_forward(x, 0.5, np.float32)[0], "y, eps")


@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("D", DS)
def test_backward(rng, N, D):
    x, dy = make(rng, N, D)
    y, norm = _C.l2_normalize_forward(x)
    before = (dy.copy(), y.copy(), norm.copy())
    dx = _C.l2_normalize_backward(dy, y, norm)
    assert dx.shape == (N, D) and dx.dtype == np.float32
    for a, a0 in zip((dy, y, norm), before):
        assert np.array_equal(a, a0)
    rdx = ref.l2_normalize_backward(dy, y, norm)
    dx32 = ref.l2_normalize_backward(dy, y, norm, dtype=np.float32)
    # dy - y (y . dy) may cancel: the terms' size, |dy| / norm, is the error's scale
    assert_float32_accurate(dx, rdx, dx32, "dx", magnitude=np.abs(dy) / norm[:, None])
    assert np.array_equal(dx, _C.l2_normalize_backward(dy=dy, y=y, norm=norm))


@pytest.mark.parametrize("D", [1, 3, 17])
def test_reference_gradient_by_finite_differences(rng, D):
    x = rng.standard_normal((4, D))
    x[2] = 0.0  # the zero row: y = x / sqrt(eps), its gradient 1 / sqrt(eps)
    eps = 1e-2  # a zero row's gradient 1 / sqrt(eps) stays in finite differences' range
    w = rng.standard_normal((4, D))
    y, norm = ref.l2_normalize_forward(x, eps)
    dx = ref.l2_normalize_backward(w, y, norm)
    numeric = numerical_grad(lambda: float((w * ref.l2_normalize_forward(x, eps)[0]).sum()), x)
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)


def test_same_bits_for_any_thread_count(tmp_path):
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.standard_normal((3001, 129)).astype(np.float32)\n"
        "dy = rng.standard_normal((3001, 129)).astype(np.float32)\n"
        "y, norm = _C.l2_normalize_forward(x)\n"
        "np.savez(sys.argv[1], y=y, norm=norm, dx=_C.l2_normalize_backward(dy, y, norm))\n"),
        threads=(1, 3))


def test_forward_bad_inputs(rng):
    x = randn(rng, 4, 6)
    assert_array_argument_checked(lambda v: _C.l2_normalize_forward(v), "x", x, sizes=False)
    for eps, exc in ((0.0, ValueError), (-1e-3, ValueError), (float("nan"), ValueError),
                     (float("inf"), ValueError), (1e-50, ValueError),  # 0 in float32
                     (1e39, ValueError), ("1e-12", TypeError), (None, TypeError)):
        with raises_naming(exc, "eps"):
            _C.l2_normalize_forward(x, eps)
    with pytest.raises(TypeError, match="bogus"):
        _C.l2_normalize_forward(x, bogus=1)


def test_backward_bad_inputs(rng):
    x, dy = randn(rng, 4, 6), randn(rng, 4, 6)
    y, norm = _C.l2_normalize_forward(x)
    assert_array_argument_checked(lambda v: _C.l2_normalize_backward(v, y, norm), "dy", dy,
                                  sizes=False)
    assert_array_argument_checked(lambda v: _C.l2_normalize_backward(dy, v, norm), "y", y)
    for bad, exc in ((norm.astype(np.float64), TypeError), (norm.tolist(), TypeError),
                     (norm[:-1].copy(), ValueError), (norm[None], ValueError),
                     (np.repeat(norm, 2)[::2], ValueError)):
        with raises_naming(exc, "norm"):
            _C.l2_normalize_backward(dy, y, bad)
    for value in (0.0, -1.0, float("nan"), float("inf")):
        bad = norm.copy()
        bad[2] = value
        with pytest.raises(ValueError, match=r"^norm\[2\] = "):
            _C.l2_normalize_backward(dy, y, bad)
