"""GridPE's complex form (the C op gridpe_complex): against the float64 reference, the
dot-product identity (y_m . y'_n = sum_d x_d x'_d cos(theta_d(m) - theta_d(n))), the
reference against finite differences, bad input (arrays, theta's TB), leaks and thread
counts."""
import numpy as np
import pytest

from conftest import (U32, assert_array_argument_checked, assert_no_leaks,
                      assert_same_bits_for_thread_counts, assert_unchanged, assert_within,
                      copies, expect_error, numerical_grad, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

# (B, T, H, E): 1s, odd and prime sizes; the last past the single-thread threshold
SIZES = [(1, 1, 1, 1), (3, 7, 2, 3), (2, 13, 3, 5), (5, 97, 2, 32)]


@pytest.mark.parametrize("B,T,H,E", SIZES)
@pytest.mark.parametrize("broadcast", [True, False])
def test_forward_and_backward_match_reference(rng, B, T, H, E, broadcast):
    """Each output is one double product (or a double sum of two) rounded once to float32:
    within float32's unit roundoff of the float64 reference, plus the double's own error (far
    smaller) relative to the terms; angles up to 50 radians."""
    x, dy = randn(rng, B, T, H, E), randn(rng, B, T, H, 2 * E)
    theta = randn(rng, 1 if broadcast else B, T, H, E, scale=20.0)
    before = copies(x, dy, theta)
    y, dx = _C.gridpe_complex_forward(x, theta), _C.gridpe_complex_backward(dy, theta)
    assert y.dtype == dx.dtype == np.float32 and y.shape == dy.shape and dx.shape == x.shape
    ey, edx = ref.gridpe_complex_forward(x, theta), ref.gridpe_complex_backward(dy, theta)
    terms = np.abs(np.cos(theta.astype(np.float64)) * dy[..., 0::2]) + np.abs(
        np.sin(theta.astype(np.float64)) * dy[..., 1::2])
    assert_within(y, ey, U32 * np.abs(ey) + 1e-15 * np.abs(x).repeat(2, -1), "y")
    assert_within(dx, edx, U32 * np.abs(edx) + 1e-15 * terms, "dx")
    assert_unchanged(before, (x, dy, theta))


def test_dot_products_are_a_cosine_kernel_per_channel(rng):
    """The complex form read with the paper's conjugate: rows of two tokens give
    sum_d x_d x'_d cos(theta_d(m) - theta_d(n)); at theta = 0 it pads with zeros and the
    backward picks the even channels."""
    x, k = rng.standard_normal((1, 6, 2, 5)), rng.standard_normal((1, 6, 2, 5))
    theta = rng.standard_normal((1, 6, 2, 5)) * 3
    yq, yk = ref.gridpe_complex_forward(x, theta), ref.gridpe_complex_forward(k, theta)
    got = np.einsum("bmhd,bnhd->bhmn", yq, yk)
    diff = theta[:, :, None] - theta[:, None, :]  # (1, m, n, H, E)
    expected = np.einsum("bmhd,bnhd,bmnhd->bhmn", x, k, np.cos(diff))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    x32 = x.astype(np.float32)
    padded = _C.gridpe_complex_forward(x32, np.zeros_like(x32))
    np.testing.assert_array_equal(padded[..., 0::2], x32)
    np.testing.assert_array_equal(padded[..., 1::2], 0)
    np.testing.assert_array_equal(_C.gridpe_complex_backward(padded, np.zeros_like(x32)), x32)


def test_reference_gradient_matches_finite_differences(rng):
    x, theta = rng.standard_normal((2, 5, 1, 3)), rng.standard_normal((1, 5, 1, 3))
    c = rng.standard_normal((2, 5, 1, 6))

    def loss():
        return (ref.gridpe_complex_forward(x, theta) * c).sum()

    np.testing.assert_allclose(ref.gridpe_complex_backward(c, theta), numerical_grad(loss, x),
                               rtol=1e-7, atol=1e-9)


# ---- bad input ----------------------------------------------------------------------------
def good_args(rng):
    return {"gridpe_complex_forward": dict(x=randn(rng, 2, 5, 2, 4),
                                           theta=randn(rng, 2, 5, 2, 4)),
            "gridpe_complex_backward": dict(dy=randn(rng, 2, 5, 2, 8),
                                            theta=randn(rng, 2, 5, 2, 4))}


@pytest.mark.parametrize("op,arg", [("gridpe_complex_forward", "x"),
                                    ("gridpe_complex_forward", "theta"),
                                    ("gridpe_complex_backward", "dy"),
                                    ("gridpe_complex_backward", "theta")])
def test_bad_arrays(rng, op, arg):
    kwargs = good_args(rng)[op]
    first = arg in ("x", "dy")  # fixes the sizes the other is checked against
    assert_array_argument_checked(lambda v: getattr(_C, op)(**{**kwargs, arg: v}), arg,
                                  kwargs[arg], sizes=not first)


@pytest.mark.parametrize("op", ["gridpe_complex_forward", "gridpe_complex_backward"])
def test_theta_batch_must_be_one_or_b(rng, op):
    kwargs = good_args(rng)[op]
    assert getattr(_C, op)(*kwargs.values()).shape[0] == 2  # positionally
    with raises_naming(ValueError, "theta"):
        getattr(_C, op)(**{**kwargs, "theta": randn(rng, 3, 5, 2, 4)})
    with pytest.raises(TypeError, match="at most 2"):
        getattr(_C, op)(**kwargs, bogus=1)


def test_no_reference_or_memory_leaks(rng):
    x, theta, dy = randn(rng, 2, 5, 2, 4), randn(rng, 1, 5, 2, 4), randn(rng, 2, 5, 2, 8)

    def calls():
        _C.gridpe_complex_forward(x, theta)
        _C.gridpe_complex_backward(dy, theta)
        expect_error(_C.gridpe_complex_forward, x, theta[:, :4])
        expect_error(_C.gridpe_complex_backward, x, theta)

    assert_no_leaks(calls, (x, theta, dy), rounds=300)


def test_results_do_not_depend_on_thread_count(tmp_path):
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(5)\n"
        "x = rng.standard_normal((8, 70, 2, 32)).astype(np.float32)\n"
        "dy = rng.standard_normal((8, 70, 2, 64)).astype(np.float32)\n"
        "theta = rng.standard_normal((1, 70, 2, 32)).astype(np.float32) * 9\n"
        "np.savez(sys.argv[1], _C.gridpe_complex_forward(x, theta),\n"
        "         _C.gridpe_complex_backward(dy, theta))\n"))
