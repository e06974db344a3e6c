"""Float64 NumPy reference of the embedding ops (csrc/ops/embedding.c): out = weight[tokens]."""
import numpy as np

from .common import _cast, returns


@returns("out")
def embedding_forward(tokens, weight, dtype=np.float64):
    """tokens int (N,), weight (V, C) -> out (N, C) = weight[tokens]."""
    (weight,) = _cast(dtype, weight)
    return weight[np.asarray(tokens)]


def embedding_backward(dout, tokens, vocab_size, dtype=np.float64):
    """dout (N, C), tokens int (N,) -> dweight (V, C) with dweight[v] = sum of dout[tokens == v]."""
    (dout,) = _cast(dtype, dout)
    dweight = np.zeros((vocab_size, dout.shape[1]), dtype=dtype)
    np.add.at(dweight, np.asarray(tokens), dout)
    return dweight
