"""Float64 NumPy reference of the layernorm ops (csrc/ops/layernorm.c):
layer normalisation over the last axis."""
import numpy as np

from .common import _cast, returns


@returns("y", "mean", "rstd")
def layernorm_forward(x, weight, bias, eps=1e-5, dtype=np.float64):
    """x (N, C), weight (C,), bias (C,) -> y (N, C), mean (N,), rstd (N,).

    y = (x - mean) * rstd * weight + bias with the biased variance over C."""
    x, weight, bias = _cast(dtype, x, weight, bias)
    mean = x.mean(-1)
    rstd = 1.0 / np.sqrt(((x - mean[:, None]) ** 2).mean(-1) + eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    return xhat * weight + bias, mean, rstd


@returns("dx", "dweight", "dbias")
def layernorm_backward(dy, x, mean, rstd, weight, dtype=np.float64):
    """dy, x (N, C), mean, rstd (N,), weight (C,) -> dx (N, C), dweight (C,), dbias (C,)."""
    dy, x, mean, rstd, weight = _cast(dtype, dy, x, mean, rstd, weight)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * weight
    dx = rstd[:, None] * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum(0), dy.sum(0)
