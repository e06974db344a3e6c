"""Float64 NumPy reference of the sln ops (csrc/ops/sln.c):
MapEM-SLN positions, 2x2 trace-free generators."""
import numpy as np

from .common import _cast, returns


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


@returns("p")
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


@returns("ddelta", "dgen", "dstart")
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
