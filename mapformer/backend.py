"""The backends a model can run on, with one calling convention.

``C`` is the extension ``mapformer._C`` (float32). ``NUMPY`` wraps ``mapformer.reference``
(float64) in the same signatures, so a model built on it is a pure NumPy reference model of
the same architecture: the golden test trains both and compares every loss and gradient.
``get("cuda")`` builds the CUDA backend (:func:`cuda_backend`: the kernels of cuda/*.cu
through :mod:`mapformer.cuda` on CuPy arrays, float32), whose ``xp`` is CuPy; the same
function over the kernels compiled for the CPU emulation with NumPy as ``xp`` is how it is
tested without a GPU.

Conventions shared by both (see ``csrc/include/mapformer/mapformer.h``): parameter gradients
passed in (``dweight``, ``dbias``, ``domega``) are accumulated in place; an activation
gradient ``dx=None`` is returned as a new array, a given ``dx`` is accumulated into.

A backend also owns allocation and the tensor arithmetic between ops (:func:`array_ops`):
layers never call NumPy on activations or gradients, so a backend whose arrays live elsewhere
(CuPy on a GPU) can run the same layers by supplying its own.
"""
from types import SimpleNamespace

import numpy as np

from . import _C, ape_maps
from . import reference as ref
from .signatures import numpy_op, signatures


def _accumulate(dx, value):
    if dx is None:
        return value
    dx += value
    return dx


def _embedding_backward(dweight, dout, tokens):
    dweight += ref.embedding_backward(dout, tokens, dweight.shape[0])


def _linear_backward(dy, x, weight, dweight, dbias=None, dx=None):
    gx, gw, gb = ref.linear_backward(dy, x, weight, dbias is not None)
    dweight += gw
    if dbias is not None:
        dbias += gb
    return _accumulate(dx, gx)


def _residual_backward(dx, dout):
    dx += dout


_conv1d_backward = numpy_op("causal_conv1d_backward", ref.causal_conv1d_backward)


def _causal_conv1d_backward(dy, x, weight, dweight, dbias, *, bias=None, activation="none"):
    if bias is not None and activation == "none":  # as the C and CUDA ops
        raise ValueError("bias is read only with activation='silu'")
    return _conv1d_backward(dy, x, weight, dweight, dbias, bias=bias, activation=activation)


def _step_bias_grad(ddelta, delta_bias, ddelta_bias):
    """ddelta_bias (E,) += ddelta (B, T, E) summed over B, T when delta_bias is given (the C
    op's rule: both or neither)."""
    if (delta_bias is None) != (ddelta_bias is None):
        raise ValueError("ddelta_bias is required with delta_bias, and only then")
    if ddelta_bias is not None:
        if ddelta_bias.shape != ddelta.shape[-1:]:
            raise ValueError(f"ddelta_bias must have shape ({ddelta.shape[-1]},) (E), got "
                             f"{ddelta_bias.shape}")
        ddelta_bias += ddelta.sum((0, 1))


def _selective_scan_backward(dy, x, delta, A, B, C, D, states, dA, dD, *, chunk=256,
                             bbar="euler", delta_bias=None, ddelta_bias=None,
                             delta_activation="none"):
    dx, ddelta, gA, dB, dC, gD = ref.selective_scan_backward(
        dy, x, delta, A, B, C, D, chunk, bbar, delta_bias=delta_bias,
        delta_activation=delta_activation)
    _step_bias_grad(ddelta, delta_bias, ddelta_bias)
    dA += gA
    dD += gD
    return dx, ddelta, dB, dC


def _complex_scan_backward(dy, x, delta, delta_angle, A, omega, B, C, D, states, dA, domega,
                           dD, *, chunk=256, bbar="euler", delta_bias=None, ddelta_bias=None,
                           delta_activation="none"):
    dx, ddelta, ddangle, gA, gomega, dB, dC, gD = ref.complex_scan_backward(
        dy, x, delta, delta_angle, A, omega, B, C, D, chunk, bbar, delta_bias=delta_bias,
        delta_activation=delta_activation)
    _step_bias_grad(ddelta, delta_bias, ddelta_bias)
    dA += gA
    domega += gomega
    dD += gD
    return dx, ddelta, ddangle, dB, dC


def _ape_powers(dtype, xp=np, to_numpy=np.asarray):
    """APE's generator-side arithmetic (parameters only: expm of H small skew matrices, their
    powers and the way back), float64 NumPy on the host on every backend, returned as ``xp``
    arrays of ``dtype``: ape_powers_forward(generator, steps) -> maps and
    ape_tree_forward(generator, depth) -> maps; ape_powers_backward / ape_tree_backward(dmaps,
    generator, dgenerator) accumulate (+=) into dgenerator; ape_basis_forward(generator) ->
    (expm(A - A^T), eig: the skew's eigendecomposition, saved for the backward) and
    ape_basis_backward(dbasis, eig, dgenerator) (+=): ape_seq's change of basis."""
    def out(a):
        return xp.ascontiguousarray(xp.asarray(np.asarray(a, dtype=dtype)))

    def forward(generator, steps):
        return out(ape_maps.ape_powers_forward(to_numpy(generator), steps))

    def backward(dmaps, generator, dgenerator):
        dgenerator += out(ape_maps.ape_powers_backward(to_numpy(dmaps), to_numpy(generator)))

    def tree_forward(generator, depth):
        return out(ape_maps.ape_tree_forward(to_numpy(generator), depth))

    def tree_backward(dmaps, generator, dgenerator):
        dgenerator += out(ape_maps.ape_tree_backward(to_numpy(dmaps), to_numpy(generator)))

    def basis_forward(generator):
        eig = ape_maps.skew_eig(to_numpy(generator))
        return out(ape_maps.ape_basis_forward(to_numpy(generator), eig)), eig

    def basis_backward(dbasis, eig, dgenerator):
        dgenerator += out(ape_maps.ape_basis_backward(to_numpy(dbasis), None, eig))

    return dict(ape_powers_forward=forward, ape_powers_backward=backward,
                ape_tree_forward=tree_forward, ape_tree_backward=tree_backward,
                ape_basis_forward=basis_forward, ape_basis_backward=basis_backward)


def _adamw_step(params, grads, m, v, decay_mask, *, lr, step, beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.0):
    params[:], m[:], v[:] = ref.adamw_step(params, grads, m, v, decay_mask, lr, beta1, beta2,
                                           eps, weight_decay, step)


def _ema_update(target, source, decay):
    target[:] = ref.ema_update(target, source, decay)


def _clip_grad_norm(grads, max_norm):
    clipped, norm = ref.clip_grad_norm(grads, max_norm)
    grads[:] = clipped
    return norm


def as_indices(a, name="ids"):
    """Integer ids -> C-contiguous int32; ValueError naming ``name`` and the first id outside
    int32's range (a cast would wrap it: 2**40 would become 0)."""
    a = np.asarray(a)
    if a.dtype != np.int32 and np.issubdtype(a.dtype, np.integer) and a.size:
        info = np.iinfo(np.int32)
        bad = np.flatnonzero((a < info.min) | (a > info.max))
        if bad.size:
            index = np.unravel_index(bad[0], a.shape)
            raise ValueError(f"{name}[{', '.join(map(str, index))}] = {a[index]} does not fit "
                             "int32 (ids must be in [0, vocab_size))")
    return np.ascontiguousarray(a, dtype=np.int32)


def array_ops(float_dtype, xp=np, to_numpy=np.asarray):
    """{name: function}: allocation and the arithmetic between ops, on arrays of the array
    module ``xp`` (NumPy, or CuPy for the CUDA backend) of ``float_dtype``; every backend has
    these names and signatures. ``to_numpy``: xp's array -> a NumPy array (host memory).

    zeros(shape, dtype=None), ones(shape), zeros_like(a): new arrays (dtype: the backend's).
    asarray(a): a C-contiguous array of the backend's dtype (a copy only when needed);
    as_indices(a, name="ids"): the same in int32 (tokens, targets); ValueError naming ``name``
    for a value outside int32's range (never wrapped). to_numpy(a): a NumPy array.
    add_(dst, src): dst += src in place. mul(a, b, out=None): a * b elementwise with NumPy's
    broadcasting (a new array, e.g. queries (B, T, H, D) by per-position factors (T, 1, 1); or
    written into ``out``, which may be a or b: a gradient pass reusing a dead buffer).
    exp(a): e^a elementwise (a new array; parameters' transforms, e.g. Mamba's A =
    -exp(A_log)). matmul(a, b): the (batched) matrix product (parameters' transforms: a
    per-head basis folded into a projection's weight, nn.Linear). sum_leading(a, n): a summed
    over its first n axes.
    broadcast_rows(row, shape, out=None): ``row`` (shape[k:]) copied to every index of the
    leading axes of ``shape``, into ``out`` when it has that shape (a buffer kept across
    steps), else into a new array.
    dropout(x, p, rng) -> (y, mask): inverted dropout, mask (x's shape) drawn from the NumPy
    Generator ``rng`` (on the host: the same masks on every backend); dropout_backward(dy,
    mask) -> dx."""
    def zeros(shape, dtype=None):
        return xp.zeros(shape, dtype or float_dtype)

    def broadcast_rows(row, shape, out=None):
        if out is None or out.shape != tuple(shape):
            out = xp.empty(shape, float_dtype)
        out[...] = row
        return out

    def add_(dst, src):
        dst += src

    def dropout(x, p, rng):
        mask = xp.asarray((rng.random(x.shape) >= p).astype(x.dtype) / (1.0 - p))
        return x * mask, mask

    return dict(
        zeros=zeros,
        ones=lambda shape: xp.ones(shape, float_dtype),
        zeros_like=xp.zeros_like,
        asarray=lambda a: xp.ascontiguousarray(xp.asarray(a), dtype=float_dtype),
        as_indices=(as_indices if xp is np else
                    lambda a, name="ids": xp.asarray(as_indices(to_numpy(a), name))),
        to_numpy=to_numpy,
        add_=add_,
        mul=xp.multiply,
        exp=xp.exp,
        matmul=xp.matmul,
        sum_leading=lambda a, n: a.sum(tuple(range(n))),
        broadcast_rows=broadcast_rows,
        dropout=dropout,
        dropout_backward=lambda dy, mask: dy * mask,
    )


# the C ops named neither *_forward nor *_backward
UPDATE_OPS = ("adamw_step", "global_norm", "clip_grad_norm", "ema_update")
C = SimpleNamespace(name="c", dtype=np.float32, **array_ops(np.float32), **{
    name: getattr(_C, name) for name in dir(_C) if name.endswith(("_forward", "_backward"))
    or name in UPDATE_OPS}, **_ape_powers(np.float32))

# the NumPy backend's ops that the table cannot derive: what the reference needs beyond the
# op's read arguments, or where the op updates state rather than accumulating a gradient
_NUMPY_OWN = dict(embedding_backward=_embedding_backward, linear_backward=_linear_backward,
                  residual_backward=_residual_backward,
                  causal_conv1d_backward=_causal_conv1d_backward,
                  selective_scan_backward=_selective_scan_backward,
                  complex_scan_backward=_complex_scan_backward, adamw_step=_adamw_step,
                  clip_grad_norm=_clip_grad_norm, ema_update=_ema_update)


def _numpy_ops():
    """{op: function} of every C op on the float64 reference: its own adapter, the generic
    one from the op's table (a reference naming its returns), or the reference itself (its
    signature already the C op's)."""
    ops = {}
    for op in signatures():
        reference = getattr(ref, op)
        ops[op] = (_NUMPY_OWN[op] if op in _NUMPY_OWN else
                   numpy_op(op, reference) if hasattr(reference, "returns") else reference)
    return ops


NUMPY = SimpleNamespace(name="numpy", dtype=np.float64, **array_ops(np.float64), **_numpy_ops(),
                        **_ape_powers(np.float64))

BACKENDS = {"c": C, "numpy": NUMPY}
KERNEL_OPS = sorted(name for name, value in vars(C).items() if name.endswith(
    ("_forward", "_backward")) or name in UPDATE_OPS)


class MissingKernel(NotImplementedError):
    """A model on the CUDA backend called an op whose family has no CUDA kernel yet (the
    message names the op and its family)."""


def family_of(op):
    """The op family of an op's name: attention_forward -> 'attention', adamw_step ->
    'adamw', ema_update -> 'ema'."""
    for suffix in ("_forward", "_backward", "_step", "_update"):
        if op.endswith(suffix):
            return op[:-len(suffix)]
    return op


class KernelBackend(SimpleNamespace):
    """A backend whose ops are whatever a kernel library supplies (:func:`cuda_backend`):
    the C backend's ops that it lacks raise :class:`MissingKernel` naming the op and its
    family when a model calls them, so a model runs on it exactly when its families all have
    kernels."""

    def __getattr__(self, name):  # only for names the backend does not have
        if name in KERNEL_OPS:
            raise MissingKernel(
                f"the {self.__dict__.get('name', 'cuda')} backend has no kernel for op {name} "
                f"(family {family_of(name)!r}): this model uses it; kernels exist for "
                f"{', '.join(self.__dict__.get('families', ()))}; use backend='c'")
        raise AttributeError(f"backend has no attribute {name!r}")


def cuda_backend(kernels, xp, to_numpy, families=None, name="cuda"):
    """The CUDA backend: float32 ``xp`` arrays (CuPy on a GPU; NumPy with the kernels
    compiled for the CPU emulation, how it is tested without one), the tensor arithmetic
    between ops (:func:`array_ops`) and APE's parameter-side arithmetic on the host
    (:func:`_ape_powers`) in ``xp``, and every op of ``kernels`` (a namespace of ops with the
    C backend's signatures: :func:`mapformer.cuda.ops`), taken by name, so a family whose
    wrapper is added there runs here with nothing else to change. The C backend's ops that
    ``kernels`` lacks raise :class:`MissingKernel` naming their family when called.
    ``to_numpy``: xp array -> NumPy array (checkpoints and metrics go to the host through
    it). ``families``: the kernel families, for the messages (default: those of ``kernels``'
    ops)."""
    if families is None:
        families = sorted({family_of(op) for op in vars(kernels)})
    ops = {**array_ops(np.float32, xp, to_numpy), **_ape_powers(np.float32, xp, to_numpy)}
    ops.update(vars(kernels))
    return KernelBackend(name=name, dtype=np.float32, xp=xp, families=tuple(families), **ops)


def _gpu_backend():
    """The CUDA backend on the GPU (CuPy arrays, CuPy's current stream); RuntimeError saying
    how to get a CUDA build, CuPy or a device when one is missing."""
    from . import cuda

    lib, cupy = cuda.load()
    kernels = cuda.ops(lib, cupy, lambda: cupy.cuda.get_current_stream().ptr)
    return cuda_backend(kernels, cupy, cupy.asnumpy)


def get(name):
    """The backend called ``name``: 'c' (the C core, float32), 'numpy' (the float64
    reference) or 'cuda' (the CUDA kernels on CuPy arrays, float32; RuntimeError saying how
    to get a CUDA build, CuPy or a device when one is missing). A backend object itself (e.g.
    :func:`cuda_backend` of emulated kernels) is returned as it is."""
    if not isinstance(name, str):
        return name
    if name == "cuda" and "cuda" not in BACKENDS:
        BACKENDS["cuda"] = _gpu_backend()
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend must be one of {sorted(set(BACKENDS) | {'cuda'})}, got "
                         f"{name!r}") from None
