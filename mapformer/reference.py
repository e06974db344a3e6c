"""Float64 NumPy reference of every C op: the specification and the tests' oracle.

Each op has ``<op>_forward`` and ``<op>_backward`` written for clarity, not speed: full
matrices, no tiling. Shapes follow the C core (``csrc/include/mapformer/mapformer.h``):
B batch, T tokens, H heads, D head dim (even), NB = D/2 rotation blocks, C model width,
V vocabulary, N rows (B*T). Inputs may be any float dtype; every op computes and returns in
its ``dtype`` argument (float64 by default: the oracle; the benchmarks time the same code in
float32 as the NumPy baseline of each C op).
"""
import math

import numpy as np

from .geometry import (CONJ_MODES, decay_table, grid_distance, rope_generator,  # noqa: F401
                       tape_initial_state, tree_distance)

TWO_PI = 2.0 * np.pi
GELU_K = float(np.sqrt(2.0 / np.pi))


def _einsum(spec, *operands):
    """np.einsum with its contraction planner, so products run as BLAS matmuls; the result
    C-contiguous (the planner may return a transposed view)."""
    return np.ascontiguousarray(np.einsum(spec, *operands, optimize=True))


def _cast(dtype, *arrays):
    return [np.asarray(a, dtype=dtype) for a in arrays]


def _default_scale(D, scale):
    """1/sqrt(D) when scale is None, as a Python float (which keeps a float32 computation in
    float32)."""
    return 1.0 / float(np.sqrt(D)) if scale is None else float(scale)


# ---- embedding ---------------------------------------------------------------------------
def embedding_forward(tokens, weight, dtype=np.float64):
    """tokens int (N,), weight (V, C) -> out (N, C) = weight[tokens]."""
    (weight,) = _cast(dtype, weight)
    return weight[np.asarray(tokens)]


def embedding_backward(dout, tokens, vocab_size, dtype=np.float64):
    """dout (N, C), tokens int (N,) -> dweight (V, C) with dweight[v] = sum of dout[tokens == v]."""
    (dout,) = _cast(dtype, dout)
    dweight = np.zeros((vocab_size, dout.shape[1]), dtype=dtype)
    np.add.at(dweight, np.asarray(tokens), dout)
    return dweight


# ---- linear ------------------------------------------------------------------------------
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


# ---- layernorm ---------------------------------------------------------------------------
def layernorm_forward(x, weight, bias, eps=1e-5, dtype=np.float64):
    """x (N, C), weight (C,), bias (C,) -> y (N, C), mean (N,), rstd (N,).

    y = (x - mean) * rstd * weight + bias with the biased variance over C."""
    x, weight, bias = _cast(dtype, x, weight, bias)
    mean = x.mean(-1)
    rstd = 1.0 / np.sqrt(((x - mean[:, None]) ** 2).mean(-1) + eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    return xhat * weight + bias, mean, rstd


def layernorm_backward(dy, x, mean, rstd, weight, dtype=np.float64):
    """dy, x (N, C), mean, rstd (N,), weight (C,) -> dx (N, C), dweight (C,), dbias (C,)."""
    dy, x, mean, rstd, weight = _cast(dtype, dy, x, mean, rstd, weight)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * weight
    dx = rstd[:, None] * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum(0), dy.sum(0)


# ---- GELU: tanh approximation or exact (approximate="tanh" | "none", PyTorch's names) -----
GELU_APPROXIMATIONS = ("tanh", "none")
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _normal_cdf(x, approximate):
    """Phi(x) = erfc(-x / sqrt 2) / 2 in float64 (math.erfc: the lower tail keeps its relative
    accuracy), after checking ``approximate``."""
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    return (0.5 * _erfc(-x / math.sqrt(2.0))).astype(x.dtype, copy=False)


def gelu_forward(x, dtype=np.float64, *, approximate="tanh"):
    """x (...) -> gelu(x). approximate "tanh": 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x +
    0.044715 x^3), computed as the equal x * sigmoid(2u), which keeps its relative accuracy for
    large negative x; "none": the exact x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    (x,) = _cast(dtype, x)
    if approximate != "tanh":
        return x * _normal_cdf(x, approximate)
    with np.errstate(over="ignore"):  # exp -> inf gives the exact limit -0
        return x / (1.0 + np.exp(-2.0 * GELU_K * (x + 0.044715 * x**3)))


def gelu_backward(dy, x, dtype=np.float64, *, approximate="tanh"):
    """dy, x (...) -> dx (...) = dy gelu'(x); exact: gelu'(x) = Phi(x) + x exp(-x^2/2) /
    sqrt(2 pi)."""
    dy, x = _cast(dtype, dy, x)
    if approximate != "tanh":
        return dy * (_normal_cdf(x, approximate)
                     + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))
    u = GELU_K * (x + 0.044715 * x**3)
    t = np.tanh(u)
    du = GELU_K * (1.0 + 3 * 0.044715 * x**2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * du)


# ---- mlp ---------------------------------------------------------------------------------
def mlp_forward(x, w_fc, b_fc, w_proj, b_proj, dtype=np.float64, *, approximate="tanh"):
    """x (N, C), w_fc (F, C), b_fc (F,), w_proj (C, F), b_proj (C,) -> y (N, C), h (N, F):
    h = x w_fc^T + b_fc, y = gelu(h) w_proj^T + b_proj (gelu's approximate as gelu_forward's)."""
    h = linear_forward(x, w_fc, b_fc, dtype=dtype)
    g = gelu_forward(h, dtype=dtype, approximate=approximate)
    return linear_forward(g, w_proj, b_proj, dtype=dtype), h


def mlp_backward(dy, x, h, w_fc, w_proj, dtype=np.float64, *, approximate="tanh"):
    """dy (N, C), x (N, C), h (N, F) from forward, w_fc (F, C), w_proj (C, F) -> dx (N, C),
    dw_fc (F, C), db_fc (F,), dw_proj (C, F), db_proj (C,)."""
    g = gelu_forward(h, dtype=dtype, approximate=approximate)
    dg, dw_proj, db_proj = linear_backward(dy, g, w_proj, dtype=dtype)
    dh = gelu_backward(dg, h, dtype=dtype, approximate=approximate)
    dx, dw_fc, db_fc = linear_backward(dh, x, w_fc, dtype=dtype)
    return dx, dw_fc, db_fc, dw_proj, db_proj


# ---- residual ----------------------------------------------------------------------------
def residual_forward(a, b, dtype=np.float64):
    """a, b (...) -> a + b."""
    a, b = _cast(dtype, a, b)
    return a + b


def residual_backward(dout, dtype=np.float64):
    """dout (...) -> (da, db): both branches receive dout unchanged."""
    (dout,) = _cast(dtype, dout)
    return dout, dout


# ---- attention: causal, none or prefix mask ---------------------------------------------
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


def attention_decode_forward(q, k, v, scale=None, keys=None, dtype=np.float64):
    """q (B, Tq, H, D), k, v (B, Tmax, H, D), Tq <= keys <= Tmax -> out (B, Tq, H, D), lse
    (B, H, Tq).

    The last Tq rows of causal attention over Tk = keys positions (all of k's when None),
    the first Tk of k, v (incremental decoding: the cached positions, then the block's own):
    query i sits at position Tk - Tq + i and attends the keys j <= Tk - Tq + i."""
    if keys is not None:
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


# ---- path integration --------------------------------------------------------------------
def wrap_angle(theta):
    """Reduce angles to [-pi, pi): theta - 2 pi floor(theta / (2 pi) + 1/2)."""
    return theta - TWO_PI * np.floor(theta / TWO_PI + 0.5)


def path_integration_forward(delta, omega, wrap=True, dtype=np.float64):
    """delta (B, T, H, NB), omega (H, NB) -> theta (B, T, H, NB).

    theta[b, t, h, i] = omega[h, i] * sum_{s <= t} delta[b, s, h, i], reduced to [-pi, pi)
    when wrap (the C op always wraps: rotations see only the angle mod 2 pi)."""
    delta, omega = _cast(dtype, delta, omega)
    theta = omega * np.cumsum(delta, axis=1)
    return wrap_angle(theta) if wrap else theta


def path_integration_backward(dtheta, delta, omega, dtype=np.float64):
    """dtheta, delta (B, T, H, NB), omega (H, NB) -> ddelta (B, T, H, NB), domega (H, NB).

    ddelta[t] = sum_{s >= t} dtheta[s] * omega; domega = sum_{b, t} dtheta * cumsum(delta)."""
    dtheta, delta, omega = _cast(dtype, dtheta, delta, omega)
    ddelta = np.flip(np.cumsum(np.flip(dtheta * omega, 1), 1), 1)
    return ddelta, (dtheta * np.cumsum(delta, axis=1)).sum((0, 1))


# ---- input-dependent rotary --------------------------------------------------------------
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


def rotary_forward(q, k, theta, dtype=np.float64):
    """q, k (B, T, H, D), theta (TB, T, H, D/2) -> q_out, k_out (B, T, H, D).

    With theta = omega * t (delta = 1 in path integration) this is RoPE."""
    return rotate_pairs(q, theta, dtype=dtype), rotate_pairs(k, theta, dtype=dtype)


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


# ---- masked softmax cross-entropy --------------------------------------------------------
def softmax_xent_forward(logits, targets, mask, dtype=np.float64):
    """logits (N, V), targets int (N,), mask (N,) -> losses (N,), loss (float).

    losses[n] = -log softmax(logits[n])[targets[n]] for every row; loss is their mean
    weighted by mask (0.0 when mask sums to 0)."""
    logits, mask = _cast(dtype, logits, mask)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    losses = -logp[np.arange(len(logits)), np.asarray(targets)]
    total = mask.sum()
    return losses, (float((losses * mask).sum() / total) if total != 0 else 0.0)


def softmax_xent_backward(logits, targets, mask, scale, dtype=np.float64):
    """logits (N, V), targets (N,), mask (N,) -> dlogits (N, V) =
    scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])). With scale = 1/sum(mask)
    this is the gradient of the loss returned by the forward."""
    logits, mask = _cast(dtype, logits, mask)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(len(logits)), np.asarray(targets)] -= 1.0
    return scale * mask[:, None] * p


# ---- AdamW -------------------------------------------------------------------------------
def adamw_step(params, grads, m, v, decay_mask, lr, beta1, beta2, eps, weight_decay, step,
               dtype=np.float64):
    """params, grads, m, v (P,), decay_mask bool (P,), step >= 1 -> new params, m, v (P,).

    PyTorch's AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr * (wd * mask * p + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps))."""
    params, grads, m, v = _cast(dtype, params, grads, m, v)
    m = beta1 * m + (1 - beta1) * grads
    v = beta2 * v + (1 - beta2) * grads**2
    mhat = m / (1 - beta1**step)
    vhat = v / (1 - beta2**step)
    decay = weight_decay * np.asarray(decay_mask, dtype=dtype) * params
    return params - lr * (decay + mhat / (np.sqrt(vhat) + eps)), m, v


# ---- global norm and clipping ------------------------------------------------------------
def global_norm(x, dtype=np.float64):
    """x (P,) -> ||x||_2 (float)."""
    (x,) = _cast(dtype, x)
    return float(np.sqrt((x * x).sum()))


def clip_grad_norm(grads, max_norm, dtype=np.float64):
    """grads (P,) -> (clipped grads (P,), norm before clipping). Scales by
    max_norm / (norm + 1e-6) only when norm > max_norm."""
    (grads,) = _cast(dtype, grads)
    norm = global_norm(grads, dtype=dtype)
    return (grads * (max_norm / (norm + 1e-6)) if norm > max_norm else grads), norm


# ---- CoPE --------------------------------------------------------------------------------
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


# ---- TAPE --------------------------------------------------------------------------------
# TAPE (Zhu et al. 2025) as the MapFormer paper describes it (sec. 3.7: "learns to modify its
# positional encoding after the attention mechanism, with input-dependent MLPs"). Every token
# carries a per-head positional state E (B, T, H, NB, 2), stored (B, T, H, D) with D = 2 NB and
# read as NB complex numbers e = e[..., 2k] + i e[..., 2k+1], initialised as RoPE,
# e = exp(i omega_k t) (tape_initial_state). In each layer queries and keys are multiplied
# pairwise by the state as complex numbers (tape_rotate_*; the rotary op when |e| = 1). After
# attention the model updates the state with ops it already has, E_att = A E (attention with E
# as the values), then the content-gated head mix (tape_mix_*):
#   E_new[b,t,h] = E_att[b,t,h] + g[b,t,h] sum_h' W[h,h'] E_att[b,t,h'],  g = sigmoid(G),
# with G = x W_g^T + b_g (B, T, H) from the layer's content (the linear op). W is real, so a
# rotation common to every head's state passes through the update unchanged (equivariance).
def _as_complex(x):
    """x (..., D) real with pairs (x[2k], x[2k+1]) -> (..., D/2) complex128."""
    return x[..., 0::2] + 1j * x[..., 1::2]


def _as_pairs(z):
    """z (..., NB) complex -> (..., 2 NB) real of z's precision, (Re, Im) interleaved."""
    out = np.empty(z.shape[:-1] + (2 * z.shape[-1],), dtype=z.real.dtype)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def _sigmoid_pair(x):
    """x (...) -> sigmoid(x), sigmoid(-x) = 1 - sigmoid(x), both to full relative accuracy."""
    t = np.exp(-np.abs(x))
    big, small = 1.0 / (1.0 + t), t / (1.0 + t)
    return np.where(x >= 0, big, small), np.where(x >= 0, small, big)


def tape_rotate_forward(q, k, e, dtype=np.float64):
    """q, k (B, T, H, D), e (B, T, H, D) (or (1, T, H, D), broadcast over b) -> q_out, k_out
    (B, T, H, D).

    Per pair, as complex numbers: y = x e, i.e. (x0 e0 - x1 e1, x0 e1 + x1 e0)."""
    q, k, e = _cast(dtype, q, k, e)
    ec = _as_complex(e)
    return _as_pairs(_as_complex(q) * ec), _as_pairs(_as_complex(k) * ec)


def tape_rotate_backward(dq_out, dk_out, q, k, e, dtype=np.float64):
    """dq_out, dk_out, q, k (B, T, H, D), e (B, T, H, D) or (1, T, H, D) -> dq, dk (B, T, H, D),
    de (e's shape).

    For y = x e (complex x, e) and a real loss L, write the gradient of a complex variable as
    dy = dL/dy0 + i dL/dy1; then a change u of y changes L by Re(conj(dy) u). Changes a of x
    and b of e change y by a e + x b, and Re(conj(dy) a e) = Re(conj(conj(e) dy) a), so
      dx = conj(e) dy:  (dy0 e0 + dy1 e1, dy1 e0 - dy0 e1),
      de = conj(x) dy:  (x0 dy0 + x1 dy1, x0 dy1 - x1 dy0),
    and de sums the q and k terms (and b, when e is broadcast)."""
    dq_out, dk_out, q, k, e = _cast(dtype, dq_out, dk_out, q, k, e)
    ec = np.conj(_as_complex(e))
    gq, gk = _as_complex(dq_out), _as_complex(dk_out)
    de = np.conj(_as_complex(q)) * gq + np.conj(_as_complex(k)) * gk
    if e.shape[0] == 1 and de.shape[0] != 1:
        de = de.sum(0, keepdims=True)
    return _as_pairs(ec * gq), _as_pairs(ec * gk), _as_pairs(de)


def tape_mix_forward(e_att, gate_logits, w, dtype=np.float64):
    """e_att (B, T, H, D), gate_logits (B, T, H), w (H, H) -> e_new (B, T, H, D).

    e_new[b, t, h] = e_att[b, t, h] + g[b, t, h] sum_h' w[h, h'] e_att[b, t, h'],
    g = sigmoid(gate_logits)."""
    e_att, gate_logits, w = _cast(dtype, e_att, gate_logits, w)
    g, _ = _sigmoid_pair(gate_logits)
    return e_att + g[..., None] * _einsum("hk,btkd->bthd", w, e_att)


def tape_mix_backward(de_new, e_att, gate_logits, w, dtype=np.float64):
    """de_new, e_att (B, T, H, D), gate_logits (B, T, H), w (H, H) -> de_att (B, T, H, D),
    dgate_logits (B, T, H), dw (H, H).

    With Y = de_new, g = sigmoid(gate_logits) and M[h] = sum_h' w[h, h'] e_att[h']:
      de_att[h'] = Y[h'] + sum_h g[h] w[h, h'] Y[h],
      dgate_logits[h] = g[h] (1 - g[h]) Y[h] . M[h]  (dot product over D),
      dw[h, h'] = sum_{b, t} g[h] Y[h] . e_att[h']."""
    de_new, e_att, gate_logits, w = _cast(dtype, de_new, e_att, gate_logits, w)
    g, one_minus_g = _sigmoid_pair(gate_logits)
    gy = g[..., None] * de_new
    m = _einsum("hk,btkd->bthd", w, e_att)
    de_att = de_new + _einsum("hk,bthd->btkd", w, gy)
    dgate = g * one_minus_g * _einsum("bthd,bthd->bth", de_new, m)
    return de_att, dgate, _einsum("bthd,btkd->hk", gy, e_att)


# ---- conjunctive attention ---------------------------------------------------------------
def _conj_parts(qx, kx, qp, kp, mode, scale, mask="causal", prefix=None):
    """The score matrices of conjunctive attention, (B, H, T, T) each: returns
    (sx, sp, zx, zp, z, causal) with sX = qx kx^T, sP = qp kp^T (unmasked), zx = scale sX and
    zp = scale sP (-inf where the mask hides the key), z the logits of the one softmax of
    score_product (scale sX sP) or sum (scale (sX + sP)), -inf where hidden (None for
    softmax_product), and causal the (B, 1, T, T) mask of the keys seen (attention_mask: by
    default j <= i)."""
    if mode not in CONJ_MODES:
        raise ValueError(f"mode must be one of {CONJ_MODES}, got {mode!r}")
    causal = attention_mask(qx.shape[0], qx.shape[1], mask, prefix)
    sx = _einsum("bihd,bjhd->bhij", qx, kx)
    sp = _einsum("bihd,bjhd->bhij", qp, kp)
    z = {"score_product": scale * sx * sp, "sum": scale * (sx + sp)}.get(mode)
    zx, zp = np.where(causal, scale * sx, -np.inf), np.where(causal, scale * sp, -np.inf)
    return sx, sp, zx, zp, (None if z is None else np.where(causal, z, -np.inf)), causal


def _log_softmax_parts(z):
    """z (..., T) with -inf entries -> (softmax(z), logsumexp(z)) along the last axis."""
    m = z.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(z - m).sum(-1))
    return np.exp(z - lse[..., None]), lse


def conj_attention_forward(qx, kx, qp, kp, v, mode="score_product", scale=None,
                           dtype=np.float64, mask="causal", prefix=None):
    """qx, kx, qp, kp, v (B, T, H, D) -> out (B, T, H, D), lse (M, B, H, T).

    MapEM's conjunctive attention (MapFormer paper, sec. 3.5.1, eq. 13), causal, per (b, h),
    with content scores sX_ij = qx_i . kx_j and positional scores sP_ij = qp_i . kp_j, j <= i:
      "score_product" (default): A = softmax_j(scale sX_ij sP_ij), the attention between the
        conjunctions g = vec(x p^T), whose inner products are sX sP; M = 1, lse = log sum_j
        exp(scale sX sP).
      "softmax_product": A = AX * AP with AX = softmax_j(scale sX), AP = softmax_j(scale sP),
        each row-softmaxed on its own (eq. 13 read literally; rows of A sum to less than 1);
        M = 2, lse[0] = log sum_j exp(scale sX), lse[1] = log sum_j exp(scale sP).
      "sum": A = softmax_j(scale (sX + sP)): plain attention on [qx, qp] and [kx, kp];
        M = 1.
    out_i = sum_{j <= i} A_ij v_j. scale defaults to 1/sqrt(D). mask, prefix: the keys each
    query sees, as attention_mask (default causal)."""
    qx, kx, qp, kp, v = _cast(dtype, qx, kx, qp, kp, v)
    scale = _default_scale(qx.shape[3], scale)
    _, _, zx, zp, z, _ = _conj_parts(qx, kx, qp, kp, mode, scale, mask, prefix)
    if mode == "softmax_product":
        (ax, lse_x), (ap, lse_p) = _log_softmax_parts(zx), _log_softmax_parts(zp)
        a, lse = ax * ap, np.stack([lse_x, lse_p])
    else:
        a, lse = _log_softmax_parts(z)
        lse = lse[None]
    return _einsum("bhij,bjhd->bihd", a, v), lse


def conj_attention_backward(dout, qx, kx, qp, kp, v, mode="score_product", scale=None,
                            dtype=np.float64, mask="causal", prefix=None):
    """dout, qx, kx, qp, kp, v (B, T, H, D) -> dqx, dkx, dqp, dkp, dv (B, T, H, D).

    With dA_ij = dout_i . v_j and Dv_i = dout_i . out_i = sum_j A_ij dA_ij:
      "score_product": dS = A (dA - Dv) (the softmax backward), and by the product rule
        dsX = scale dS sP, dsP = scale dS sX.
      "softmax_product": A = AX AP, so dAX = dA AP and dAP = dA AX; through each softmax
        dzX = AX (dAX - sum_k AX_ik dAX_ik) = A dA - AX Dv (the sum is sum_k A_ik dA_ik = Dv),
        and likewise dzP = A dA - AP Dv; dsX = scale dzX, dsP = scale dzP.
      "sum": dsX = dsP = scale A (dA - Dv).
    Then dqx = dsX kx, dkx = dsX^T qx, dqp = dsP kp, dkp = dsP^T qp, dv = A^T dout
    (every score gradient is 0 where the mask hides the key)."""
    dout, qx, kx, qp, kp, v = _cast(dtype, dout, qx, kx, qp, kp, v)
    scale = _default_scale(qx.shape[3], scale)
    sx, sp, zx, zp, z, causal = _conj_parts(qx, kx, qp, kp, mode, scale, mask, prefix)
    da = _einsum("bihd,bjhd->bhij", dout, v)
    if mode == "softmax_product":
        (ax, _), (ap, _) = _log_softmax_parts(zx), _log_softmax_parts(zp)
        a = ax * ap
        delta = (a * da).sum(-1, keepdims=True)
        dsx, dsp = scale * (a * da - ax * delta), scale * (a * da - ap * delta)
    else:
        a, _ = _log_softmax_parts(z)
        ds = a * (da - (a * da).sum(-1, keepdims=True))
        if mode == "score_product":
            dsx, dsp = scale * ds * sp, scale * ds * sx
        else:
            dsx = dsp = scale * ds
    dsx, dsp = np.where(causal, dsx, 0.0), np.where(causal, dsp, 0.0)
    return (_einsum("bhij,bjhd->bihd", dsx, kx), _einsum("bhij,bihd->bjhd", dsx, qx),
            _einsum("bhij,bjhd->bihd", dsp, kp), _einsum("bhij,bihd->bjhd", dsp, qp),
            _einsum("bhij,bihd->bjhd", a, dout))


# ---- Mamba / MAMPa pieces: SiLU, softplus, the SiLU gate, causal depthwise conv1d, scans
SOFTPLUS_THRESHOLD = 20.0  # Mamba's (torch.nn.functional.softplus's default): x above it -> x


def silu_forward(x, dtype=np.float64):
    """x (...) -> y (...) = x sigmoid(x)."""
    (x,) = _cast(dtype, x)
    return x / (1.0 + np.exp(-x))


def silu_backward(dy, x, dtype=np.float64):
    """dy, x (...) -> dx (...) = dy s (1 + x (1 - s)), s = sigmoid(x)."""
    dy, x = _cast(dtype, dy, x)
    s = 1.0 / (1.0 + np.exp(-x))
    return dy * s * (1.0 + x * (1.0 - s))


def softplus_forward(x, dtype=np.float64):
    """x (...) -> y (...) = log(1 + e^x), or x where x > 20 (Mamba's threshold)."""
    (x,) = _cast(dtype, x)
    return np.where(x > SOFTPLUS_THRESHOLD, x,
                    np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


def softplus_backward(dy, x, dtype=np.float64):
    """dy, x (...) -> dx (...) = dy sigmoid(x), or dy where x > 20."""
    dy, x = _cast(dtype, dy, x)
    return np.where(x > SOFTPLUS_THRESHOLD, dy, dy / (1.0 + np.exp(-x)))


def silu_gate_forward(y, z, dtype=np.float64):
    """y, z (...) -> out (...) = y silu(z) (Mamba's output gate)."""
    y, z = _cast(dtype, y, z)
    return y * silu_forward(z, dtype)


def silu_gate_backward(dout, y, z, dtype=np.float64):
    """dout, y, z (...) -> dy (...) = dout silu(z), dz (...) = dout y silu'(z)."""
    dout, y, z = _cast(dtype, dout, y, z)
    return dout * silu_forward(z, dtype), silu_backward(dout * y, z, dtype)


def _conv_silu(activation):
    """Whether the conv's activation ('none' or 'silu', else ValueError) is SiLU."""
    if activation not in ("none", "silu"):
        raise ValueError(f"activation must be 'none' or 'silu', got {activation!r}")
    return activation == "silu"


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


def _phi(z):
    """phi(z) = (e^z - 1) / z (1 at z = 0) and phi'(z) = (e^z - phi) / z, elementwise on
    complex z: the zero-order-hold factor of B_bar = Delta phi(Delta A) B (MapFormer eq. 8)."""
    small = np.abs(z) < 1e-2
    zs = np.where(small, 1.0, z)
    phi = np.where(small, 1 + z / 2 + z**2 / 6 + z**3 / 24 + z**4 / 120, (np.exp(z) - 1) / zs)
    dphi = np.where(small, 0.5 + z / 3 + z**2 / 8 + z**3 / 30 + z**4 / 144,
                    (np.exp(z) - phi) / zs)
    return phi, dphi


def _scan_states(x, delta, dangle, A, omega, Bc, Cc, bbar):
    """The diagonal complex scan of both selective scans (float64/complex128):
    z = delta A + i dangle omega (B, T, E, K), h_t = e^z h_{t-1} + delta x phi(z) Bc_t with
    phi = 1 (Euler) or (e^z - 1) / z (ZOH). Returns z, phi, dphi, hs (B, T, E, K)."""
    if bbar not in ("euler", "zoh"):
        raise ValueError(f"bbar must be 'euler' or 'zoh', got {bbar!r}")
    z = delta[..., None] * A + 1j * (dangle[..., None] * omega)
    if bbar == "zoh":
        phi, dphi = _phi(z)
    else:
        phi, dphi = np.ones_like(z), np.zeros_like(z)
    a = np.exp(z)
    s = (delta * x)[..., None] * phi * Bc[:, :, None, :]
    hs = np.empty_like(z)
    h = np.zeros(z[:, 0].shape, complex)
    for t in range(x.shape[1]):
        h = a[:, t] * h + s[:, t]
        hs[:, t] = h
    return z, phi, dphi, hs


def _scan_backward(dy, x, delta, dangle, A, omega, Bc, Cc, D, bbar):
    """Gradients of _scan_states + the readout y = Re(conj(Cc) h) summed over K + D x."""
    z, phi, dphi, hs = _scan_states(x, delta, dangle, A, omega, Bc, Cc, bbar)
    a = np.exp(z)
    T = x.shape[1]
    r = delta * x
    dz = np.zeros_like(z)
    dr = np.zeros_like(x)
    dBc = np.zeros_like(Bc)
    g = np.zeros(z[:, 0].shape, complex)
    for t in range(T - 1, -1, -1):
        g = Cc[:, t, None, :] * dy[:, t, :, None] + (np.conj(a[:, t + 1]) * g if t + 1 < T else 0)
        hprev = hs[:, t - 1] if t > 0 else 0
        gs = g * np.conj(Bc[:, t, None, :])  # the gradient of s / phi_t... of (r phi)
        dz[:, t] = g * np.conj(a[:, t] * hprev) + np.conj(dphi[:, t]) * r[:, t, :, None] * gs
        dr[:, t] = np.real(np.conj(gs) * phi[:, t]).sum(-1)
        dBc[:, t] = (np.conj(r[:, t, :, None] * phi[:, t]) * g).sum(1)
    dCc = (dy[..., None] * hs).sum(2)  # (B, T, K): Re and Im parts are h's
    dx = delta * dr + D * dy
    ddelta = x * dr + (dz.real * A).sum(-1)
    ddangle = (dz.imag * omega).sum(-1)
    dA = (dz.real * delta[..., None]).sum((0, 1))
    domega = (dz.imag * dangle[..., None]).sum((0, 1))
    dD = (dy * x).sum((0, 1))
    return dx, ddelta, ddangle, dA, domega, dBc, dCc, dD


def _scan_step(delta, delta_bias, delta_activation):
    """The step the scans take from delta (B, T, E): delta + delta_bias (E,) (when given),
    through softplus with delta_activation 'softplus' (Mamba's delta_bias, delta_softplus).
    Returns (the step, the pre-activation)."""
    if delta_activation not in ("none", "softplus"):
        raise ValueError(f"delta_activation must be 'none' or 'softplus', got "
                         f"{delta_activation!r}")
    if delta_bias is not None and np.shape(delta_bias) != delta.shape[-1:]:
        raise ValueError(f"delta_bias must have shape ({delta.shape[-1]},) (E), got "
                         f"{np.shape(delta_bias)}")
    pre = delta if delta_bias is None else delta + delta_bias
    return (softplus_forward(pre) if delta_activation == "softplus" else pre), pre


def _step_backward(dstep, pre, delta_activation):
    """The gradient of the step -> the gradient of delta (delta_bias's: its sum over B, T)."""
    return softplus_backward(dstep, pre) if delta_activation == "softplus" else dstep


def _chunk_ends(hs, chunk):
    """hs (B, T, E, K) -> the states at the ends of the chunks, (B, ceil(T / chunk), E, K)."""
    T = hs.shape[1]
    return hs[:, [min(c + chunk, T) - 1 for c in range(0, T, chunk)]]


def selective_scan_forward(x, delta, A, B, C, D, chunk=256, bbar="euler", dtype=np.float64,
                           *, delta_bias=None, delta_activation="none"):
    """Mamba-1's selective scan (selective_scan_ref of state-spaces/mamba, real A, variable B
    and C, before the gate): x, delta (B, T, E), A (E, N) (Mamba: -exp(A_log)), B, C
    (B, T, N), D (E,) -> y (B, T, E), states (B, ceil(T / chunk), E, N), the state h at each
    chunk's last step, where
      h_t[e, n] = exp(d_t[e] A[e, n]) h_{t-1}[e, n] + d_t[e] phi B_t[n] x_t[e],
      y_t[e] = sum_n C_t[n] h_t[e, n] + D[e] x_t[e],
    phi = 1 (bbar 'euler', Mamba's) or (exp(d A) - 1) / (d A) ('zoh', eq. 8), and the step
    d = delta + delta_bias (E,) (when given), through softplus with delta_activation
    'softplus' (selective_scan_ref's delta_bias and delta_softplus)."""
    x, delta, A, B, C, D = _cast(dtype, x, delta, A, B, C, D)
    delta, _ = _scan_step(delta, None if delta_bias is None else _cast(dtype, delta_bias)[0],
                          delta_activation)
    _, _, _, hs = _scan_states(x, delta, delta, A, np.zeros_like(A), B, C, bbar)
    y = (C[:, :, None, :] * hs.real).sum(-1) + D * x
    return y.astype(dtype), _chunk_ends(hs.real, chunk).astype(dtype)


def selective_scan_backward(dy, x, delta, A, B, C, D, chunk=256, bbar="euler",
                            dtype=np.float64, *, delta_bias=None, delta_activation="none"):
    """dy (B, T, E) and selective_scan_forward's inputs -> dx, ddelta (B, T, E), dA (E, N),
    dB, dC (B, T, N), dD (E,); ddelta is the gradient of delta (before the bias and softplus),
    and delta_bias's gradient is its sum over B and T."""
    dy, x, delta, A, B, C, D = _cast(dtype, dy, x, delta, A, B, C, D)
    step, pre = _scan_step(delta, None if delta_bias is None else _cast(dtype, delta_bias)[0],
                           delta_activation)
    dx, dstep, _, dA, _, dB, dC, dD = _scan_backward(dy, x, step, step, A, np.zeros_like(A),
                                                     B + 0j, C + 0j, D, bbar)
    ddelta = _step_backward(dstep.real, pre, delta_activation)
    return [np.asarray(v.real, dtype) for v in (dx, ddelta, dA, dB, dC, dD)]


def _pairs_to_complex(v):
    return v[..., 0::2] + 1j * v[..., 1::2]


def _complex_to_pairs(z):
    out = np.empty(z.shape[:-1] + (2 * z.shape[-1],))
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def complex_scan_forward(x, delta, delta_angle, A, omega, B, C, D, chunk=256, bbar="euler",
                         dtype=np.float64, *, delta_bias=None, delta_activation="none"):
    """MAMPa's scan: Mamba's with each pair of states a 2x2 block A + omega S (S the rotation
    generator), i.e. one complex state per pair with eigenvalue A + i omega.
    x, delta, delta_angle (B, T, E), A, omega (E, K), B, C (B, T, 2K) (pairs (re, im)),
    D (E,) -> y (B, T, E), states (B, ceil(T / chunk), E, 2K) (pairs (re, im)):
      z_t = delta_t A + i delta_angle_t omega, h_t = e^z_t h_{t-1} + delta_t x_t phi(z_t) B'_t,
      y_t = sum_k 2 Re(C'_t h_t) + D x_t,
    with B' = b_re + i b_im and C' = (c_re - i c_im) / 2 (selective_scan_ref's complex A);
    delta_t the step (delta + delta_bias, through softplus with delta_activation 'softplus',
    as selective_scan_forward's); delta_angle None: the rotation takes that step (Mamba's
    complex A), an array: taken as it is (a separate signed step, the signed-angle reading);
    phi = 1 (Euler) or (e^z - 1) / z (ZOH). The rotation angle of each step is formed from
    delta_angle omega alone; nothing accumulates an angle."""
    x, delta, A, omega, B, C, D = _cast(dtype, x, delta, A, omega, B, C, D)
    delta, _ = _scan_step(delta, None if delta_bias is None else _cast(dtype, delta_bias)[0],
                          delta_activation)
    delta_angle = delta if delta_angle is None else _cast(dtype, delta_angle)[0]
    Bc, Cc = _pairs_to_complex(B), _pairs_to_complex(C)
    _, _, _, hs = _scan_states(x, delta, delta_angle, A, omega, Bc, Cc, bbar)
    y = 2 * np.real(((Cc.conj() / 2)[:, :, None, :] * hs)).sum(-1) + D * x
    return y.astype(dtype), _complex_to_pairs(_chunk_ends(hs, chunk)).astype(dtype)


def complex_scan_backward(dy, x, delta, delta_angle, A, omega, B, C, D, chunk=256,
                          bbar="euler", dtype=np.float64, *, delta_bias=None,
                          delta_activation="none"):
    """dy (B, T, E) and complex_scan_forward's inputs -> dx, ddelta, ddelta_angle (B, T, E),
    dA, domega (E, K), dB, dC (B, T, 2K), dD (E,); ddelta is the gradient of delta (before the
    bias and softplus; with delta_angle None it holds the rotation's part too, and
    ddelta_angle is None), delta_bias's gradient is its sum over B and T."""
    dy, x, delta, A, omega, B, C, D = _cast(dtype, dy, x, delta, A, omega, B, C, D)
    step, pre = _scan_step(delta, None if delta_bias is None else _cast(dtype, delta_bias)[0],
                           delta_activation)
    angle = step if delta_angle is None else _cast(dtype, delta_angle)[0]
    dx, dstep, ddangle, dA, domega, dBc, dCc, dD = _scan_backward(
        dy, x, step, angle, A, omega, _pairs_to_complex(B), _pairs_to_complex(C), D, bbar)
    if delta_angle is None:
        dstep, ddangle = dstep + ddangle, None
    ddelta = _step_backward(dstep, pre, delta_activation)
    return [None if v is None else np.asarray(v, dtype)
            for v in (dx, ddelta, ddangle, dA, domega, _complex_to_pairs(dBc),
                      _complex_to_pairs(dCc), dD)]


# ---- sln: MapEM-SLN positions, 2x2 trace-free generators -----------------------------------
def _sln_parts(delta, gen, clamp):
    """Phi (B, T, H, NB), the generator's (a, b, c) with A = [[a, b], [c, -a]] and
    q = a^2 + b c = -det A (H, NB), and the closed form's C, S and derivatives in Phi and q."""
    phi = np.cumsum(delta, axis=1)
    a, b, c = (gen[..., 0] - gen[..., 3]) / 2, gen[..., 1], gen[..., 2]
    q = a * a + b * c
    x = phi * phi * q
    clamped = x > clamp * clamp
    small = np.abs(x) < 1e-3
    with np.errstate(all="ignore"):
        root = np.sqrt(np.abs(np.where(small | clamped, 1.0, x)))  # |Phi| sqrt|q|
        arg = np.abs(phi) * np.sqrt(np.abs(q))
        cosh_like = np.where(x > 0, np.cosh(arg), np.cos(arg))
        sinc_like = np.where(x > 0, np.sinh(root), np.sin(root)) / root  # g(x)
        f = np.where(small, 1 + x / 2 + x**2 / 24 + x**3 / 720, cosh_like)
        g = np.where(small, 1 + x / 6 + x**2 / 120 + x**3 / 5040, sinc_like)
        big_c, big_s = np.cosh(clamp), np.sign(phi) * np.sinh(clamp) / np.sqrt(np.abs(q))
        C = np.where(clamped, big_c, f)
        S = np.where(clamped, big_s, phi * g)
        gp = np.where(small, 1 / 6 + x / 60 + x**2 / 1680 + x**3 / 90720,
                      (f - g) / np.where(small, 1.0, 2 * x))
        dS_dq = np.where(clamped, -S / (2 * np.where(clamped, q, 1.0)), phi**3 * gp)
    dC_dphi = np.where(clamped, 0.0, q * S)
    dS_dphi = np.where(clamped, 0.0, C)
    dC_dq = np.where(clamped, 0.0, phi * S / 2)
    return (a, b, c), C, S, dC_dphi, dS_dphi, dC_dq, dS_dq


def sln_forward(delta, gen, start, clamp=10.0, dtype=np.float64):
    """delta (B, T, H, NB), gen (H, NB, 4) (A_bar per block, row-major), start (H, D = 2 NB)
    -> p (B, T, H, D): per block p[t] = exp(Phi_t A) start with A = A_bar - tr(A_bar)/2 I
    and Phi_t = cumsum_t(delta); exp(Phi A) = C I + S A (C = cosh, S = sinh / sqrt(q) for
    q = -det A > 0, cos / sin for q < 0, series near 0), |Phi| sqrt q capped at clamp."""
    delta, gen, start = _cast(dtype, delta, gen, start)
    (a, b, c), C, S, *_ = _sln_parts(delta, gen, clamp)
    u, v = start[:, 0::2], start[:, 1::2]
    p = np.empty(delta.shape[:-1] + (start.shape[-1],), dtype=dtype)
    p[..., 0::2] = C * u + S * (a * u + b * v)
    p[..., 1::2] = C * v + S * (c * u - a * v)
    return p


def sln_backward(dp, delta, gen, start, clamp=10.0, dtype=np.float64):
    """dp (B, T, H, D) -> ddelta (B, T, H, NB), dgen (H, NB, 4) (the trace-free part),
    dstart (H, D): the gradients of :func:`sln_forward`."""
    dp, delta, gen, start = _cast(dtype, dp, delta, gen, start)
    (a, b, c), C, S, dC_dphi, dS_dphi, dC_dq, dS_dq = _sln_parts(delta, gen, clamp)
    u, v = start[:, 0::2], start[:, 1::2]
    g0, g1 = dp[..., 0::2], dp[..., 1::2]
    dC, dS = g0 * u + g1 * v, g0 * (a * u + b * v) + g1 * (c * u - a * v)
    dphi = dC * dC_dphi + dS * dS_dphi
    ddelta = np.flip(np.cumsum(np.flip(dphi, 1), 1), 1)
    dq = (dC * dC_dq + dS * dS_dq).sum((0, 1))
    s0, s1 = S * g0, S * g1
    dA = np.stack([(s0 * u).sum((0, 1)) + dq * a, (s0 * v).sum((0, 1)) + dq * c,
                   (s1 * u).sum((0, 1)) + dq * b, (s1 * v).sum((0, 1)) - dq * a], axis=-1)
    half_trace = (dA[..., 0] + dA[..., 3]) / 2
    dA[..., 0] -= half_trace
    dA[..., 3] -= half_trace
    dstart = np.empty_like(start)
    dstart[:, 0::2] = (C * g0 + a * s0 + c * s1).sum((0, 1))
    dstart[:, 1::2] = (C * g1 + b * s0 - a * s1).sum((0, 1))
    return ddelta, dA, dstart


# ---- b4: MapEM-b4 positions, 4x4 blocks with one skew generator (quaternion split) ---------
def qmul(a, b):
    """Hamilton product of quaternions (..., 4) = (w, x, y, z)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw],
                    axis=-1)


def qconj(a):
    return a * np.array([1.0, -1.0, -1.0, -1.0])


def _qexp_parts(w):
    """w (..., 3) -> qexp(w) = (cos n, sinc(n) w) (..., 4), sinc = sin n / n and
    k = (cos n - sinc n) / n^2 (..., 1), by series for n < 0.05."""
    n2 = (w * w).sum(-1, keepdims=True)
    n = np.sqrt(n2)
    small = n < 0.05
    safe = np.where(small, 1.0, n)
    sc = np.where(small, 1 - n2 / 6 + n2**2 / 120 - n2**3 / 5040, np.sin(safe) / safe)
    k = np.where(small, -1 / 3 + n2 / 30 - n2**2 / 840 + n2**3 / 45360,
                 (np.cos(safe) - np.sin(safe) / safe) / safe**2)
    return np.concatenate([np.cos(n), sc * w], axis=-1), sc, k


def quaternion_generator(u, v):
    """The skew 4x4 generator S = L(u) + R(v) (..., 4, 4) of pure quaternions u, v (..., 3):
    S p = u p + p v (quaternion products)."""
    basis = np.eye(4)
    pu = np.concatenate([np.zeros(u.shape[:-1] + (1,)), u], -1)
    pv = np.concatenate([np.zeros(v.shape[:-1] + (1,)), v], -1)
    cols = [qmul(pu, np.broadcast_to(e, pu.shape)) + qmul(np.broadcast_to(e, pv.shape), pv)
            for e in basis]
    return np.stack(cols, axis=-1)


def b4_forward(delta, gen, start, dtype=np.float64):
    """delta (B, T, H, NB), gen (H, NB, 6) = (u, v), start (H, D = 4 NB) -> p (B, T, H, D):
    per 4-block p[t] = exp(Phi_t S) p* = qexp(Phi_t u) p* qexp(Phi_t v) (quaternion products),
    S = L(u) + R(v), Phi_t = cumsum_t(delta)."""
    delta, gen, start = _cast(dtype, delta, gen, start)
    phi = np.cumsum(delta, axis=1)[..., None]
    s = start.reshape(start.shape[0], -1, 4)
    a, _, _ = _qexp_parts(phi * gen[..., :3])
    c, _, _ = _qexp_parts(phi * gen[..., 3:])
    return qmul(qmul(a, s), c).reshape(delta.shape[:-1] + (start.shape[-1],))


def b4_backward(dp, delta, gen, start, dtype=np.float64):
    """dp (B, T, H, D) -> ddelta (B, T, H, NB), dgen (H, NB, 6), dstart (H, D): the
    gradients of :func:`b4_forward`. dPhi = <g, u p + p v>; dp* = conj(a) g conj(c);
    du = Phi J(Phi u)^T (g conj(p* c)), dv = Phi J(Phi v)^T (conj(a p*) g), J the Jacobian of
    qexp: J^T g = sinc n (g_vec - g_0 w) + k w (w . g_vec)."""
    dp, delta, gen, start = _cast(dtype, dp, delta, gen, start)
    phi = np.cumsum(delta, axis=1)[..., None]
    s = start.reshape(start.shape[0], -1, 4)
    g = dp.reshape(delta.shape + (4,))
    u, v = gen[..., :3], gen[..., 3:]
    zero = np.zeros(u.shape[:-1] + (1,))
    pu, pv = np.concatenate([zero, u], -1), np.concatenate([zero, v], -1)
    wu, wv = phi * u, phi * v
    a, sca, ka = _qexp_parts(wu)
    c, scc, kc = _qexp_parts(wv)
    p = qmul(qmul(a, s), c)
    dphi = (g * (qmul(pu, p) + qmul(p, pv))).sum(-1)
    ddelta = np.flip(np.cumsum(np.flip(dphi, 1), 1), 1)
    dstart = qmul(qmul(qconj(a), g), qconj(c)).sum((0, 1)).reshape(start.shape)

    def jt(w, sc, k, ga):
        return sc * (ga[..., 1:] - ga[..., :1] * w) + k * w * (w * ga[..., 1:]).sum(-1,
                                                                                  keepdims=True)
    da = qmul(g, qconj(qmul(s, c)))
    dc = qmul(qconj(qmul(a, s)), g)
    du = (phi * jt(wu, sca, ka, da)).sum((0, 1))
    dv = (phi * jt(wv, scc, kc, dc)).sum((0, 1))
    return ddelta, np.concatenate([du, dv], -1), dstart


# ---- nc: MapEM-NC ordered product of 4x4 rotations (unit-quaternion pairs) -----------------
# The op's layout is feature-major within a head: w (B, T, H, 6, NB) holds coordinate f of
# block k's (u, v) at [..., f, k], and p, p* (..., H, D = 4 NB) hold component f of block k's
# quaternion at f NB + k (the C kernels load a feature of consecutive blocks as one vector).
def nc_blocks(x, f):
    """The op's feature-major layout -> block-major: w (f = 6) (..., 6, NB) -> (..., NB, 6);
    p, p* (f = 4) (..., 4 NB) -> (..., NB, 4)."""
    x = np.asarray(x)
    if f == 4:
        x = x.reshape(x.shape[:-1] + (4, x.shape[-1] // 4))
    return np.swapaxes(x, -1, -2)


def nc_features(x):
    """Block-major -> the op's layout (inverse of :func:`nc_blocks`, f the last axis):
    (..., NB, 6) -> (..., 6, NB); (..., NB, 4) -> (..., 4 NB)."""
    f = np.asarray(x).shape[-1]
    x = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    return x.reshape(x.shape[:-2] + (-1,)) if f == 4 else x


def nc_forward(w, start, dtype=np.float64):
    """w (B, T, H, 6, NB) = per token the (u_t, v_t) of its step generator
    S_t = L(u_t) + R(v_t), start (H, D = 4 NB) -> p (B, T, H, D) (both feature-major, see
    above): per 4-block the ordered product p_t = exp(S_t) exp(S_{t-1}) ... exp(S_1) p*,
    computed as p_t = A_t p* C_t with A_t = qexp(u_t) A_{t-1}, C_t = C_{t-1} qexp(v_t)
    (A_0 = C_0 = 1)."""
    w, start = _cast(dtype, w, start)
    w, s = nc_blocks(w, 6), nc_blocks(start, 4)
    B, T, H, NB, _ = w.shape
    a, _, _ = _qexp_parts(w[..., :3])
    c, _, _ = _qexp_parts(w[..., 3:])
    A = np.zeros((B, H, NB, 4))
    A[..., 0] = 1.0
    C = A.copy()
    p = np.empty((B, T, H, NB, 4), dtype=dtype)
    for t in range(T):
        A, C = qmul(a[:, t], A), qmul(C, c[:, t])
        p[:, t] = qmul(qmul(A, s), C)
    return nc_features(p)


def nc_backward(dp, w, start, dtype=np.float64):
    """dp (B, T, H, D) -> dw (B, T, H, 6, NB), dstart (H, D) (feature-major): the gradients
    of :func:`nc_forward` by the reverse-time adjoints of the two prefix products:
    lam_t = g_t conj(p* C_t) + conj(a_{t+1}) lam_{t+1}, da_t = lam_t conj(A_{t-1});
    mu_t = conj(A_t p*) g_t + mu_{t+1} conj(c_{t+1}), dc_t = conj(C_{t-1}) mu_t;
    dw = J^T (da, dc) (qexp's Jacobian, see b4_backward); dp* = sum conj(A_t) g_t conj(C_t)."""
    dp, w, start = _cast(dtype, dp, w, start)
    w, s, g = nc_blocks(w, 6), nc_blocks(start, 4), nc_blocks(dp, 4)
    B, T, H, NB, _ = w.shape
    a, sca, ka = _qexp_parts(w[..., :3])
    c, scc, kc = _qexp_parts(w[..., 3:])
    A = np.zeros((B, T + 1, H, NB, 4))
    A[..., 0] = 1.0
    C = A.copy()
    for t in range(T):
        A[:, t + 1], C[:, t + 1] = qmul(a[:, t], A[:, t]), qmul(C[:, t], c[:, t])
    dstart = nc_features(qmul(qmul(qconj(A[:, 1:]), g), qconj(C[:, 1:])).sum((0, 1)))
    dw = np.empty_like(w)
    lam = np.zeros((B, H, NB, 4))
    mu = np.zeros((B, H, NB, 4))
    for t in range(T - 1, -1, -1):
        lam = qmul(g[:, t], qconj(qmul(s, C[:, t + 1]))) + (
            qmul(qconj(a[:, t + 1]), lam) if t + 1 < T else 0.0)
        mu = qmul(qconj(qmul(A[:, t + 1], s)), g[:, t]) + (
            qmul(mu, qconj(c[:, t + 1])) if t + 1 < T else 0.0)
        for half, q, sc, k, d in ((slice(0, 3), w[:, t, ..., :3], sca[:, t], ka[:, t],
                                   qmul(lam, qconj(A[:, t]))),
                                  (slice(3, 6), w[:, t, ..., 3:], scc[:, t], kc[:, t],
                                   qmul(qconj(C[:, t]), mu))):
            dw[:, t, ..., half] = sc * (d[..., 1:] - d[..., :1] * q) + k * q * (
                q * d[..., 1:]).sum(-1, keepdims=True)
    return nc_features(dw), dstart


# ---- APE: per-token orthogonal maps ------------------------------------------------------
def _ape_chunks(x, maps, index):
    """x (B, T, H, D), maps (A, P, H, E, E), index (TB, T, A) -> x as (B, T, H, A, E) and the
    token's maps (B, T, A, H, E, E)."""
    A, _, _, E, _ = maps.shape
    B, T, H, _ = x.shape
    index = np.asarray(index)
    m = maps[np.arange(A), index]  # (TB, T, A, H, E, E)
    return x.reshape(B, T, H, A, E), np.broadcast_to(m, (B,) + m.shape[1:])


def ape_apply_forward(x, maps, index, dtype=np.float64):
    """x (B, T, H, D), maps (A, P, H, E, E) with D = A E, index int (TB, T, A) in [0, P),
    TB in {1, B} -> y (B, T, H, D): chunk a of each head, y[..., aE:(a+1)E], is
    maps[a, index[tb, t, a], h] times x's chunk a (APE: M(p) q, M(p) k)."""
    x, maps = _cast(dtype, x, maps)
    xs, m = _ape_chunks(x, maps, index)
    return np.einsum("btahij,bthaj->bthai", m, xs).reshape(x.shape)


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


def ape_decay_forward(q, k, gamma, dtype=np.float64):
    """q, k (B, T, H, D), gamma > 0 -> (q_out, k_out) = (gamma^(t - c) q, gamma^(c - t) k) per
    token t, c = (T - 1) / 2: q_out_i . k_out_j = gamma^(i - j) q_i . k_j, APE's multiplicative
    decay gamma^distance of the logits of causal attention (j <= i)."""
    q, k = _cast(dtype, q, k)
    s = _decay_scales(q.shape[1], gamma, dtype)
    return q * s, k / s


def ape_decay_backward(dq_out, dk_out, gamma, dtype=np.float64):
    """dq_out, dk_out (B, T, H, D) -> (dq, dk) = (gamma^(t - c) dq_out, gamma^(c - t) dk_out)
    (gamma a constant)."""
    return ape_decay_forward(dq_out, dk_out, gamma, dtype)


# ---- GridPE's complex form ----------------------------------------------------------------
def gridpe_complex_forward(x, theta, dtype=np.float64):
    """x (B, T, H, E), theta (TB, T, H, E) (TB = 1 broadcast or B) -> y (B, T, H, 2E) with
    y[..., 2d] = x_d cos theta_d, y[..., 2d + 1] = x_d sin theta_d: one complex exponential
    per real channel, so y_m . y'_n = sum_d x_d x'_d cos(theta_d(m) - theta_d(n))."""
    x, theta = _cast(dtype, x, theta)
    y = np.empty(x.shape[:-1] + (2 * x.shape[-1],), dtype)
    y[..., 0::2], y[..., 1::2] = x * np.cos(theta), x * np.sin(theta)
    return y


def gridpe_complex_backward(dy, theta, dtype=np.float64):
    """dy (B, T, H, 2E), theta (TB, T, H, E) -> dx (B, T, H, E) = cos theta dy[..., 2d] +
    sin theta dy[..., 2d + 1] (theta fixed: no gradient)."""
    dy, theta = _cast(dtype, dy, theta)
    return np.cos(theta) * dy[..., 0::2] + np.sin(theta) * dy[..., 1::2]


# ---- APE: generators, their exponentials and powers (parameter-side) ---------------------
def expm(x, dtype=np.float64):
    """Matrix exponential of a stack x (..., n, n): scaling and squaring, Taylor degree 18 on
    x / 2^s with ||x / 2^s||_1 <= 1/2 (truncation below 1e-22 relative)."""
    (x,) = _cast(dtype, x)
    norm = np.abs(x).sum(-2).max() if x.size else 0.0
    s = max(0, int(np.ceil(np.log2(norm))) + 1) if norm > 0 else 0
    y = x / 2.0 ** s
    eye = np.broadcast_to(np.eye(x.shape[-1], dtype=dtype), x.shape)
    result, term = eye.copy(), eye.copy()
    for k in range(1, 19):
        term = term @ y / k
        result = result + term
    for _ in range(s):
        result = result @ result
    return result


def expm_frechet(x, g, dtype=np.float64):
    """The Frechet derivative of expm at x (..., n, n) in the direction g: the upper-right
    block of expm([[x, g], [0, x]]) (the block-triangular identity)."""
    x, g = _cast(dtype, x, g)
    n = x.shape[-1]
    big = np.zeros(x.shape[:-2] + (2 * n, 2 * n), dtype)
    big[..., :n, :n] = big[..., n:, n:] = x
    big[..., :n, n:] = g
    return expm(big, dtype=dtype)[..., :n, n:]


def _swap(m):
    return np.swapaxes(m, -1, -2)


def _times(table, m):
    """table (G, n, H, E, E) times m (G, H, E, E) on the right, every entry: a stack of
    E x E products (each below the size at which NumPy's BLAS starts threads: one large
    product per (g, h) ran 5-30x slower with two threads on a busy 2-core machine)."""
    return table @ m[:, None]


def ape_powers_forward(generator, steps, dtype=np.float64):
    """generator (G, H, E, E) (any real matrices A) -> maps (G, steps, H, E, E) with
    maps[g, p, h] = W^p, W = expm(A - A^T) (orthogonal, det +1), p = 0..steps-1, by doubling:
    table[0..2n) = [table[0..n), table[0..n) W^n], W^2n = W^n W^n (ceil(log2 steps) batched
    products)."""
    (a,) = _cast(dtype, generator)
    w = expm(a - _swap(a), dtype=dtype)  # (G, H, E, E)
    table = np.broadcast_to(np.eye(a.shape[-1], dtype=dtype), a.shape)[:, None].copy()
    power = w
    while table.shape[1] < steps:
        table = np.concatenate([table, _times(table, power)], axis=1)
        power = power @ power
    return table[:, :steps].copy()


def ape_powers_backward(dmaps, generator, dtype=np.float64):
    """dmaps (G, P, H, E, E), generator (G, H, E, E) -> dgenerator (G, H, E, E): the doubling
    undone level by level (d table[:n] += d table[n:] (W^n)^T, d W^n = sum_j table[j]^T
    d table[n + j], d W^n += dW^2n (W^n)^T + (W^n)^T dW^2n), then through expm by its Frechet
    derivative at S^T (dS = L(S^T, dW)) and dA = dS - dS^T."""
    dmaps, a = _cast(dtype, dmaps, generator)
    steps = dmaps.shape[1]
    s = a - _swap(a)
    w = expm(s, dtype=dtype)
    tables, powers = [], []
    table = np.broadcast_to(np.eye(a.shape[-1], dtype=dtype), a.shape)[:, None].copy()
    power = w
    while table.shape[1] < steps:
        tables.append(table)
        powers.append(power)
        table = np.concatenate([table, _times(table, power)], axis=1)
        power = power @ power
    dtable = np.zeros_like(table)
    dtable[:, :steps] = dmaps
    dpower = np.zeros_like(w)  # the gradient of the last (unused) power
    for table, power in zip(reversed(tables), reversed(powers)):
        n = table.shape[1]
        dpower = dpower @ _swap(power) + _swap(power) @ dpower  # power @ power
        dpower = dpower + (_swap(table) @ dtable[:, n:]).sum(1)  # sum_j table[j]^T d[n + j]
        dtable = dtable[:, :n] + _times(dtable[:, n:], _swap(power))
    ds = expm_frechet(_swap(s), dpower, dtype=dtype)
    return ds - _swap(ds)


def skew_eig(generator, dtype=np.float64):
    """generator A (..., n, n) real -> (lam (..., n) real, U (..., n, n) unitary) with the
    skew S = A - A^T = U diag(i lam) U^H (from the Hermitian -i S)."""
    (a,) = _cast(dtype, generator)
    return np.linalg.eigh(-1j * (a - _swap(a)))


def ape_basis_forward(generator, eig=None, dtype=np.float64):
    """generator (..., E, E) (any real A) -> M = expm(A - A^T) (..., E, E), orthogonal with
    det +1: ape_seq's change of basis (APE's canonical form W = M^T R(theta) M). Through the
    eigendecomposition ``eig`` = skew_eig(A) (computed when not given): M = U diag(e^(i lam))
    U^H (real up to rounding)."""
    lam, u = skew_eig(generator, dtype) if eig is None else eig
    return ((u * np.exp(1j * lam)[..., None, :]) @ _swap(u).conj()).real.astype(dtype)


def ape_basis_backward(dbasis, generator, eig=None, dtype=np.float64):
    """dbasis (..., E, E), generator A (..., E, E) (or its ``eig`` = skew_eig(A)) -> dA
    (..., E, E). M = expm(S), S = A - A^T normal, so expm's Frechet derivative is diagonal in
    S's eigenbasis: L(S, G) = U (Phi o (U^H G U)) U^H with Phi_jk = (e^(i lam_j) -
    e^(i lam_k)) / (i (lam_j - lam_k)) = e^(i (lam_j + lam_k) / 2) sinc((lam_j - lam_k) / 2)
    (e^(i lam_j) when equal: the form used, stable for close eigenvalues). Its adjoint is
    L(S^T, .) = L(-S, .): conj(Phi); then dS = L(S^T, dM) and dA = dS - dS^T (the same number
    as expm_frechet(S^T, dM), without the 2E x 2E exponential)."""
    (dbasis,) = _cast(dtype, dbasis)
    lam, u = skew_eig(generator, dtype) if eig is None else eig
    half = (lam[..., :, None] - lam[..., None, :]) / 2
    phi = np.exp(0.5j * (lam[..., :, None] + lam[..., None, :])) * np.sinc(half / np.pi)
    uh = _swap(u).conj()
    ds = (u @ (phi.conj() * (uh @ dbasis @ u)) @ uh).real
    return (ds - _swap(ds)).astype(dtype)


def ape_tree_forward(generator, depth, dtype=np.float64):
    """generator (2, H, E, E) (one per branch: 0 left, 1 right) -> maps (1, 2^(depth+1), H, E,
    E): the operator of every node of a binary tree of ``depth`` levels below the root, by heap
    number h (root 1, children 2h and 2h + 1; entry 0 unused, the identity):
    maps[0, 1] = I, maps[0, h] = maps[0, h // 2] W_(h % 2), W_b = expm(A_b - A_b^T), the
    ordered product of the branches' operators along the root-to-node path (non-commutative:
    left-then-right differs from right-then-left). Built level by level (2 batched products
    per level)."""
    (a,) = _cast(dtype, generator)
    w = expm(a - _swap(a), dtype=dtype)  # (2, H, E, E)
    h, e = a.shape[1], a.shape[-1]
    table = np.empty((1, 2 ** (depth + 1), h, e, e), dtype)
    table[0, :2] = np.eye(e, dtype=dtype)
    for level in range(1, depth + 1):
        parents = table[:, 2 ** (level - 1):2 ** level]
        for b in (0, 1):
            table[:, 2 ** level + b:2 ** (level + 1):2] = _times(parents, w[b][None])
    return table


def ape_tree_backward(dmaps, generator, dtype=np.float64):
    """dmaps (1, 2^(depth+1), H, E, E), generator (2, H, E, E) -> dgenerator (2, H, E, E): the
    levels undone from the deepest (dW_b += sum over branch-b children of M_parent^T
    dM_child; dM_parent += dM_child W_b^T), then each W_b through expm's Frechet derivative."""
    dmaps, a = _cast(dtype, dmaps, generator)
    depth = dmaps.shape[1].bit_length() - 2
    s = a - _swap(a)
    w = expm(s, dtype=dtype)
    table = ape_tree_forward(a, depth, dtype=dtype)
    d = dmaps.copy()
    dw = np.zeros_like(w)
    for level in range(depth, 0, -1):
        lo, hi = 2 ** (level - 1), 2 ** level
        parents = table[:, lo:hi]
        for b in (0, 1):
            children = d[:, 2 ** level + b:2 ** (level + 1):2]
            dw[b] += (_swap(parents) @ children).sum(1)[0]
            d[:, lo:hi] += _times(children, _swap(w[b])[None])
    ds = expm_frechet(_swap(s), dw, dtype=dtype)
    return ds - _swap(ds)


# ---- vq: vector quantisation, M parallel codebooks -----------------------------------------
def vq_forward(z, codebook, dtype=np.float64):
    """z (N, M, D), codebook (M, K, D) -> (codes (N, M, D), indices int32 (N, M),
    dist (N, M), total).

    indices[n, m] = argmin_k ||z[n, m] - codebook[m, k]||^2 from the expansion
    ||z||^2 - 2 z.e + ||e||^2 (the lowest k on ties: np.argmin), codes = the chosen codes,
    dist = ||z - codes||^2 recomputed directly for the chosen code, total = dist.sum()."""
    z, codebook = _cast(dtype, z, codebook)
    scores = (np.einsum("nmd,nmd->nm", z, z)[:, :, None]
              - 2.0 * np.einsum("nmd,mkd->nmk", z, codebook)
              + np.einsum("mkd,mkd->mk", codebook, codebook)[None])
    indices = np.argmin(scores, axis=-1).astype(np.int32)
    codes = codebook[np.arange(codebook.shape[0])[None, :], indices]
    dist = ((z - codes) ** 2).sum(-1)
    return codes, indices, dist, float(dist.sum())


def vq_backward(dcodes, z, codebook, indices, codebook_weight, commitment_weight,
                dtype=np.float64):
    """-> (dz (N, M, D), dcodebook (M, K, D)): the gradients of
    L(codes) + codebook_weight sum ||codes - sg(z)||^2 + commitment_weight sum ||sg(codes) - z||^2
    with codes = codebook[m, indices] taken straight through (dL/dcodes goes to z unchanged):
    dz = dcodes + 2 commitment_weight (z - codes);
    dcodebook[m, k] = 2 codebook_weight sum_{n: indices[n, m] = k} (codebook[m, k] - z[n, m])."""
    dcodes, z, codebook = _cast(dtype, dcodes, z, codebook)
    M, K, D = codebook.shape
    indices = np.asarray(indices)
    codes = codebook[np.arange(M)[None, :], indices]
    dz = dcodes + 2.0 * commitment_weight * (z - codes)
    dcodebook = np.zeros_like(codebook)
    for m in range(M):
        np.add.at(dcodebook[m], indices[:, m], 2.0 * codebook_weight * (codes[:, m] - z[:, m]))
    return dz, dcodebook


# ---- l2_normalize: rows scaled to unit length (TDB's enc objective) -------------------------
def l2_normalize_forward(x, eps=1e-12, dtype=np.float64):
    """x (N, D) -> (y (N, D), norm (N,)): norm = sqrt(sum_d x^2 + eps), y = x / norm."""
    (x,) = _cast(dtype, x)
    norm = np.sqrt((x * x).sum(-1) + eps)
    return x / norm[:, None], norm


def l2_normalize_backward(dy, y, norm, dtype=np.float64):
    """dy (N, D), the forward's y (N, D) and norm (N,) -> dx (N, D) = (dy - y (y . dy)) / norm."""
    dy, y, norm = _cast(dtype, dy, y, norm)
    return (dy - y * (y * dy).sum(-1, keepdims=True)) / norm[:, None]


# ---- ema: exponential moving average (TDB's teacher) ----------------------------------------
def ema_update(target, source, decay, dtype=np.float64):
    """target, source (P,), decay in [0, 1) -> decay target + (1 - decay) source (P,)."""
    target, source = _cast(dtype, target, source)
    return decay * target + (1.0 - decay) * source


# ---- lstm: one layer, gates (i, f, g, o) -----------------------------------------------------
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_forward(x, w_ih, w_hh, b, h0=None, c0=None, dtype=np.float64):
    """x (B, T, C), w_ih (4H, C), w_hh (4H, H), b (4H,), h0, c0 (B, H) or None (zeros) ->
    (h (B, T, H), c (B, T, H), gates (B, T, 4H)): per step pre = x_t w_ih^T + b + h_{t-1}
    w_hh^T, gates = (sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)), c_t = f c_{t-1} + i g,
    h_t = o tanh(c_t)."""
    x, w_ih, w_hh, b = _cast(dtype, x, w_ih, w_hh, b)
    B, T, _ = x.shape
    H = w_hh.shape[1]
    hp = np.zeros((B, H), dtype) if h0 is None else np.asarray(h0, dtype)
    cp = np.zeros((B, H), dtype) if c0 is None else np.asarray(c0, dtype)
    h, c, gates = (np.zeros((B, T, H), dtype), np.zeros((B, T, H), dtype),
                   np.zeros((B, T, 4 * H), dtype))
    for t in range(T):
        pre = x[:, t] @ w_ih.T + b + hp @ w_hh.T
        i, f, g, o = np.split(pre, 4, axis=-1)
        i, f, g, o = _sigmoid(i), _sigmoid(f), np.tanh(g), _sigmoid(o)
        cp = f * cp + i * g
        hp = o * np.tanh(cp)
        h[:, t], c[:, t], gates[:, t] = hp, cp, np.concatenate([i, f, g, o], -1)
    return h, c, gates


def lstm_backward(dh, x, w_ih, w_hh, h, c, gates, h0=None, c0=None, dtype=np.float64):
    """Backpropagation through time of :func:`lstm_forward` from dh (B, T, H), the gradient
    reaching every h_t, and the forward's h, c, gates -> (dx (B, T, C), dw_ih (4H, C),
    dw_hh (4H, H), db (4H,), dh0 (B, H), dc0 (B, H))."""
    dh, x, w_ih, w_hh, h, c, gates = _cast(dtype, dh, x, w_ih, w_hh, h, c, gates)
    B, T, _ = x.shape
    H = w_hh.shape[1]
    h0 = np.zeros((B, H), dtype) if h0 is None else np.asarray(h0, dtype)
    c0 = np.zeros((B, H), dtype) if c0 is None else np.asarray(c0, dtype)
    dx, dw_ih, dw_hh = np.zeros_like(x), np.zeros_like(w_ih), np.zeros_like(w_hh)
    db = np.zeros(4 * H, dtype)
    dh_next, dc_next = np.zeros((B, H), dtype), np.zeros((B, H), dtype)
    for t in reversed(range(T)):
        i, f, g, o = np.split(gates[:, t], 4, axis=-1)
        c_prev = c[:, t - 1] if t > 0 else c0
        h_prev = h[:, t - 1] if t > 0 else h0
        tc = np.tanh(c[:, t])
        dht = dh[:, t] + dh_next
        dct = dc_next + dht * o * (1 - tc * tc)
        dpre = np.concatenate([dct * g * i * (1 - i), dct * c_prev * f * (1 - f),
                               dct * i * (1 - g * g), dht * tc * o * (1 - o)], -1)
        dx[:, t] = dpre @ w_ih
        dw_ih += dpre.T @ x[:, t]
        dw_hh += dpre.T @ h_prev
        db += dpre.sum(0)
        dh_next, dc_next = dpre @ w_hh, dct * f
    return dx, dw_ih, dw_hh, db, dh_next, dc_next


# ---- nc_general: MapEM-NC ordered product for any block size b and K generators ------------
def _expm(x):
    """exp of a stack of square matrices x (..., n, n): scaling (the stack's largest Frobenius
    norm to at most 1/4) and squaring of the degree-18 Taylor polynomial, in float64."""
    f = float(np.sqrt((x * x).sum((-2, -1))).max(initial=0.0))
    s = max(0, int(np.ceil(np.log2(f / 0.25)))) if f > 0.25 else 0
    a = x / 2.0 ** s
    eye = np.broadcast_to(np.eye(x.shape[-1]), x.shape)
    r = eye + a / 18
    for k in range(17, 0, -1):
        r = eye + a @ r / k
    for _ in range(s):
        r = r @ r
    return r


def nc_general_forward(theta, gen, start, dtype=np.float64):
    """theta (B, T, H, NB, K), gen (H, NB, K, b, b) the generators S_i, start (H, D = NB b)
    -> p (B, T, H, D): per block p_t = exp(X_t) p_{t-1}, p_0 = start,
    X_t = sum_i theta_t,i S_i."""
    theta, gen, start = _cast(dtype, theta, gen, start)
    B, T, H, NB, _ = theta.shape
    b = gen.shape[-1]
    r = _expm(np.einsum("bthki,hkirc->bthkrc", theta, gen))
    v = np.broadcast_to(start.reshape(H, NB, b), (B, H, NB, b))
    p = np.empty((B, T, H, NB, b), dtype=dtype)
    for t in range(T):
        v = np.einsum("bhkrc,bhkc->bhkr", r[:, t], v)
        p[:, t] = v
    return p.reshape(B, T, H, NB * b)


def nc_general_backward(dp, theta, gen, start, dtype=np.float64):
    """dp (B, T, H, D) -> dtheta (B, T, H, NB, K), dgen (H, NB, K, b, b), dstart (H, D): the
    gradients of :func:`nc_general_forward`, lam_t = dp_t + R_{t+1}^T lam_{t+1},
    dX_t = the Frechet derivative of exp at X_t^T in the direction lam_t p_{t-1}^T (the upper
    right block of exp([[X^T, E], [0, X^T]])), dtheta_t,i = <dX_t, S_i>,
    dS_i = sum_t theta_t,i dX_t, dstart = sum_b R_1^T lam_1."""
    dp, theta, gen, start = _cast(dtype, dp, theta, gen, start)
    B, T, H, NB, _ = theta.shape
    b = gen.shape[-1]
    x = np.einsum("bthki,hkirc->bthkrc", theta, gen)
    r = _expm(x)
    g = dp.reshape(B, T, H, NB, b)
    prev = np.empty((B, T, H, NB, b))
    v = np.broadcast_to(start.reshape(H, NB, b), (B, H, NB, b))
    for t in range(T):
        prev[:, t] = v
        v = np.einsum("bhkrc,bhkc->bhkr", r[:, t], v)
    lam = np.zeros((B, H, NB, b))
    dx = np.empty_like(x)
    for t in range(T - 1, -1, -1):
        lam = g[:, t] + (np.einsum("bhkrc,bhkr->bhkc", r[:, t + 1], lam) if t + 1 < T else 0.0)
        e = lam[..., :, None] * prev[:, t, ..., None, :]
        xt = np.swapaxes(x[:, t], -1, -2)
        big = np.zeros(xt.shape[:-2] + (2 * b, 2 * b))
        big[..., :b, :b], big[..., b:, b:], big[..., :b, b:] = xt, xt, e
        dx[:, t] = _expm(big)[..., :b, b:]
    dstart = np.einsum("bhkrc,bhkr->hkc", r[:, 0], lam).reshape(start.shape) if T else \
        np.zeros(start.shape)
    dtheta = np.einsum("bthkrc,hkirc->bthki", dx, gen)
    dgen = np.einsum("bthki,bthkrc->hkirc", theta, dx)
    return dtheta, dgen, dstart
