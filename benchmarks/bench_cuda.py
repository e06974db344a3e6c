"""The CUDA kernels' speed on a GPU (mapformer.cuda.gpu_ops(): a CUDA build and CuPy), each
checked against the C core (mapformer._C) on the same inputs before it is timed.

  ms       median of --repeats calls after --warmup, timed with CUDA events on CuPy's current
           stream (outputs allocated by each call, as the ops do);
  TFLOP/s  flops / ms for attention (causal: the forward's two products over the lower
           triangle, 2 B H T^2 D; the backward's five, 5 B H T^2 D), conj_attention (4 and
           8 B H T^2 D), cope's forward (counted as attention's), linear and mlp
           (2 N Cin Cout per product);
  GB/s     compulsory bytes (every input read and every output written once, 4 B a float) /
           ms for the memory-bound ops.

With --emulate the same script runs the kernels' CPU emulation build (tests/cuda_emulation.py)
on NumPy arrays at tiny sizes: it checks that the script and the ops work, and its times are
the emulator's, not a GPU's (the JSON says so). Prints one JSON line at the end.

    python benchmarks/bench_cuda.py                     # on a GPU
    python benchmarks/bench_cuda.py --emulate --tiny    # anywhere: a check of the script
"""
import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mapformer import _C, cuda  # noqa: E402


def relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def benches(ops, dev, sizes):
    """[(name, flops, bytes, call, check)]: check() -> the largest error relative to the
    largest |value| of the C core's result."""
    rng = np.random.default_rng(0)
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    B, T, H, D = sizes["batch"], sizes["seq"], sizes["heads"], sizes["head_dim"]
    N, C = sizes["rows"], sizes["width"]
    q, k, v, dout = r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D)
    dq, dk, dv = dev(q), dev(k), dev(v)
    out_c, lse_c = _C.attention_forward(q, k, v)
    out, lse = ops.attention_forward(dq, dk, dv)
    ddout = dev(dout)
    conj_c = _C.conj_attention_forward(q, k, q, k, v)
    conj = ops.conj_attention_forward(dq, dk, dq, dk, dv)
    e = r(H, 64, D)
    de = dev(e)
    x, w, b = r(N, C), r(4 * C, C), r(4 * C)
    w_proj, b_proj = r(C, 4 * C), r(C)
    dx, dw, db, dwp, dbp = dev(x), dev(w), dev(b), dev(w_proj), dev(b_proj)
    n = N * C
    theta = r(B, T, H, D // 2)
    dtheta = dev(theta)
    params, grads = r(n), r(n)
    m, vv, mask = np.zeros(n, np.float32), np.zeros(n, np.float32), np.ones(n, bool)
    state = [dev(a) for a in (params, m, vv)]
    dgrads, dmask = dev(grads), dev(mask)
    omega = r(H, D // 2)
    domega = dev(omega)
    host = lambda a: np.asarray(a.get() if hasattr(a, "get") else a)  # noqa: E731

    def adamw_check():
        got, want = [dev(a.copy()) for a in (params, m, vv)], [a.copy() for a in (params, m, vv)]
        ops.adamw_step(got[0], dgrads, got[1], got[2], dmask, lr=1e-3, step=1)
        _C.adamw_step(want[0], grads, want[1], want[2], mask, lr=1e-3, step=1)
        return max(relative_error(host(g), w) for g, w in zip(got, want))
    att = B * H * T * T * D
    return [
        ("attention_forward", 2 * att, 4 * (4 * B * T * H * D + B * H * T),
         lambda: ops.attention_forward(dq, dk, dv),
         lambda: relative_error(host(out), out_c)),
        ("attention_backward", 5 * att, 4 * (7 * B * T * H * D + B * H * T),
         lambda: ops.attention_backward(ddout, dq, dk, dv, out, lse),
         lambda: max(relative_error(host(a), e) for a, e in zip(
             ops.attention_backward(ddout, dq, dk, dv, out, lse),
             _C.attention_backward(dout, q, k, v, out_c, lse_c)))),
        # conjunctive attention (score_product): four products over the lower triangle
        # forward, eight backward, 2 B H T^2 D / 2 each
        ("conj_attention_forward", 4 * att, 4 * (6 * B * T * H * D + B * H * T),
         lambda: ops.conj_attention_forward(dq, dk, dq, dk, dv),
         lambda: relative_error(host(ops.conj_attention_forward(dq, dk, dq, dk, dv)[0]),
                                _C.conj_attention_forward(q, k, q, k, v)[0])),
        ("conj_attention_backward", 8 * att, 4 * (13 * B * T * H * D + B * H * T),
         lambda: ops.conj_attention_backward(ddout, dq, dk, dq, dk, dv, *conj),
         lambda: max(relative_error(host(a), e) for a, e in zip(
             ops.conj_attention_backward(ddout, dq, dk, dq, dk, dv, *conj),
             _C.conj_attention_backward(dout, q, k, q, k, v, *conj_c)))),
        ("cope_forward", 2 * att, 4 * (4 * B * T * H * D + B * H * T),
         lambda: ops.cope_forward(dq, dk, dv, de),
         lambda: relative_error(host(ops.cope_forward(dq, dk, dv, de)[0]),
                                _C.cope_forward(q, k, v, e)[0])),
        ("linear_forward", 2 * N * C * 4 * C, 4 * (N * C + 4 * C * C + 4 * N * C),
         lambda: ops.linear_forward(dx, dw, db),
         lambda: relative_error(host(ops.linear_forward(dx, dw, db)),
                                _C.linear_forward(x, w, b))),
        ("mlp_forward", 4 * N * C * 4 * C, 4 * (2 * N * C + 8 * C * C + 4 * N * C),
         lambda: ops.mlp_forward(dx, dw, db, dwp, dbp),
         lambda: relative_error(host(ops.mlp_forward(dx, dw, db, dwp, dbp)[0]),
                                _C.mlp_forward(x, w, b, w_proj, b_proj)[0])),
        ("gelu_forward", None, 8 * n, lambda: ops.gelu_forward(dx),
         lambda: relative_error(host(ops.gelu_forward(dx)), _C.gelu_forward(x))),
        ("layernorm_forward", None, 4 * (2 * n + 2 * C + 2 * N),
         lambda: ops.layernorm_forward(dx, dbp, dbp),
         lambda: relative_error(host(ops.layernorm_forward(dx, dbp, dbp)[0]),
                                _C.layernorm_forward(x, b_proj, b_proj)[0])),
        ("rotary_forward", None, 4 * (4 * B * T * H * D + B * T * H * D // 2),
         lambda: ops.rotary_forward(dq, dk, dtheta),
         lambda: relative_error(host(ops.rotary_forward(dq, dk, dtheta)[0]),
                                _C.rotary_forward(q, k, theta)[0])),
        ("path_integration_forward", None, 4 * (2 * B * T * H * D // 2 + H * D // 2),
         lambda: ops.path_integration_forward(dtheta, domega),
         lambda: relative_error(host(ops.path_integration_forward(dtheta, domega)),
                                _C.path_integration_forward(theta, omega))),
        ("adamw_step", None, 4 * 7 * n + n,
         lambda: ops.adamw_step(*state[:1], dgrads, *state[1:], dmask, lr=1e-3, step=1),
         adamw_check),
    ]


def add_common_arguments(p, repeats, warmup):
    """The options every CUDA benchmark script shares: --emulate, --tiny, --repeats,
    --warmup, --max-error."""
    p.add_argument("--emulate", action="store_true",
                   help="run the CPU emulation build on NumPy arrays (a check, not a speed)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (with --emulate)")
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--max-error", type=float, default=1e-3,
                   help="largest error relative to the C core's largest |value| allowed")


def backend(emulate):
    """(ops, dev, host, sync, device): the emulation build on NumPy arrays (emulate) or the
    GPU through CuPy; dev / host move an array there / back, device names the machine
    (and, on a GPU, the path of the matrix products: cuBLAS or the kernels' tiles)."""
    if emulate:
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        from cuda_emulation import Emulation, build

        return (cuda.ops(Emulation(build()).lib, np), np.asarray, np.asarray, lambda: None,
                "CPU emulation (not a GPU speed)")
    lib, cupy = cuda.load()
    return (cuda.gpu_ops(), cupy.asarray, cupy.asnumpy,
            cupy.cuda.get_current_stream().synchronize,
            cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
            + f", matrix products on {cuda.products(lib)}")


def measure(name, call, check, a, sync):
    """(ms, error): check() against the C core (SystemExit past a.max_error), then the median
    of a.repeats calls after a.warmup (CUDA events, or the wall clock with a.emulate)."""
    error = check()
    if not error <= a.max_error:
        raise SystemExit(f"{name}: error {error:.3g} against the C core > {a.max_error}")
    for _ in range(a.warmup):
        call()
    sync()
    times = []
    for _ in range(a.repeats):
        if a.emulate:
            t0 = time.perf_counter()
            call()
            times.append(1e3 * (time.perf_counter() - t0))
        else:
            import cupy

            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times)), error


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p, repeats=20, warmup=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--rows", type=int, default=16384, help="linear, mlp, elementwise: rows N")
    p.add_argument("--width", type=int, default=256, help="linear, mlp: width C (F = 4C)")
    a = p.parse_args()
    sizes = dict(batch=a.batch, seq=a.seq, heads=a.heads, head_dim=a.head_dim, rows=a.rows,
                 width=a.width)
    if a.tiny:
        sizes = dict(batch=1, seq=37, heads=2, head_dim=16, rows=40, width=16)
        a.repeats, a.warmup = 2, 1
    ops, dev, _, sync, device = backend(a.emulate)
    results = []
    for name, flops, nbytes, call, check in benches(ops, dev, sizes):
        ms, error = measure(name, call, check, a, sync)
        row = dict(op=name, ms=round(ms, 4), error=error)
        if flops:
            row["TFLOP/s"] = round(flops / ms / 1e9, 3)
        row["GB/s"] = round(nbytes / ms / 1e6, 2)
        results.append(row)
        print(f"{name:26s} {ms:10.4f} ms  " + "  ".join(
            f"{k} {row[k]}" for k in ("TFLOP/s", "GB/s") if k in row) + f"  err {error:.2g}")
    print(json.dumps(dict(device=device, sizes=sizes, results=results)))


if __name__ == "__main__":
    main()
