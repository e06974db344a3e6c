"""Float64 NumPy reference of the grad_norm ops (csrc/ops/grad_norm.c): global norm and clipping."""
import numpy as np

from .common import _cast, returns


@returns("norm")
def global_norm(x, dtype=np.float64):
    """x (P,) -> ||x||_2 (float)."""
    (x,) = _cast(dtype, x)
    return float(np.sqrt((x * x).sum()))


def clip_grad_norm(grads, max_norm, dtype=np.float64):
    """grads (P,) -> (clipped grads (P,), norm before clipping). Scales by
    max_norm / (norm + 1e-6) only when norm > max_norm."""
    (grads,) = _cast(dtype, grads)
    norm = global_norm(grads, dtype=dtype)
    return (grads * (max_norm / (norm + 1e-6)) if norm > max_norm else grads), norm
