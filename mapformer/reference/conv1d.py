"""Float64 NumPy reference of the conv1d ops (csrc/ops/conv1d.c):
causal depthwise conv1d (Mamba's)."""
import numpy as np

from .activation import silu_backward, silu_forward
from .common import _cast, returns


def _conv_silu(activation):
    """Whether the conv's activation ('none' or 'silu', else ValueError) is SiLU."""
    if activation not in ("none", "silu"):
        raise ValueError(f"activation must be 'none' or 'silu', got {activation!r}")
    return activation == "silu"


@returns("y")
def causal_conv1d_forward(x, weight, bias, dtype=np.float64, *, activation="none"):
    """x (B, T, E), weight (E, W), bias (E,) -> y (B, T, E), depthwise and causal:
    y[b, t, e] = bias[e] + sum_{j < W} weight[e, j] x[b, t - W + 1 + j, e] (x = 0 before t = 0);
    activation 'silu': silu of that."""
    if _conv_silu(activation):
        return silu_forward(causal_conv1d_forward(x, weight, bias, dtype), dtype)
    x, weight, bias = _cast(dtype, x, weight, bias)
    T, W = x.shape[1], weight.shape[1]
    y = np.broadcast_to(bias, x.shape).copy()
    for j in range(W):
        s = W - 1 - j  # the shift back in time
        if s < T:
            y[:, s:] += weight[:, j] * x[:, :T - s]
    return y


@returns("dx", "dweight", "dbias")
def causal_conv1d_backward(dy, x, weight, dtype=np.float64, *, bias=None, activation="none"):
    """dy, x (B, T, E), weight (E, W) -> dx (B, T, E), dweight (E, W), dbias (E,); activation
    'silu': dy is the gradient of the SiLU's output, the convolution recomputed with bias (E,)
    (required then: NumPy would read None as NaN)."""
    if _conv_silu(activation):
        if bias is None:
            raise ValueError("bias is required with activation='silu' (the backward "
                             "recomputes the convolution)")
        dy = silu_backward(dy, causal_conv1d_forward(x, weight, bias, dtype), dtype)
    dy, x, weight = _cast(dtype, dy, x, weight)
    T, W = x.shape[1], weight.shape[1]
    dx = np.zeros_like(x)
    dweight = np.zeros_like(weight)
    for j in range(W):
        s = W - 1 - j
        if s < T:
            dx[:, :T - s] += weight[:, j] * dy[:, s:]
            dweight[:, j] = (dy[:, s:] * x[:, :T - s]).sum((0, 1))
    return dx, dweight, dy.sum((0, 1))
