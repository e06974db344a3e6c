"""Milliseconds of the Mamba / MAMPa block's x-projection (u (N, E) -> dt_in (N, R), B, C (N, S)),
forward + backward (its products accumulated into u's gradient, as in the block), written as
three thin products (x_dt, x_B, x_C) against the one stacked product the block runs
(mapformer.mixers.mamba.x_proj_forward / x_proj_backward).

Defaults: the training step's shape (bench_train_step.py: batch 128 x 256 tokens, d_model 128,
so E = 256, R = 8, S = 16). The two ways alternate, repeats times each; medians. One thread:
OMP_NUM_THREADS=1. Prints one JSON line at the end.
"""
import argparse
import json
import time
from types import SimpleNamespace

import numpy as np

from mapformer import backend
from mapformer.mixers.mamba import x_proj_backward, x_proj_forward


def layer(rng, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    return SimpleNamespace(weight=SimpleNamespace(value=w, grad=np.zeros_like(w)))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=128 * 256)
    p.add_argument("--E", type=int, default=256)
    p.add_argument("--R", type=int, default=8)
    p.add_argument("--S", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = p.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ops, rng = backend.C, np.random.default_rng(0)
    u = rng.standard_normal((args.rows, args.E)).astype(np.float32)
    layers = [layer(rng, r, args.E) for r in (args.R, args.S, args.S)]
    dys = [rng.standard_normal((args.rows, r)).astype(np.float32)
           for r in (args.R, args.S, args.S)]

    def separate():
        for lay in layers:
            ops.linear_forward(u, lay.weight.value, None)
        for lay, dy in zip(layers, dys):
            ops.linear_backward(dy, u, lay.weight.value, lay.weight.grad, None, du)

    def stacked():
        w, _ = x_proj_forward(ops, u, layers)
        x_proj_backward(ops, w, u, layers, dys, du)

    du = np.zeros_like(u)  # u's gradient from the scan, which both accumulate into
    times = {"separate": [], "stacked": []}
    for _ in range(args.repeats):
        for name, fn in (("separate", separate), ("stacked", stacked)):
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    figures = {"rows": args.rows, "E": args.E, "R": args.R, "S": args.S, "clock": args.clock}
    for name, ts in times.items():
        figures[f"{name}_ms"] = round(float(np.median(ts)) * 1e3, 1)
        print(f"{name}: {np.median(ts) * 1e3:.1f} ms (forward + backward, median of "
              f"{args.repeats})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
