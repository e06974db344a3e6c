"""Float64 NumPy reference of the adamw ops (csrc/ops/adamw.c): one AdamW step."""
import numpy as np

from .common import _cast


def adamw_step(params, grads, m, v, decay_mask, lr, beta1, beta2, eps, weight_decay, step,
               dtype=np.float64):
    """params, grads, m, v (P,), decay_mask bool (P,), step >= 1 -> new params, m, v (P,).

    PyTorch's AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    p -= lr * (wd * mask * p + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps))."""
    params, grads, m, v = _cast(dtype, params, grads, m, v)
    m = beta1 * m + (1 - beta1) * grads
    v = beta2 * v + (1 - beta2) * grads**2
    mhat = m / (1 - beta1**step)
    vhat = v / (1 - beta2**step)
    decay = weight_decay * np.asarray(decay_mask, dtype=dtype) * params
    return params - lr * (decay + mhat / (np.sqrt(vhat) + eps)), m, v
