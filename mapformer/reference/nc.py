"""Float64 NumPy reference of the nc ops (csrc/ops/nc.c):
MapEM-NC ordered product of 4x4 rotations (unit-quaternion pairs)."""
import numpy as np

from .b4 import _qexp_parts, qconj, qmul
from .common import _cast, returns


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


@returns("p")
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


@returns("dw", "dstart")
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
