"""Float64 NumPy reference of the softmax_xent ops (csrc/ops/softmax_xent.c):
masked softmax cross-entropy."""
import numpy as np

from .common import _cast, returns


@returns("losses", "loss")
def softmax_xent_forward(logits, targets, mask, dtype=np.float64):
    """logits (N, V), targets int (N,), mask (N,) -> losses (N,), loss (float).

    losses[n] = -log softmax(logits[n])[targets[n]] for every row; loss is their mean
    weighted by mask (0.0 when mask sums to 0)."""
    logits, mask = _cast(dtype, logits, mask)
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    losses = -logp[np.arange(len(logits)), np.asarray(targets)]
    total = mask.sum()
    return losses, (float((losses * mask).sum() / total) if total != 0 else 0.0)


@returns("dlogits")
def softmax_xent_backward(logits, targets, mask, scale, dtype=np.float64):
    """logits (N, V), targets (N,), mask (N,) -> dlogits (N, V) =
    scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])). With scale = 1/sum(mask)
    this is the gradient of the loss returned by the forward."""
    logits, mask = _cast(dtype, logits, mask)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(len(logits)), np.asarray(targets)] -= 1.0
    return scale * mask[:, None] * p
