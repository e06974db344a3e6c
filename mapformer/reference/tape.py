"""Float64 NumPy reference of the tape ops (csrc/ops/tape.c):
TAPE: complex-state rotary and the content-gated head mix."""
import numpy as np

from .common import _cast, _einsum, returns


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


@returns("q_out", "k_out")
def tape_rotate_forward(q, k, e, dtype=np.float64):
    """q, k (B, T, H, D), e (B, T, H, D) (or (1, T, H, D), broadcast over b) -> q_out, k_out
    (B, T, H, D).

    Per pair, as complex numbers: y = x e, i.e. (x0 e0 - x1 e1, x0 e1 + x1 e0)."""
    q, k, e = _cast(dtype, q, k, e)
    ec = _as_complex(e)
    return _as_pairs(_as_complex(q) * ec), _as_pairs(_as_complex(k) * ec)


@returns("dq", "dk", "de")
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


@returns("e_new")
def tape_mix_forward(e_att, gate_logits, w, dtype=np.float64):
    """e_att (B, T, H, D), gate_logits (B, T, H), w (H, H) -> e_new (B, T, H, D).

    e_new[b, t, h] = e_att[b, t, h] + g[b, t, h] sum_h' w[h, h'] e_att[b, t, h'],
    g = sigmoid(gate_logits)."""
    e_att, gate_logits, w = _cast(dtype, e_att, gate_logits, w)
    g, _ = _sigmoid_pair(gate_logits)
    return e_att + g[..., None] * _einsum("hk,btkd->bthd", w, e_att)


@returns("de_att", "dgate_logits", "dw")
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
