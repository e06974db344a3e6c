"""What every reference module shares: constants, the returns decorator, casting, the einsum
helper and the attention ops' default scale."""
import numpy as np

TWO_PI = 2.0 * np.pi
GELU_K = float(np.sqrt(2.0 / np.pi))


def returns(*names):
    """Decorator naming what a reference op returns by the C op's table
    (``mapformer.signatures``; one name: a single value, several: a tuple in that order): the
    gradients of the arrays the C op updates in place under those arrays' names (``dgen``:
    the gradient to add to ``dgen``), then its new outputs. The NumPy backend
    (``signatures.numpy_op``) reads it to call the reference in the C op's signature."""
    def mark(fn):
        fn.returns = names
        return fn
    return mark


def _einsum(spec, *operands):
    """np.einsum with its contraction planner, so products run as BLAS matmuls; the result
    C-contiguous (the planner may return a transposed view)."""
    return np.ascontiguousarray(np.einsum(spec, *operands, optimize=True))


def _cast(dtype, *arrays):
    return [np.asarray(a, dtype=dtype) for a in arrays]


def _default_scale(D, scale):
    """1/sqrt(D) when scale is None, as a Python float (which keeps a float32 computation in
    float32)."""
    return 1.0 / float(np.sqrt(D)) if scale is None else float(scale)
