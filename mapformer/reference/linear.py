"""Float64 NumPy reference of the linear ops (csrc/ops/linear.c): y = x weight^T + bias."""
import numpy as np

from .common import _cast, returns


@returns("y")
def linear_forward(x, weight, bias=None, dtype=np.float64):
    """x (N, Cin), weight (Cout, Cin), bias (Cout,) or None -> y (N, Cout) = x weight^T + bias."""
    x, weight = _cast(dtype, x, weight)
    y = x @ weight.T
    return y if bias is None else y + np.asarray(bias, dtype=dtype)


def linear_backward(dy, x, weight, has_bias=True, dtype=np.float64):
    """dy (N, Cout), x (N, Cin), weight (Cout, Cin) -> dx (N, Cin), dweight (Cout, Cin),
    dbias (Cout,) or None."""
    dy, x, weight = _cast(dtype, dy, x, weight)
    return dy @ weight, dy.T @ x, (dy.sum(0) if has_bias else None)
