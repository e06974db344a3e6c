"""Float64 NumPy reference of the gridpe ops (csrc/ops/gridpe.c): GridPE's complex form."""
import numpy as np

from .common import _cast, returns


@returns("y")
def gridpe_complex_forward(x, theta, dtype=np.float64):
    """x (B, T, H, E), theta (TB, T, H, E) (TB = 1 broadcast or B) -> y (B, T, H, 2E) with
    y[..., 2d] = x_d cos theta_d, y[..., 2d + 1] = x_d sin theta_d: one complex exponential
    per real channel, so y_m . y'_n = sum_d x_d x'_d cos(theta_d(m) - theta_d(n))."""
    x, theta = _cast(dtype, x, theta)
    y = np.empty(x.shape[:-1] + (2 * x.shape[-1],), dtype)
    y[..., 0::2], y[..., 1::2] = x * np.cos(theta), x * np.sin(theta)
    return y


@returns("dx")
def gridpe_complex_backward(dy, theta, dtype=np.float64):
    """dy (B, T, H, 2E), theta (TB, T, H, E) -> dx (B, T, H, E) = cos theta dy[..., 2d] +
    sin theta dy[..., 2d + 1] (theta fixed: no gradient)."""
    dy, theta = _cast(dtype, dy, theta)
    return np.cos(theta) * dy[..., 0::2] + np.sin(theta) * dy[..., 1::2]
