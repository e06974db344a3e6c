"""Float64 NumPy reference of the l2_normalize ops (csrc/ops/l2_normalize.c):
rows scaled to unit length (TDB's enc objective)."""
import numpy as np

from .common import _cast, returns


@returns("y", "norm")
def l2_normalize_forward(x, eps=1e-12, dtype=np.float64):
    """x (N, D) -> (y (N, D), norm (N,)): norm = sqrt(sum_d x^2 + eps), y = x / norm."""
    (x,) = _cast(dtype, x)
    norm = np.sqrt((x * x).sum(-1) + eps)
    return x / norm[:, None], norm


@returns("dx")
def l2_normalize_backward(dy, y, norm, dtype=np.float64):
    """dy (N, D), the forward's y (N, D) and norm (N,) -> dx (N, D) = (dy - y (y . dy)) / norm."""
    dy, y, norm = _cast(dtype, dy, y, norm)
    return (dy - y * (y * dy).sum(-1, keepdims=True)) / norm[:, None]
