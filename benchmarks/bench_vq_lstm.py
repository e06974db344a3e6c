"""Speed of the vq and lstm ops (TDB's issue): vq_forward at batch 32 x 400 positions,
K = 1000 codes of width 256, against the machine's sgemm rate on the same product measured
in the same run (NumPy's matmul; the issue asks for >= 70%), and the LSTM forward + backward
against the float32 NumPy reference. Times are per-call CPU-time minima (--clock cpu,
default) or wall-time minima.

    OMP_NUM_THREADS=1 python benchmarks/bench_vq_lstm.py
"""
import argparse
import time

import numpy as np

from mapformer import _C
from mapformer import reference as ref


def best(fn, repeats, clock):
    times = []
    for _ in range(repeats):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32 * 400)
    parser.add_argument("--codes", type=int, default=1000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(0)
    z = rng.standard_normal((args.rows, 1, args.width)).astype(np.float32)
    cb = rng.standard_normal((1, args.codes, args.width)).astype(np.float32)
    flop = 2 * args.rows * args.codes * args.width
    t_vq = best(lambda: _C.vq_forward(z, cb), args.repeats, clock)
    z2, e = z[:, 0], cb[0]
    t_mm = best(lambda: z2 @ e.T, args.repeats, clock)
    print(f"vq_forward {args.rows} x {args.codes} codes x {args.width}: {t_vq * 1e3:.1f} ms "
          f"({flop / t_vq / 1e9:.1f} GFLOP/s); sgemm alone {t_mm * 1e3:.1f} ms "
          f"({flop / t_mm / 1e9:.1f} GFLOP/s): {t_mm / t_vq:.0%} of the sgemm rate")
    _, idx, _, _ = _C.vq_forward(z, cb)
    dcb = np.zeros_like(cb)
    t_back = best(lambda: _C.vq_backward(z, z, cb, idx, dcb, 1.0, 0.25), args.repeats, clock)
    print(f"vq_backward: {t_back * 1e3:.1f} ms")

    B, T, C, H = 32, 400, 128, 128
    x = (rng.standard_normal((B, T, C)) * 0.5).astype(np.float32)
    w_ih, w_hh = ((rng.standard_normal((4 * H, n)) / np.sqrt(n)).astype(np.float32)
                  for n in (C, H))
    b = np.zeros(4 * H, np.float32)
    dh = rng.standard_normal((B, T, H)).astype(np.float32)
    grads = [np.zeros_like(a) for a in (w_ih, w_hh, b)]

    def c_step():
        h, c, g = _C.lstm_forward(x, w_ih, w_hh, b)
        _C.lstm_backward(dh, x, w_ih, w_hh, h, c, g, *grads)

    def numpy_step():
        h, c, g = ref.lstm_forward(x, w_ih, w_hh, b, dtype=np.float32)
        ref.lstm_backward(dh, x, w_ih, w_hh, h, c, g, dtype=np.float32)

    t_c = best(c_step, args.repeats, clock)
    t_np = best(numpy_step, max(1, args.repeats // 2), clock)
    print(f"lstm forward + backward B {B} T {T} C {C} H {H}: C {t_c * 1e3:.1f} ms, NumPy "
          f"float32 reference {t_np * 1e3:.1f} ms ({t_np / t_c:.1f}x)")


if __name__ == "__main__":
    main()
