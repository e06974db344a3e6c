"""Float64 NumPy reference of the conj_attention ops (csrc/ops/conj_attention.c):
MapEM's conjunctive attention."""
import numpy as np

from ..geometry import CONJ_MODES
from .attention import attention_mask
from .common import _cast, _default_scale, _einsum, returns


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


@returns("out", "lse")
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


@returns("dqx", "dkx", "dqp", "dkp", "dv")
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
