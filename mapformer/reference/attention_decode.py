"""Float64 NumPy reference of the attention_decode ops (csrc/ops/attention_decode.c):
causal attention of new queries on cached keys."""
import numpy as np

from .common import _cast, _default_scale, _einsum, returns


@returns("out", "lse")
def attention_decode_forward(q, k, v, scale=None, keys=None, dtype=np.float64):
    """q (B, Tq, H, D), k, v (B, Tmax, H, D), Tq <= keys <= Tmax -> out (B, Tq, H, D), lse
    (B, H, Tq).

    The last Tq rows of causal attention over Tk = keys positions (all of k's when None or
    0, the C op's default),
    the first Tk of k, v (incremental decoding: the cached positions, then the block's own):
    query i sits at position Tk - Tq + i and attends the keys j <= Tk - Tq + i."""
    if keys:
        k, v = k[:, :keys], v[:, :keys]
    q, k, v = _cast(dtype, q, k, v)
    Tq, Tk, D = q.shape[1], k.shape[1], q.shape[3]
    if Tq > Tk:
        raise ValueError(f"q's {Tq} positions exceed k's {Tk}")
    scale = _default_scale(D, scale)
    s = _einsum("bihd,bjhd->bhij", q, k) * scale
    s = np.where(np.arange(Tk) <= np.arange(Tk - Tq, Tk)[:, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(s - m).sum(-1))
    p = np.exp(s - lse[..., None])
    return _einsum("bhij,bjhd->bihd", p, v), lse
