"""Choose the attention kernels' block and register tile for one kernel set by measurement.

Compiles benchmarks/attention_tiles.c (the kernels of csrc/ops/kernels/attention.h, alone)
once per candidate shape (block BT, tile rows MR, tile vectors NV) with the kernel set's vector
width and ISA flags, then runs the candidates in alternation, `--rounds` times each, at the
training step's attention size (batch 128, 256 tokens, 2 heads of 64 by default). Each run
reports the minimum over `--repeats` calls (the least disturbed by other work on a shared
machine) of the wall time or, with `--clock cpu` (the default for one thread), of the
process's CPU time, which does not count the time a thread waited for a core; the table
gives, per shape, the median over rounds of those minima, for the forward and the backward
of plain attention (kind 3) and of the conjunctive score_product mode (kind 0), and their
rate in GFLOP/s of the products the step needs (2 T^2 D B H / 2 flops per product: 2
forward, 4 backward for plain; 3 and 6 conjunctive). Every shape must print the same
checksums up to float32 rounding (checked).

Example (AVX2, one thread):
  python benchmarks/attention_tiles.py --set avx2 --threads 1 --shapes 48x4x3,48x6x2,64x4x2
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = {  # vector width, ISA flags (setup.py's)
    "avx512": (16, ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"]),
    "avx2": (8, ["-mavx2", "-mfma"]),
    "portable": (4, []),
}
FLAGS = ["-std=c11", "-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wall",
         "-Wextra", "-lm"]


def build(kset, shape, outdir):
    vw, isa = SETS[kset]
    bt, mr, nv = shape
    exe = os.path.join(outdir, f"tiles_{kset}_{bt}x{mr}x{nv}")
    subprocess.run(["gcc", *FLAGS[:-1], *isa, f"-I{ROOT}/csrc/include", f"-DMF_VW={vw}",
                    f"-DMF_ATTN_BT={bt}", f"-DMF_ATTN_MR={mr}", f"-DMF_ATTN_NV={nv}",
                    "-DMF_ATTN_TABLE=tiles_kernels",
                    os.path.join(ROOT, "benchmarks", "attention_tiles.c"), "-o", exe, "-lm"],
                   check=True)
    return exe


def run(exe, args, kind):
    out = subprocess.run([exe, str(args.batch), str(args.seq), str(args.heads),
                          str(args.head_dim), str(kind), str(args.repeats), str(args.threads)],
                         check=True, capture_output=True, text=True).stdout.split()
    return {out[i]: float(out[i + 1]) for i in range(0, len(out), 2)}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", default="avx2", choices=sorted(SETS))
    p.add_argument("--shapes", default="48x4x3,48x6x2,64x4x2",
                   help="comma-separated BTxMRxNV candidates")
    p.add_argument("--kinds", default="3,0", help="3 plain attention; 0, 1, 2 conj modes")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="default: cpu for one thread, wall for more")
    args = p.parse_args()
    clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    key = "_cpu_min" if clock == "cpu" else "_min"
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    kinds = [int(k) for k in args.kinds.split(",")]
    half = args.batch * args.heads * args.seq * args.seq * args.head_dim  # 2 T^2 D / 2 per bh
    products = {3: (2, 4), 0: (3, 6), 1: (3, 6), 2: (3, 6)}
    with tempfile.TemporaryDirectory() as tmp:
        exes = {shape: build(args.set, shape, tmp) for shape in shapes}
        runs = {(shape, kind): [] for shape in shapes for kind in kinds}
        for r in range(args.rounds):  # alternate: every shape once per round, order rotated
            order = list(itertools.product(shapes, kinds))
            order = order[r % len(order):] + order[:r % len(order)]
            for shape, kind in order:
                runs[shape, kind].append(run(exes[shape], args, kind))
    table = []
    for kind in kinds:
        sums = [statistics.median(x["out"] for x in runs[s, kind]) for s in shapes]
        assert max(sums) - min(sums) <= 1e-4 * max(sums), ("shapes disagree", kind, sums)
        for shape in shapes:
            fwd = statistics.median(x["fwd" + key] for x in runs[shape, kind])
            bwd = statistics.median(x["bwd" + key] for x in runs[shape, kind])
            nf, nb = products[kind]
            row = dict(set=args.set, shape="x".join(map(str, shape)), kind=kind,
                       threads=args.threads, clock=clock, fwd_ms=round(fwd, 2),
                       bwd_ms=round(bwd, 2),
                       fwd_gflops=round(nf * half / fwd / 1e6, 1),
                       bwd_gflops=round(nb * half / bwd / 1e6, 1))
            table.append(row)
            print(f"{args.set} BT x MR x NV {row['shape']:>8}  kind {kind}: forward "
                  f"{fwd:7.2f} ms ({row['fwd_gflops']:5.1f} GFLOP/s)  backward {bwd:7.2f} ms "
                  f"({row['bwd_gflops']:5.1f} GFLOP/s)")
    print(json.dumps({"bench": "attention_tiles", "rounds": args.rounds,
                      "repeats": args.repeats, "results": table}))


if __name__ == "__main__":
    main()
