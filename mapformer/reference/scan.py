"""Float64 NumPy reference of the scan ops (csrc/ops/scan.c):
the selective scans, real (Mamba) and complex (MAMPa)."""
import numpy as np

from .activation import softplus_backward, softplus_forward
from .common import _cast, returns


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


@returns("y", "states")
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


@returns("y", "states")
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
