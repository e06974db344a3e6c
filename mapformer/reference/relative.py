"""Float64 NumPy reference of the relative ops (csrc/ops/relative.c): attention with Shaw et
al.'s clipped relative position embeddings."""
import numpy as np

from .attention import attention_mask
from .common import _cast, _default_scale, _einsum, returns


def relative_offsets(T, R2):
    """int (T, T): c_ij = min(max(j - i, -R), R) + R, the row of the (R2, D) embeddings
    that query i and key j meet at (R2 = 2 R + 1)."""
    R = (R2 - 1) // 2
    offsets = np.arange(T)[None, :] - np.arange(T)[:, None]
    return np.clip(offsets, -R, R) + R


def _probabilities(q, k, rel_k, scale, rel_scale, mask, prefix):
    """(P (B, H, T, T) the attention probabilities, 0 where masked; lse (B, H, T);
    c (T, T) the offsets' rows)."""
    B, T, _, D = q.shape
    c = relative_offsets(T, rel_k.shape[0])
    z = _einsum("bihd,rd->bhir", q, rel_k)  # (B, H, T, R2)
    a = scale * _einsum("bihd,bjhd->bhij", q, k) + rel_scale * np.take_along_axis(
        z, np.broadcast_to(c, z.shape[:2] + c.shape), axis=-1)
    seen = attention_mask(B, T, mask, prefix)
    a = np.where(seen, a, -np.inf)
    m = a.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(a - m).sum(-1))
    return np.where(seen, np.exp(a - lse[..., None]), 0.0), lse, c


def _by_offset(x, c, R2):
    """(B, H, T, R2): x (B, H, T, T) summed over the keys j of each row i by their offset
    row c_ij."""
    out = np.zeros(x.shape[:3] + (R2,), dtype=x.dtype)
    for r in range(R2):
        out[..., r] = np.where(c == r, x, 0.0).sum(-1)
    return out


@returns("out", "lse")
def relative_forward(q, k, v, rel_k, rel_v=None, scale=None, rel_scale=None, dtype=np.float64,
                     mask="causal", prefix=None):
    """q, k, v (B, T, H, D), rel_k, rel_v (R2, D) -> out (B, T, H, D), lse (B, H, T).

    Per (b, h), query i and the keys j it sees (attention_mask(mask, prefix)), at the offset
    row c_ij (:func:`relative_offsets`):
      a_ij = scale q_i . k_j + rel_scale q_i . rel_k[c_ij],
      out_i = sum_j softmax_j(a_ij) (v_j + rel_v[c_ij]) (no rel_v term when it is None),
      lse_i = log sum_j exp(a_ij).
    scale defaults to 1/sqrt(D), rel_scale to scale (Shaw et al.)."""
    q, k, v, rel_k = _cast(dtype, q, k, v, rel_k)
    scale = _default_scale(q.shape[3], scale)
    rel_scale = scale if rel_scale is None else float(rel_scale)
    p, lse, c = _probabilities(q, k, rel_k, scale, rel_scale, mask, prefix)
    return _outputs(p, c, v, rel_v, rel_k.shape[0], dtype), lse


def _outputs(p, c, v, rel_v, R2, dtype):
    """out (B, T, H, D) = P V + W rel_v (W: P summed by offset row; no term without rel_v)."""
    out = _einsum("bhij,bjhd->bihd", p, v)
    if rel_v is None:
        return out
    return out + _einsum("bhir,rd->bihd", _by_offset(p, c, R2), np.asarray(rel_v, dtype=dtype))


@returns("dq", "dk", "dv", "drel_k", "drel_v")
def relative_backward(dout, q, k, v, rel_k, rel_v=None, scale=None, rel_scale=None,
                      dtype=np.float64, mask="causal", prefix=None):
    """dout, q, k, v (B, T, H, D), rel_k, rel_v (R2, D) -> dq, dk, dv (B, T, H, D),
    drel_k, drel_v (R2, D) (drel_v None without rel_v).

    With P = softmax(a), W_ir = sum_{j: c_ij = r} P_ij and Dv_i = dout_i . out_i:
      dP_ij = dout_i . v_j + dout_i . rel_v[c_ij],  dA_ij = P_ij (dP_ij - Dv_i),
      G_ir = sum_{j: c_ij = r} dA_ij,
      dq_i = scale sum_j dA_ij k_j + rel_scale sum_r G_ir rel_k[r],
      dk_j = scale sum_i dA_ij q_i,  dv_j = sum_i P_ij dout_i,
      drel_k[r] = rel_scale sum_{b, h, i} G_ir q_i,  drel_v[r] = sum_{b, h, i} W_ir dout_i."""
    dout, q, k, v, rel_k = _cast(dtype, dout, q, k, v, rel_k)
    R2 = rel_k.shape[0]
    scale = _default_scale(q.shape[3], scale)
    rel_scale = scale if rel_scale is None else float(rel_scale)
    p, _, c = _probabilities(q, k, rel_k, scale, rel_scale, mask, prefix)
    out = _outputs(p, c, v, rel_v, R2, dtype)
    dp = _einsum("bihd,bjhd->bhij", dout, v)
    if rel_v is not None:
        y = _einsum("bihd,rd->bhir", dout, np.asarray(rel_v, dtype=dtype))
        dp = dp + np.take_along_axis(y, np.broadcast_to(c, y.shape[:2] + c.shape), axis=-1)
    delta = _einsum("bihd,bihd->bhi", dout, out)
    da = p * (dp - delta[..., None])
    g = _by_offset(da, c, R2)
    dq = scale * _einsum("bhij,bjhd->bihd", da, k) + rel_scale * _einsum("bhir,rd->bihd", g,
                                                                         rel_k)
    dk = scale * _einsum("bhij,bihd->bjhd", da, q)
    dv = _einsum("bhij,bihd->bjhd", p, dout)
    drel_k = rel_scale * _einsum("bhir,bihd->rd", g, q)
    drel_v = None if rel_v is None else _einsum("bhir,bihd->rd", _by_offset(p, c, R2), dout)
    return dq, dk, dv, drel_k, drel_v
