"""Per-op benchmarks of the C core against the same math in NumPy float32.

Each benchmark is an `OpBench`: a name, its sizes, an explicit `flops()` and `bytes()`, the C
call, the NumPy float32 call, and a `check()` that compares the two results before anything is
timed (a benchmark of a wrong kernel is worthless). Families of benchmarks are registered in
FAMILIES; add an op by appending a function that returns its list of OpBench.

Conventions:
  ms       median wall time of `--repeats` calls after `--warmup` calls (min also reported);
           outputs are allocated by each call, as the library API does.
  GB/s     bytes() / median time, bytes() = compulsory traffic: every input read once and every
           output written once, 4 B per float32 (write-allocate traffic not counted).
  GFLOP/s  flops() / median time, flops() = adds and multiplies of the op's defining formulas
           (see each family's docstring for what is counted).
The NumPy side is the float64 reference's formulas (mapformer/reference.py) transcribed to
float32 arrays, computing each cos/sin once: what an eager-NumPy layer would run.

`--threads N` sets OMP_NUM_THREADS before the C core is loaded. Prints one JSON line at the end.
"""
import argparse
import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

TWO_PI32 = np.float32(2.0 * np.pi)


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


def timeit(fn, warmup, repeats):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(np.min(times))


# ---- path integration + rotary (MapWM) ----------------------------------------------------
def _np_path_integration_forward(delta, omega):
    theta = omega * np.cumsum(delta, axis=1)
    return theta - TWO_PI32 * np.floor(theta / TWO_PI32 + np.float32(0.5))


def _np_rotate(x, c, s):
    y = np.empty_like(x)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y[..., 0::2] = x0 * c - x1 * s
    y[..., 1::2] = x0 * s + x1 * c
    return y


def _np_rotary_forward(q, k, theta):
    c, s = np.cos(theta), np.sin(theta)
    return _np_rotate(q, c, s), _np_rotate(k, c, s)


def _np_rotary_backward(dq_out, dk_out, q, k, theta):
    c, s = np.cos(theta), np.sin(theta)
    dtheta = np.zeros(np.broadcast_shapes(q.shape[:-1] + (q.shape[-1] // 2,), theta.shape),
                      np.float32)
    grads = []
    for dy, x in ((dq_out, q), (dk_out, k)):
        dx = _np_rotate(dy, c, -s)  # R(theta)^T dy
        grads.append(dx)
        dtheta += x[..., 0::2] * dx[..., 1::2] - x[..., 1::2] * dx[..., 0::2]
    if theta.shape[0] == 1:
        dtheta = dtheta.sum(0, keepdims=True)
    return grads[0], grads[1], dtheta


def _np_path_integration_backward(dtheta, delta, omega, domega):
    ddelta = np.ascontiguousarray(np.flip(np.cumsum(np.flip(dtheta * omega, 1), 1), 1))
    domega += (dtheta * np.cumsum(delta, axis=1)).sum((0, 1))
    return ddelta


def _wrapped(a):
    return a - 2 * np.pi * np.floor(a / (2 * np.pi) + 0.5)


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
    NB = D // 2
    N = B * T * H * NB
    rng = np.random.default_rng(seed)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    delta = f32(B, T, H, NB)
    omega = (2 * np.pi * np.geomspace(1.0, 1.0 / 64, NB)[None].repeat(H, 0)).astype(np.float32)
    q, k, dq_out, dk_out, dtheta = f32(B, T, H, D), f32(B, T, H, D), f32(B, T, H, D), \
        f32(B, T, H, D), f32(B, T, H, NB)
    theta = C.path_integration_forward(delta, omega)
    domega_c, domega_np = np.zeros((H, NB), np.float32), np.zeros((H, NB), np.float32)
    sizes = dict(B=B, T=T, H=H, D=D, TB=B)

    def close(a, b, name, tol=2e-3):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = np.abs(a - b).max() / max(1.0, np.abs(b).max())
        assert err < tol, f"{name}: C and NumPy float32 differ by {err:.3g} (relative)"

    def check_pi_fwd():
        close(_wrapped(C.path_integration_forward(delta, omega)
                       - _np_path_integration_forward(delta, omega)), 0.0, "theta")

    def check_rot_fwd():
        for a, b, n in zip(C.rotary_forward(q, k, theta), _np_rotary_forward(q, k, theta),
                           ("q_out", "k_out")):
            close(a, b, n)

    def check_rot_bwd():
        for a, b, n in zip(C.rotary_backward(dq_out, dk_out, q, k, theta),
                           _np_rotary_backward(dq_out, dk_out, q, k, theta),
                           ("dq", "dk", "dtheta")):
            close(a, b, n)

    def check_pi_bwd():
        dc, dn = np.zeros_like(domega_c), np.zeros_like(domega_np)
        close(C.path_integration_backward(dtheta, delta, omega, dc),
              _np_path_integration_backward(dtheta, delta, omega, dn), "ddelta")
        close(dc, dn, "domega")

    def c_fwd():
        th = C.path_integration_forward(delta, omega)
        return C.rotary_forward(q, k, th)

    def np_fwd():
        th = _np_path_integration_forward(delta, omega)
        return _np_rotary_forward(q, k, th)

    def c_bwd():
        _, _, dth = C.rotary_backward(dq_out, dk_out, q, k, theta)
        return C.path_integration_backward(dth, delta, omega, domega_c)

    def np_bwd():
        _, _, dth = _np_rotary_backward(dq_out, dk_out, q, k, theta)
        return _np_path_integration_backward(dth, delta, omega, domega_np)

    def both(*checks):
        def run():
            for chk in checks:
                chk()
        return run

    return [
        OpBench("path_integration_forward", sizes, lambda: 2 * N, lambda: 8 * N,
                lambda: C.path_integration_forward(delta, omega),
                lambda: _np_path_integration_forward(delta, omega), check_pi_fwd),
        OpBench("rotary_forward", sizes, lambda: 12 * N, lambda: 36 * N,
                lambda: C.rotary_forward(q, k, theta), lambda: _np_rotary_forward(q, k, theta),
                check_rot_fwd),
        OpBench("rotary_backward", sizes, lambda: 20 * N, lambda: 56 * N,
                lambda: C.rotary_backward(dq_out, dk_out, q, k, theta),
                lambda: _np_rotary_backward(dq_out, dk_out, q, k, theta), check_rot_bwd),
        OpBench("path_integration_backward", sizes, lambda: 5 * N, lambda: 12 * N,
                lambda: C.path_integration_backward(dtheta, delta, omega, domega_c),
                lambda: _np_path_integration_backward(dtheta, delta, omega, domega_np),
                check_pi_bwd),
        OpBench("path_integration+rotary forward", sizes, lambda: 14 * N, lambda: 44 * N,
                c_fwd, np_fwd, both(check_pi_fwd, check_rot_fwd),
                notes="theta = path_integration(delta, omega); rotary(q, k, theta)"),
        OpBench("path_integration+rotary backward", sizes, lambda: 25 * N, lambda: 68 * N,
                c_bwd, np_bwd, both(check_rot_bwd, check_pi_bwd),
                notes="rotary backward, then path_integration backward of its dtheta"),
    ]


FAMILIES = {
    "rotary": rotary_benches,
}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES),
                   help="comma-separated subset of: " + ", ".join(FAMILIES))
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the C core (default: the environment's)")
    args = p.parse_args()
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    from mapformer import _C  # after OMP_NUM_THREADS is set: libgomp reads it once

    results = []
    for family in args.families.split(","):
        for b in FAMILIES[family](_C):
            b.check()
            c_ms, c_min = timeit(b.c, args.warmup, args.repeats)
            np_ms, np_min = timeit(b.numpy, args.warmup, args.repeats)
            row = {
                "family": family, "name": b.name, "sizes": b.sizes,
                "c_ms": round(c_ms * 1e3, 3), "c_min_ms": round(c_min * 1e3, 3),
                "numpy_ms": round(np_ms * 1e3, 3), "numpy_min_ms": round(np_min * 1e3, 3),
                "speedup": round(np_ms / c_ms, 2),
                "c_gbps": round(b.bytes() / c_ms / 1e9, 2),
                "numpy_gbps": round(b.bytes() / np_ms / 1e9, 2),
                "c_gflops": round(b.flops() / c_ms / 1e9, 2),
                "numpy_gflops": round(b.flops() / np_ms / 1e9, 2),
            }
            results.append(row)
            print(f"{b.name:<36} C {row['c_ms']:8.2f} ms ({row['c_gbps']:6.1f} GB/s, "
                  f"{row['c_gflops']:5.1f} GFLOP/s)   NumPy f32 {row['numpy_ms']:8.2f} ms "
                  f"({row['numpy_gbps']:5.1f} GB/s)   x{row['speedup']:.1f}")
    print(json.dumps({"bench": "ops", "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                      "repeats": args.repeats, "results": results}))


if __name__ == "__main__":
    main()
