"""Float64 NumPy reference of the residual ops (csrc/ops/residual.c): out = a + b."""
import numpy as np

from .common import _cast, returns


@returns("out")
def residual_forward(a, b, dtype=np.float64):
    """a, b (...) -> a + b."""
    a, b = _cast(dtype, a, b)
    return a + b


def residual_backward(dout, dtype=np.float64):
    """dout (...) -> (da, db): both branches receive dout unchanged."""
    (dout,) = _cast(dtype, dout)
    return dout, dout
