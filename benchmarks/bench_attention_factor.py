"""The attention op's per-pair logit factor (pos_ids, pair_factor: APE's distance decay on
ape_grid and ape_tree) against the plain op, forward and backward, per kernel set.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/bench_attention_factor.py \\
        --kernel-sets avx512,blas

Causal attention at (batch, seq, heads, head dim) = (32, 256, 2, 64) by default, the table
gamma^|i - j| on pos_ids = arange(T) (T x T positions: the largest table a sequence of T
tokens needs). Each (set, direction) alternates the plain and the table call for --rounds
rounds of --repeats calls; the figure is the median over rounds of each round's median, in
the process's CPU time (all threads': on a shared machine one-thread figures stay
comparable), and the ratio table / plain of those medians. Prints one JSON line at the end
(with --json FILE, also writes it there with the run's provenance: benchmarks/report.py)."""
import argparse
import statistics
import time

import numpy as np

from report import add_json_option, emit  # the checkout first on sys.path

from mapformer import _C


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernel-sets", default=None,
                        help="comma-separated (default: every set this CPU runs)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    B, T, H, D = args.batch, args.seq, args.heads, args.head_dim
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(4))
    i = np.arange(T)
    factor = dict(pos_ids=np.tile(i.astype(np.int32), (B, 1)),
                  pair_factor=(0.98 ** np.abs(i[:, None] - i[None, :])).astype(np.float32))
    sets = args.kernel_sets.split(",") if args.kernel_sets else _C.kernel_sets()
    before = _C.kernels()
    results = []
    try:
        for kset in sets:
            _C.set_kernels(kset)
            saved = {"plain": _C.attention_forward(q, k, v),
                     "table": _C.attention_forward(q, k, v, **factor)}
            calls = {}
            for name, kw in (("plain", {}), ("table", factor)):
                out, lse = saved[name]
                calls["forward", name] = lambda kw=kw: _C.attention_forward(q, k, v, **kw)
                calls["backward", name] = lambda kw=kw, out=out, lse=lse: \
                    _C.attention_backward(dout, q, k, v, out, lse, **kw)
            rounds = {key: [] for key in calls}
            for _ in range(args.rounds):
                for key, fn in calls.items():
                    rounds[key].append(timed(fn, args.repeats))
            for direction in ("forward", "backward"):
                plain = statistics.median(rounds[direction, "plain"])
                table = statistics.median(rounds[direction, "table"])
                print(f"attention_{direction} [{kset}] (B={B}, T={T}, H={H}, D={D}): plain "
                      f"{plain:.2f} ms, table {table:.2f} ms, table / plain {table / plain:.3f}")
                results.append({"family": "attention", "name": f"attention_{direction}[{kset}] "
                                "with the pair factor", "sizes": {"B": B, "T": T, "H": H, "D": D},
                                "c_ms": round(table, 3), "plain_ms": round(plain, 3),
                                "factor_over_plain": round(table / plain, 3)})
    finally:
        _C.set_kernels(before)
    emit({"bench": "attention_factor", "clock": "cpu", "repeats": args.repeats,
          "rounds": args.rounds, "results": results}, args.json)


if __name__ == "__main__":
    main()
