"""Float64 NumPy reference of the rotary ops (csrc/ops/rotary.c):
input-dependent rotary: pairs of q and k rotated by theta."""
import numpy as np

from .common import _cast, returns


def rotate_pairs(x, theta, dtype=np.float64):
    """x (B, T, H, D), theta (TB, T, H, D/2), TB in {1, B} -> x with each pair
    (x[2i], x[2i+1]) rotated by theta_i: (x0 cos - x1 sin, x0 sin + x1 cos)."""
    x, theta = _cast(dtype, x, theta)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = np.cos(theta), np.sin(theta)
    y = np.empty(np.broadcast_shapes(x.shape, theta.shape[:-1] + (x.shape[-1],)), dtype=dtype)
    y[..., 0::2] = x0 * c - x1 * s
    y[..., 1::2] = x0 * s + x1 * c
    return y


@returns("q_out", "k_out")
def rotary_forward(q, k, theta, dtype=np.float64):
    """q, k (B, T, H, D), theta (TB, T, H, D/2) -> q_out, k_out (B, T, H, D).

    With theta = omega * t (delta = 1 in path integration) this is RoPE."""
    return rotate_pairs(q, theta, dtype=dtype), rotate_pairs(k, theta, dtype=dtype)


@returns("dq", "dk", "dtheta")
def rotary_backward(dq_out, dk_out, q, k, theta, dtype=np.float64):
    """dq_out, dk_out, q, k (B, T, H, D), theta (TB, T, H, D/2) -> dq, dk (B, T, H, D),
    dtheta (TB, T, H, D/2).

    dx = R(theta)^T dy; dtheta = y0 dy1 - y1 dy0 summed over q and k (and over b when TB = 1)."""
    (theta,) = _cast(dtype, theta)
    dtheta = 0.0
    grads = []
    for dy, x in ((dq_out, q), (dk_out, k)):
        (dy,) = _cast(dtype, dy)
        y = rotate_pairs(x, theta, dtype=dtype)
        grads.append(rotate_pairs(dy, -theta, dtype=dtype))
        dtheta = dtheta + y[..., 0::2] * dy[..., 1::2] - y[..., 1::2] * dy[..., 0::2]
    if theta.shape[0] == 1:
        dtheta = dtheta.sum(0, keepdims=True)
    return grads[0], grads[1], dtheta
