"""Seeded fuzzing of every function of mapformer._C (issue 13), run as a script by
tests/test_fuzz.py in a child process, so that a crash fails the test with its reproducer.

Call i of seed S draws from ``default_rng([S, i])``: a good call of one op (small random sizes;
the scans' K sometimes at the binding's limit or one past it, their chunk from 1 to 2**63 - 1),
then one or two defects: a wrong dtype, non-native byte order, one axis too many or too few, a
changed or zero-sized axis, a strided or Fortran-ordered view, a read-only written array, a
non-array, two arguments sharing memory, out-of-range ids, NaN, infinite, overflowing or
ill-typed scalars, unknown or missing arguments. Each call must either raise TypeError or
ValueError whose message names an argument of the op, or return exactly (bit for bit, every
array it wrote included) what the same call on fresh copies of its arguments returns; a call
whose scalars are ordinary must return finite values. One call in five instead gives a real
hyper-parameter (or chunk) as a NumPy scalar of another kind: a complex one must be refused with
a TypeError naming it. A scan's good call whose chunk exceeds T must return chunk = T's bits.

    python tests/fuzz_ops.py --seed 0 --calls 10000 --log calls.txt   # the test's run
    python tests/fuzz_ops.py --seed 0 --only 1234                      # one call, verbosely

Before each call its description is written to --log (flushed), so that the last line of the
log names the call that crashed. Exit status 0: every call behaved; 1: some did (printed).
"""
import argparse
import re
import sys
import warnings

import numpy as np

from mapformer import _C
from mapformer.signatures import signatures

SIGNATURES = signatures()  # the binding's own tables: the one declaration of every op
# the arrays each op writes in place (everything else it is given, it only reads)
WRITTEN = {op: set(sig.written) for op, sig in SIGNATURES.items() if sig.written}
IDS = {"embedding_forward": ("tokens", "V"), "embedding_backward": ("tokens", "V"),
       "softmax_xent_forward": ("targets", "V"), "softmax_xent_backward": ("targets", "V"),
       **{op: ("prefix", "T+1") for op in ("attention_forward", "attention_backward",
                                           "conj_attention_forward", "conj_attention_backward",
                                           "relative_forward", "relative_backward")}}
MODULE_FUNCTIONS = tuple(sorted(n for n in dir(_C) if not n.startswith("_") and callable(
    getattr(_C, n)) and n not in SIGNATURES))


# the scans' K at the binding's limit and one past it (real: K <= 256 states; complex: 2K <=
# 256 floats): past it the call is refused naming A, and states are then not made
SCAN_LIMITS = {False: (256, 257), True: (128, 129)}
SCANS = ("selective_scan_forward", "selective_scan_backward", "complex_scan_forward",
         "complex_scan_backward")


def chunks(T):
    """The scans' chunk lengths drawn: ordinary ones, T and around it, and huge ones whose
    products with the scratch sizes wrap int64 (each >= T must give chunk = T's bits)."""
    return [1, 2, max(T - 1, 1), T, T + 1, 256, 2**31, 2**60, 2**62, 2**63 - 1]


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def good_call(op, rng):
    """Keyword arguments of a valid call of ``op`` at small random sizes, and the sizes."""
    B, T, H = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 3))
    D = int(rng.choice([16, 18, 32]))
    N, C, F, V = (int(rng.integers(1, 8)), int(rng.integers(1, 9)), int(rng.integers(1, 12)),
                  int(rng.integers(2, 9)))
    P = int(rng.integers(1, 40))
    s = dict(B=B, T=T, H=H, D=D, N=N, C=C, F=F, V=V, P=P, **{"T+1": T + 1})

    def bthd():
        return f32(rng, B, T, H, D)

    def masked():
        """the attention ops' mask and prefix, drawn"""
        mask = str(rng.choice(["causal", "none", "prefix"]))
        prefix = rng.integers(0, T + 1, B).astype(np.int32) if mask == "prefix" else None
        return dict(mask=mask, prefix=prefix)

    if op == "embedding_forward":
        return dict(tokens=rng.integers(0, V, N).astype(np.int32), weight=f32(rng, V, C)), s
    if op == "embedding_backward":
        return dict(dweight=f32(rng, V, C), dout=f32(rng, N, C),
                    tokens=rng.integers(0, V, N).astype(np.int32)), s
    if op == "linear_forward":
        return dict(x=f32(rng, N, C), weight=f32(rng, F, C), bias=f32(rng, F)), s
    if op == "linear_backward":
        return dict(dy=f32(rng, N, F), x=f32(rng, N, C), weight=f32(rng, F, C),
                    dweight=f32(rng, F, C), dbias=f32(rng, F), dx=f32(rng, N, C)), s
    if op == "layernorm_forward":
        return dict(x=f32(rng, N, C), weight=f32(rng, C), bias=f32(rng, C), eps=1e-5), s
    if op == "layernorm_backward":
        x, w = f32(rng, N, C), f32(rng, C)
        _, mean, rstd = _C.layernorm_forward(x, w, f32(rng, C))
        return dict(dy=f32(rng, N, C), x=x, mean=mean, rstd=rstd, weight=w,
                    dweight=f32(rng, C), dbias=f32(rng, C), dx=f32(rng, N, C)), s
    if op == "gelu_forward":
        return dict(x=f32(rng, N, C)), s
    if op == "gelu_backward":
        return dict(dy=f32(rng, N, C), x=f32(rng, N, C)), s
    if op == "residual_forward":
        return dict(a=f32(rng, N, C), b=f32(rng, N, C)), s
    if op == "residual_backward":
        return dict(dx=f32(rng, N, C), dout=f32(rng, N, C)), s
    if op == "mlp_forward":
        return dict(x=f32(rng, N, C), w_fc=f32(rng, F, C), b_fc=f32(rng, F),
                    w_proj=f32(rng, C, F), b_proj=f32(rng, C)), s
    if op == "mlp_backward":
        x, w_fc, w_proj = f32(rng, N, C), f32(rng, F, C), f32(rng, C, F)
        _, h = _C.mlp_forward(x, w_fc, f32(rng, F), w_proj, f32(rng, C))
        return dict(dy=f32(rng, N, C), x=x, h=h, w_fc=w_fc, w_proj=w_proj,
                    dw_fc=f32(rng, F, C), db_fc=f32(rng, F), dw_proj=f32(rng, C, F),
                    db_proj=f32(rng, C)), s
    if op == "attention_forward":
        return dict(q=bthd(), k=bthd(), v=bthd(), scale=None, **masked()), s
    if op == "attention_decode_forward":
        return dict(q=f32(rng, B, int(rng.integers(1, T + 1)), H, D), k=bthd(), v=bthd(),
                    scale=None), s
    if op == "attention_backward":
        q, k, v, m = bthd(), bthd(), bthd(), masked()
        out, lse = _C.attention_forward(q, k, v, **m)
        return dict(dout=bthd(), q=q, k=k, v=v, out=out, lse=lse, scale=None, **m), s
    if op == "rotary_forward":
        return dict(q=bthd(), k=bthd(), theta=f32(rng, 1, T, H, D // 2)), s
    if op == "rotary_backward":
        return dict(dq_out=bthd(), dk_out=bthd(), q=bthd(), k=bthd(),
                    theta=f32(rng, B, T, H, D // 2)), s
    if op == "path_integration_forward":
        return dict(delta=f32(rng, B, T, H, D // 2), omega=f32(rng, H, D // 2)), s
    if op == "path_integration_backward":
        return dict(dtheta=f32(rng, B, T, H, D // 2), delta=f32(rng, B, T, H, D // 2),
                    omega=f32(rng, H, D // 2), domega=f32(rng, H, D // 2)), s
    if op == "softmax_xent_forward":
        return dict(logits=f32(rng, N, V), targets=rng.integers(0, V, N).astype(np.int32),
                    mask=rng.random(N).astype(np.float32)), s
    if op == "softmax_xent_backward":
        return dict(logits=f32(rng, N, V), targets=rng.integers(0, V, N).astype(np.int32),
                    mask=rng.random(N).astype(np.float32), scale=0.5), s
    if op == "adamw_step":
        return dict(params=f32(rng, P), grads=f32(rng, P), m=f32(rng, P),
                    v=np.abs(f32(rng, P)), decay_mask=rng.random(P) < 0.5, lr=1e-3,
                    step=int(rng.integers(1, 100)), weight_decay=0.01), s
    if op == "ema_update":
        return dict(target=f32(rng, P), source=f32(rng, P), decay=float(rng.random())), s
    if op == "l2_normalize_forward":
        return dict(x=f32(rng, N, C), eps=1e-12), s
    if op == "l2_normalize_backward":
        y, norm = _C.l2_normalize_forward(f32(rng, N, C))
        return dict(dy=f32(rng, N, C), y=y, norm=norm), s
    if op == "clip_grad_norm":
        return dict(grads=f32(rng, P), max_norm=1.0), s
    if op == "global_norm":
        return dict(x=f32(rng, P)), s
    if op == "cope_forward":
        return dict(q=bthd(), k=bthd(), v=bthd(), e=f32(rng, H, T + 1, D), scale=None), s
    if op == "cope_backward":
        q, k, v, e = bthd(), bthd(), bthd(), f32(rng, H, T + 1, D)
        out, lse = _C.cope_forward(q, k, v, e)
        return dict(dout=bthd(), q=q, k=k, v=v, e=e, out=out, lse=lse,
                    de=f32(rng, H, T + 1, D), scale=None), s
    if op in ("relative_forward", "relative_backward"):
        R2 = 2 * int(rng.integers(0, 4)) + 1
        q, k, v, rel_k, rel_v = bthd(), bthd(), bthd(), f32(rng, R2, D), f32(rng, R2, D)
        s["R2"] = R2
        if op == "relative_forward":
            return dict(q=q, k=k, v=v, rel_k=rel_k, rel_v=rel_v, **masked()), s
        mask = masked()
        out, lse = _C.relative_forward(q, k, v, rel_k, rel_v, **mask)
        return dict(dout=bthd(), q=q, k=k, v=v, rel_k=rel_k, out=out, lse=lse,
                    drel_k=f32(rng, R2, D), rel_v=rel_v, drel_v=f32(rng, R2, D), **mask), s
    if op == "tape_mix_forward":
        return dict(e_att=bthd(), gate_logits=f32(rng, B, T, H), w=f32(rng, H, H)), s
    if op == "tape_mix_backward":
        return dict(de_new=bthd(), e_att=bthd(), gate_logits=f32(rng, B, T, H),
                    w=f32(rng, H, H), dw=f32(rng, H, H)), s
    if op == "tape_rotate_forward":
        return dict(q=bthd(), k=bthd(), e=bthd()), s
    if op == "tape_rotate_backward":
        return dict(dq_out=bthd(), dk_out=bthd(), q=bthd(), k=bthd(), e=bthd()), s
    if op in ("silu_forward", "softplus_forward"):
        return dict(x=f32(rng, N, C)), s
    if op in ("silu_backward", "softplus_backward"):
        return dict(dy=f32(rng, N, C), x=f32(rng, N, C)), s
    if op == "silu_gate_forward":
        return dict(y=f32(rng, N, C), z=f32(rng, N, C)), s
    if op == "silu_gate_backward":
        return dict(dout=f32(rng, N, C), y=f32(rng, N, C), z=f32(rng, N, C)), s
    W = int(rng.integers(1, 5))
    activation = str(rng.choice(["none", "silu"]))
    if op == "causal_conv1d_forward":
        return dict(x=f32(rng, B, T, C), weight=f32(rng, C, W), bias=f32(rng, C),
                    activation=activation), s
    if op == "causal_conv1d_backward":
        bias = dict(bias=f32(rng, C)) if activation == "silu" else {}
        return dict(dy=f32(rng, B, T, C), x=f32(rng, B, T, C), weight=f32(rng, C, W),
                    dweight=f32(rng, C, W), dbias=f32(rng, C), **bias,
                    activation=activation), s
    cx = op.startswith("complex_scan")
    K = int(rng.choice(SCAN_LIMITS[cx])) if rng.random() < 0.1 else int(rng.integers(1, 5))
    chunk = int(rng.choice(chunks(T)))
    delta = np.abs(f32(rng, B, T, C)) * np.float32(0.1)
    real_scan = dict(x=f32(rng, B, T, C), delta=delta, A=-np.abs(f32(rng, C, K)),
                     B=f32(rng, B, T, K), C=f32(rng, B, T, K), D=f32(rng, C), chunk=chunk)
    s["K"] = K
    if op == "selective_scan_forward":
        return real_scan, s
    if op == "selective_scan_backward":
        _, states = _C.selective_scan_forward(**real_scan) if K <= 256 else (None, None)
        return dict(dy=f32(rng, B, T, C), **real_scan, states=states, dA=f32(rng, C, K),
                    dD=f32(rng, C)), s
    complex_scan = dict(x=f32(rng, B, T, C), delta=delta, delta_angle=f32(rng, B, T, C),
                        A=-np.abs(f32(rng, C, K)), omega=f32(rng, C, K),
                        B=f32(rng, B, T, 2 * K), C=f32(rng, B, T, 2 * K), D=f32(rng, C),
                        chunk=chunk)
    if op == "complex_scan_forward":
        return complex_scan, s
    if op == "complex_scan_backward":
        _, states = _C.complex_scan_forward(**complex_scan) if K <= 128 else (None, None)
        return dict(dy=f32(rng, B, T, C), **complex_scan, states=states, dA=f32(rng, C, K),
                    domega=f32(rng, C, K), dD=f32(rng, C)), s
    if op in ("ape_apply_forward", "ape_apply_backward"):
        A = int(rng.choice([1, 2]))
        E = D // A
        args = dict(x=bthd(), maps=f32(rng, A, P, H, E, E),
                    index=rng.integers(0, P, (int(rng.choice([1, B])), T, A)).astype(np.int32))
        if op == "ape_apply_forward":
            return args, s
        return dict(dy=bthd(), **args, dmaps=f32(rng, A, P, H, E, E)), s
    if op == "gridpe_complex_forward":
        return dict(x=f32(rng, B, T, H, D // 2),
                    theta=f32(rng, int(rng.choice([1, B])), T, H, D // 2)), s
    if op == "gridpe_complex_backward":
        return dict(dy=bthd(), theta=f32(rng, int(rng.choice([1, B])), T, H, D // 2)), s
    if op in ("ape_decay_forward", "ape_decay_backward"):
        names = ("q", "k") if op == "ape_decay_forward" else ("dq_out", "dk_out")
        return dict(zip(names, (bthd(), bthd())), gamma=float(rng.choice([0.5, 0.98, 1.0]))), s
    M = int(rng.integers(1, 3))
    z, codebook = f32(rng, N, M, C), f32(rng, M, V, C)
    if op == "vq_forward":
        return dict(z=z, codebook=codebook), s
    if op == "vq_backward":
        _, indices, _, _ = _C.vq_forward(z, codebook)
        return dict(dcodes=f32(rng, N, M, C), z=z, codebook=codebook, indices=indices,
                    dcodebook=f32(rng, M, V, C), codebook_weight=1.0,
                    commitment_weight=0.25), s
    lstm = dict(x=f32(rng, B, T, C), w_ih=f32(rng, 4 * F, C), w_hh=f32(rng, 4 * F, F),
                b=f32(rng, 4 * F))
    if op == "lstm_forward":
        return dict(**lstm, h0=f32(rng, B, F), c0=f32(rng, B, F)), s
    if op == "lstm_backward":
        h, c, gates = _C.lstm_forward(**lstm)
        return dict(dh=f32(rng, B, T, F), **lstm, h=h, c=c, gates=gates,
                    dw_ih=f32(rng, 4 * F, C), dw_hh=f32(rng, 4 * F, F), db=f32(rng, 4 * F)), s
    NB2, NB4 = D // 2, D // 4
    sln = dict(delta=f32(rng, B, T, H, NB2), gen=f32(rng, H, NB2, 4), start=f32(rng, H, D))
    if op == "sln_forward":
        return sln, s
    if op == "sln_backward":
        return dict(dp=bthd(), **sln, dgen=f32(rng, H, NB2, 4), dstart=f32(rng, H, D)), s
    b4 = dict(delta=f32(rng, B, T, H, NB4), gen=f32(rng, H, NB4, 6), start=f32(rng, H, D))
    if op == "b4_forward":
        return b4, s
    if op == "b4_backward":
        return dict(dp=bthd(), **b4, dgen=f32(rng, H, NB4, 6), dstart=f32(rng, H, D)), s
    nc = dict(w=f32(rng, B, T, H, 6, NB4), start=f32(rng, H, D))
    if op == "nc_forward":
        return nc, s
    if op == "nc_backward":
        return dict(dp=bthd(), **nc, dstart=f32(rng, H, D)), s
    ncg = dict(theta=f32(rng, B, T, H, NB2, 3), gen=f32(rng, H, NB2, 3, 2, 2),
               start=f32(rng, H, D))
    if op == "nc_general_forward":
        return ncg, s
    if op == "nc_general_backward":
        return dict(dp=bthd(), **ncg, dgen=f32(rng, H, NB2, 3, 2, 2), dstart=f32(rng, H, D)), s
    mode = str(rng.choice(["score_product", "softmax_product", "sum"]))
    if op == "conj_attention_forward":
        return dict(qx=bthd(), kx=bthd(), qp=bthd(), kp=bthd(), v=bthd(), mode=mode,
                    scale=None, **masked()), s
    if op == "conj_attention_backward":
        qx, kx, qp, kp, v, m = bthd(), bthd(), bthd(), bthd(), bthd(), masked()
        out, lse = _C.conj_attention_forward(qx, kx, qp, kp, v, mode=mode, **m)
        return dict(dout=bthd(), qx=qx, kx=kx, qp=qp, kp=kp, v=v, out=out, lse=lse,
                    mode=mode, scale=None, **m), s
    raise KeyError(op)


OPS = sorted(SIGNATURES)


# ---- defects ------------------------------------------------------------------------------

BAD_SCALARS = [float("nan"), float("inf"), -float("inf"), 2**2000, -(2**2000), 1e300, -1e300,
               2**63, -(2**63) - 1, -1, 0, "1", b"x", [1.0], None, True, np.float64("nan"),
               np.int64(-5), 3.5e38, -3.5e38]
ROWS = [a for sig in SIGNATURES.values() for a in sig.args]
SCALAR_NAMES = {a.name for a in ROWS if a.kind in ("float", "int", "choice")}
CHOICE_NAMES = {a.name for a in ROWS if a.kind == "choice"}
# the real hyper-parameters (a good call that gives one a value: the NumPy scalar kinds
# replace it)
REAL_SCALARS = {a.name for a in ROWS if a.kind == "float"}
BAD_MODES = ["score_product\0junk", "", "sum\0", "SUM", "score_product ", 3, None, b"sum"]


def arrays_of(kwargs):
    return [k for k, v in kwargs.items() if isinstance(v, np.ndarray)]


def sharing(a, b, rng):
    """Views (a2, b2) of one buffer with a's and b's values, b's start inside a's bytes."""
    start = int(rng.integers(0, max(a.nbytes, 1))) // 4 * 4
    raw = np.zeros(start + b.nbytes + a.nbytes + 64, np.uint8)
    base = (-raw.ctypes.data) % 64
    bv = raw[base + start:base + start + b.nbytes].view(b.dtype).reshape(b.shape)
    av = raw[base:base + a.nbytes].view(a.dtype).reshape(a.shape)
    av[...] = a
    bv[...] = b
    return av, bv


def mutate(op, kwargs, sizes, rng):
    """Apply one random defect to ``kwargs`` in place; returns (description, ordinary) where
    ordinary is False when a scalar was made extreme (a finite result is then not required)."""
    names = arrays_of(kwargs)
    if not names:  # an earlier defect took the arrays away
        kwargs["bogus"] = 1
        return "unknown keyword bogus", True
    name = str(rng.choice(names))
    a = kwargs[name]
    kind = int(rng.integers(0, 16))
    ordinary = True
    if kind == 0:
        dtype = rng.choice([np.float64, np.float16, np.int32, np.int64, np.bool_, np.uint8,
                            np.complex64, np.float32])
        kwargs[name] = a.astype(dtype)
        what = f"{name} as {np.dtype(dtype)}"
    elif kind == 1:
        kwargs[name] = a.astype(a.dtype.newbyteorder(">" if sys.byteorder == "little" else "<"))
        what = f"{name} byte-swapped"
    elif kind == 2:
        kwargs[name] = a[..., None] if rng.random() < 0.5 else np.zeros((), a.dtype)
        what = f"{name} ndim {kwargs[name].ndim}"
    elif kind == 3:
        axis = int(rng.integers(0, max(a.ndim, 1)))
        shape = list(a.shape) or [1]
        shape[axis] = int(rng.choice([0, max(shape[axis] - 1, 0), shape[axis] + 1,
                                      shape[axis] * 2]))
        kwargs[name] = np.resize(a, shape).astype(a.dtype) if 0 not in shape else \
            np.zeros(shape, a.dtype)
        what = f"{name} shape {tuple(shape)}"
    elif kind == 4:  # every array empty along one shared size
        letter = str(rng.choice(["N", "B", "T", "P"]))
        for n in names:
            arr = kwargs[n]
            shape = [0 if d == sizes[letter] and i == 0 else d for i, d in enumerate(arr.shape)]
            kwargs[n] = np.zeros(shape, arr.dtype)
        what = f"axis 0 of size {sizes[letter]} zeroed"
    elif kind == 5:
        wide = np.repeat(a[..., None], 2, axis=-1) if a.ndim else a
        kwargs[name] = wide[..., 0] if a.ndim else a
        what = f"{name} strided view"
    elif kind == 6:
        kwargs[name] = np.asfortranarray(a) if a.ndim > 1 and a.shape[0] > 1 else \
            np.lib.stride_tricks.as_strided(a, a.shape, [0] * a.ndim)
        what = f"{name} Fortran-ordered or zero-stride"
    elif kind == 7:
        a = a.copy()
        a.flags.writeable = False
        kwargs[name] = a
        what = f"{name} read-only"
    elif kind == 8:
        kwargs[name] = rng.choice([None, 1.0, "x"]) if rng.random() < 0.5 else a.tolist()
        what = f"{name} not an array ({type(kwargs[name]).__name__})"
    elif kind in (9, 10):  # two arguments sharing memory
        others = [n for n in names if n != name]
        if not others:
            return mutate(op, kwargs, sizes, rng)
        other = str(rng.choice(others))
        if kind == 10:  # the very same array twice (when shapes allow)
            if kwargs[other].shape == a.shape and kwargs[other].dtype == a.dtype:
                kwargs[other] = a
                return f"{other} is {name}", ordinary
        kwargs[name], kwargs[other] = sharing(a, kwargs[other], rng)
        what = f"{name} and {other} share memory"
    elif kind == 11 and op in IDS and isinstance(kwargs.get(IDS[op][0]), np.ndarray) \
            and kwargs[IDS[op][0]].ndim == 1 and kwargs[IDS[op][0]].size:
        ids, letter = IDS[op]
        t = kwargs[ids].astype(np.int32)
        t[int(rng.integers(0, t.size))] = int(rng.choice(
            [-1, sizes[letter], sizes[letter] + 1, 2**31 - 1, -(2**31)]))
        kwargs[ids] = t
        what = f"{ids} out of range"
    elif kind == 12:
        scalars = [k for k in kwargs if k in SCALAR_NAMES] or ["scale"]
        s = str(rng.choice(scalars))
        if s in CHOICE_NAMES:
            kwargs[s] = BAD_MODES[int(rng.integers(0, len(BAD_MODES)))]
        else:
            kwargs[s] = BAD_SCALARS[int(rng.integers(0, len(BAD_SCALARS)))]
        ordinary = False
        what = f"{s}={kwargs[s]!r}"
    elif kind == 13:
        if rng.random() < 0.5:
            kwargs["bogus"] = 1
            what = "unknown keyword bogus"
        else:
            del kwargs[name]
            what = f"{name} missing"
    elif kind == 14:  # values: extreme but finite floats (no defect: a result must be exact)
        if a.dtype == np.float32:
            kwargs[name] = (a * np.float32(rng.choice([0, 1e-30, 1e4]))).astype(np.float32)
        what = f"{name} scaled"
        ordinary = False
    else:
        kwargs[name] = np.ascontiguousarray(a[::-1]) if a.ndim else a
        what = f"{name} reversed (no defect)"
    return what, ordinary


def numpy_scalar(op, kwargs, rng):
    """Give one real hyper-parameter (or a scan's chunk) as a NumPy scalar of another kind, in
    place; returns (description, must_refuse): a complex one must be refused with a TypeError
    naming it (as Python's complex is: NumPy's float() would drop the imaginary part), a
    real, integer or 0-d one must give the plain value's result. None when the call has no
    such scalar."""
    names = [k for k in kwargs if (k in REAL_SCALARS and isinstance(kwargs[k], float))
             or (k == "chunk" and isinstance(kwargs[k], int))]
    if not names:
        return None
    name = str(rng.choice(names))
    value = kwargs[name]
    if name == "chunk":
        kinds = [np.int64, np.int32, np.uint64, np.complex128, np.complex64]
    else:
        kinds = [np.float32, np.float64, np.complex128, np.complex64, np.clongdouble,
                 lambda v: np.array(v, np.complex128), lambda v: np.array(v, np.float64)]
    kind = kinds[int(rng.integers(0, len(kinds)))]
    if name == "chunk" and kind is np.int32 and value > 2**31 - 1:
        kind = np.int64
    kwargs[name] = kind(value)
    refused = np.iscomplexobj(kwargs[name])
    return f"{name}={kwargs[name]!r} ({type(kwargs[name]).__name__})", refused


# ---- one call -----------------------------------------------------------------------------

def copy_args(kwargs):
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (np.isnan(a) and np.isnan(b))
    return a == b


def finite(values):
    return all(np.isfinite(v).all() for v in values
               if isinstance(v, (np.ndarray, float)) and np.asarray(v).dtype.kind == "f")


def check_call(op, kwargs, ordinary, refused=None, equivalent=None):
    """None if the call behaved, else what went wrong. ``refused``: the argument the call must
    be refused naming (TypeError); ``equivalent``: the keyword arguments of another call that
    must return the same bits (a scan's chunk beyond T against chunk = T)."""
    call = getattr(_C, op)
    fresh = copy_args(kwargs)
    try:
        result = call(**kwargs)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        names = [refused] if refused else list(kwargs) + [op]
        if refused and not isinstance(exc, TypeError):
            return f"raised {type(exc).__name__}, not TypeError, for {refused}: {message!r}"
        if not any(re.search(rf"\b{re.escape(n)}\b", message) for n in names):
            return f"{type(exc).__name__} names no argument: {message!r}"
        return None
    except Exception as exc:  # MemoryError, SystemError, OverflowError ...
        return f"raised {type(exc).__name__}: {exc}"
    if refused:
        return f"accepted {refused} of {type(kwargs[refused]).__name__}"
    got = list(as_tuple(result)) + [kwargs[n] for n in WRITTEN.get(op, ()) if n in kwargs]
    try:
        again = call(**fresh)
    except Exception as exc:
        return f"succeeded, but on fresh copies raised {type(exc).__name__}: {exc}"
    want = list(as_tuple(again)) + [fresh[n] for n in WRITTEN.get(op, ()) if n in fresh]
    if len(got) != len(want) or not all(same(g, w) for g, w in zip(got, want)):
        return "returned other values than the same call on fresh copies"
    if equivalent is not None:
        try:
            again = call(**equivalent)
        except Exception as exc:
            return f"succeeded, but its equivalent call raised {type(exc).__name__}: {exc}"
        want = list(as_tuple(again)) + [equivalent[n] for n in WRITTEN.get(op, ())
                                        if n in equivalent]
        if len(got) != len(want) or not all(same(g, w) for g, w in zip(got, want)):
            return "returned other values than its equivalent call (chunk = T)"
    if ordinary and not finite(got):
        return "returned non-finite values for finite inputs"
    return None


def module_call(name, rng):
    """A malformed call of a module function; the kernel set and the subnormal mode are
    restored after."""
    bad = {"set_kernels": [(), ("avx2\0",), ("no such set",), (3,), (None,), ("",),
                           ("portable", "x")],
           "set_subnormals": [(), ("flush\0",), ("fast",), (1,), (None,), ("",),
                              ("keep", "x")]}.get(name, [(), (1,), ("x",)])
    args = bad[int(rng.integers(0, len(bad)))]
    return args, f"{name}{args!r}"


def run_call(seed, index, log=None):
    rng = np.random.default_rng([seed, index])
    pick = int(rng.integers(0, len(OPS) + len(MODULE_FUNCTIONS)))
    if pick >= len(OPS):
        name = MODULE_FUNCTIONS[pick - len(OPS)]
        args, what = module_call(name, rng)
        if log:
            log.write(f"{index} {what}\n")
            log.flush()
        active, mode = _C.kernels(), _C.subnormals()
        try:
            getattr(_C, name)(*args)
        except (TypeError, ValueError):
            pass
        except Exception as exc:
            return what, f"raised {type(exc).__name__}: {exc}"
        finally:
            _C.set_kernels(active)
            _C.set_subnormals(mode)
        return what, None
    op = OPS[pick]
    kwargs, sizes = good_call(op, rng)
    equivalent = None
    if op in SCANS and kwargs["chunk"] > sizes["T"]:  # must give chunk = T's bits
        equivalent = copy_args(kwargs)
        equivalent["chunk"] = sizes["T"]
    whats, ordinary, refused = [f"K={sizes['K']} chunk={kwargs['chunk']}"] if op in SCANS \
        else [], True, None
    scalar = numpy_scalar(op, kwargs, rng) if rng.random() < 0.2 else None
    if scalar is not None:  # the one change: the call is otherwise good
        whats.append(scalar[0])
        refused = scalar[0].split("=")[0] if scalar[1] else None
    elif op in SCANS and rng.random() < 0.3:  # a good scan call, its chunk the only test
        whats.append("no defect")
    else:
        for _ in range(1 + int(rng.random() < 0.25)):
            what, ok = mutate(op, kwargs, sizes, rng)
            whats.append(what)
            ordinary &= ok
        equivalent = None  # a defect may make the twin invalid
    what = f"{op}: " + "; ".join(whats)
    if log:
        log.write(f"{index} {what}\n")
        log.flush()
    return what, check_call(op, kwargs, ordinary, refused, equivalent)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--only", type=int, default=None, help="run call INDEX only")
    parser.add_argument("--log", default=None)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # the defects' own casts (complex to real, overflow)
    indices = [args.only] if args.only is not None else range(args.calls)
    log = open(args.log, "w") if args.log else None
    failures, ops = [], set()
    for i in indices:
        what, problem = run_call(args.seed, i, log)
        ops.add(what.split(":")[0].split("(")[0])
        if args.only is not None:
            print(what, "->", problem or "ok")
        if problem:
            failures.append(f"call {i} ({what}): {problem}  [reproduce: python "
                            f"tests/fuzz_ops.py --seed {args.seed} --only {i}]")
    print(f"{len(indices)} calls over {len(ops)} functions, {len(failures)} misbehaved")
    for line in failures[:50]:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
