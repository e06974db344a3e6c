"""Float64 NumPy reference of the path_integration ops (csrc/ops/path_integration.c):
theta = wrap(omega cumsum_t(delta))."""
import numpy as np

from .common import TWO_PI, _cast, returns


def wrap_angle(theta):
    """Reduce angles to [-pi, pi): theta - 2 pi floor(theta / (2 pi) + 1/2)."""
    return theta - TWO_PI * np.floor(theta / TWO_PI + 0.5)


@returns("theta")
def path_integration_forward(delta, omega, wrap=True, dtype=np.float64):
    """delta (B, T, H, NB), omega (H, NB) -> theta (B, T, H, NB).

    theta[b, t, h, i] = omega[h, i] * sum_{s <= t} delta[b, s, h, i], reduced to [-pi, pi)
    when wrap (the C op always wraps: rotations see only the angle mod 2 pi)."""
    delta, omega = _cast(dtype, delta, omega)
    theta = omega * np.cumsum(delta, axis=1)
    return wrap_angle(theta) if wrap else theta


@returns("ddelta", "domega")
def path_integration_backward(dtheta, delta, omega, dtype=np.float64):
    """dtheta, delta (B, T, H, NB), omega (H, NB) -> ddelta (B, T, H, NB), domega (H, NB).

    ddelta[t] = sum_{s >= t} dtheta[s] * omega; domega = sum_{b, t} dtheta * cumsum(delta)."""
    dtheta, delta, omega = _cast(dtype, dtheta, delta, omega)
    ddelta = np.flip(np.cumsum(np.flip(dtheta * omega, 1), 1), 1)
    return ddelta, (dtheta * np.cumsum(delta, axis=1)).sum((0, 1))
