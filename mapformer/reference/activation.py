"""Float64 NumPy reference of the activation ops (csrc/ops/activation.c):
SiLU, softplus and the SiLU gate (Mamba's)."""
import numpy as np

from .common import _cast, returns


SOFTPLUS_THRESHOLD = 20.0  # Mamba's (torch.nn.functional.softplus's default): x above it -> x


@returns("y")
def silu_forward(x, dtype=np.float64):
    """x (...) -> y (...) = x sigmoid(x)."""
    (x,) = _cast(dtype, x)
    return x / (1.0 + np.exp(-x))


@returns("dx")
def silu_backward(dy, x, dtype=np.float64):
    """dy, x (...) -> dx (...) = dy s (1 + x (1 - s)), s = sigmoid(x)."""
    dy, x = _cast(dtype, dy, x)
    s = 1.0 / (1.0 + np.exp(-x))
    return dy * s * (1.0 + x * (1.0 - s))


@returns("y")
def softplus_forward(x, dtype=np.float64):
    """x (...) -> y (...) = log(1 + e^x), or x where x > 20 (Mamba's threshold)."""
    (x,) = _cast(dtype, x)
    return np.where(x > SOFTPLUS_THRESHOLD, x,
                    np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


@returns("dx")
def softplus_backward(dy, x, dtype=np.float64):
    """dy, x (...) -> dx (...) = dy sigmoid(x), or dy where x > 20."""
    dy, x = _cast(dtype, dy, x)
    return np.where(x > SOFTPLUS_THRESHOLD, dy, dy / (1.0 + np.exp(-x)))


@returns("out")
def silu_gate_forward(y, z, dtype=np.float64):
    """y, z (...) -> out (...) = y silu(z) (Mamba's output gate)."""
    y, z = _cast(dtype, y, z)
    return y * silu_forward(z, dtype)


@returns("dy", "dz")
def silu_gate_backward(dout, y, z, dtype=np.float64):
    """dout, y, z (...) -> dy (...) = dout silu(z), dz (...) = dout y silu'(z)."""
    dout, y, z = _cast(dtype, dout, y, z)
    return dout * silu_forward(z, dtype), silu_backward(dout * y, z, dtype)
