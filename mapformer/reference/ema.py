"""Float64 NumPy reference of the ema ops (csrc/ops/ema.c):
exponential moving average (TDB's teacher)."""
import numpy as np

from .common import _cast


def ema_update(target, source, decay, dtype=np.float64):
    """target, source (P,), decay in [0, 1) -> decay target + (1 - decay) source (P,)."""
    target, source = _cast(dtype, target, source)
    return decay * target + (1.0 - decay) * source
