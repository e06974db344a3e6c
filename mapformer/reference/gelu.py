"""Float64 NumPy reference of the gelu ops (csrc/ops/gelu.c):
GELU, tanh approximation or exact (approximate='tanh' | 'none', PyTorch's names)."""
import math

import numpy as np

from .common import GELU_K, _cast, returns


GELU_APPROXIMATIONS = ("tanh", "none")


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _normal_cdf(x, approximate):
    """Phi(x) = erfc(-x / sqrt 2) / 2 in float64 (math.erfc: the lower tail keeps its relative
    accuracy), after checking ``approximate``."""
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    return (0.5 * _erfc(-x / math.sqrt(2.0))).astype(x.dtype, copy=False)


@returns("y")
def gelu_forward(x, dtype=np.float64, *, approximate="tanh"):
    """x (...) -> gelu(x). approximate "tanh": 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x +
    0.044715 x^3), computed as the equal x * sigmoid(2u), which keeps its relative accuracy for
    large negative x; "none": the exact x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    (x,) = _cast(dtype, x)
    if approximate != "tanh":
        return x * _normal_cdf(x, approximate)
    with np.errstate(over="ignore"):  # exp -> inf gives the exact limit -0
        return x / (1.0 + np.exp(-2.0 * GELU_K * (x + 0.044715 * x**3)))


@returns("dx")
def gelu_backward(dy, x, dtype=np.float64, *, approximate="tanh"):
    """dy, x (...) -> dx (...) = dy gelu'(x); exact: gelu'(x) = Phi(x) + x exp(-x^2/2) /
    sqrt(2 pi)."""
    dy, x = _cast(dtype, dy, x)
    if approximate != "tanh":
        return dy * (_normal_cdf(x, approximate)
                     + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))
    u = GELU_K * (x + 0.044715 * x**3)
    t = np.tanh(u)
    du = GELU_K * (1.0 + 3 * 0.044715 * x**2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * du)
