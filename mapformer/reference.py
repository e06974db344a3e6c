"""Float64 NumPy reference of every C op: the specification and the tests' oracle.

Each op has ``<op>_forward`` and ``<op>_backward`` written for clarity, not speed: full
matrices, no tiling. Shapes follow the C core (``csrc/include/mapformer/mapformer.h``):
B batch, T tokens, H heads, D head dim (even), NB = D/2 rotation blocks, C model width,
V vocabulary, N rows (B*T). Inputs may be any float dtype; results are float64.
"""
import numpy as np

TWO_PI = 2.0 * np.pi
GELU_K = np.sqrt(2.0 / np.pi)


def _f64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


# ---- embedding ---------------------------------------------------------------------------
def embedding_forward(tokens, weight):
    """tokens int (N,), weight (V, C) -> out (N, C) = weight[tokens]."""
    (weight,) = _f64(weight)
    return weight[np.asarray(tokens)]


def embedding_backward(dout, tokens, vocab_size):
    """dout (N, C), tokens int (N,) -> dweight (V, C) with dweight[v] = sum of dout[tokens == v]."""
    (dout,) = _f64(dout)
    dweight = np.zeros((vocab_size, dout.shape[1]))
    np.add.at(dweight, np.asarray(tokens), dout)
    return dweight


# ---- linear ------------------------------------------------------------------------------
def linear_forward(x, weight, bias=None):
    """x (N, Cin), weight (Cout, Cin), bias (Cout,) or None -> y (N, Cout) = x weight^T + bias."""
    x, weight = _f64(x, weight)
    y = x @ weight.T
    return y if bias is None else y + np.asarray(bias, dtype=np.float64)


def linear_backward(dy, x, weight, has_bias=True):
    """dy (N, Cout), x (N, Cin), weight (Cout, Cin) -> dx (N, Cin), dweight (Cout, Cin),
    dbias (Cout,) or None."""
    dy, x, weight = _f64(dy, x, weight)
    return dy @ weight, dy.T @ x, (dy.sum(0) if has_bias else None)


# ---- layernorm ---------------------------------------------------------------------------
def layernorm_forward(x, weight, bias, eps=1e-5):
    """x (N, C), weight (C,), bias (C,) -> y (N, C), mean (N,), rstd (N,).

    y = (x - mean) * rstd * weight + bias with the biased variance over C."""
    x, weight, bias = _f64(x, weight, bias)
    mean = x.mean(-1)
    rstd = 1.0 / np.sqrt(((x - mean[:, None]) ** 2).mean(-1) + eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    return xhat * weight + bias, mean, rstd


def layernorm_backward(dy, x, mean, rstd, weight):
    """dy, x (N, C), mean, rstd (N,), weight (C,) -> dx (N, C), dweight (C,), dbias (C,)."""
    dy, x, mean, rstd, weight = _f64(dy, x, mean, rstd, weight)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * weight
    dx = rstd[:, None] * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum(0), dy.sum(0)


# ---- GELU (tanh approximation) -----------------------------------------------------------
def gelu_forward(x):
    """x (...) -> 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    (x,) = _f64(x)
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + 0.044715 * x**3)))


def gelu_backward(dy, x):
    """dy, x (...) -> dx (...)."""
    dy, x = _f64(dy, x)
    u = GELU_K * (x + 0.044715 * x**3)
    t = np.tanh(u)
    du = GELU_K * (1.0 + 3 * 0.044715 * x**2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * du)


# ---- residual ----------------------------------------------------------------------------
def residual_forward(a, b):
    """a, b (...) -> a + b."""
    a, b = _f64(a, b)
    return a + b


def residual_backward(dout):
    """dout (...) -> (da, db): both branches receive dout unchanged."""
    (dout,) = _f64(dout)
    return dout, dout


# ---- causal attention --------------------------------------------------------------------
def attention_forward(q, k, v, scale=None):
    """q, k, v (B, T, H, D) -> out (B, T, H, D), lse (B, H, T).

    out[b, i, h] = sum_{j <= i} softmax_j(scale * q_i . k_j) v_j (causal);
    lse[b, h, i] = log sum_{j <= i} exp(scale * q_i . k_j). scale defaults to 1/sqrt(D)."""
    q, k, v = _f64(q, k, v)
    T, D = q.shape[1], q.shape[3]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(s - m).sum(-1))
    p = np.exp(s - lse[..., None])
    return np.einsum("bhij,bjhd->bihd", p, v), lse


def attention_backward(dout, q, k, v, scale=None):
    """dout, q, k, v (B, T, H, D) -> dq, dk, dv (B, T, H, D)."""
    dout, q, k, v = _f64(dout, q, k, v)
    D = q.shape[3]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    out, lse = attention_forward(q, k, v, scale)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    p = np.tril(np.exp(s - lse[..., None]))
    dv = np.einsum("bhij,bihd->bjhd", p, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, v)
    delta = np.einsum("bihd,bihd->bhi", dout, out)
    ds = p * (dp - delta[..., None]) * scale
    return np.einsum("bhij,bjhd->bihd", ds, k), np.einsum("bhij,bihd->bjhd", ds, q), dv


# ---- path integration --------------------------------------------------------------------
def wrap_angle(theta):
    """Reduce angles to [-pi, pi): theta - 2 pi floor(theta / (2 pi) + 1/2)."""
    return theta - TWO_PI * np.floor(theta / TWO_PI + 0.5)


def path_integration_forward(delta, omega, wrap=True):
    """delta (B, T, H, NB), omega (H, NB) -> theta (B, T, H, NB).

    theta[b, t, h, i] = omega[h, i] * sum_{s <= t} delta[b, s, h, i], reduced to [-pi, pi)
    when wrap (the C op always wraps: rotations see only the angle mod 2 pi)."""
    delta, omega = _f64(delta, omega)
    theta = omega * np.cumsum(delta, axis=1)
    return wrap_angle(theta) if wrap else theta


def path_integration_backward(dtheta, delta, omega):
    """dtheta, delta (B, T, H, NB), omega (H, NB) -> ddelta (B, T, H, NB), domega (H, NB).

    ddelta[t] = sum_{s >= t} dtheta[s] * omega; domega = sum_{b, t} dtheta * cumsum(delta)."""
    dtheta, delta, omega = _f64(dtheta, delta, omega)
    ddelta = np.flip(np.cumsum(np.flip(dtheta * omega, 1), 1), 1)
    return ddelta, (dtheta * np.cumsum(delta, axis=1)).sum((0, 1))


# ---- input-dependent rotary --------------------------------------------------------------
def rotate_pairs(x, theta):
    """x (B, T, H, D), theta (TB, T, H, D/2), TB in {1, B} -> x with each pair
    (x[2i], x[2i+1]) rotated by theta_i: (x0 cos - x1 sin, x0 sin + x1 cos)."""
    x, theta = _f64(x, theta)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = np.cos(theta), np.sin(theta)
    y = np.empty(np.broadcast_shapes(x.shape, theta.shape[:-1] + (x.shape[-1],)))
    y[..., 0::2] = x0 * c - x1 * s
    y[..., 1::2] = x0 * s + x1 * c
    return y


def rotary_forward(q, k, theta):
    """q, k (B, T, H, D), theta (TB, T, H, D/2) -> q_out, k_out (B, T, H, D).

    With theta = omega * t (delta = 1 in path integration) this is RoPE."""
    return rotate_pairs(q, theta), rotate_pairs(k, theta)


def rotary_backward(dq_out, dk_out, q, k, theta):
    """dq_out, dk_out, q, k (B, T, H, D), theta (TB, T, H, D/2) -> dq, dk (B, T, H, D),
    dtheta (TB, T, H, D/2).

    dx = R(theta)^T dy; dtheta = y0 dy1 - y1 dy0 summed over q and k (and over b when TB = 1)."""
    (theta,) = _f64(theta)
    dtheta = 0.0
    grads = []
    for dy, x in ((dq_out, q), (dk_out, k)):
        (dy,) = _f64(dy)
        y = rotate_pairs(x, theta)
        grads.append(rotate_pairs(dy, -theta))
        dtheta = dtheta + y[..., 0::2] * dy[..., 1::2] - y[..., 1::2] * dy[..., 0::2]
    if theta.shape[0] == 1:
        dtheta = dtheta.sum(0, keepdims=True)
    return grads[0], grads[1], dtheta


# ---- masked softmax cross-entropy --------------------------------------------------------
def softmax_xent_forward(logits, targets, mask):
    """logits (N, V), targets int (N,), mask (N,) -> losses (N,), loss (float).

    losses[n] = -log softmax(logits[n])[targets[n]] for every row; loss is their mean
    weighted by mask (0.0 when mask sums to 0)."""
    logits, mask = _f64(logits, mask)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    losses = -logp[np.arange(len(logits)), np.asarray(targets)]
    total = mask.sum()
    return losses, (float((losses * mask).sum() / total) if total != 0 else 0.0)


def softmax_xent_backward(logits, targets, mask, scale):
    """logits (N, V), targets (N,), mask (N,) -> dlogits (N, V) =
    scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])). With scale = 1/sum(mask)
    this is the gradient of the loss returned by the forward."""
    logits, mask = _f64(logits, mask)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(len(logits)), np.asarray(targets)] -= 1.0
    return scale * mask[:, None] * p


# ---- AdamW -------------------------------------------------------------------------------
def adamw_step(params, grads, m, v, decay_mask, lr, beta1, beta2, eps, weight_decay, step):
    """params, grads, m, v (P,), decay_mask bool (P,), step >= 1 -> new params, m, v (P,).

    PyTorch's AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr * (wd * mask * p + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps))."""
    params, grads, m, v = _f64(params, grads, m, v)
    m = beta1 * m + (1 - beta1) * grads
    v = beta2 * v + (1 - beta2) * grads**2
    mhat = m / (1 - beta1**step)
    vhat = v / (1 - beta2**step)
    decay = weight_decay * np.asarray(decay_mask, dtype=np.float64) * params
    return params - lr * (decay + mhat / (np.sqrt(vhat) + eps)), m, v


# ---- global norm and clipping ------------------------------------------------------------
def global_norm(x):
    """x (P,) -> ||x||_2 (float)."""
    (x,) = _f64(x)
    return float(np.sqrt((x * x).sum()))


def clip_grad_norm(grads, max_norm):
    """grads (P,) -> (clipped grads (P,), norm before clipping). Scales by
    max_norm / (norm + 1e-6) only when norm > max_norm."""
    (grads,) = _f64(grads)
    norm = global_norm(grads)
    return (grads * (max_norm / (norm + 1e-6)) if norm > max_norm else grads), norm
