"""The CUDA kernels (cuda/*.cu) as ops with the C backend's signatures, on device arrays.

``setup.py`` builds the kernels with ``MAPFORMER_CUDA=on`` (nvcc, sm_80 and sm_90) into
``mapformer/libmapformer_cuda.so``, a plain shared library whose functions take the C ops'
parameter structs (``csrc/include/mapformer/params.h`` and the family headers it includes,
written next to the library by the build as one file) plus a stream. :func:`ops` wraps them for an array module ``xp``: CuPy on a GPU
(pointers from ``a.data.ptr``, CuPy's current stream), or NumPy with the library compiled for
the CPU emulation of CUDA's model (tests/cuda_emulation.py), which is how the wrappers are
tested on machines without a GPU.

The families in :data:`FAMILIES` have kernels; ``mapformer.backend.get("cuda")`` builds the
model-level backend on them, or says what is missing.
"""
import ctypes
import math
import os
import re
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(HERE, "libmapformer_cuda.so")
PARAMS_H = [os.path.join(HERE, "params.h"),
            os.path.join(os.path.dirname(HERE), "csrc", "include", "mapformer", "params.h")]
FAMILIES = ("gelu", "activation (silu, softplus, silu_gate)", "layernorm", "rotary",
            "path_integration", "embedding", "softmax_xent", "adamw", "attention", "linear",
            "mlp", "residual", "grad_norm", "tape_rotate", "ape_decay", "causal_conv1d",
            "selective_scan", "complex_scan", "sln", "b4", "nc", "vq", "lstm", "conj_attention",
            "cope", "attention_decode", "tape_mix", "ape_apply", "gridpe_complex",
            "l2_normalize", "ema")
HOW_TO_BUILD = ("build the CUDA kernels and install CuPy: MAPFORMER_CUDA=on pip install "
                "'.[cuda]' (needs the CUDA Toolkit's nvcc; cupy-cuda13x, or '.[cuda12]' for a "
                "CUDA 12 toolkit and driver)")

_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "int64_t": ctypes.c_int64,
           "int32_t": ctypes.c_int32, "int": ctypes.c_int}


def read_params(path):
    """params.h's text with the family headers it includes (``#include "mapformer/ops/X.h"``,
    found in ``ops/`` beside it) put in their place; a CUDA build's copy has them in place
    already."""
    here = os.path.dirname(path)
    with open(path) as f:
        text = f.read()

    def family(match):
        with open(os.path.join(here, "ops", match.group(1) + ".h")) as header:
            return header.read()
    return re.sub(r'^#include "mapformer/ops/(\w+)\.h"$', family, text, flags=re.M)


def parse_params(path):
    """{name: ctypes.Structure} for every ``typedef struct {...} Mf*Params;`` of params.h and
    its family headers (pointers become void pointers): the layout is the headers' own, never
    a copy of it."""
    text = re.sub(r"/\*.*?\*/", "", read_params(path), flags=re.S)
    structs = {}
    for body, name in re.findall(r"typedef struct \{(.*?)\}\s*(\w+);", text, flags=re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            base, rest = re.sub(r"\bconst\b", "", decl).split(None, 1)
            for item in (i.strip() for i in rest.split(",")):
                fields.append((item.lstrip("*").strip(),
                               ctypes.c_void_p if item.startswith("*") else _CTYPES[base]))
        structs[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
    return structs


def load():
    """(library, cupy): the nvcc-built library and CuPy with a GPU; RuntimeError saying how to
    get them when any is missing."""
    if not os.path.exists(LIBRARY):
        raise RuntimeError(f"mapformer was built without CUDA ({LIBRARY} is missing): "
                           + HOW_TO_BUILD)
    try:
        import cupy
    except ImportError:
        raise RuntimeError("the CUDA backend needs CuPy, which is not installed: "
                           + HOW_TO_BUILD) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise RuntimeError(f"no usable CUDA device ({error})") from None
    if count < 1:
        raise RuntimeError("no CUDA device found")
    gemm = os.environ.get("MAPFORMER_CUDA_GEMM", "cublas")
    if gemm not in ("cublas", "tiled"):
        raise RuntimeError(f"MAPFORMER_CUDA_GEMM must be cublas or tiled, got {gemm!r}")
    try:  # CuPy loads its cuBLAS, which cuda/blas.cu then finds by soname for the products
        cupy.cuda.device.get_cublas_handle()
    except Exception:  # noqa: BLE001 (CuPy without cuBLAS: the products run on the kernels' tiles)
        pass
    return ctypes.CDLL(LIBRARY), cupy


def products(lib):
    """'cublas' or 'tiled': the path of the kernels' matrix products in ``lib`` (cuda/blas.cu:
    cuBLAS when it could be loaded and MAPFORMER_CUDA_GEMM is not 'tiled'; the tiles of
    cuda/gemm.cuh otherwise, and always under the CPU emulation)."""
    lib.mf_blas_library.restype = ctypes.c_int
    return ("tiled", "cublas")[lib.mf_blas_library()]


def describe():
    """One line for ``python -m mapformer info``: the GPU the CUDA backend would run on and
    the path of its products, or why it cannot run here."""
    try:
        lib, cupy = load()
    except (RuntimeError, OSError) as error:
        return f"unavailable: {error}"
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    return (f"{name} (CuPy {cupy.__version__}), matrix products on {products(lib)} "
            "(MAPFORMER_CUDA_GEMM=tiled for the kernels' own)")


def _pointer(a):
    if a is None:
        return None
    data = a.data
    return data.ptr if hasattr(data, "ptr") else a.ctypes.data


def ops(lib, xp, stream=lambda: None, params_h=None):
    """SimpleNamespace of the ops in :data:`FAMILIES` with the C backend's signatures (see
    mapformer._C's docstrings), running ``lib``'s kernels on arrays of ``xp`` on the stream
    handle ``stream()`` returns (an int or None). Arguments are made C-contiguous float32
    (int32 ids, uint8 masks); an op's error status raises ValueError naming the op.
    params_h: the params.h that ``lib`` was compiled with (default: the copy a CUDA build
    installs beside this module, else the source tree's)."""
    path = params_h or next((p for p in PARAMS_H if os.path.exists(p)), None)
    if path is None:
        raise RuntimeError(f"mapformer.cuda: no params.h beside the package or in a source "
                           f"tree (a CUDA build installs one): {HOW_TO_BUILD}")
    structs = parse_params(path)
    f32 = lambda a: xp.ascontiguousarray(xp.asarray(a), dtype=xp.float32)  # noqa: E731
    i32 = lambda a: xp.ascontiguousarray(xp.asarray(a), dtype=xp.int32)  # noqa: E731

    def call(function, struct, **fields):
        params = structs[struct]()
        for key, value in fields.items():
            if xp is not np and isinstance(value, np.ndarray):
                raise TypeError(f"{function}: {key} is a NumPy array, a host pointer to the "
                                f"kernel: pass {xp.__name__} arrays")
            setattr(params, key, _pointer(value) if hasattr(value, "shape") else value)
        fn = getattr(lib, function)
        fn.argtypes = [ctypes.POINTER(structs[struct]), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        status = fn(ctypes.byref(params), stream())
        if status != 0:
            raise ValueError(f"{function}: status {status} (1: bad sizes or scalars, "
                             "4: CUDA refused the launch)")

    def empty(*shape):
        return xp.empty(shape, xp.float32)

    def shaped(name, a, want):
        """ValueError naming ``name`` unless a has the shape ``want`` (a tuple): the kernels
        index every array by sizes taken from others."""
        if tuple(a.shape) != tuple(want):
            raise ValueError(f"{name} must have the shape {tuple(want)}, got {tuple(a.shape)}")

    def shaped_like(ref, **arrays):
        """ValueError naming the first of ``arrays`` whose shape is not ref's (the elementwise
        kernels read ref.size floats of each)."""
        for name, a in arrays.items():
            shaped(name, a, ref.shape)

    def exact(approximate):
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        return int(approximate == "none")

    def gelu_forward(x, *, approximate="tanh"):
        x = f32(x)
        y = empty(*x.shape)
        call("gelu_forward_cuda", "MfGeluParams", y=y, x=x, n=x.size, exact=exact(approximate))
        return y

    def gelu_backward(dy, x, *, approximate="tanh"):
        dy, x = f32(dy), f32(x)
        shaped_like(x, dy=dy)
        dx = empty(*x.shape)
        call("gelu_backward_cuda", "MfGeluParams", dx=dx, dy=dy, x=x, n=x.size,
             exact=exact(approximate))
        return dx

    def activation(name):
        def forward(x):
            x = f32(x)
            y = empty(*x.shape)
            call(f"{name}_forward_cuda", "MfActivationParams", y=y, x=x, n=x.size)
            return y

        def backward(dy, x):
            dy, x = f32(dy), f32(x)
            shaped_like(x, dy=dy)
            dx = empty(*x.shape)
            call(f"{name}_backward_cuda", "MfActivationParams", dx=dx, dy=dy, x=x, n=x.size)
            return dx
        return forward, backward

    silu_forward, silu_backward = activation("silu")
    softplus_forward, softplus_backward = activation("softplus")

    def silu_gate_forward(y, z):
        y, z = f32(y), f32(z)
        shaped_like(y, z=z)
        out = empty(*y.shape)
        call("silu_gate_forward_cuda", "MfSiluGateParams", out=out, y=y, z=z, n=y.size)
        return out

    def silu_gate_backward(dout, y, z):
        dout, y, z = f32(dout), f32(y), f32(z)
        shaped_like(y, z=z, dout=dout)
        dy, dz = empty(*y.shape), empty(*y.shape)
        call("silu_gate_backward_cuda", "MfSiluGateParams", dy=dy, dz=dz, dout=dout, y=y, z=z,
             n=y.size)
        return dy, dz

    def layernorm_forward(x, weight, bias, eps=1e-5):
        x = f32(x)
        N, C = x.shape
        y, mean, rstd = empty(N, C), empty(N), empty(N)
        call("layernorm_forward_cuda", "MfLayernormParams", y=y, mean=mean, rstd=rstd, x=x,
             weight=f32(weight), bias=f32(bias), N=N, C=C, eps=eps)
        return y, mean, rstd

    def layernorm_backward(dy, x, mean, rstd, weight, dweight, dbias, dx=None):
        x = f32(x)
        N, C = x.shape
        out = empty(N, C) if dx is None else dx
        call("layernorm_backward_cuda", "MfLayernormParams", dx=out, dweight=dweight,
             dbias=dbias, dy=f32(dy), x=x, mean_in=f32(mean), rstd_in=f32(rstd),
             weight=f32(weight), N=N, C=C, accumulate_dx=int(dx is not None))
        return out

    def rotary_forward(q, k, theta):
        q, k, theta = f32(q), f32(k), f32(theta)
        B, T, H, D = q.shape
        q_out, k_out = empty(B, T, H, D), empty(B, T, H, D)
        call("rotary_forward_cuda", "MfRotaryParams", q_out=q_out, k_out=k_out, q=q, k=k,
             theta=theta, B=B, T=T, H=H, D=D, TB=theta.shape[0])
        return q_out, k_out

    def rotary_backward(dq_out, dk_out, q, k, theta):
        q, k, theta = f32(q), f32(k), f32(theta)
        B, T, H, D = q.shape
        dq, dk, dtheta = empty(B, T, H, D), empty(B, T, H, D), empty(*theta.shape)
        call("rotary_backward_cuda", "MfRotaryParams", dq=dq, dk=dk, dtheta=dtheta,
             dq_out=f32(dq_out), dk_out=f32(dk_out), q=q, k=k, theta=theta, B=B, T=T, H=H,
             D=D, TB=theta.shape[0])
        return dq, dk, dtheta

    def path_integration_forward(delta, omega):
        delta = f32(delta)
        B, T, H, NB = delta.shape
        theta = empty(B, T, H, NB)
        call("path_integration_forward_cuda", "MfPathIntegrationParams", theta=theta,
             delta=delta, omega=f32(omega), B=B, T=T, H=H, NB=NB)
        return theta

    def path_integration_backward(dtheta, delta, omega, domega):
        delta = f32(delta)
        B, T, H, NB = delta.shape
        ddelta = empty(B, T, H, NB)
        scratch = xp.empty(B * H * NB, xp.float64)
        call("path_integration_backward_cuda", "MfPathIntegrationParams", ddelta=ddelta,
             domega=domega, dtheta=f32(dtheta), delta=delta, omega=f32(omega), B=B, T=T, H=H,
             NB=NB, scratch=scratch, scratch_floats=2 * scratch.size)
        return ddelta

    def embedding_forward(tokens, weight):
        tokens, weight = i32(tokens), f32(weight)
        (N,), (V, C) = tokens.shape, weight.shape
        out = empty(N, C)
        call("embedding_forward_cuda", "MfEmbeddingParams", out=out, tokens=tokens,
             weight=weight, N=N, V=V, C=C)
        return out

    def embedding_backward(dweight, dout, tokens):
        tokens = i32(tokens)
        V, C = dweight.shape
        call("embedding_backward_cuda", "MfEmbeddingParams", dweight=dweight, dout=f32(dout),
             tokens=tokens, N=tokens.shape[0], V=V, C=C)

    def softmax_xent_forward(logits, targets, mask):
        logits = f32(logits)
        N, V = logits.shape
        losses, loss = empty(N), xp.zeros(1, xp.float64)
        call("softmax_xent_forward_cuda", "MfSoftmaxXentParams", losses=losses, loss=loss,
             logits=logits, targets=i32(targets), mask=f32(mask), N=N, V=V)
        return losses, float(loss[0])

    def softmax_xent_backward(logits, targets, mask, scale):
        logits = f32(logits)
        N, V = logits.shape
        dlogits = empty(N, V)
        call("softmax_xent_backward_cuda", "MfSoftmaxXentParams", dlogits=dlogits,
             logits=logits, targets=i32(targets), mask=f32(mask), N=N, V=V, scale=scale)
        return dlogits

    def adamw_step(params, grads, m, v, decay_mask, *, lr, step, beta1=0.9, beta2=0.999,
                   eps=1e-8, weight_decay=0.0):
        mask = xp.ascontiguousarray(xp.asarray(decay_mask), dtype=xp.uint8)
        call("adamw_step_cuda", "MfAdamwParams", params=params, m=m, v=v, grads=f32(grads),
             decay_mask=mask, n=params.size, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
             weight_decay=weight_decay, step=step)

    def factor_fields(B, T, pos_ids, pair_factor):
        """the struct's per-pair factor fields (attention); ValueError naming a bad one (the
        kernels cannot check the device array pos_ids: its range is checked here)"""
        if pos_ids is None and pair_factor is None:
            return {}
        if pos_ids is None or pair_factor is None:
            raise ValueError(f"{'pos_ids' if pos_ids is None else 'pair_factor'} is required "
                             "with the other (a per-pair logit factor takes both)")
        if xp.asarray(pos_ids).dtype.kind not in "iu":
            raise TypeError(f"pos_ids must hold integers, got {xp.asarray(pos_ids).dtype}")
        raw_ids, pair_factor = xp.asarray(pos_ids), f32(pair_factor)
        N = pair_factor.shape[0] if pair_factor.ndim == 2 else 0
        if pair_factor.shape != (N, N) or not 1 <= N <= 4096:
            raise ValueError(f"pair_factor must be (N, N) with N in [1, 4096], got "
                             f"{tuple(pair_factor.shape)}")
        if not bool(xp.isfinite(pair_factor).all()):
            raise ValueError("pair_factor must be finite (it would reach the backward's masked "
                             "pairs as 0 * inf)")
        if (raw_ids.shape != (B, T) or int(raw_ids.min()) < 0 or int(raw_ids.max()) >= N):
            raise ValueError(f"pos_ids must be (B, T) = ({B}, {T}) int32 in [0, N = {N})")
        pos_ids = i32(raw_ids)
        return dict(pos_ids=pos_ids, pair_factor=pair_factor, npos=N)

    def attention_forward(q, k, v, scale=None, *, mask="causal", prefix=None, pos_ids=None,
                          pair_factor=None):
        q, k, v = f32(q), f32(k), f32(v)
        B, T, H, D = q.shape
        out, lse = empty(B, T, H, D), empty(B, H, T)
        call("attention_forward_cuda", "MfAttentionParams", out=out, lse=lse, q=q, k=k, v=v,
             B=B, T=T, H=H, D=D, scale=1.0 / math.sqrt(D) if scale is None else scale,
             **mask_fields(B, T, mask, prefix), **factor_fields(B, T, pos_ids, pair_factor))
        return out, lse

    def attention_backward(dout, q, k, v, out, lse, scale=None, *, mask="causal", prefix=None,
                           pos_ids=None, pair_factor=None):
        q, k, v = f32(q), f32(k), f32(v)
        B, T, H, D = q.shape
        dq, dk, dv, scratch = (empty(B, T, H, D), empty(B, T, H, D), empty(B, T, H, D),
                               empty(B * H * T))
        call("attention_backward_cuda", "MfAttentionParams", dq=dq, dk=dk, dv=dv, q=q, k=k,
             v=v, dout=f32(dout), o=f32(out), lse_in=f32(lse), B=B, T=T, H=H, D=D,
             scale=1.0 / math.sqrt(D) if scale is None else scale, scratch=scratch,
             scratch_floats=scratch.size, **mask_fields(B, T, mask, prefix),
             **factor_fields(B, T, pos_ids, pair_factor))
        return dq, dk, dv

    def linear_forward(x, weight, bias=None):
        x, weight = f32(x), f32(weight)
        (N, Cin), Cout = x.shape, weight.shape[0]
        y = empty(N, Cout)
        call("linear_forward_cuda", "MfLinearParams", y=y, x=x, weight=weight,
             bias=None if bias is None else f32(bias), N=N, Cin=Cin, Cout=Cout)
        return y

    def linear_backward(dy, x, weight, dweight, dbias=None, dx=None):
        x, weight = f32(x), f32(weight)
        (N, Cin), Cout = x.shape, weight.shape[0]
        out = empty(N, Cin) if dx is None else dx
        call("linear_backward_cuda", "MfLinearParams", dx=out, dweight=dweight, dbias=dbias,
             dy=f32(dy), x=x, weight=weight, N=N, Cin=Cin, Cout=Cout,
             accumulate_dx=int(dx is not None))
        return out

    def mlp_forward(x, w_fc, b_fc, w_proj, b_proj, *, approximate="tanh"):
        x = f32(x)
        (N, C), F = x.shape, w_fc.shape[0]
        y, h, scratch = empty(N, C), empty(N, F), empty(N * F)
        call("mlp_forward_cuda", "MfMlpParams", y=y, h=h, x=x, w_fc=f32(w_fc), b_fc=f32(b_fc),
             w_proj=f32(w_proj), b_proj=f32(b_proj), N=N, C=C, F=F, exact=exact(approximate),
             scratch=scratch, scratch_floats=scratch.size)
        return y, h

    def mlp_backward(dy, x, h, w_fc, w_proj, dw_fc, db_fc, dw_proj, db_proj, *,
                     approximate="tanh"):
        x = f32(x)
        (N, C), F = x.shape, w_fc.shape[0]
        dx, scratch = empty(N, C), empty(2 * N * F)
        call("mlp_backward_cuda", "MfMlpParams", dx=dx, dw_fc=dw_fc, db_fc=db_fc,
             dw_proj=dw_proj, db_proj=db_proj, dy=f32(dy), h_in=f32(h), x=x, w_fc=f32(w_fc),
             w_proj=f32(w_proj), N=N, C=C, F=F, exact=exact(approximate), scratch=scratch,
             scratch_floats=scratch.size)
        return dx

    def residual_forward(a, b):
        a, b = f32(a), f32(b)
        out = empty(*a.shape)
        call("residual_forward_cuda", "MfResidualParams", out=out, a=a, b=b, n=a.size)
        return out

    def residual_backward(dx, dout):
        call("residual_backward_cuda", "MfResidualParams", dx=dx, dout=f32(dout), n=dx.size)

    def global_norm(x):
        x = f32(x)
        norm = xp.zeros(1, xp.float64)
        call("global_norm_cuda", "MfGradNormParams", norm=norm, x=x, n=x.size)
        return float(norm[0])

    def clip_grad_norm(grads, max_norm):
        norm = xp.zeros(1, xp.float64)
        call("clip_grad_norm_cuda", "MfGradNormParams", norm=norm, grads=grads, n=grads.size,
             max_norm=max_norm)
        return float(norm[0])

    def tape_rotate_forward(q, k, e):
        q, k, e = f32(q), f32(k), f32(e)
        B, T, H, D = q.shape
        q_out, k_out = empty(B, T, H, D), empty(B, T, H, D)
        call("tape_rotate_forward_cuda", "MfTapeRotateParams", q_out=q_out, k_out=k_out, q=q,
             k=k, e=e, B=B, T=T, H=H, D=D)
        return q_out, k_out

    def tape_rotate_backward(dq_out, dk_out, q, k, e):
        q, k, e = f32(q), f32(k), f32(e)
        B, T, H, D = q.shape
        dq, dk, de = empty(B, T, H, D), empty(B, T, H, D), empty(B, T, H, D)
        call("tape_rotate_backward_cuda", "MfTapeRotateParams", dq=dq, dk=dk, de=de,
             dq_out=f32(dq_out), dk_out=f32(dk_out), q=q, k=k, e=e, B=B, T=T, H=H, D=D)
        return dq, dk, de

    def ape_decay(direction):
        def op(q, k, gamma):
            q, k = f32(q), f32(k)
            B, T, H, D = q.shape
            a, b = empty(B, T, H, D), empty(B, T, H, D)
            names = ("q_out", "k_out", "q", "k") if direction == "forward" else \
                ("dq", "dk", "dq_out", "dk_out")
            call(f"ape_decay_{direction}_cuda", "MfApeDecayParams",
                 **dict(zip(names, (a, b, q, k))), B=B, T=T, H=H, D=D, gamma=gamma)
            return a, b
        return op

    ape_decay_forward, ape_decay_backward = ape_decay("forward"), ape_decay("backward")

    def conv_silu(activation):
        if activation not in ("none", "silu"):
            raise ValueError(f"activation must be 'none' or 'silu', got {activation!r}")
        return int(activation == "silu")

    def causal_conv1d_forward(x, weight, bias, *, activation="none"):
        x, weight = f32(x), f32(weight)
        (B, T, E), W = x.shape, weight.shape[1]
        y = empty(B, T, E)
        call("causal_conv1d_forward_cuda", "MfConv1dParams", y=y, x=x, weight=weight,
             bias=f32(bias), B=B, T=T, E=E, W=W, silu=conv_silu(activation))
        return y

    def causal_conv1d_backward(dy, x, weight, dweight, dbias, *, bias=None,
                               activation="none"):
        x, weight, silu = f32(x), f32(weight), conv_silu(activation)
        if (bias is None) == bool(silu):
            raise ValueError("bias is required with activation='silu', and read only then")
        (B, T, E), W = x.shape, weight.shape[1]
        dx = empty(B, T, E)
        call("causal_conv1d_backward_cuda", "MfConv1dParams", dx=dx, dweight=dweight,
             dbias=dbias, dy=f32(dy), x=x, weight=weight,
             bias=None if bias is None else f32(bias), B=B, T=T, E=E, W=W, silu=silu)
        return dx

    # ---- the attention family's other ops (cuda/conj_attention.cu, attention_decode.cu,
    # tape.cu's tape_mix, ape.cu's ape_apply, gridpe.cu) ----
    conj_modes = ("score_product", "softmax_product", "sum")
    masks = ("causal", "none", "prefix")

    def mask_fields(B, T, mask, prefix):
        """the struct's mask and prefix fields (attention, conj_attention); ValueError naming a
        bad one (the kernels cannot check the device array prefix: its range is checked here)"""
        if mask not in masks:
            raise ValueError(f"mask must be one of {masks}, got {mask!r}")
        if mask != "prefix":
            return dict(mask=masks.index(mask), prefix=None)
        if prefix is None:
            raise ValueError("prefix is required with mask='prefix'")
        prefix = i32(prefix)
        if prefix.shape != (B,) or int(prefix.min()) < 0 or int(prefix.max()) > T:
            raise ValueError(f"prefix must be (B,) = ({B},) int32 in [0, T = {T}]")
        return dict(mask=masks.index(mask), prefix=prefix)

    def conj_fields(qx, mode, scale, mask, prefix):
        """the struct's size, mode, mask and prefix fields; ValueError naming a bad one"""
        B, T, H, D = qx.shape
        if mode not in conj_modes:
            raise ValueError(f"mode must be one of {conj_modes}, got {mode!r}")
        return dict(B=B, T=T, H=H, D=D, scale=1.0 / math.sqrt(D) if scale is None else scale,
                    mode=conj_modes.index(mode), **mask_fields(B, T, mask, prefix))

    def conj_attention_forward(qx, kx, qp, kp, v, mode="score_product", scale=None, *,
                               mask="causal", prefix=None):
        qx = f32(qx)
        B, T, H, D = qx.shape
        fields = conj_fields(qx, mode, scale, mask, prefix)
        out, lse = empty(B, T, H, D), empty(2 if mode == "softmax_product" else 1, B, H, T)
        call("conj_attention_forward_cuda", "MfConjAttentionParams", out=out, lse=lse, qx=qx,
             kx=f32(kx), qp=f32(qp), kp=f32(kp), v=f32(v), **fields)
        return out, lse

    def conj_attention_backward(dout, qx, kx, qp, kp, v, out, lse, mode="score_product",
                                scale=None, *, mask="causal", prefix=None):
        qx = f32(qx)
        B, T, H, D = qx.shape
        fields = conj_fields(qx, mode, scale, mask, prefix)
        grads = [empty(B, T, H, D) for _ in range(5)]
        scratch = empty(B * H * T)
        call("conj_attention_backward_cuda", "MfConjAttentionParams",
             **dict(zip(("dqx", "dkx", "dqp", "dkp", "dv"), grads)), qx=qx, kx=f32(kx),
             qp=f32(qp), kp=f32(kp), v=f32(v), dout=f32(dout), o=f32(out), lse_in=f32(lse),
             scratch=scratch, scratch_floats=scratch.size, **fields)
        return tuple(grads)

    def attention_decode_forward(q, k, v, scale=None, keys=None):
        q, k, v = f32(q), f32(k), f32(v)
        (B, Tq, H, D), Tmax = q.shape, k.shape[1]
        out, lse = empty(B, Tq, H, D), empty(B, H, Tq)
        call("attention_decode_forward_cuda", "MfAttentionDecodeParams", out=out, lse=lse, q=q,
             k=k, v=v, B=B, Tq=Tq, Tk=Tmax if keys is None else keys, Tmax=Tmax, H=H, D=D,
             scale=1.0 / math.sqrt(D) if scale is None else scale)
        return out, lse

    def tape_mix_forward(e_att, gate_logits, w):
        e_att = f32(e_att)
        B, T, H, D = e_att.shape
        e_new = empty(B, T, H, D)
        call("tape_mix_forward_cuda", "MfTapeMixParams", e_new=e_new, e_att=e_att,
             gate_logits=f32(gate_logits), w=f32(w), B=B, T=T, H=H, D=D)
        return e_new

    def tape_mix_backward(de_new, e_att, gate_logits, w, dw):
        e_att = f32(e_att)
        B, T, H, D = e_att.shape
        de_att, dgate_logits = empty(B, T, H, D), empty(B, T, H)
        call("tape_mix_backward_cuda", "MfTapeMixParams", de_att=de_att,
             dgate_logits=dgate_logits, dw=dw, de_new=f32(de_new), e_att=e_att,
             gate_logits=f32(gate_logits), w=f32(w), B=B, T=T, H=H, D=D)
        return de_att, dgate_logits

    def ape_fields(x, maps, index):
        """sizes and index; ValueError naming index when an entry is outside [0, P) (the
        kernels cannot check the device array)"""
        index = i32(index)
        (B, T, H, D), (A, P) = x.shape, maps.shape[:2]
        if index.size and (int(index.min()) < 0 or int(index.max()) >= P):
            raise ValueError(f"index entries must be in [0, P = {P})")
        return dict(B=B, T=T, H=H, D=D, A=A, P=P, TB=index.shape[0], index=index)

    def ape_apply_forward(x, maps, index):
        x, maps = f32(x), f32(maps)
        y = empty(*x.shape)
        call("ape_apply_forward_cuda", "MfApeParams", y=y, x=x, maps=maps,
             **ape_fields(x, maps, index))
        return y

    def ape_apply_backward(dy, x, maps, index, dmaps):
        x, maps = f32(x), f32(maps)
        dx = empty(*x.shape)
        call("ape_apply_backward_cuda", "MfApeParams", dx=dx, dmaps=dmaps, dy=f32(dy), x=x,
             maps=maps, **ape_fields(x, maps, index))
        return dx

    def gridpe_complex_forward(x, theta):
        x, theta = f32(x), f32(theta)
        B, T, H, E = x.shape
        y = empty(B, T, H, 2 * E)
        call("gridpe_complex_forward_cuda", "MfGridpeParams", y=y, x=x, theta=theta, B=B, T=T,
             H=H, W=2 * E, TB=theta.shape[0])
        return y

    def gridpe_complex_backward(dy, theta):
        dy, theta = f32(dy), f32(theta)
        B, T, H, W = dy.shape
        dx = empty(B, T, H, W // 2)
        call("gridpe_complex_backward_cuda", "MfGridpeParams", dx=dx, dy=dy, theta=theta, B=B,
             T=T, H=H, W=W, TB=theta.shape[0])
        return dx

    def cope_scratch(direction, fields):
        params = structs["MfCopeParams"](**fields)
        fn = getattr(lib, f"cope_{direction}_cuda_scratch_floats")
        fn.argtypes = [ctypes.POINTER(structs["MfCopeParams"])]
        fn.restype = ctypes.c_int64
        return empty(fn(ctypes.byref(params)))

    def cope_forward(q, k, v, e, scale=None):
        q, e = f32(q), f32(e)
        B, T, H, D = q.shape
        sizes = dict(B=B, T=T, H=H, D=D, n_pos=e.shape[1],
                     scale=1.0 / math.sqrt(D) if scale is None else scale)
        out, lse, scratch = empty(B, T, H, D), empty(B, H, T), cope_scratch("forward", sizes)
        call("cope_forward_cuda", "MfCopeParams", out=out, lse=lse, q=q, k=f32(k), v=f32(v),
             e=e, scratch=scratch, scratch_floats=scratch.size, **sizes)
        return out, lse

    def cope_backward(dout, q, k, v, e, out, lse, de, scale=None):
        q, e = f32(q), f32(e)
        B, T, H, D = q.shape
        sizes = dict(B=B, T=T, H=H, D=D, n_pos=e.shape[1],
                     scale=1.0 / math.sqrt(D) if scale is None else scale)
        dq, dk, dv = empty(B, T, H, D), empty(B, T, H, D), empty(B, T, H, D)
        scratch = cope_scratch("backward", sizes)
        call("cope_backward_cuda", "MfCopeParams", dq=dq, dk=dk, dv=dv, de=de, dout=f32(dout),
             q=q, k=f32(k), v=f32(v), e=e, o=f32(out), lse_in=f32(lse), scratch=scratch,
             scratch_floats=scratch.size, **sizes)
        return dq, dk, dv

    def scan(cx):
        """selective_scan (cx False) or complex_scan's forward and backward"""
        name = "complex_scan" if cx else "selective_scan"

        def fields(x, delta, dangle, A, omega, Bm, Cm, D, chunk, bbar, delta_bias,
                   delta_activation):
            if bbar not in ("euler", "zoh"):
                raise ValueError(f"bbar must be 'euler' or 'zoh', got {bbar!r}")
            if delta_activation not in ("none", "softplus"):
                raise ValueError(f"delta_activation must be 'none' or 'softplus', got "
                                 f"{delta_activation!r}")
            x, A = f32(x), f32(A)
            for arg, a, axes in (("x", x, "(B, T, E)"), ("A", A, "(E, K)")):
                if a.ndim != axes.count(",") + 1:
                    raise ValueError(f"{arg} must be {axes}, got shape {tuple(a.shape)}")
            (B, T, E), K = x.shape, A.shape[1]
            f = dict(x=x, delta=f32(delta), A=A, Bm=f32(Bm), Cm=f32(Cm), D=f32(D), B=B, T=T,
                     E=E, K=K, chunk=min(chunk, T), bbar=int(bbar == "zoh"),
                     delta_softplus=int(delta_activation == "softplus"))
            S = 2 * K if cx else K  # x and A set the sizes the kernels index every array by
            for arg, key, want in (("delta", "delta", (B, T, E)), ("A", "A", (E, K)),
                                   ("B", "Bm", (B, T, S)), ("C", "Cm", (B, T, S)),
                                   ("D", "D", (E,))):
                shaped(arg, f[key], want)
            if delta_bias is not None:
                bias = xp.asarray(delta_bias)
                if bias.dtype.kind != "f":
                    raise TypeError(f"delta_bias must be a float array, got {bias.dtype}")
                shaped("delta_bias", bias, (E,))
                f.update(delta_bias=f32(bias))
            if cx:
                f.update(delta_angle=None if dangle is None else f32(dangle), omega=f32(omega))
                if dangle is not None:
                    shaped("delta_angle", f["delta_angle"], (B, T, E))
                shaped("omega", f["omega"], (E, K))
            return f

        def written(arg, a, want):
            """a, checked as an array the kernel adds to in place: float32 (TypeError),
            contiguous and of the shape ``want`` (ValueError), each naming ``arg``"""
            if not hasattr(a, "shape") or a.dtype != xp.float32:
                raise TypeError(f"{arg} must be a float32 array (written in place), got "
                                f"{getattr(a, 'dtype', type(a).__name__)}")
            if tuple(a.shape) != want or not a.flags.c_contiguous:
                raise ValueError(f"{arg} must be a contiguous {want} array (written in place), "
                                 f"got shape {tuple(a.shape)}")

        def bias_grad(ddelta_bias, delta_bias, E):
            """ddelta_bias, checked: the (E,) float32 array delta_bias's gradient is added to in
            place, given with delta_bias and only then"""
            if (delta_bias is None) != (ddelta_bias is None):
                raise ValueError("ddelta_bias is required with delta_bias (its gradient is "
                                 "accumulated there)" if delta_bias is not None else
                                 "ddelta_bias is given without delta_bias")
            if ddelta_bias is None:
                return {}
            written("ddelta_bias", ddelta_bias, (E,))
            return dict(ddelta_bias=ddelta_bias)

        def forward(x, delta, dangle, A, omega, Bm, Cm, D, chunk, bbar, delta_bias,
                    delta_activation):
            f = fields(x, delta, dangle, A, omega, Bm, Cm, D, chunk, bbar, delta_bias,
                       delta_activation)
            B, T, E, S = f["B"], f["T"], f["E"], f["Bm"].shape[2]
            y, states = empty(B, T, E), empty(B, -(-T // max(chunk, 1)), E, S)
            call(f"{name}_forward_cuda", "MfScanParams", y=y, states=states, **f)
            return y, states

        def backward(dy, x, delta, dangle, A, omega, Bm, Cm, D, states, dA, domega, dD, chunk,
                     bbar, delta_bias, delta_activation, ddelta_bias):
            f = fields(x, delta, dangle, A, omega, Bm, Cm, D, chunk, bbar, delta_bias,
                       delta_activation)
            B, T, E, S = f["B"], f["T"], f["E"], f["Bm"].shape[2]
            f.update(bias_grad(ddelta_bias, delta_bias, E))
            dy, states = f32(dy), f32(states)
            shaped("dy", dy, (B, T, E))
            shaped("states", states, (B, -(-T // max(chunk, 1)), E, S))
            for arg, a, want in (("dA", dA, (E, f["K"])), ("dD", dD, (E,)),
                                 *((("domega", domega, (E, f["K"])),) if cx else ())):
                written(arg, a, want)
            params = structs["MfScanParams"](**{k: v for k, v in f.items() if k in SIZES})
            size = getattr(lib, f"{name}_backward_scratch_floats_cuda")
            size.argtypes, size.restype = [ctypes.POINTER(structs["MfScanParams"])], ctypes.c_int64
            n = size(ctypes.byref(params))
            out = dict(dx=empty(B, T, E), ddelta=empty(B, T, E), dBm=empty(B, T, S),
                       dCm=empty(B, T, S))
            if cx:
                out.update(domega=domega)
                if dangle is not None:
                    out.update(ddelta_angle=empty(B, T, E))
            call(f"{name}_backward_cuda", "MfScanParams", dA=dA, dD=dD, dy=dy,
                 states_in=states, scratch=empty(max(n, 1)), scratch_floats=n, **out, **f)
            grads = (out["dx"], out["ddelta"]) + ((out.get("ddelta_angle"),) if cx else ())
            return grads + (out["dBm"], out["dCm"])
        return forward, backward

    SIZES = ("B", "T", "E", "K", "chunk", "bbar", "delta_softplus")
    real_scan, real_scan_backward = scan(False)
    complex_forward, complex_backward = scan(True)

    def selective_scan_forward(x, delta, A, B, C, D, *, chunk=256, bbar="euler",
                               delta_bias=None, delta_activation="none"):
        return real_scan(x, delta, None, A, None, B, C, D, chunk, bbar, delta_bias,
                         delta_activation)

    def selective_scan_backward(dy, x, delta, A, B, C, D, states, dA, dD, *, chunk=256,
                                bbar="euler", delta_bias=None, delta_activation="none",
                                ddelta_bias=None):
        return real_scan_backward(dy, x, delta, None, A, None, B, C, D, states, dA, None, dD,
                                  chunk, bbar, delta_bias, delta_activation, ddelta_bias)

    def complex_scan_forward(x, delta, delta_angle, A, omega, B, C, D, *, chunk=256,
                             bbar="euler", delta_bias=None, delta_activation="none"):
        return complex_forward(x, delta, delta_angle, A, omega, B, C, D, chunk, bbar,
                               delta_bias, delta_activation)

    def complex_scan_backward(dy, x, delta, delta_angle, A, omega, B, C, D, states, dA, domega,
                              dD, *, chunk=256, bbar="euler", delta_bias=None,
                              delta_activation="none", ddelta_bias=None):
        return complex_backward(dy, x, delta, delta_angle, A, omega, B, C, D, states, dA,
                                domega, dD, chunk, bbar, delta_bias, delta_activation,
                                ddelta_bias)

    def group_sizes(delta, start, per_block):
        delta = f32(delta)
        B, T, H, NB = delta.shape
        return delta, dict(B=B, T=T, H=H, NB=NB, D=per_block * NB, F=6 if per_block == 4 else 4)

    def sln_forward(delta, gen, start, clamp=10.0):
        delta, sizes = group_sizes(delta, start, 2)
        p = empty(sizes["B"], sizes["T"], sizes["H"], sizes["D"])
        call("sln_forward_cuda", "MfSlnParams", p=p, delta=delta, gen=f32(gen),
             start=f32(start), clamp=clamp, **sizes)
        return p

    def sln_backward(dp, delta, gen, start, dgen, dstart, clamp=10.0):
        delta, sizes = group_sizes(delta, start, 2)
        ddelta = empty(*delta.shape)
        call("sln_backward_cuda", "MfSlnParams", ddelta=ddelta, dgen=dgen, dstart=dstart,
             dp=f32(dp), delta=delta, gen=f32(gen), start=f32(start), clamp=clamp, **sizes)
        return ddelta

    def b4_forward(delta, gen, start):
        delta, sizes = group_sizes(delta, start, 4)
        p = empty(sizes["B"], sizes["T"], sizes["H"], sizes["D"])
        call("b4_forward_cuda", "MfB4Params", p=p, delta=delta, gen=f32(gen), start=f32(start),
             **sizes)
        return p

    def b4_backward(dp, delta, gen, start, dgen, dstart):
        delta, sizes = group_sizes(delta, start, 4)
        ddelta = empty(*delta.shape)
        call("b4_backward_cuda", "MfB4Params", ddelta=ddelta, dgen=dgen, dstart=dstart,
             dp=f32(dp), delta=delta, gen=f32(gen), start=f32(start), **sizes)
        return ddelta

    def nc_forward(w, start):
        w = f32(w)
        B, T, H, F, NB = w.shape
        p = empty(B, T, H, 4 * NB)
        call("nc_forward_cuda", "MfNcParams", p=p, w=w, start=f32(start), B=B, T=T, H=H, NB=NB,
             D=4 * NB, F=F)
        return p

    def nc_backward(dp, w, start, dstart):
        w = f32(w)
        B, T, H, F, NB = w.shape
        dw = empty(B, T, H, F, NB)
        call("nc_backward_cuda", "MfNcParams", dw=dw, dstart=dstart, dp=f32(dp), w=w,
             start=f32(start), B=B, T=T, H=H, NB=NB, D=4 * NB, F=F)
        return dw

    # vq and lstm (cuda/vq.cu, cuda/lstm.cu)
    def vq_forward(z, codebook):
        z, codebook = f32(z), f32(codebook)
        (N, M, D), K = z.shape, codebook.shape[1]
        codes, indices = empty(N, M, D), xp.empty((N, M), xp.int32)
        dist, total = empty(N, M), xp.zeros(1, xp.float64)
        scratch = empty(M * K + N * K)
        call("vq_forward_cuda", "MfVqParams", codes=codes, indices=indices, dist=dist,
             total=total, z=z, codebook=codebook, N=N, M=M, K=K, D=D, scratch=scratch,
             scratch_floats=scratch.size)
        return codes, indices, dist, float(total[0])

    def vq_backward(dcodes, z, codebook, indices, dcodebook, codebook_weight,
                    commitment_weight):
        z, codebook, indices = f32(z), f32(codebook), i32(indices)
        (N, M, D), K = z.shape, codebook.shape[1]
        if indices.shape != (N, M) or int(indices.min()) < 0 or int(indices.max()) >= K:
            raise ValueError(f"vq_backward: indices must be (N, M) = {(N, M)} ids in [0, {K})")
        dz = empty(N, M, D)
        call("vq_backward_cuda", "MfVqParams", dz=dz, dcodebook=dcodebook, dcodes=f32(dcodes),
             indices_in=indices, z=z, codebook=codebook, N=N, M=M, K=K, D=D,
             codebook_weight=codebook_weight, commitment_weight=commitment_weight)
        return dz

    def optional(a):
        return None if a is None else f32(a)

    def lstm_forward(x, w_ih, w_hh, b, h0=None, c0=None):
        x = f32(x)
        (B, T, C), H = x.shape, w_hh.shape[1]
        h, c, gates = empty(B, T, H), empty(B, T, H), empty(B, T, 4 * H)
        call("lstm_forward_cuda", "MfLstmParams", h=h, c=c, gates=gates, x=x, h0=optional(h0),
             c0=optional(c0), w_ih=f32(w_ih), w_hh=f32(w_hh), b=f32(b), B=B, T=T, C=C, H=H)
        return h, c, gates

    def lstm_backward(dh, x, w_ih, w_hh, h, c, gates, dw_ih, dw_hh, db, h0=None, c0=None):
        x = f32(x)
        (B, T, C), H = x.shape, w_hh.shape[1]
        dx, dh0, dc0 = empty(B, T, C), empty(B, H), empty(B, H)
        scratch = empty(B * T * 5 * H + 2 * B * H)
        call("lstm_backward_cuda", "MfLstmParams", dx=dx, dw_ih=dw_ih, dw_hh=dw_hh, db=db,
             dh0=dh0, dc0=dc0, dh=f32(dh), x=x, h_in=f32(h), c_in=f32(c), gates_in=f32(gates),
             h0=optional(h0), c0=optional(c0), w_ih=f32(w_ih), w_hh=f32(w_hh), B=B, T=T, C=C,
             H=H, scratch=scratch, scratch_floats=scratch.size)
        return dx, dh0, dc0

    def l2_normalize_forward(x, eps=1e-12):
        x = f32(x)
        N, D = x.shape
        y, norm = empty(N, D), empty(N)
        call("l2_normalize_forward_cuda", "MfL2NormalizeParams", y=y, norm=norm, x=x, N=N, D=D,
             eps=eps)
        return y, norm

    def l2_normalize_backward(dy, y, norm):
        dy = f32(dy)
        N, D = dy.shape
        dx = empty(N, D)
        call("l2_normalize_backward_cuda", "MfL2NormalizeParams", dx=dx, dy=dy, y_in=f32(y),
             norm_in=f32(norm), N=N, D=D)
        return dx

    def ema_update(target, source, decay):
        call("ema_update_cuda", "MfEmaParams", target=target, source=f32(source), n=target.size,
             decay=decay)

    vq_lstm = SimpleNamespace(vq_forward=vq_forward, vq_backward=vq_backward,
                            lstm_forward=lstm_forward, lstm_backward=lstm_backward)

    return SimpleNamespace(
        gelu_forward=gelu_forward, gelu_backward=gelu_backward, silu_forward=silu_forward,
        silu_backward=silu_backward, softplus_forward=softplus_forward,
        softplus_backward=softplus_backward, silu_gate_forward=silu_gate_forward,
        silu_gate_backward=silu_gate_backward, layernorm_forward=layernorm_forward,
        layernorm_backward=layernorm_backward, rotary_forward=rotary_forward,
        rotary_backward=rotary_backward, path_integration_forward=path_integration_forward,
        path_integration_backward=path_integration_backward, embedding_forward=embedding_forward,
        embedding_backward=embedding_backward, softmax_xent_forward=softmax_xent_forward,
        softmax_xent_backward=softmax_xent_backward, adamw_step=adamw_step,
        attention_forward=attention_forward, attention_backward=attention_backward,
        linear_forward=linear_forward, linear_backward=linear_backward, mlp_forward=mlp_forward,
        mlp_backward=mlp_backward, residual_forward=residual_forward,
        residual_backward=residual_backward, global_norm=global_norm,
        clip_grad_norm=clip_grad_norm, tape_rotate_forward=tape_rotate_forward,
        tape_rotate_backward=tape_rotate_backward, ape_decay_forward=ape_decay_forward,
        ape_decay_backward=ape_decay_backward, causal_conv1d_forward=causal_conv1d_forward,
        causal_conv1d_backward=causal_conv1d_backward,
        selective_scan_forward=selective_scan_forward,
        selective_scan_backward=selective_scan_backward,
        complex_scan_forward=complex_scan_forward, complex_scan_backward=complex_scan_backward,
        sln_forward=sln_forward, sln_backward=sln_backward, b4_forward=b4_forward,
        b4_backward=b4_backward, nc_forward=nc_forward, nc_backward=nc_backward,
        conj_attention_forward=conj_attention_forward,
        conj_attention_backward=conj_attention_backward,
        attention_decode_forward=attention_decode_forward, tape_mix_forward=tape_mix_forward,
        tape_mix_backward=tape_mix_backward, ape_apply_forward=ape_apply_forward,
        ape_apply_backward=ape_apply_backward, gridpe_complex_forward=gridpe_complex_forward,
        gridpe_complex_backward=gridpe_complex_backward, cope_forward=cope_forward,
        cope_backward=cope_backward, l2_normalize_forward=l2_normalize_forward,
        l2_normalize_backward=l2_normalize_backward, ema_update=ema_update, **vars(vq_lstm))


def gpu_ops():
    """:func:`ops` on the GPU (CuPy arrays, CuPy's current stream); RuntimeError saying how to
    get a CUDA build when there is none."""
    lib, cupy = load()
    return ops(lib, cupy, lambda: cupy.cuda.get_current_stream().ptr)
