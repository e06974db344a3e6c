"""The CUDA scan and group kernels' speed on a GPU (cuda/scan.cu, sln.cu, b4.cu, nc.cu through
mapformer.cuda.gpu_ops(): a CUDA build and CuPy), each checked against the C core
(mapformer._C) on the same inputs before it is timed.

  ms        median of --repeats calls after --warmup, CUDA events on CuPy's current stream;
  Gsteps/s  state updates per second: B T E K for the scans (K complex states for
            complex_scan), B T H NB block positions for sln, b4, nc;
  error     the largest difference from the C core relative to its largest |value|.

With --emulate the same script runs the kernels' CPU emulation build (tests/cuda_emulation.py)
on NumPy arrays at tiny sizes: a check that the script and the ops work; its times are the
emulator's, not a GPU's (the JSON says so). Prints one JSON line at the end.

    python benchmarks/bench_cuda_scans.py                     # on a GPU
    python benchmarks/bench_cuda_scans.py --emulate --tiny    # anywhere: a check of the script
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_cuda import add_common_arguments, backend, measure, relative_error  # noqa: E402
from mapformer import _C  # noqa: E402  (bench_cuda put the repository on sys.path)


def benches(ops, dev, host, s):
    """[(name, steps, call, check)]: check() -> the error against the C core."""
    rng = np.random.default_rng(0)

    def r(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    B, T, E, K, chunk = s["batch"], s["seq"], s["channels"], s["states"], s["chunk"]
    out = []
    for cx in (False, True):
        Kc = K // 2 if cx else K  # the same state floats per channel
        S = 2 * Kc if cx else Kc
        x = r(B, T, E)
        delta = np.log1p(np.exp(r(B, T, E) * 1.5 - 2)).astype(np.float32)
        A = (-np.arange(1, Kc + 1) * rng.uniform(0.05, 1.0, (E, 1))).astype(np.float32)
        args = [x, delta] + ([r(B, T, E)] if cx else []) + [A] + (
            [r(E, Kc, scale=3.0)] if cx else []) + [r(B, T, S), r(B, T, S), r(E)]
        dargs = [dev(a) for a in args]
        dy = r(B, T, E)
        ddy = dev(dy)
        name = "complex_scan" if cx else "selective_scan"
        fwd, bwd = getattr(ops, f"{name}_forward"), getattr(ops, f"{name}_backward")
        cfwd, cbwd = getattr(_C, f"{name}_forward"), getattr(_C, f"{name}_backward")
        pshapes = [A.shape, A.shape, (E,)] if cx else [A.shape, (E,)]
        for bbar in ("euler", "zoh"):
            kw = dict(chunk=chunk, bbar=bbar)
            y_c, st_c = cfwd(*args, **kw)
            y, st = fwd(*dargs, **kw)
            grads_c = cbwd(dy, *args, st_c, *[np.zeros(p, np.float32) for p in pshapes], **kw)

            def fcheck(fwd=fwd, dargs=dargs, kw=kw, y_c=y_c):
                return relative_error(host(fwd(*dargs, **kw)[0]), y_c)

            def bcheck(bwd=bwd, dargs=dargs, st=st, kw=kw, grads_c=grads_c, ddy=ddy,
                       pshapes=pshapes):
                got = bwd(ddy, *dargs, st, *[dev(np.zeros(p, np.float32)) for p in pshapes],
                          **kw)
                return max(relative_error(host(g), w) for g, w in zip(got, grads_c))
            params = [dev(np.zeros(p, np.float32)) for p in pshapes]
            out.append((f"{name}_forward {bbar}", B * T * E * Kc,
                        lambda fwd=fwd, dargs=dargs, kw=kw: fwd(*dargs, **kw), fcheck))
            out.append((f"{name}_backward {bbar}", B * T * E * Kc,
                        lambda bwd=bwd, dargs=dargs, st=st, kw=kw, params=params, ddy=ddy:
                        bwd(ddy, *dargs, st, *params, **kw), bcheck))
    Bg, Tg, H, NB = s["batch"], s["seq"], s["heads"], s["blocks"]
    steps = Bg * Tg * H * NB
    groups = {
        "sln": ([r(Bg, Tg, H, NB, scale=0.3), r(H, NB, 4), r(H, 2 * NB)], 2, (3.0,)),
        "b4": ([r(Bg, Tg, H, NB, scale=0.5), r(H, NB, 6), r(H, 4 * NB)], 4, ()),
        "nc": ([r(Bg, Tg, H, 6, NB, scale=0.5), r(H, 4 * NB)], 4, ()),
    }
    for name, (args, width, extra) in groups.items():
        dargs = [dev(a) for a in args]
        dp = r(Bg, Tg, H, width * NB)
        ddp = dev(dp)
        fwd, bwd = getattr(ops, f"{name}_forward"), getattr(ops, f"{name}_backward")
        cfwd, cbwd = getattr(_C, f"{name}_forward"), getattr(_C, f"{name}_backward")
        acc = args[1:]  # the parameter gradients (dgen, dstart or dstart) have their shapes
        p_c = cfwd(*args, *extra)
        d_c = cbwd(dp, *args, *[np.zeros_like(a) for a in acc], *extra)

        def fcheck(fwd=fwd, dargs=dargs, extra=extra, p_c=p_c):
            return relative_error(host(fwd(*dargs, *extra)), p_c)

        def bcheck(bwd=bwd, dargs=dargs, acc=acc, extra=extra, d_c=d_c, ddp=ddp):
            got = bwd(ddp, *dargs, *[dev(np.zeros_like(a)) for a in acc], *extra)
            return relative_error(host(got), d_c)
        params = [dev(np.zeros_like(a)) for a in acc]
        out.append((f"{name}_forward", steps,
                    lambda fwd=fwd, dargs=dargs, extra=extra: fwd(*dargs, *extra), fcheck))
        out.append((f"{name}_backward", steps,
                    lambda bwd=bwd, dargs=dargs, params=params, extra=extra, ddp=ddp:
                    bwd(ddp, *dargs, *params, *extra), bcheck))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(p, repeats=10, warmup=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--channels", type=int, default=256, help="scans: channels E")
    p.add_argument("--states", type=int, default=16,
                   help="scans: state floats per channel (K real, K / 2 complex)")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--heads", type=int, default=4, help="sln, b4, nc: heads H")
    p.add_argument("--blocks", type=int, default=16, help="sln, b4, nc: blocks NB per head")
    a = p.parse_args()
    sizes = dict(batch=a.batch, seq=a.seq, channels=a.channels, states=a.states,
                 chunk=a.chunk, heads=a.heads, blocks=a.blocks)
    if a.tiny:
        sizes = dict(batch=2, seq=19, channels=9, states=4, chunk=8, heads=2, blocks=3)
        a.repeats, a.warmup = 1, 0
    ops, dev, host, sync, device = backend(a.emulate)
    results = []
    for name, steps, call, check in benches(ops, dev, host, sizes):
        ms, error = measure(name, call, check, a, sync)
        row = dict(op=name, ms=round(ms, 4), **{"Gsteps/s": round(steps / ms / 1e6, 3)},
                   error=error)
        results.append(row)
        print(f"{name:30s} {ms:10.4f} ms  Gsteps/s {row['Gsteps/s']}  err {error:.2g}")
    print(json.dumps(dict(device=device, sizes=sizes, results=results)))


if __name__ == "__main__":
    main()
