"""Float64 NumPy reference of the mlp ops (csrc/ops/mlp.c):
y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj."""
import numpy as np

from .common import returns
from .gelu import gelu_backward, gelu_forward
from .linear import linear_backward, linear_forward


@returns("y", "h")
def mlp_forward(x, w_fc, b_fc, w_proj, b_proj, dtype=np.float64, *, approximate="tanh"):
    """x (N, C), w_fc (F, C), b_fc (F,), w_proj (C, F), b_proj (C,) -> y (N, C), h (N, F):
    h = x w_fc^T + b_fc, y = gelu(h) w_proj^T + b_proj (gelu's approximate as gelu_forward's)."""
    h = linear_forward(x, w_fc, b_fc, dtype=dtype)
    g = gelu_forward(h, dtype=dtype, approximate=approximate)
    return linear_forward(g, w_proj, b_proj, dtype=dtype), h


@returns("dx", "dw_fc", "db_fc", "dw_proj", "db_proj")
def mlp_backward(dy, x, h, w_fc, w_proj, dtype=np.float64, *, approximate="tanh"):
    """dy (N, C), x (N, C), h (N, F) from forward, w_fc (F, C), w_proj (C, F) -> dx (N, C),
    dw_fc (F, C), db_fc (F,), dw_proj (C, F), db_proj (C,)."""
    g = gelu_forward(h, dtype=dtype, approximate=approximate)
    dg, dw_proj, db_proj = linear_backward(dy, g, w_proj, dtype=dtype)
    dh = gelu_backward(dg, h, dtype=dtype, approximate=approximate)
    dx, dw_fc, db_fc = linear_backward(dh, x, w_fc, dtype=dtype)
    return dx, dw_fc, db_fc, dw_proj, db_proj
