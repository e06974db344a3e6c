"""Float64 NumPy reference of the nc_general ops (csrc/ops/nc_general.c):
MapEM-NC's ordered product for any block size b and K generators."""
import numpy as np

from .common import _cast, returns


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


@returns("p")
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


@returns("dtheta", "dgen", "dstart")
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
