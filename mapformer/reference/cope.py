"""Float64 NumPy reference of the cope ops (csrc/ops/cope.c):
CoPE attention (contextual positions)."""
import numpy as np

from .common import _cast, _default_scale, _einsum, returns


def _cope_parts(q, k, e, scale):
    """The pieces of CoPE attention that forward and backward share, per (b, h, i, j):
    s (scaled content scores), g (gates, 0 above the diagonal), p_raw (positions before the
    clamp), f, c (floor and ceil of the clamped position), w (interpolation weight),
    z (B, H, T, n_pos) position logits, zf, zc (z gathered at f and c), a (attention logits,
    -inf above the diagonal), causal (T, T) mask."""
    T, n_pos = q.shape[1], e.shape[1]
    causal = np.tril(np.ones((T, T), dtype=bool))
    s = _einsum("bihd,bjhd->bhij", q, k) * scale
    g = np.where(causal, 1.0 / (1.0 + np.exp(-s)), 0.0)
    # p_raw[i, j] = sum_{t = j..i} g[i, t]: reverse cumulative sum along keys (g is 0 for t > i)
    p_raw = np.flip(np.cumsum(np.flip(g, -1), -1), -1)
    p = np.minimum(p_raw, n_pos - 1)
    floor = np.floor(p)
    f, c, w = floor.astype(np.int64), np.ceil(p).astype(np.int64), p - floor
    z = _einsum("bihd,hnd->bhin", q, e)  # unscaled, as in the CoPE reference code
    zf, zc = np.take_along_axis(z, f, -1), np.take_along_axis(z, c, -1)
    a = np.where(causal, s + (1.0 - w) * zf + w * zc, -np.inf)
    return dict(s=s, g=g, p_raw=p_raw, f=f, c=c, w=w, z=z, zf=zf, zc=zc, a=a, causal=causal)


@returns("out", "lse")
def cope_forward(q, k, v, e, scale=None, dtype=np.float64):
    """q, k, v (B, T, H, D), e (H, n_pos, D) -> out (B, T, H, D), lse (B, H, T).

    Contextual position encoding (Golovneva et al. 2024), causal, per (b, h):
      s_ij = scale q_i . k_j (j <= i),  g_ij = sigmoid(s_ij),
      p_ij = min(sum_{t = j..i} g_it, n_pos - 1),
      z_i[n] = q_i . e[h, n] (unscaled),
      a_ij = s_ij + (1 - w) z_i[floor p_ij] + w z_i[ceil p_ij],  w = p_ij - floor p_ij,
      out_i = sum_{j <= i} softmax_j(a_ij) v_j,  lse_i = log sum_{j <= i} exp(a_ij).
    scale defaults to 1/sqrt(D)."""
    q, k, v, e = _cast(dtype, q, k, v, e)
    scale = _default_scale(q.shape[3], scale)
    a = _cope_parts(q, k, e, scale)["a"]
    m = a.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(a - m).sum(-1))
    prob = np.exp(a - lse[..., None])
    return _einsum("bhij,bjhd->bihd", prob, v), lse


@returns("dq", "dk", "dv", "de")
def cope_backward(dout, q, k, v, e, scale=None, dtype=np.float64):
    """dout, q, k, v (B, T, H, D), e (H, n_pos, D) -> dq, dk, dv (B, T, H, D), de (H, n_pos, D).

    With P = softmax(a) and Dv_i = dout_i . out_i:
      dA_ij = P_ij (dout_i . v_j - Dv_i);
      dz_i[floor p_ij] += (1 - w) dA_ij,  dz_i[ceil p_ij] += w dA_ij;
      dp_ij = dA_ij (z_i[ceil p_ij] - z_i[floor p_ij]), which is 0 where the position is
        clamped or an exact integer (floor = ceil: the derivative of w = p - floor(p) with
        floor's derivative taken as 0, as autograd does in the CoPE reference code);
      dg_it = sum_{j <= t} dp_ij  (p_ij sums g_it over t >= j);
      ds_ij = dA_ij + dg_ij g_ij (1 - g_ij);
      dq_i = scale sum_j ds_ij k_j + sum_n dz_i[n] e[h, n],  dk_j = scale sum_i ds_ij q_i,
      dv_j = sum_i P_ij dout_i,  de[h, n] = sum_{b, i} dz_i[n] q_i."""
    dout, q, k, v, e = _cast(dtype, dout, q, k, v, e)
    B, T, H, D = q.shape
    n_pos = e.shape[1]
    scale = _default_scale(D, scale)
    x = _cope_parts(q, k, e, scale)
    a, g, w, f, c, causal = x["a"], x["g"], x["w"], x["f"], x["c"], x["causal"]
    m = a.max(-1, keepdims=True)
    prob = np.exp(a - m)
    prob /= prob.sum(-1, keepdims=True)
    out = _einsum("bhij,bjhd->bihd", prob, v)
    dv = _einsum("bhij,bihd->bjhd", prob, dout)
    dprob = _einsum("bihd,bjhd->bhij", dout, v)
    delta = _einsum("bihd,bihd->bhi", dout, out)
    da = prob * (dprob - delta[..., None])  # 0 above the diagonal, where prob is 0
    dz = np.zeros((B, H, T, n_pos), dtype=da.dtype)
    bb, hh, ii, _ = np.indices(da.shape, sparse=True)
    np.add.at(dz, (bb, hh, ii, f), (1.0 - w) * da)
    np.add.at(dz, (bb, hh, ii, c), w * da)
    dp = da * (x["zc"] - x["zf"])
    dg = np.cumsum(dp, -1)
    ds = np.where(causal, da + dg * g * (1.0 - g), 0.0)
    dq = scale * _einsum("bhij,bjhd->bihd", ds, k) + _einsum("bhin,hnd->bihd", dz, e)
    dk = scale * _einsum("bhij,bihd->bjhd", ds, q)
    de = _einsum("bhin,bihd->hnd", dz, q)
    return dq, dk, dv, de
