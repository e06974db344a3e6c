"""Speed of the vq and lstm ops (TDB's issue): vq_forward at batch 32 x 400 positions,
K = 1000 codes of width 256, against the machine's sgemm rate on the same product measured
in the same run (NumPy's matmul; the issue asks for >= 70%), and the LSTM forward + backward
against the float32 NumPy reference; and the enc objective's ops (l2_normalize forward +
backward at 32 x 200 rows of width 128, ema_update over a cpu-scale teacher's 400k
parameters) against the NumPy arithmetic that tdb.py ran before them. Times are per-call
CPU times (--clock cpu, default) or wall times: minima for vq and lstm, medians for enc.
--parts picks the parts. Prints one JSON line at the end (with --json FILE, also writes it
there with the run's provenance: benchmarks/report.py; rows as bench_ops.py's).

    OMP_NUM_THREADS=1 python benchmarks/bench_vq_lstm.py
    OMP_NUM_THREADS=1 python benchmarks/bench_vq_lstm.py --parts enc --repeats 51
"""
import argparse
import time

import numpy as np

from report import add_json_option, emit  # the checkout first on sys.path

from mapformer import _C
from mapformer import reference as ref


def samples(fn, repeats, clock):
    times = []
    for _ in range(repeats):
        t = clock()
        fn()
        times.append(clock() - t)
    return times


def best(fn, repeats, clock):
    return min(samples(fn, repeats, clock))


def median(fn, repeats, clock):
    return float(np.median(samples(fn, repeats, clock)))


def row(family, name, sizes, c_s, numpy_s=None, **extra):
    """A timing row (benchmarks/report.py): times in seconds in, milliseconds out."""
    out = {"family": family, "name": name, "sizes": sizes, "c_ms": round(c_s * 1e3, 3)}
    if numpy_s is not None:
        out.update(numpy_ms=round(numpy_s * 1e3, 3), speedup=round(numpy_s / c_s, 2))
    return {**out, **extra}


def enc_ops(rows, width, ema_size, repeats, clock, rng):
    """The enc objective's C ops against tdb.py's former NumPy arithmetic (float32): two
    rows."""
    g = rng.standard_normal((rows, width)).astype(np.float32)
    dy = rng.standard_normal((rows, width)).astype(np.float32)

    def c_norm():
        y, norm = _C.l2_normalize_forward(g)
        _C.l2_normalize_backward(dy, y, norm)

    def numpy_norm():
        norm = ((g * g).sum(-1, keepdims=True) + 1e-12) ** 0.5
        y = g / norm
        (dy - y * (y * dy).sum(-1, keepdims=True)) / norm

    t_c, t_np = median(c_norm, repeats, clock), median(numpy_norm, repeats, clock)
    print(f"l2_normalize forward + backward {rows} x {width}: C {t_c * 1e3:.3f} ms, NumPy "
          f"{t_np * 1e3:.3f} ms ({t_np / t_c:.1f}x)")
    out = [row("enc", "l2_normalize forward + backward", {"N": rows, "C": width}, t_c, t_np)]
    t = rng.standard_normal(ema_size).astype(np.float32)
    src = rng.standard_normal(ema_size).astype(np.float32)

    def numpy_ema():
        t[:] *= 0.99
        t[:] += (1.0 - 0.99) * src

    t_c = median(lambda: _C.ema_update(t, src, 0.99), repeats, clock)
    t_np = median(numpy_ema, repeats, clock)
    print(f"ema_update over {ema_size} parameters: C {t_c * 1e3:.3f} ms, NumPy "
          f"{t_np * 1e3:.3f} ms ({t_np / t_c:.1f}x)")
    return out + [row("enc", "ema_update", {"parameters": ema_size}, t_c, t_np)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32 * 400)
    parser.add_argument("--codes", type=int, default=1000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--parts", default="vq,lstm,enc",
                        help="comma-separated: vq, lstm, enc (default all)")
    parser.add_argument("--enc-rows", type=int, default=32 * 200)
    parser.add_argument("--enc-width", type=int, default=128)
    parser.add_argument("--ema-size", type=int, default=400_000)
    add_json_option(parser)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= {"vq", "lstm", "enc"}:
        parser.error(f"--parts: unknown {sorted(parts - {'vq', 'lstm', 'enc'})}")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(0)
    results = []
    if "vq" in parts:
        results += vq(args, clock, rng)
    if "lstm" in parts:
        results += lstm(args, clock, rng)
    if "enc" in parts:
        results += enc_ops(args.enc_rows, args.enc_width, args.ema_size, args.repeats, clock,
                           np.random.default_rng(1))
    emit({"bench": "vq_lstm", "clock": args.clock, "repeats": args.repeats,
          "statistic": "minimum (vq, lstm), median (enc)", "results": results}, args.json)


def vq(args, clock, rng):
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
    sizes = {"N": args.rows, "K": args.codes, "C": args.width}
    return [row("vq", "vq_forward", sizes, t_vq, c_gflops=round(flop / t_vq / 1e9, 2),
                sgemm_ms=round(t_mm * 1e3, 3), fraction_of_sgemm=round(t_mm / t_vq, 3)),
            row("vq", "vq_backward", sizes, t_back)]


def lstm(args, clock, rng):
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
    return [row("lstm", "lstm forward + backward", {"B": B, "T": T, "C": C, "H": H}, t_c, t_np)]


if __name__ == "__main__":
    main()
