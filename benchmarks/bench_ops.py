"""Per-op benchmarks of the C core against the same math in NumPy float32.

Each benchmark is an `OpBench`: a name, its sizes, an explicit `flops()` and `bytes()`, the C
call, the NumPy float32 call, and a `check()` that compares the two results before anything is
timed (a benchmark of a wrong kernel is worthless). Families of benchmarks are registered in
FAMILIES; add an op by appending a function that returns its list of OpBench.

Conventions:
  ms       median wall time of `--repeats` calls after `--warmup` calls (min also reported);
           outputs are allocated by each call, as the library API does. With `--clock cpu`,
           the process's CPU time instead (all threads'; it leaves out the time a thread
           waited for a core, so on a shared machine one-thread figures stay comparable).
  GB/s     bytes() / median time, bytes() = compulsory traffic: every input read once and every
           output written once, 4 B per float32 (write-allocate traffic not counted).
  GFLOP/s  flops() / median time, flops() = adds and multiplies of the op's defining formulas
           (see each family's docstring for what is counted).
The NumPy side is the op's float64 reference (mapformer/reference/) run with dtype=float32:
the same formulas, as an eager-NumPy layer would run them (attention's backward, like the
reference, recomputes the forward from q, k, v).

Families: rotary (path integration + rotary), attention (causal attention forward/backward
on every kernel set the CPU runs, or those --kernel-sets names; flops are the products the
training step needs; the NumPy side runs on a smaller batch and is scaled, see
attention_benches, and --no-numpy skips it), conj_attention (MapEM's conjunctive attention in
its three modes, sized, counted and scaled as attention; the summary gives each kernel set's
forward, backward and total fraction of the sgemm rate, its time against the OpenBLAS tiles'
(set 'blas') and each mode's against the attention op's), linear (linear forward and backward
at the training step's shapes, on every kernel set, the OpenBLAS path included), mlp (the fused
MLP op on every kernel set, against the separate linear and gelu ops it replaces, and NumPy;
and with the exact GELU, approximate='none', on the active set),
sgemm (one large sgemm: the machine's matmul rate, which the JSON summary compares attention,
the linears and the MLP against), scan (Mamba's and MAMPa's selective scans forward and
backward, against a large copy's bandwidth in the same run and the float32 NumPy reference), ape (ape_seq's positional work, its basis folded into
the projections and the rotary op, and the dense maps of ape_grid / ape_tree on q and k with
their generator's powers, forward and backward, against RoPE's rotary op plus its angles;
sized by --batch, --seq, --heads, --head-dim; the summary gives the ratios of their forward +
backward times).

`--threads N` sets OMP_NUM_THREADS before the C core is loaded. Prints one JSON line at the end
(with --json FILE, also writes it there with the run's provenance; the performance pages are
rendered from such files by docs/gen_pages.py's ``op-bench`` directive).
"""
import argparse
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from report import add_json_option, emit  # the checkout first on sys.path

F32 = np.float32  # the reference's dtype on the NumPy side


@dataclass
class OpBench:
    name: str
    sizes: dict
    flops: Callable[[], float]
    bytes: Callable[[], float]
    c: Callable[[], object]
    numpy: Callable[[], object]
    check: Callable[[], None]
    notes: str = ""
    extra: dict = field(default_factory=dict)


def timeit(fn, warmup, repeats, clock=time.perf_counter):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return float(np.median(times)), float(np.min(times))


# ---- path integration + rotary (MapWM) ----------------------------------------------------
def rotary_benches(C, B=128, T=256, H=2, D=64, seed=0):
    """Path integration (theta = wrap(omega * cumsum_t delta)) and the rotary op on q and k,
    MapWM's per-batch angles (TB = B), at the MapFormer paper's scale by default.

    With N = B*T*H*(D/2) angles (2N pairs of q and of k):
      bytes  path_integration fwd  delta in, theta out                        8N
             rotary fwd            q, k, theta in; q_out, k_out out           36N
             rotary bwd            dq_out, dk_out, q, k, theta in;
                                   dq, dk, dtheta out                         56N
             path_integration bwd  dtheta, delta in; ddelta out               12N
      flops  path_integration fwd  cumsum add, omega mul                       2N
             rotary fwd            per pair of q and of k: 4 mul + 2 add       12N
             rotary bwd            per pair: R^T dy 6, dtheta 2 mul + 2 add    20N
             path_integration bwd  ddelta: mul + add; domega: cumsum add,
                                   mul, add                                    5N
    cos/sin, the angle wrap and float/double conversions are not counted."""
    from mapformer import reference as ref

    NB = D // 2
    N = B * T * H * NB
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    delta = f32(B, T, H, NB)
    omega = (2 * np.pi * np.geomspace(1.0, 1.0 / 64, NB)[None].repeat(H, 0)).astype(np.float32)
    q, k, dq_out, dk_out, dtheta = f32(B, T, H, D), f32(B, T, H, D), f32(B, T, H, D), \
        f32(B, T, H, D), f32(B, T, H, NB)
    theta = C.path_integration_forward(delta, omega)
    domega_c = np.zeros((H, NB), np.float32)
    sizes = dict(B=B, T=T, H=H, D=D, TB=B)

    def close(a, b, name, tol=2e-3):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = np.abs(a - b).max() / max(1.0, np.abs(b).max())
        assert err < tol, f"{name}: C and NumPy float32 differ by {err:.3g} (relative)"

    def check_pi_fwd():
        close(ref.wrap_angle(C.path_integration_forward(delta, omega)
                       - ref.path_integration_forward(delta, omega, dtype=F32)), 0.0, "theta")

    def check_rot_fwd():
        for a, b, n in zip(C.rotary_forward(q, k, theta), ref.rotary_forward(q, k, theta, dtype=F32),
                           ("q_out", "k_out")):
            close(a, b, n)

    def check_rot_bwd():
        for a, b, n in zip(C.rotary_backward(dq_out, dk_out, q, k, theta),
                           ref.rotary_backward(dq_out, dk_out, q, k, theta, dtype=F32),
                           ("dq", "dk", "dtheta")):
            close(a, b, n)

    def check_pi_bwd():
        dc = np.zeros_like(domega_c)
        ddelta, domega = ref.path_integration_backward(dtheta, delta, omega, dtype=F32)
        close(C.path_integration_backward(dtheta, delta, omega, dc), ddelta, "ddelta")
        close(dc, domega, "domega")

    def c_fwd():
        th = C.path_integration_forward(delta, omega)
        return C.rotary_forward(q, k, th)

    def np_fwd():
        th = ref.path_integration_forward(delta, omega, dtype=F32)
        return ref.rotary_forward(q, k, th, dtype=F32)

    def c_bwd():
        _, _, dth = C.rotary_backward(dq_out, dk_out, q, k, theta)
        return C.path_integration_backward(dth, delta, omega, domega_c)

    def np_bwd():
        _, _, dth = ref.rotary_backward(dq_out, dk_out, q, k, theta, dtype=F32)
        return ref.path_integration_backward(dth, delta, omega, dtype=F32)

    def both(*checks):
        def run():
            for chk in checks:
                chk()
        return run

    return [
        OpBench("path_integration_forward", sizes, lambda: 2 * N, lambda: 8 * N,
                lambda: C.path_integration_forward(delta, omega),
                lambda: ref.path_integration_forward(delta, omega, dtype=F32), check_pi_fwd),
        OpBench("rotary_forward", sizes, lambda: 12 * N, lambda: 36 * N,
                lambda: C.rotary_forward(q, k, theta), lambda: ref.rotary_forward(q, k, theta, dtype=F32),
                check_rot_fwd),
        OpBench("rotary_backward", sizes, lambda: 20 * N, lambda: 56 * N,
                lambda: C.rotary_backward(dq_out, dk_out, q, k, theta),
                lambda: ref.rotary_backward(dq_out, dk_out, q, k, theta, dtype=F32), check_rot_bwd),
        OpBench("path_integration_backward", sizes, lambda: 5 * N, lambda: 12 * N,
                lambda: C.path_integration_backward(dtheta, delta, omega, domega_c),
                lambda: ref.path_integration_backward(dtheta, delta, omega, dtype=F32),
                check_pi_bwd),
        OpBench("path_integration+rotary forward", sizes, lambda: 14 * N, lambda: 44 * N,
                c_fwd, np_fwd, both(check_pi_fwd, check_rot_fwd),
                notes="theta = path_integration(delta, omega); rotary(q, k, theta)"),
        OpBench("path_integration+rotary backward", sizes, lambda: 25 * N, lambda: 68 * N,
                c_bwd, np_bwd, both(check_rot_bwd, check_pi_bwd),
                notes="rotary backward, then path_integration backward of its dtheta"),
    ]


# ---- causal attention -------------------------------------------------------------------
def attention_benches(C, B=128, T=256, H=2, D=64, numpy_batch=16, seed=0, kernel_sets=None,
                      numpy=True):
    """Causal softmax attention, forward (out, lse) and backward (dq, dk, dv), at the
    MapFormer paper's scale by default (batch 128, 256 tokens, 2 heads of 64), on every kernel
    set in `kernel_sets` (default: every set this CPU runs, mapformer._C.kernel_sets()); each
    set's results are checked before it is timed.

    flops are the products the training step needs (bench_train_step counts the same), over
    the useful causal half of each T x T product, 2 * T * T * D / 2 per (b, h) per product:
    forward 2 (S = Q K^T, O = P V), backward 4 (dV = P^T dO, dP = dO V^T, dQ = dS K,
    dK = dS^T Q). The backward's recomputation of S, the softmax, the exponentials and the
    rescaling are the kernels' overhead, not counted. bytes: forward reads q, k, v and writes
    out, lse; backward reads dout, q, k, v, out, lse and writes dq, dk, dv (4 B per float32).
    The NumPy float32 side (timed once, with the first set, unless numpy is False)
    materialises the B x H x T x T scores; it runs on a batch of `numpy_batch` and its time is
    scaled by B / numpy_batch (extra["numpy_scale"])."""
    from mapformer import reference as ref

    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, k, v, dout = (f32(B, T, H, D) for _ in range(4))
    scale = 1.0 / np.sqrt(D)
    out, lse = C.attention_forward(q, k, v)
    nb = min(B, numpy_batch)
    qn, kn, vn, don, on, lsen = q[:nb], k[:nb], v[:nb], dout[:nb], out[:nb], lse[:nb]
    half_matmul = 2.0 * T * T * D / 2 * B * H
    nelem = B * T * H * D

    def close(a, b, name, tol):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = np.abs(a - b).max() / max(1.0, np.abs(b).max())
        assert err < tol, f"{name}: differs by {err:.3g} (relative to max(1, max|ref|))"

    def check_fwd():
        # C against the float64 reference on a slice, and against NumPy float32
        o2, l2 = C.attention_forward(q[:2], k[:2], v[:2])
        ro, rl = ref.attention_forward(q[:2], k[:2], v[:2])
        close(o2, ro, "out vs reference", 1e-5)
        close(l2, rl, "lse vs reference", 1e-5)
        o3, l3 = C.attention_forward(qn, kn, vn)
        no, nl = ref.attention_forward(qn, kn, vn, scale, dtype=F32)
        close(o3, no, "out vs NumPy float32", 1e-4)
        close(l3, nl, "lse vs NumPy float32", 1e-4)

    def check_bwd():
        o2, l2 = C.attention_forward(q[:2], k[:2], v[:2])
        got = C.attention_backward(dout[:2], q[:2], k[:2], v[:2], o2, l2)
        for a, b, n in zip(got, ref.attention_backward(dout[:2], q[:2], k[:2], v[:2]),
                           ("dq", "dk", "dv")):
            close(a, b, n + " vs reference", 1e-4)
        got = C.attention_backward(don, qn, kn, vn, on, lsen)
        for a, b, n in zip(got, ref.attention_backward(don, qn, kn, vn, scale, dtype=F32),
                           ("dq", "dk", "dv")):
            close(a, b, n + " vs NumPy float32", 1e-3)

    benches = []
    for i, kset in enumerate(kernel_sets or C.kernel_sets()):
        sizes = dict(B=B, T=T, H=H, D=D, kernels=kset)
        with_numpy = numpy and i == 0
        extra = dict(numpy_scale=B / nb, numpy_batch=nb) if with_numpy else {}
        benches += [
            OpBench(f"attention_forward [{kset}]", sizes, lambda: 2 * half_matmul,
                    lambda: 4 * (4 * nelem + B * H * T),
                    on_kernels(C, kset, lambda: C.attention_forward(q, k, v)),
                    (lambda: ref.attention_forward(qn, kn, vn, scale, dtype=F32)) if with_numpy else None,
                    on_kernels(C, kset, check_fwd),
                    notes="causal; flops = 2 products of the causal half", extra=extra),
            OpBench(f"attention_backward [{kset}]", sizes, lambda: 4 * half_matmul,
                    lambda: 4 * (8 * nelem + B * H * T),
                    on_kernels(C, kset, lambda: C.attention_backward(dout, q, k, v, out, lse)),
                    (lambda: ref.attention_backward(don, qn, kn, vn, scale, dtype=F32))
                    if with_numpy else None,
                    on_kernels(C, kset, check_bwd),
                    notes="causal; flops = 4 products of the causal half", extra=extra),
        ]
    return benches


# ---- conjunctive attention (MapEM) --------------------------------------------------------
CONJ_MODES = ("score_product", "softmax_product", "sum")


def conj_attention_benches(C, B=128, T=256, H=2, D=64, numpy_batch=16, seed=0,
                           kernel_sets=None, numpy=True):
    """MapEM's conjunctive attention in each mode (score_product, softmax_product, sum),
    forward (out, lse) and backward (dqx, dkx, dqp, dkp, dv), at the MapFormer paper's scale
    by default (batch 128, 256 tokens, 2 heads of 64), on every kernel set in `kernel_sets`
    (default: every set this CPU runs), as the attention family.

    flops are the products the training step needs (bench_train_step counts the same), over
    the useful causal half of each T x T product, 2 * T * T * D / 2 per (b, h) per product:
    forward 3 (sX, sP, O = A V), backward 6 (dA = dO V^T, dV = A^T dO, dqx = dsX kx,
    dkx = dsX^T qx, dqp = dsP kp, dkp = dsP^T qp). Not counted (the kernels' overhead): the
    backward's recomputation of sX and sP, softmax_product's second forward pass over them,
    softmax, exponentials and the elementwise combination of the score tiles. bytes: forward
    reads qx, kx, qp, kp, v and writes out, lse (M B H T floats, M = 2 for softmax_product,
    else 1); backward reads dout, qx, kx, qp, kp, v, out, lse and writes the five gradients.
    The NumPy float32 side (timed once, with the first set, unless numpy is False)
    materialises the B x H x T x T matrices; it runs on a batch of `numpy_batch` and its time
    is scaled by B / numpy_batch (extra["numpy_scale"]). The JSON summary compares each mode's
    forward + backward with the attention family's on the same set."""
    from mapformer import reference as ref

    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    qx, kx, qp, kp, v, dout = (f32(B, T, H, D) for _ in range(6))
    scale = 1.0 / np.sqrt(D)
    nb = min(B, numpy_batch)
    ins, ins_np, ins_2 = (qx, kx, qp, kp, v), tuple(x[:nb] for x in (qx, kx, qp, kp, v)), \
        tuple(x[:2] for x in (qx, kx, qp, kp, v))
    half_matmul = 2.0 * T * T * D / 2 * B * H
    nelem, nrow = B * T * H * D, B * H * T
    names = ("dqx", "dkx", "dqp", "dkp", "dv")

    def close(a, b, name, tol):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = np.abs(a - b).max() / max(1.0, np.abs(b).max())
        assert err < tol, f"{name}: differs by {err:.3g} (relative to max(1, max|ref|))"

    benches = []
    for i, kset in enumerate(kernel_sets or C.kernel_sets()):
        with_numpy = numpy and i == 0
        extra = dict(numpy_scale=B / nb, numpy_batch=nb) if with_numpy else {}
        for mode in CONJ_MODES:
            M = 2 if mode == "softmax_product" else 1
            out, lse = on_kernels(C, kset, lambda mode=mode: C.conj_attention_forward(
                *ins, mode))()
            on, lsen, don = out[:nb], np.ascontiguousarray(lse[:, :nb]), dout[:nb]

            def check_fwd(mode=mode):
                # C against the float64 reference on a slice, and against NumPy float32
                o2, l2 = C.conj_attention_forward(*ins_2, mode)
                ro, rl = ref.conj_attention_forward(*ins_2, mode)
                close(o2, ro, "out vs reference", 1e-4)
                close(l2, rl, "lse vs reference", 1e-5)
                o3, l3 = C.conj_attention_forward(*ins_np, mode)
                no, nl = ref.conj_attention_forward(*ins_np, mode, scale, dtype=F32)
                close(o3, no, "out vs NumPy float32", 1e-3)
                close(l3, nl, "lse vs NumPy float32", 1e-4)

            def check_bwd(mode=mode, on=on, lsen=lsen):
                o2, l2 = C.conj_attention_forward(*ins_2, mode)
                got = C.conj_attention_backward(dout[:2], *ins_2, o2, l2, mode)
                for a, b, n in zip(got, ref.conj_attention_backward(dout[:2], *ins_2, mode),
                                   names):
                    close(a, b, n + " vs reference", 1e-3)
                got = C.conj_attention_backward(don, *ins_np, on, lsen, mode)
                want = ref.conj_attention_backward(don, *ins_np, mode, scale, dtype=F32)
                for a, b, n in zip(got, want, names):
                    close(a, b, n + " vs NumPy float32", 1e-3)

            sizes = dict(B=B, T=T, H=H, D=D, mode=mode, kernels=kset)
            benches += [
                OpBench(f"conj_attention_forward {mode} [{kset}]", sizes,
                        lambda: 3 * half_matmul, lambda M=M: 4 * (6 * nelem + M * nrow),
                        on_kernels(C, kset, lambda mode=mode: C.conj_attention_forward(
                            *ins, mode)),
                        (lambda mode=mode: ref.conj_attention_forward(*ins_np, mode, scale, dtype=F32))
                        if with_numpy else None,
                        on_kernels(C, kset, check_fwd),
                        notes="causal; flops = 3 products of the causal half", extra=extra),
                OpBench(f"conj_attention_backward {mode} [{kset}]", sizes,
                        lambda: 6 * half_matmul, lambda M=M: 4 * (12 * nelem + M * nrow),
                        on_kernels(C, kset, lambda mode=mode, out=out, lse=lse:
                                      C.conj_attention_backward(dout, *ins, out, lse, mode)),
                        (lambda mode=mode: ref.conj_attention_backward(
                            don, *ins_np, mode, scale, dtype=F32)) if with_numpy else None,
                        on_kernels(C, kset, check_bwd),
                        notes="causal; flops = 6 products of the causal half", extra=extra),
            ]
    return benches


# ---- linear at the training step's shapes ---------------------------------------------------
def on_kernels(C, kernels, fn):
    """fn run with the C core's kernel set `kernels` active ('avx512', 'avx2', 'portable',
    'blas': _C.kernel_sets()), the set active before restored after."""
    def run():
        before = C.kernels()
        C.set_kernels(kernels)
        try:
            return fn()
        finally:
            C.set_kernels(before)
    return run


def kernel_label(kernels):
    return " (OpenBLAS path)" if kernels == "blas" else f" [{kernels}]"


def linear_benches(C, N=32768, width=128, ratio=4, seed=0):
    """y = x W^T + b and its backward (dx = dy W, dW += dy^T x, db += column sums of dy) at the
    shapes of a training step's linears (N = B*T rows): the projections (width -> width), the
    MLP's fc (width -> ratio*width) and proj (back). Their rates, against the square sgemm's,
    are what bounds the step (bench_train_step). Each runs on every kernel set this CPU has
    (_C.kernel_sets(): the tiled kernels at each vector width, and the OpenBLAS path 'blas');
    the JSON summary gives each set's time against the OpenBLAS path's and its fraction of
    the square sgemm's rate. flops 2 N Cin Cout forward, twice that backward; bytes: forward
    x, W, b read, y written; backward dy, x, W read, dx, dW, db written."""
    from mapformer import reference as ref

    rng = np.random.default_rng(seed)
    benches = []
    for c_in, c_out in ((width, width), (width, ratio * width), (ratio * width, width)):
        x = rng.standard_normal((N, c_in)).astype(np.float32)
        w = rng.standard_normal((c_out, c_in)).astype(np.float32)
        b = rng.standard_normal(c_out).astype(np.float32)
        dy = rng.standard_normal((N, c_out)).astype(np.float32)
        dw, db = np.zeros_like(w), np.zeros_like(b)

        def check(x=x[:300], w=w, b=b, dy=dy[:300]):
            gw = np.zeros_like(w)
            gx = C.linear_backward(dy, x, w, gw, np.zeros_like(b))
            for name, got, want in (("y", C.linear_forward(x, w, b), x @ w.T + b),
                                    ("dx", gx, dy @ w), ("dW", gw, dy.T @ x)):
                err = np.abs(got - want).max() / np.abs(want).max()
                assert err < 1e-5, f"linear {name} differs from NumPy by {err:.3g}"

        def forward(x=x, w=w, b=b):
            return C.linear_forward(x, w, b)

        def backward(x=x, w=w, dy=dy, dw=dw, db=db):
            return C.linear_backward(dy, x, w, dw, db)

        sizes = dict(N=N, Cin=c_in, Cout=c_out)
        flops = 2.0 * N * c_in * c_out
        fwd_bytes = 4.0 * (N * c_in + c_in * c_out + c_out + N * c_out)
        bwd_bytes = 4.0 * (2 * N * c_out + 2 * N * c_in + 2 * c_in * c_out + c_out)
        for kernels in C.kernel_sets():
            label = kernel_label(kernels)
            benches.append(OpBench(
                f"linear_forward {c_in}->{c_out}{label}", sizes, lambda f=flops: f,
                lambda v=fwd_bytes: v, on_kernels(C, kernels, forward),
                lambda x=x, w=w, b=b: ref.linear_forward(x, w, b, dtype=F32),
                on_kernels(C, kernels, check),
                extra=dict(kernels=kernels, op=f"linear_forward {c_in}->{c_out}")))
            benches.append(OpBench(
                f"linear_backward {c_in}->{c_out}{label}", sizes, lambda f=flops: 2 * f,
                lambda v=bwd_bytes: v, on_kernels(C, kernels, backward),
                lambda x=x, w=w, dy=dy: ref.linear_backward(dy, x, w, dtype=F32),
                on_kernels(C, kernels, check),
                extra=dict(kernels=kernels, op=f"linear_backward {c_in}->{c_out}")))
    return benches


# ---- MLP: the fused op against the separate linear and gelu ops ----------------------------
def mlp_benches(C, N=32768, width=128, ratio=4, seed=0):
    """The transformer block's MLP, y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj, at the
    training step's size (N = B*T rows, width C, F = ratio*C hidden units), run three ways:
    the fused op (mlp_forward / mlp_backward: row blocks that stay in cache; only h is kept),
    the separate C ops it replaces (linear, gelu, linear, keeping h and g), and NumPy float32.
    flops: the four (forward: two) products, 2 N C F each; GELU is not counted. bytes: the
    fused op's inputs read and outputs written once. The JSON summary gives fused / separate
    time."""
    from mapformer import reference as ref

    rng = np.random.default_rng(seed)
    F = ratio * width
    f = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)  # noqa: E731
    x, w_fc, b_fc, dy = f(N, width), f(F, width), f(F), f(N, width)
    w_proj, b_proj = f(width, F), f(width)
    y, h = C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    g = C.gelu_forward(h)  # what the separate ops keep from their forward
    grads = [np.zeros_like(a) for a in (w_fc, b_fc, w_proj, b_proj)]

    def separate_forward():
        h1 = C.linear_forward(x, w_fc, b_fc)
        return C.linear_forward(C.gelu_forward(h1), w_proj, b_proj), h1

    def separate_backward():
        dg = C.linear_backward(dy, g, w_proj, grads[2], grads[3])
        return C.linear_backward(C.gelu_backward(dg, h), x, w_fc, grads[0], grads[1])

    def numpy_forward():
        return ref.mlp_forward(x, w_fc, b_fc, w_proj, b_proj, dtype=F32)

    def numpy_backward():
        return ref.mlp_backward(dy, x, h, w_fc, w_proj, dtype=F32)

    def check_forward():
        for a, b, name in zip(C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj),
                              separate_forward(), ("y", "h")):
            err = np.abs(a - b).max() / np.abs(b).max()
            assert err < 1e-5, f"mlp_forward {name} differs from the separate ops by {err:.3g}"

    def check_backward():
        fused = [np.zeros_like(a) for a in grads]
        dx = C.mlp_backward(dy, x, h, w_fc, w_proj, *fused)
        want = numpy_backward()
        for a, b, name in zip([dx, *fused], [want[0], want[1], want[2], want[3], want[4]],
                              ("dx", "dw_fc", "db_fc", "dw_proj", "db_proj")):
            err = np.abs(a - b).max() / np.abs(b).max()
            assert err < 1e-3, f"mlp_backward {name} differs from NumPy by {err:.3g}"

    def flops(products):
        return lambda: 2.0 * products * N * width * F

    def fwd_bytes():  # x, weights, biases in; h, y out
        return 4.0 * (2 * N * width + 2 * width * F + F + width + N * F)

    def bwd_bytes():  # dy, x, h, weights in; dx, weight and bias gradients out
        return 4.0 * (3 * N * width + N * F + 4 * width * F + 2 * (F + width))
    sizes = dict(N=N, C=width, F=F)
    benches = []
    for kernels in C.kernel_sets():
        label = "" if kernels == C.kernels() else kernel_label(kernels)
        benches += [
            OpBench(f"mlp_forward{label}", sizes, flops(2), fwd_bytes,
                    on_kernels(C, kernels, lambda: C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)),
                    numpy_forward, on_kernels(C, kernels, check_forward),
                    extra=dict(kernels=kernels, op="mlp_forward")),
            OpBench(f"mlp_backward{label}", sizes, flops(4), bwd_bytes,
                    on_kernels(C, kernels,
                               lambda: C.mlp_backward(dy, x, h, w_fc, w_proj, *grads)),
                    numpy_backward, on_kernels(C, kernels, check_backward),
                    extra=dict(kernels=kernels, op="mlp_backward"))]
    # the exact GELU (approximate="none"), also applied in the product's registers; C only
    # (NumPy's float64 erfc is a Python-level loop)
    h_erf = C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj, approximate="none")[1]

    def erf_forward():
        return C.mlp_forward(x, w_fc, b_fc, w_proj, b_proj, approximate="none")

    def erf_backward():
        return C.mlp_backward(dy, x, h_erf, w_fc, w_proj, *grads, approximate="none")

    def check_erf():
        y1, h1 = erf_forward()
        g1 = C.gelu_forward(h1, approximate="none")
        assert np.array_equal(y1, C.linear_forward(g1, w_proj, b_proj)), "exact mlp_forward"
        fused, sep = [np.zeros_like(a) for a in grads], [np.zeros_like(a) for a in grads]
        dx = C.mlp_backward(dy, x, h1, w_fc, w_proj, *fused, approximate="none")
        dg = C.linear_backward(dy, g1, w_proj, sep[2], sep[3])
        dh = C.gelu_backward(dg, h1, approximate="none")
        assert np.array_equal(dx, C.linear_backward(dh, x, w_fc, sep[0], sep[1])), "exact dx"
    benches += [
        OpBench("mlp_forward exact gelu", sizes, flops(2), fwd_bytes, erf_forward, None,
                check_erf, notes="approximate='none'", extra=dict(kernels=C.kernels())),
        OpBench("mlp_backward exact gelu", sizes, flops(4), bwd_bytes, erf_backward, None,
                check_erf, notes="approximate='none'", extra=dict(kernels=C.kernels()))]
    return benches + [
        OpBench("mlp_forward separate ops", sizes, flops(2), fwd_bytes, separate_forward,
                numpy_forward, check_forward, extra=dict(kernels=C.kernels())),
        OpBench("mlp_backward separate ops", sizes, flops(4), bwd_bytes, separate_backward,
                numpy_backward, check_backward, extra=dict(kernels=C.kernels())),
    ]


# ---- the machine's sgemm rate, for comparison ---------------------------------------------
def sgemm_benches(C, N=2048, seed=0):
    """One large sgemm, y = x W^T with x, W (N, N): the rate every matmul-bound op is judged
    against. C side: linear_forward (OpenBLAS from scipy-openblas32); NumPy side: x @ W.T
    (NumPy's own OpenBLAS). flops 2 N^3; bytes 3 N^2 floats."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, N)).astype(np.float32)
    w = rng.standard_normal((N, N)).astype(np.float32)

    def check():
        a = C.linear_forward(x[:64], w)
        b = x[:64].astype(np.float64) @ w.T.astype(np.float64)
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < 1e-4, f"sgemm differs by {err:.3g}"

    return [OpBench(f"sgemm {N}x{N}x{N}", dict(N=N), lambda: 2.0 * N**3, lambda: 12.0 * N * N,
                    lambda: C.linear_forward(x, w), lambda: x @ w.T, check)]


# ---- selective scans (Mamba, MAMPa) --------------------------------------------------------
def scan_benches(C, B=128, T=256, E=256, N=16, numpy_batch=2, copy_mb=512, seed=0):
    """Mamba's real selective scan and MAMPa's complex scan (N state floats per channel: N
    real states, or N/2 complex ones), forward and backward, at batch B, T tokens, E
    channels, with their default chunk (256 steps); and a large copy (``copy_mb`` MB, NumPy's
    copyto: memcpy) whose GB/s is the machine's memory bandwidth in this run, which the
    summary compares the scans' GB/s against. The NumPy side is mapformer.reference's scan
    with dtype float32 (its sequential loop over t on (B, E, K) complex arrays) on
    ``numpy_batch`` rows, its time scaled to B. The "zoh" rows are the same four with
    bbar="zoh" (zero-order hold: phi(z) = (e^z - 1) / z per step and state, phi' in the
    backward; no NumPy side), to set against the Euler rows. The "softplus" rows are the
    Euler four as the models call them by default: the steps before their bias and softplus,
    which the scan forms (delta_bias, delta_activation="softplus"), and the complex scan's
    rotation taking the same step (delta_angle None: no delta_angle read, no ddelta_angle
    written, so its bytes are the real scan's); no NumPy side, checked against the plain rows.

    With M = B*T*E, P = B*T*N, Q = B*NC*E*N (the saved chunk states):
      bytes  forward   x, delta (, delta_angle) in; B, C in; y, states out   4 (3M + 2P + Q)
                                                                    complex: 4 (4M + 2P + Q)
             backward  dy, x, delta (, delta_angle), B, C, states in;
                       dx, ddelta (, ddelta_angle), dB, dC out      4 (5M + 4P + Q), complex
                                                                    4 (7M + 4P + Q)
      flops  per (b, t, e, state float), as scan.c writes the formulas (exp, sin, cos not
             counted): real forward 6, backward 22; complex forward 10, backward 32."""
    from mapformer import reference as ref
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    K = N // 2
    x, dy = f32(B, T, E), f32(B, T, E)
    delta = np.log1p(np.exp(f32(B, T, E) - 3)).astype(np.float32)  # softplus, about 0.05
    dangle = f32(B, T, E)
    Bm, Cm, D = f32(B, T, N), f32(B, T, N), f32(E)
    A_real = -np.tile(np.arange(1, N + 1, dtype=np.float32), (E, 1))
    A_cx = -np.tile(np.arange(1, K + 1, dtype=np.float32), (E, 1))
    omega = np.tile((2 * np.pi * np.geomspace(1, 1 / 64, K)).astype(np.float32), (E, 1))
    nb = numpy_batch
    real_in = (x, delta, A_real, Bm, Cm, D)
    cx_in = (x, delta, dangle, A_cx, omega, Bm, Cm, D)
    real_small = tuple(a[:nb] if a.ndim == 3 else a for a in real_in)
    cx_small = tuple(a[:nb] if a.ndim == 3 else a for a in cx_in)
    y_r, st_r = C.selective_scan_forward(*real_in)
    y_c, st_c = C.complex_scan_forward(*cx_in)
    M, P, Q = B * T * E, B * T * N, st_r.size
    sizes = dict(B=B, T=T, E=E, N=N)
    src = np.ones(copy_mb * (1 << 20) // 4, np.float32)
    dst = np.empty_like(src)

    def close(a, b, name, tol=1e-3):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = np.abs(a - b).max() / max(1.0, np.abs(b).max())
        assert err < tol, f"{name}: C and the reference differ by {err:.3g} (relative)"

    def check_real():
        close(y_r[:nb], ref.selective_scan_forward(*real_small)[0], "scan y")
        g = C.selective_scan_backward(dy, *real_in, st_r, np.zeros_like(A_real),
                                      np.zeros_like(D))
        r = ref.selective_scan_backward(dy[:nb], *real_small)
        close(g[0][:nb], r[0], "scan dx")

    def check_cx():
        close(y_c[:nb], ref.complex_scan_forward(*cx_small)[0], "complex scan y")
        g = C.complex_scan_backward(dy, *cx_in, st_c, np.zeros_like(A_cx),
                                    np.zeros_like(omega), np.zeros_like(D))
        r = ref.complex_scan_backward(dy[:nb], *cx_small)
        close(g[0][:nb], r[0], "complex scan dx")

    scale = {"numpy_scale": B / nb}
    f32ref = dict(dtype=np.float32)
    zb = dict(bbar="zoh")
    y_rz, st_rz = C.selective_scan_forward(*real_in, **zb)
    y_cz, st_cz = C.complex_scan_forward(*cx_in, **zb)

    def check_zoh():
        close(y_rz[:nb], ref.selective_scan_forward(*real_small, **zb)[0], "zoh scan y")
        close(y_cz[:nb], ref.complex_scan_forward(*cx_small, **zb)[0], "zoh complex scan y")

    def variant(label, real_args, cx_args, st_real, st_cx, kw, grad_kw, check):
        """The four rows of a variant of the scans (``label``): forward and backward of the
        real and the complex scan on those arguments with the keywords ``kw`` (and the
        backward's ``grad_kw``); the complex scan's bytes with delta_angle read (and
        ddelta_angle written) where cx_args gives one."""
        angle = cx_args[2] is not None
        def real_grads():
            return np.zeros_like(A_real), np.zeros_like(D)

        def cx_grads():
            return np.zeros_like(A_cx), np.zeros_like(omega), np.zeros_like(D)

        return [
            OpBench(f"selective_scan_forward {label}", sizes, lambda: 6.0 * M * N,
                    lambda: 4.0 * (3 * M + 2 * P + Q),
                    lambda: C.selective_scan_forward(*real_args, **kw), None, check),
            OpBench(f"selective_scan_backward {label}", sizes, lambda: 22.0 * M * N,
                    lambda: 4.0 * (5 * M + 4 * P + Q),
                    lambda: C.selective_scan_backward(dy, *real_args, st_real, *real_grads(),
                                                      **kw, **grad_kw), None, check),
            OpBench(f"complex_scan_forward {label}", sizes, lambda: 10.0 * M * N,
                    lambda: 4.0 * ((3 + angle) * M + 2 * P + Q),
                    lambda: C.complex_scan_forward(*cx_args, **kw), None, check),
            OpBench(f"complex_scan_backward {label}", sizes, lambda: 32.0 * M * N,
                    lambda: 4.0 * ((5 + 2 * angle) * M + 4 * P + Q),
                    lambda: C.complex_scan_backward(dy, *cx_args, st_cx, *cx_grads(), **kw,
                                                    **grad_kw), None, check),
        ]

    # zero-order hold (bbar="zoh"): the same scans with phi(z), phi'(z) (against Euler's rows)
    zoh = variant("zoh", real_in, cx_in, st_rz, st_cz, zb, {}, check_zoh)
    # the models' default calls (mamba.py, mampa.py): the steps before their bias and
    # softplus, formed inside the scan (Mamba's delta_bias, delta_softplus), and for MAMPa the
    # rotation taking the same step (delta_angle None); the steps are the rows' above:
    # dt_pre = softplus^-1(delta) - bias
    bias = np.linspace(-0.5, 0.5, E, dtype=np.float32)
    sp = dict(delta_bias=bias, delta_activation="softplus")
    dt_pre = (np.log(np.expm1(delta.astype(np.float64))) - bias).astype(np.float32)
    real_sp = (x, dt_pre, *real_in[2:])
    cx_sp = (x, dt_pre, None, *cx_in[3:])
    y_rs, st_rs = C.selective_scan_forward(*real_sp, **sp)
    y_cs, st_cs = C.complex_scan_forward(*cx_sp, **sp)

    def check_softplus():
        """Against the plain scans on the same steps (the complex one with delta_angle =
        delta): y, dx, and ddelta = the plain scan's step gradient (both of the complex
        one's) times softplus' slope, summed over (b, t) for delta_bias."""
        slope = 1.0 / (1.0 + np.exp(-(dt_pre.astype(np.float64) + bias)))
        zeros = np.zeros_like
        y_sh, st_sh = C.complex_scan_forward(x, delta, delta, *cx_in[3:])
        close(y_rs, y_r, "softplus scan y", 1e-5)
        close(y_cs, y_sh, "softplus complex scan y", 1e-5)
        dbias = np.zeros(E, np.float32)
        g = C.selective_scan_backward(dy, *real_sp, st_rs, zeros(A_real), zeros(D),
                                      ddelta_bias=dbias, **sp)
        want = C.selective_scan_backward(dy, *real_in, st_r, zeros(A_real), zeros(D))
        close(g[0], want[0], "softplus scan dx", 1e-5)
        close(g[1], want[1] * slope, "softplus scan ddelta", 1e-5)
        close(dbias, (want[1] * slope).sum((0, 1)), "softplus scan ddelta_bias", 1e-5)
        dbias[:] = 0
        g = C.complex_scan_backward(dy, *cx_sp, st_cs, zeros(A_cx), zeros(omega), zeros(D),
                                    ddelta_bias=dbias, **sp)
        want = C.complex_scan_backward(dy, x, delta, delta, *cx_in[3:], st_sh, zeros(A_cx),
                                       zeros(omega), zeros(D))
        step = (want[1].astype(np.float64) + want[2]) * slope
        close(g[0], want[0], "softplus complex scan dx", 1e-5)
        close(g[1], step, "softplus complex scan ddelta", 1e-5)
        close(dbias, step.sum((0, 1)), "softplus complex scan ddelta_bias", 1e-5)

    softplus = variant("softplus", real_sp, cx_sp, st_rs, st_cs, sp,
                       dict(ddelta_bias=np.zeros(E, np.float32)), check_softplus)
    return [
        OpBench(f"memcpy {copy_mb} MB", dict(MB=copy_mb), lambda: 0.0,
                lambda: 2.0 * src.nbytes, lambda: np.copyto(dst, src), None, lambda: None,
                notes="the machine's copy bandwidth in this run (read + write)"),
        OpBench("selective_scan_forward", sizes, lambda: 6.0 * M * N,
                lambda: 4.0 * (3 * M + 2 * P + Q), lambda: C.selective_scan_forward(*real_in),
                lambda: ref.selective_scan_forward(*real_small, **f32ref), check_real,
                extra=scale),
        OpBench("selective_scan_backward", sizes, lambda: 22.0 * M * N,
                lambda: 4.0 * (5 * M + 4 * P + Q),
                lambda: C.selective_scan_backward(dy, *real_in, st_r, np.zeros_like(A_real),
                                                  np.zeros_like(D)),
                lambda: ref.selective_scan_backward(dy[:nb], *real_small, **f32ref),
                check_real, extra=scale),
        OpBench("complex_scan_forward", sizes, lambda: 10.0 * M * N,
                lambda: 4.0 * (4 * M + 2 * P + Q), lambda: C.complex_scan_forward(*cx_in),
                lambda: ref.complex_scan_forward(*cx_small, **f32ref), check_cx, extra=scale),
        OpBench("complex_scan_backward", sizes, lambda: 32.0 * M * N,
                lambda: 4.0 * (7 * M + 4 * P + Q),
                lambda: C.complex_scan_backward(dy, *cx_in, st_c, np.zeros_like(A_cx),
                                                np.zeros_like(omega), np.zeros_like(D)),
                lambda: ref.complex_scan_backward(dy[:nb], *cx_small, **f32ref), check_cx,
                extra=scale),
        *zoh,
        *softplus,
    ]


# ---- APE: per-token orthogonal maps against RoPE's rotary op ------------------------------
def ape_benches(C, B=128, T=256, H=2, D=64, seed=0):
    """ape_seq's positional work in one attention layer (issue 12's budget: forward + backward
    at most 1.5x RoPE's), against RoPE's: the rotary op on q and k plus its angles
    (path_integration of Delta = 1, as the rope scheme builds them; TB = 1). ape_seq is kept
    in APE's canonical form W = M^T R(omega) M (mapformer/schemes/ape.py): its work beyond the
    mixer's projections is

    ape_seq forward   M = expm(B - B^T) (backend.C.ape_basis_forward, float64 NumPy through
                      the skew eigendecomposition, kept for the backward; once per step for
                      every layer, counted whole here), M folded into the q and k weights and biases
                      (nn.fold_heads, C = H D; the projections themselves are the mixer's
                      either way), then RoPE's work with trainable omega: path_integration and
                      the rotary op
    ape_seq backward  rotary and path_integration backward, the folds' backward
                      (nn.fold_heads_backward, with the folded weights' gradient buffers the
                      linear op then writes into) and expm's (ape_basis_backward, from the
                      forward's eigendecomposition)
    ape_seq+decay     the same with ape_decay = 0.98: the ape_decay op on the rotated q and k
                      (forward) and on their gradients (backward); 2 N D flops, 16 N D bytes
                      each way
    ape dense maps    the route ape_grid and ape_tree take (and ape_seq took before, 20.8x):
                      the dense maps W^0..W^(T-1) by doubling (ape_powers_*, float64 NumPy) and
                      the C op ape_apply on q and k, forward and backward
    With N = B*T*H rows of D (E = D, one axis), NB = D / 2:
      flops  ape_seq fwd: rotary 12 N NB + angles 2 T H NB + folds 2 x 2 H D^2 (C + 1)
             (+ the eigendecomposition); bwd: 20 N NB + 5 T H NB + 2 x 4 H D^2 (C + 1)
             dense: ape_apply fwd (q and k) 2 x 2 N D^2 + powers ~ 2 H T D^3; bwd 2 x 4 N D^2
             + powers bwd ~ 3 x 2 H T D^3 (+ a 2D expm)
      bytes  ape_seq as RoPE's plus the weights: fwd 16 N D + 12 T H NB + 16 C H D, bwd
             24 N D + 20 T H NB + 32 C H D; dense fwd 16 N D + 4 T H D^2, bwd 24 N D +
             12 T H D^2
    No NumPy side (the float64 reference's einsum of the map gradients is (B, T, H, D, D)).
    Run with OMP_NUM_THREADS set in the environment as well as --threads: the generator side
    runs on NumPy's BLAS, loaded before --threads applies (measured with --threads 1 alone
    and --clock cpu: its idle threads' spinning made the dense backward 2.8 s instead of
    0.24)."""
    from mapformer import backend
    from mapformer import reference as ref
    from mapformer.nn import fold_heads, fold_heads_backward

    NB, c = D // 2, H * D
    ops = backend.C
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, k, dq_out, dk_out = f32(B, T, H, D), f32(B, T, H, D), f32(B, T, H, D), f32(B, T, H, D)
    omega = (10000.0 ** (-np.arange(NB) / NB))[None].repeat(H, 0).astype(np.float32)
    ones = np.ones((1, T, H, NB), np.float32)
    theta = C.path_integration_forward(ones, omega)
    domega = np.zeros_like(omega)
    n, sizes = B * T * H, dict(B=B, T=T, H=H, D=D)
    # ape_seq: a trained basis is no longer the identity
    basis_gen, dbasis_gen = 0.05 * f32(H, D, D), np.zeros((H, D, D), np.float32)
    wq, wk, bq, bk = 0.02 * f32(c, c), 0.02 * f32(c, c), 0.02 * f32(c), 0.02 * f32(c)
    dwq, dwk, dbq, dbk = (np.zeros_like(a) for a in (wq, wk, bq, bk))
    basis, eig = ops.ape_basis_forward(basis_gen)
    # the dense route: a trained generator is no longer block-diagonal
    generator = ref.rope_generator(omega.astype(np.float64)).astype(np.float32)
    generator += 0.01 * f32(*generator.shape)
    dgenerator = np.zeros_like(generator)
    index = np.arange(T, dtype=np.int32).reshape(1, T, 1)
    maps = ops.ape_powers_forward(generator, T)

    def seq_fwd():
        m, _ = ops.ape_basis_forward(basis_gen)
        folded = fold_heads(ops, m, wq, bq), fold_heads(ops, m, wk, bk)
        th = C.path_integration_forward(ones, omega)
        return folded, C.rotary_forward(q, k, th)

    def seq_bwd():
        dq, dk, dth = C.rotary_backward(dq_out, dk_out, q, k, theta)
        seq_bwd_rest(dth)
        return dq, dk

    def seq_bwd_rest(dth):
        """after the rotary op's backward: the angles', the folds' and expm's"""
        C.path_integration_backward(dth, ones, omega, domega)
        dbasis = np.zeros_like(basis)
        for w, b, dw, db in ((wq, bq, dwq, dbq), (wk, bk, dwk, dbk)):
            # the folded weight's gradient buffers the linear op's backward writes into
            dw_folded, db_folded = np.zeros_like(w), np.zeros_like(b)
            fold_heads_backward(ops, basis, w, b, dw_folded, db_folded, dw, db, dbasis)
        ops.ape_basis_backward(dbasis, eig, dbasis_gen)
        return dbasis_gen

    def decay_fwd():
        qr, kr = seq_fwd()[1]
        return C.ape_decay_forward(qr, kr, 0.98)

    def decay_bwd():
        dqa, dka = C.ape_decay_backward(dq_out, dk_out, 0.98)
        dq, dk, dth = C.rotary_backward(dqa, dka, q, k, theta)
        return seq_bwd_rest(dth), dq, dk

    def dense_fwd():
        m = ops.ape_powers_forward(generator, T)
        return C.ape_apply_forward(q, m, index), C.ape_apply_forward(k, m, index)

    def dense_bwd():
        dmaps = np.zeros_like(maps)
        dq = C.ape_apply_backward(dq_out, q, maps, index, dmaps)
        dk = C.ape_apply_backward(dk_out, k, maps, index, dmaps)
        ops.ape_powers_backward(dmaps, generator, dgenerator)
        return dq, dk

    def rope_fwd():
        th = C.path_integration_forward(ones, omega)
        return C.rotary_forward(q, k, th)

    def rope_bwd():
        dq, dk, dth = C.rotary_backward(dq_out, dk_out, q, k, theta)
        C.path_integration_backward(dth, ones, omega, domega)
        return dq, dk

    def check():
        """ape_apply with the maps of the RoPE generator is the rotary op at angles t omega;
        ape_seq's route (M folded, then rotated by t omega) is the dense W^t with W = M^T R M
        (generator M^T A_rope M), up to the M^T the scores cancel."""
        rope_maps = ops.ape_powers_forward(ref.rope_generator(omega.astype(np.float64)), T)
        th = (np.arange(T)[None, :, None, None] * omega).astype(np.float32)
        a, b = C.ape_apply_forward(q, rope_maps, index), C.rotary_forward(q, k, th)[0]
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < 1e-4, f"ape_apply with RoPE's maps differs from rotary by {err:.3g}"
        m = ref.ape_basis_forward(basis_gen)
        dense = m.swapaxes(-1, -2) @ ref.rope_generator(omega.astype(np.float64)) @ m
        dense_maps = ops.ape_powers_forward(dense, T)
        a = C.ape_apply_forward(q, dense_maps, index)
        mq = np.einsum("hij,bthj->bthi", m, q).astype(np.float32)
        b = np.einsum("hji,bthj->bthi", m, C.rotary_forward(mq, mq, th)[0])
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < 1e-4, f"ape_seq's canonical form differs from the dense W^t by {err:.3g}"

    fold = 2 * 2 * H * D * D * (c + 1)
    powers = 2 * H * T * D ** 3
    return [
        OpBench("ape_seq forward", sizes, lambda: 12 * n * NB + 2 * T * H * NB + fold,
                lambda: 16 * n * D + 12 * T * H * NB + 16 * c * H * D, seq_fwd, None, check,
                notes="basis expm (float64 NumPy), folds into W_q, W_k, angles, rotary"),
        OpBench("ape_seq backward", sizes, lambda: 20 * n * NB + 5 * T * H * NB + 2 * fold,
                lambda: 24 * n * D + 20 * T * H * NB + 32 * c * H * D, seq_bwd, None, check,
                notes="rotary and angles backward, the folds' and expm's"),
        OpBench("ape_seq+decay forward", sizes,
                lambda: 12 * n * NB + 2 * T * H * NB + fold + 2 * n * D,
                lambda: 32 * n * D + 12 * T * H * NB + 16 * c * H * D, decay_fwd, None, check,
                notes="ape_seq forward, then ape_decay (gamma 0.98) on the rotated q and k"),
        OpBench("ape_seq+decay backward", sizes,
                lambda: 20 * n * NB + 5 * T * H * NB + 2 * fold + 2 * n * D,
                lambda: 40 * n * D + 20 * T * H * NB + 32 * c * H * D, decay_bwd, None, check,
                notes="ape_decay backward, then ape_seq backward"),
        OpBench("ape dense maps forward", sizes, lambda: 4 * n * D * D + powers,
                lambda: 16 * n * D + 4 * T * H * D * D, dense_fwd, None, check,
                notes="powers of the generator (float64 NumPy), ape_apply on q and k"),
        OpBench("ape dense maps backward", sizes, lambda: 8 * n * D * D + 3 * powers,
                lambda: 24 * n * D + 12 * T * H * D * D, dense_bwd, None, check,
                notes="ape_apply backward on q and k, then the generator's gradient"),
        OpBench("rope angles+rotary forward", sizes, lambda: 12 * n * NB + 2 * T * H * NB,
                lambda: 16 * n * D + 12 * T * H * NB, rope_fwd, None, check,
                notes="theta = path_integration(1, omega) (TB = 1); rotary(q, k, theta)"),
        OpBench("rope angles+rotary backward", sizes, lambda: 20 * n * NB + 5 * T * H * NB,
                lambda: 24 * n * D + 20 * T * H * NB, rope_bwd, None, check,
                notes="rotary backward, then path_integration backward (RoPE tuned)"),
    ]


def groups_benches(C, B=128, T=256, H=2, D=64, seed=0):
    """Issue 10's positional ops, forward + backward each, beside MapWM's cumulative-sum path
    integration of the same head (its budget: NC at most 3x path integration):
    path_integration  (B, T, H, D/2) angles, forward and backward
    sln               2x2 trace-free blocks, (B, T, H, D/2) Delta, positions (B, T, H, D)
    b4                4x4 blocks, (B, T, H, D/4) Delta
    nc                4x4 blocks, ordered product of per-token steps (B, T, H, 6, D/4)
    nc_general b K    b x b blocks, the same product through exp(sum_i theta_i S_i) by
                      scaling and squaring (B, T, H, D/b, K), K = b(b-1)/2: b 4 and b 8
    Bytes: the arrays read and written; no NumPy side (the references loop in Python)."""
    rng = np.random.default_rng(seed)
    f32 = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    n2, n4 = D // 2, D // 4
    d2, d4, om = f32(B, T, H, n2), f32(B, T, H, n4), f32(H, n2)
    gen2, gen6, start = f32(H, n2, 4), f32(H, n4, 6), f32(H, D)
    w, dp, dth = f32(B, T, H, 6, n4), f32(B, T, H, D), f32(B, T, H, n2)
    sizes = dict(B=B, T=T, H=H, D=D)
    rows = B * T * H

    def pi():
        C.path_integration_forward(d2, om)
        C.path_integration_backward(dth, d2, om, np.zeros_like(om))

    def sln():
        C.sln_forward(d2, gen2, start)
        C.sln_backward(dp, d2, gen2, start, np.zeros_like(gen2), np.zeros_like(start))

    def b4():
        C.b4_forward(d4, gen6, start)
        C.b4_backward(dp, d4, gen6, start, np.zeros_like(gen6), np.zeros_like(start))

    def nc():
        C.nc_forward(w, start)
        C.nc_backward(dp, w, start, np.zeros_like(start))

    def general(b):
        k = b * (b - 1) // 2
        a = rng.standard_normal((H, D // b, k, b, b)) / k ** 0.5
        gen = (a - np.swapaxes(a, -1, -2)).astype(np.float32)
        theta = f32(B, T, H, D // b, k)

        def run():
            C.nc_general_forward(theta, gen, start)
            C.nc_general_backward(dp, theta, gen, start, np.zeros_like(gen),
                                  np.zeros_like(start))
        return OpBench(f"nc_general b {b} K {k} fwd+bwd", sizes, lambda: 0,
                       lambda: 4 * rows * (D // b * k * 2 + D * 2), run, None, check)

    def check():
        assert np.isfinite(C.nc_forward(w, start)).all()

    return [
        OpBench("path_integration fwd+bwd (groups baseline)", sizes, lambda: 0,
                lambda: 4 * rows * n2 * 4, pi, None, check),
        OpBench("sln fwd+bwd", sizes, lambda: 0, lambda: 4 * rows * (n2 * 2 + D * 2), sln,
                None, check),
        OpBench("b4 fwd+bwd", sizes, lambda: 0, lambda: 4 * rows * (n4 * 2 + D * 2), b4,
                None, check),
        OpBench("nc fwd+bwd", sizes, lambda: 0, lambda: 4 * rows * (n4 * 12 + D * 2), nc,
                None, check),
        general(4),
        general(8),
    ]


FAMILIES = {
    "rotary": rotary_benches,
    "attention": attention_benches,
    "conj_attention": conj_attention_benches,
    "linear": linear_benches,
    "mlp": mlp_benches,
    "sgemm": sgemm_benches,
    "scan": scan_benches,
    "ape": ape_benches,
    "groups": groups_benches,
}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES),
                   help="comma-separated subset of: " + ", ".join(FAMILIES))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--settle", type=float, default=0.3,
                   help="seconds of sleep before each timed side (the other side's threads "
                        "stop spinning)")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the C core (default: the environment's)")
    p.add_argument("--batch", type=int, default=128, help="attention, conj_attention: batch B")
    p.add_argument("--seq", type=int, default=256, help="attention, conj_attention: tokens T")
    p.add_argument("--heads", type=int, default=2, help="attention, conj_attention: heads H")
    p.add_argument("--head-dim", type=int, default=64, help="attention, conj_attention: head dim D")
    p.add_argument("--numpy-batch", type=int, default=16,
                   help="attention, conj_attention: batch the NumPy float32 side "
                        "runs on (time scaled to B)")
    p.add_argument("--mlp-rows", type=int, default=32768, help="linear, mlp: rows N (= B*T)")
    p.add_argument("--mlp-width", type=int, default=128,
                   help="linear, mlp: width C (F = 4C)")
    p.add_argument("--sgemm-n", type=int, default=2048, help="sgemm: N of the N^3 product")
    p.add_argument("--scan-batch", type=int, default=128, help="scan: batch B (T is --seq)")
    p.add_argument("--scan-channels", type=int, default=256, help="scan: channels E")
    p.add_argument("--scan-state", type=int, default=16, help="scan: state floats N")
    p.add_argument("--scan-numpy-batch", type=int, default=2,
                   help="scan: batch the NumPy reference runs on (time scaled to B)")
    p.add_argument("--copy-mb", type=int, default=512, help="scan: MB of the bandwidth copy")
    p.add_argument("--kernel-sets", default=None,
                   help="attention, conj_attention: comma-separated kernel sets to run "
                        "(default: every set this CPU runs, mapformer._C.kernel_sets())")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall time, or the process's CPU time (see Conventions)")
    p.add_argument("--ops", default=None,
                   help="comma-separated substrings: run only the benchmarks whose name "
                        "contains one (e.g. 'path_integration,nc fwd' for the groups "
                        "family's nc-vs-path-integration ratio without nc_general)")
    add_json_option(p)
    p.add_argument("--no-numpy", action="store_true",
                   help="attention, conj_attention: skip the (slow) NumPy float32 side")
    args = p.parse_args()
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from mapformer import _C  # after OMP_NUM_THREADS is set: libgomp reads it once

    attn_args = dict(B=args.batch, T=args.seq, H=args.heads, D=args.head_dim,
                     numpy_batch=args.numpy_batch, numpy=not args.no_numpy,
                     kernel_sets=args.kernel_sets.split(",") if args.kernel_sets else None)
    family_args = {
        "attention": attn_args,
        "conj_attention": attn_args,
        "linear": dict(N=args.mlp_rows, width=args.mlp_width),
        "mlp": dict(N=args.mlp_rows, width=args.mlp_width),
        "sgemm": dict(N=args.sgemm_n),
        "scan": dict(B=args.scan_batch, T=args.seq, E=args.scan_channels, N=args.scan_state,
                     numpy_batch=args.scan_numpy_batch, copy_mb=args.copy_mb),
        "ape": dict(B=args.batch, T=args.seq, H=args.heads, D=args.head_dim),
        "groups": dict(B=args.batch, T=args.seq, H=args.heads, D=args.head_dim),
    }
    ops = args.ops.split(",") if args.ops else None
    results = []
    for family in args.families.split(","):
        for b in FAMILIES[family](_C, **family_args.get(family, {})):
            if ops and not any(o in b.name for o in ops):
                continue
            b.check()
            clock = time.process_time if args.clock == "cpu" else time.perf_counter
            # each side starts after the other's thread pool has gone to sleep: NumPy's
            # OpenBLAS threads spin for about 0.1 s after a call, the C core's OpenMP threads
            # briefly, and either steals a core from the other side's timing meanwhile
            time.sleep(args.settle)
            c_ms, c_min = timeit(b.c, args.warmup, args.repeats, clock)
            row = {
                "family": family, "name": b.name, "sizes": b.sizes,
                "c_ms": round(c_ms * 1e3, 3), "c_min_ms": round(c_min * 1e3, 3),
                "c_gbps": round(b.bytes() / c_ms / 1e9, 2),
                "c_gflops": round(b.flops() / c_ms / 1e9, 2),
            }
            line = (f"{b.name:<48} C {row['c_ms']:8.2f} ms ({row['c_gbps']:6.1f} GB/s, "
                    f"{row['c_gflops']:5.1f} GFLOP/s)")
            if b.numpy is not None:
                time.sleep(args.settle)
                np_ms, np_min = timeit(b.numpy, args.warmup, args.repeats, clock)
                # a NumPy side timed on a smaller problem is scaled up to the benchmark's size
                np_scale = b.extra.get("numpy_scale", 1.0)
                np_ms, np_min = np_ms * np_scale, np_min * np_scale
                row.update({
                    "numpy_ms": round(np_ms * 1e3, 3), "numpy_min_ms": round(np_min * 1e3, 3),
                    "speedup": round(np_ms / c_ms, 2),
                    "numpy_gbps": round(b.bytes() / np_ms / 1e9, 2),
                    "numpy_gflops": round(b.flops() / np_ms / 1e9, 2)})
                if np_scale != 1.0:
                    row["numpy_scaled_by"] = np_scale
                line += (f"   NumPy f32 {row['numpy_ms']:8.2f} ms ({row['numpy_gbps']:5.1f} "
                         f"GB/s)   x{row['speedup']:.1f}")
            row.update({key: val for key, val in b.extra.items() if key != "numpy_scale"})
            results.append(row)
            print(line)
    summary = {}
    by_name = {row["name"]: row for row in results}
    sgemm = next((row for row in results if row["family"] == "sgemm"), None)

    def fwd_bwd(fwd_name, bwd_name):
        """forward + backward of one op on one kernel set: time, rate, fractions of the
        sgemm rate (each direction's and the sum's)"""
        fwd, bwd = by_name.get(fwd_name), by_name.get(bwd_name)
        if fwd is None or bwd is None:
            return None
        ms = fwd["c_ms"] + bwd["c_ms"]
        gflops = (fwd["c_gflops"] * fwd["c_ms"] + bwd["c_gflops"] * bwd["c_ms"]) / ms
        entry = {"c_ms": round(ms, 3), "c_gflops": round(gflops, 2)}
        if "numpy_ms" in fwd and "numpy_ms" in bwd:
            entry["speedup_vs_numpy"] = round((fwd["numpy_ms"] + bwd["numpy_ms"]) / ms, 2)
        if sgemm is not None:
            rate = sgemm["c_gflops"]
            entry["fraction_of_sgemm"] = round(gflops / rate, 3)
            entry["forward_fraction_of_sgemm"] = round(fwd["c_gflops"] / rate, 3)
            entry["backward_fraction_of_sgemm"] = round(bwd["c_gflops"] / rate, 3)
        return entry

    kernel_sets = list(dict.fromkeys(row["sizes"]["kernels"] for row in results
                                     if "kernels" in row["sizes"]))
    for kset in kernel_sets:
        attn = fwd_bwd(f"attention_forward [{kset}]", f"attention_backward [{kset}]")
        if attn is not None:
            summary[f"attention_fwd_bwd [{kset}]"] = attn
        for mode in CONJ_MODES:
            entry = fwd_bwd(f"conj_attention_forward {mode} [{kset}]",
                            f"conj_attention_backward {mode} [{kset}]")
            if entry is None:
                continue
            if attn is not None:  # the plain attention op at the same size, on the same set
                entry["time_vs_attention"] = round(entry["c_ms"] / attn["c_ms"], 2)
                entry["gflops_vs_attention"] = round(entry["c_gflops"] / attn["c_gflops"], 2)
            summary[f"conj_attention_{mode}_fwd_bwd [{kset}]"] = entry
    for key, entry in list(summary.items()):  # each set's time against the OpenBLAS tiles'
        blas = summary.get(key[:key.rfind("[")] + "[blas]")
        if key.endswith("]") and blas is not None and blas is not entry:
            entry["time_vs_blas"] = round(entry["c_ms"] / blas["c_ms"], 3)
    for key, entry in summary.items():
        if "fraction_of_sgemm" in entry:
            print(f"{key:<48} {entry['c_ms']:8.2f} ms fwd+bwd, of the sgemm rate: forward "
                  f"{entry['forward_fraction_of_sgemm']:.2f}, backward "
                  f"{entry['backward_fraction_of_sgemm']:.2f}, both "
                  f"{entry['fraction_of_sgemm']:.2f}"
                  + (f"; time vs blas {entry['time_vs_blas']:.2f}" if "time_vs_blas" in entry
                     else ""))
    copy = next((row for row in results if row["name"].startswith("memcpy")), None)
    for name in ("selective_scan_forward", "selective_scan_backward", "complex_scan_forward",
                 "complex_scan_backward"):
        row = by_name.get(name)
        if row is not None and copy is not None:
            summary[f"{name}_fraction_of_copy_bandwidth"] = round(
                row["c_gbps"] / copy["c_gbps"], 3)
            print(f"{name:<48} {row['c_gbps']:6.1f} GB/s = "
                  f"{row['c_gbps'] / copy['c_gbps']:.2f} of the copy's {copy['c_gbps']:.1f}")
    rope = fwd_bwd("rope angles+rotary forward", "rope angles+rotary backward")
    for key, label in (("ape_seq", "ape_seq"), ("ape_seq_decay", "ape_seq+decay"),
                       ("ape_dense", "ape dense maps")):
        ape = fwd_bwd(f"{label} forward", f"{label} backward")
        if ape is not None and rope is not None:
            summary[f"{key}_fwd_bwd_vs_rope"] = round(ape["c_ms"] / rope["c_ms"], 2)
            print(f"{label} forward+backward {ape['c_ms']:.2f} ms against RoPE's rotary + "
                  f"angles {rope['c_ms']:.2f} ms: x{summary[f'{key}_fwd_bwd_vs_rope']:.2f}")
    for step in ("forward", "backward"):
        fused, separate = by_name.get(f"mlp_{step}"), by_name.get(f"mlp_{step} separate ops")
        if fused is not None and separate is not None:
            summary[f"mlp_{step}_fused_vs_separate"] = round(fused["c_ms"] / separate["c_ms"], 3)
    # each kernel set's run of an op against the OpenBLAS path's run of it
    blas_runs = {row["op"]: row for row in results if row.get("kernels") == "blas" and "op" in row}
    for row in results:
        blas = blas_runs.get(row.get("op"))
        if blas is not None and row is not blas:
            entry = {"kernel_vs_openblas_time": round(row["c_ms"] / blas["c_ms"], 3)}
            if sgemm is not None:
                entry["fraction_of_sgemm"] = round(row["c_gflops"] / sgemm["c_gflops"], 3)
            summary[row["name"]] = entry
    emit({"bench": "ops", "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
          "clock": args.clock, "repeats": args.repeats, "warmup": args.warmup,
          "results": results, "summary": summary}, args.json)


if __name__ == "__main__":
    main()
