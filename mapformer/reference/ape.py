"""Float64 NumPy reference of the ape ops (csrc/ops/ape.c):
APE's per-token orthogonal maps and its distance decay."""
import numpy as np

from .common import _cast, returns


def _ape_chunks(x, maps, index):
    """x (B, T, H, D), maps (A, P, H, E, E), index (TB, T, A) -> x as (B, T, H, A, E) and the
    token's maps (B, T, A, H, E, E)."""
    A, _, _, E, _ = maps.shape
    B, T, H, _ = x.shape
    index = np.asarray(index)
    m = maps[np.arange(A), index]  # (TB, T, A, H, E, E)
    return x.reshape(B, T, H, A, E), np.broadcast_to(m, (B,) + m.shape[1:])


@returns("y")
def ape_apply_forward(x, maps, index, dtype=np.float64):
    """x (B, T, H, D), maps (A, P, H, E, E) with D = A E, index int (TB, T, A) in [0, P),
    TB in {1, B} -> y (B, T, H, D): chunk a of each head, y[..., aE:(a+1)E], is
    maps[a, index[tb, t, a], h] times x's chunk a (APE: M(p) q, M(p) k)."""
    x, maps = _cast(dtype, x, maps)
    xs, m = _ape_chunks(x, maps, index)
    return np.einsum("btahij,bthaj->bthai", m, xs).reshape(x.shape)


@returns("dx", "dmaps")
def ape_apply_backward(dy, x, maps, index, dtype=np.float64):
    """dy, x (B, T, H, D), maps (A, P, H, E, E), index (TB, T, A) -> dx (B, T, H, D) = M^T dy
    per chunk, dmaps (A, P, H, E, E) = sum over the tokens at each position of dy x^T."""
    dy, x, maps = _cast(dtype, dy, x, maps)
    xs, m = _ape_chunks(x, maps, index)
    dys = dy.reshape(xs.shape)
    dx = np.einsum("btahij,bthai->bthaj", m, dys).reshape(x.shape)
    grads = np.einsum("bthai,bthaj->btahij", dys, xs)  # (B, T, A, H, E, E)
    A = maps.shape[0]
    idx = np.broadcast_to(np.asarray(index), x.shape[:2] + (A,))
    dmaps = np.zeros_like(maps)
    np.add.at(dmaps, (np.broadcast_to(np.arange(A), idx.shape), idx), grads)
    return dx, dmaps


def _decay_scales(T, gamma, dtype):
    """(T, 1, 1) gamma^(t - c), c = (T - 1) / 2."""
    e = (np.arange(T) - (T - 1) / 2.0) * np.log(float(gamma))
    return np.exp(e).astype(dtype)[:, None, None]


@returns("q_out", "k_out")
def ape_decay_forward(q, k, gamma, dtype=np.float64):
    """q, k (B, T, H, D), gamma > 0 -> (q_out, k_out) = (gamma^(t - c) q, gamma^(c - t) k) per
    token t, c = (T - 1) / 2: q_out_i . k_out_j = gamma^(i - j) q_i . k_j, APE's multiplicative
    decay gamma^distance of the logits of causal attention (j <= i)."""
    q, k = _cast(dtype, q, k)
    s = _decay_scales(q.shape[1], gamma, dtype)
    return q * s, k / s


@returns("dq", "dk")
def ape_decay_backward(dq_out, dk_out, gamma, dtype=np.float64):
    """dq_out, dk_out (B, T, H, D) -> (dq, dk) = (gamma^(t - c) dq_out, gamma^(c - t) dk_out)
    (gamma a constant)."""
    return ape_decay_forward(dq_out, dk_out, gamma, dtype)
