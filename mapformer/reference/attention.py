"""Float64 NumPy reference of the attention ops (csrc/ops/attention.c):
softmax attention, causal, none or prefix mask, an optional per-pair factor."""
import numpy as np

from .common import _cast, _default_scale, _einsum, returns


MASKS = ("causal", "none", "prefix")


def attention_mask(B, T, mask="causal", prefix=None):
    """The keys each query sees, (B, 1, T, T) bool [b, 0, i, j]: j <= max(i, P_b - 1) with
    P_b = 0 for "causal" (j <= i), T for "none" (every key) and prefix[b] (B,) in [0, T] for
    "prefix" (a prefix LM: full attention within the first P_b tokens, causal after them)."""
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    if (mask == "prefix") != (prefix is not None):
        raise ValueError("prefix (B,) is required with mask='prefix' and read only then")
    P = {"causal": np.zeros(B, np.int64), "none": np.full(B, T, np.int64)}.get(mask)
    if P is None:
        P = np.asarray(prefix, dtype=np.int64).reshape(B)
        if np.any((P < 0) | (P > T)):
            raise ValueError(f"prefix must lie in [0, T = {T}], got {P}")
    i = np.arange(T)
    lim = np.maximum(i[None, :], P[:, None] - 1)  # (B, T): the last key query i sees
    return (i[None, None, :] <= lim[:, :, None])[:, None]


def pair_factors(pos_ids, pair_factor, bt, dtype=np.float64):
    """The per-pair logit factors (B, 1, T, T) [b, 0, i, j] = pair_factor[pos_ids[b, i],
    pos_ids[b, j]] of pos_ids (B, T) = bt ints in [0, N) and pair_factor (N, N) finite; 1 (a
    scalar) when both are None. Only one of them given, or a bad one: ValueError naming it."""
    if pos_ids is None and pair_factor is None:
        return 1.0
    if pos_ids is None or pair_factor is None:
        raise ValueError(f"{'pos_ids' if pos_ids is None else 'pair_factor'} is required "
                         "with the other (a per-pair logit factor takes both)")
    ids = np.asarray(pos_ids)
    table = np.asarray(pair_factor, dtype=dtype)
    if table.ndim != 2 or table.shape[0] != table.shape[1]:
        raise ValueError(f"pair_factor must be (N, N), got {table.shape}")
    if not np.isfinite(table).all():
        raise ValueError("pair_factor must be finite")
    if (ids.shape != tuple(bt) or ids.dtype.kind not in "iu"
            or np.any((ids < 0) | (ids >= table.shape[0]))):
        raise ValueError(f"pos_ids must be (B, T) = {tuple(bt)} integers in "
                         f"[0, N = {table.shape[0]})")
    return table[ids[:, :, None], ids[:, None, :]][:, None]


@returns("out", "lse")
def attention_forward(q, k, v, scale=None, dtype=np.float64, mask="causal", prefix=None,
                      pos_ids=None, pair_factor=None):
    """q, k, v (B, T, H, D) -> out (B, T, H, D), lse (B, H, T).

    out[b, i, h] = sum_{j seen} softmax_j(f_ij * scale * q_i . k_j) v_j, the keys j seen by
    query i as attention_mask(mask, prefix) says (default causal, j <= i);
    lse[b, h, i] = log sum_{j seen} exp(f_ij * scale * q_i . k_j). scale defaults to
    1/sqrt(D); f_ij = pair_factor[pos_ids[b, i], pos_ids[b, j]] (pair_factors; 1 without
    them), applied before the mask."""
    q, k, v = _cast(dtype, q, k, v)
    B, T, D = q.shape[0], q.shape[1], q.shape[3]
    scale = _default_scale(D, scale)
    s = _einsum("bihd,bjhd->bhij", q, k) * scale * pair_factors(pos_ids, pair_factor, (B, T),
                                                                 dtype)
    s = np.where(attention_mask(B, T, mask, prefix), s, -np.inf)
    m = s.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(s - m).sum(-1))
    p = np.exp(s - lse[..., None])
    return _einsum("bhij,bjhd->bihd", p, v), lse


@returns("dq", "dk", "dv")
def attention_backward(dout, q, k, v, scale=None, dtype=np.float64, mask="causal",
                       prefix=None, pos_ids=None, pair_factor=None):
    """dout, q, k, v (B, T, H, D) -> dq, dk, dv (B, T, H, D), under the same mask and
    per-pair factors (the raw scores' gradient is f_ij times the logits')."""
    dout, q, k, v = _cast(dtype, dout, q, k, v)
    scale = _default_scale(q.shape[3], scale)
    out, lse = attention_forward(q, k, v, scale, dtype=dtype, mask=mask, prefix=prefix,
                                 pos_ids=pos_ids, pair_factor=pair_factor)
    f = pair_factors(pos_ids, pair_factor, q.shape[:2], dtype)
    s = _einsum("bihd,bjhd->bhij", q, k) * scale * f
    seen = attention_mask(q.shape[0], q.shape[1], mask, prefix)
    p = np.where(seen, np.exp(s - lse[..., None]), 0.0)
    dv = _einsum("bhij,bihd->bjhd", p, dout)
    dp = _einsum("bihd,bjhd->bhij", dout, v)
    delta = _einsum("bihd,bihd->bhi", dout, out)
    ds = p * (dp - delta[..., None]) * scale * f
    return _einsum("bhij,bjhd->bihd", ds, k), _einsum("bhij,bihd->bjhd", ds, q), dv
