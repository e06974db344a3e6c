"""Milliseconds per training step (forward + backward + clipping + AdamW) at the MapFormer
paper's scale, against two bounds on each kernel set the CPU has.

Defaults: batch 128, 256 tokens, d_model 128, 2 heads (head dim 64), 1 layer, navigation
tokens. For every kernel set (`--kernel-sets`, default all this CPU runs) the steps run on that
set, and the step's matrix-multiply flops are set against
  fma bound      the machine's own limit: its multiply-add issue rate at the set's vector width
                 on every thread (benchmarks/fma_peak.c, compiled and run by this script:
                 avx512 512-bit FMAs, avx2 256-bit, portable 128-bit unfused multiply + add;
                 blas, whose OpenBLAS kernels pick their own width, at the widest the CPU has);
  product bound  the library's own product rate on that set (x (16384, 512) times a 512 x 512
                 weight through the C core's linear op: the largest weight it multiplies on
                 the set's row-block kernels, a larger one going to OpenBLAS on every set;
                 best of 30, before and after the steps).
Each model prints its ms per step and the two ratios step / bound. Peak RSS is ru_maxrss of
this process after the steps of the first kernel set (the product's matrices are freed before
them).

Matmul flops of a step: 3x the forward's (the backward does twice the forward's products:
dV, dP, and dQ, dK per score; linears dX and dW), the forward's counted by
mapformer.models.forward_flops from what each registered component declares (N = B*T rows,
C width, V vocab, r Delta rank, 4C the MLP width):
  mixer            attention: 2 N 4 C^2 (q, k, v, out) + over the causal half, B H T^2 D per
                   matmul, scores and PV; conjunctive (mapem_os, mapem_s): q, k and the content
                   scores only with content scores (mapem_os), plus the positional scores;
                   mamba, mampa (E = 2C inner channels, R = ceil(C/16), S = d_state): 2 N (2 C E
                   + E (R + 2S) + R E + E C) (in_x, in_z, x_dt, x_B, x_C, dt, out; mampa with
                   signed_angle also dt_angle), the scan and the conv1d are not matmuls
  scheme           mapwm, mapem: 2 N r (C + C/2) (Delta); cope: 2 N C n_pos (its position
                   logits); tape: B H T^2 D (the state's PV) + 2 N C H (its gate); rope, none: 0
  MLP, head        2 N 2 * 4 C^2; 2 N C V
The attention backward's recomputation of the scores is not counted: it is an implementation
choice, not work the step needs.

`--models` takes presets and preset/scheme pairs (rope/ape_seq, rope/gridpe, rope/ape_grid).
With `--task rooms` it takes the rows of TDB's Table 1 instead (transformer, lstm, the TDB
rows; default all), each stepping as mapformer.reproduce.tdb trains it at `--scale` (cpu: batch
32, walks of 200 steps = 400 tokens, width 128, 2 layers, 4 heads, K 500), the teacher's EMA
after TDB's enc row's steps; TDB's flops are mapformer.tdb.step_flops's (the body's blocks, the
VQ's distances 2 B N C K, the heads' layers, 3x, plus the enc teacher's forward).

    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --task rooms --kernel-sets avx512
APE's generator side runs on NumPy's OpenBLAS: set OPENBLAS_NUM_THREADS=1 for it (its own
threads fight the C core's OpenMP ones).

With --backend cuda the same steps run on the CUDA backend (a CUDA build, CuPy and a GPU;
wall clock, the stream synchronized after each step), the one bound is cuBLAS's float32 sgemm
rate through CuPy (CUDA events), and the per-op table's step synchronizes after every op (so
its ops' times add up to more than the step's, which overlaps launches with the GPU's work).

Prints one JSON line at the end (with --json FILE, also writes it there, with the run's
provenance: commit, CPU, threads, OpenBLAS); docs/gen_pages.py renders the performance pages
from such files.
"""
import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from report import add_json_option, emit  # noqa: E402  the checkout first on sys.path

from mapformer import _C, backend, tdb  # noqa: E402
from mapformer.models import MODELS, ModelConfig, Transformer, forward_flops  # noqa: E402
from mapformer.reproduce import tdb as tdb_table  # noqa: E402
from mapformer.tasks import navigation, rooms  # noqa: E402
from mapformer.train import AdamW, TrainConfig, model_kind  # noqa: E402


def step_flops(cfg, batch, tokens):
    """Matmul flops of one step: 3x the forward's (backward = 2 forward); TDB's by
    mapformer.tdb.step_flops (its enc teacher's forward added)."""
    if isinstance(cfg, tdb.TDBConfig):
        return tdb.step_flops(cfg, batch, tokens)
    return 3 * forward_flops(cfg, batch, tokens)


# the clock every figure is taken with: wall time, or with --clock cpu the process's CPU time
# (all threads'; on a shared machine a one-thread run's figures then leave out the time the
# thread waited for a core)
clock = time.perf_counter


PRODUCT_WIDTH = 512  # the widest square weight csrc/ops/linear.c multiplies on the kernel set
GPU_PRODUCT = 2048  # cuBLAS's square sgemm


def product_rate(rows, repeats, on_gpu=False):
    """Best GFLOP/s of the library's own products on the active kernel set: x (rows, 512)
    times a 512 x 512 weight through the C core's linear op (the largest weight it multiplies
    with the set's row-block kernels; a larger one goes to OpenBLAS on every set), its row
    blocks over the OpenMP threads as the model's are. on_gpu: cuBLAS's 2048^3 sgemm through
    CuPy. The best of many runs is the machine's capability; on a shared machine it makes the
    bound the conservative one."""
    if on_gpu:
        import cupy

        x, w = (cupy.random.default_rng(0).standard_normal((GPU_PRODUCT, GPU_PRODUCT),
                                                           cupy.float32) for _ in range(2))
        x @ w
        times = []
        for _ in range(repeats):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            x @ w
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
        return 2 * GPU_PRODUCT**3 / min(times) / 1e9
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, PRODUCT_WIDTH)).astype(np.float32)
    w = rng.standard_normal((PRODUCT_WIDTH, PRODUCT_WIDTH)).astype(np.float32)
    backend.C.linear_forward(x, w)
    times = []
    for _ in range(repeats):
        t0 = clock()
        backend.C.linear_forward(x, w)
        times.append(clock() - t0)
    return 2 * rows * PRODUCT_WIDTH**2 / min(times) / 1e9


# the vector width whose multiply-add rate bounds a kernel set's products (blas: OpenBLAS
# picks its kernels' width itself, so the widest the CPU has, the machine's limit)
SET_WIDTH = {"avx512": "512", "avx2": "256", "portable": "128"}


def fma_peak(repeats=5):
    """{"512": GFLOP/s, "256": ..., "128": ...} of benchmarks/fma_peak.c on every OpenMP
    thread this process would use (the same environment), 0 for a width the CPU lacks; the
    program is compiled with the C compiler (``CC``, else cc) into a temporary folder."""
    source = Path(__file__).with_name("fma_peak.c")
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "fma_peak"
        compiler = os.environ.get("CC", "cc")
        try:
            subprocess.run([compiler, "-std=c11", "-O2", "-fopenmp", str(source), "-o",
                            str(program)], check=True, capture_output=True, text=True)
        except FileNotFoundError:
            sys.exit(f"bench_train_step.py: no C compiler {compiler!r} to build {source} "
                     "(set CC)")
        except subprocess.CalledProcessError as error:
            sys.exit(f"bench_train_step.py: {compiler} failed on {source}: "
                     f"{error.stderr.strip().splitlines()[-1] if error.stderr else error}")
        out = subprocess.run([str(program), str(repeats)], check=True, capture_output=True,
                             text=True)
    return json.loads(out.stdout)["gflops"]


class OpTimer:
    """Wraps every function of a backend (``ops``) to add up its time per op; ``sync`` waits
    for the op to finish (the CUDA backend's stream) before the clock is read."""

    def __init__(self, ops, sync):
        self.ops, self.sync = ops, sync
        self.totals = defaultdict(float)
        self.original = dict(vars(ops))
        for name, fn in self.original.items():
            if callable(fn) and not isinstance(fn, type):
                setattr(ops, name, self.wrap(name, fn))

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            t0 = clock()
            out = fn(*args, **kwargs)
            self.sync()
            self.totals[name] += clock() - t0
            return out
        return timed

    def restore(self):
        for name, fn in self.original.items():
            setattr(self.ops, name, fn)


# the sizes of --task navigation's steps, by flag
SIZES = {"--batch": 128, "--tokens": 256, "--d-model": 128, "--heads": 2, "--layers": 1}
# the rows of TDB's Table 1 --task rooms times (its MapWM angle-map row trains as a Transformer
# like its transformer row)
ROOM_ROWS = tuple(row for row in tdb_table.ROWS if row != "mapwm_angles")


def navigation_model(model_name, args):
    """(config, model, loss inputs) of model_name on 2D navigation: a preset, or
    'preset/scheme' for the preset with another positional scheme (e.g. rope/ape_seq); the
    tokens' coordinates (the agent's cells) go to the model, for the schemes that read them
    (gridpe, ape_grid)."""
    task = navigation.NavigationConfig(dims=2, steps=args.tokens // 2, grid_size=64)
    preset, _, positional = model_name.partition("/")
    cfg = ModelConfig.for_task(preset, task, d_model=args.d_model, n_heads=args.heads,
                               n_layers=args.layers,
                               **({"positional": positional} if positional else {}))
    batch = navigation.generate(task, args.batch, np.random.default_rng(0))
    inputs = (batch.tokens, batch.targets, batch.mask, navigation.token_coordinates(batch))
    return cfg, Transformer(cfg, seed=0, backend=args.backend), inputs


def rooms_model(row, args):
    """(config, model, loss inputs) of a row of TDB's Table 1 (mapformer.reproduce.tdb.ROWS)
    at --scale, on a batch of its rooms task's training walks."""
    scale = tdb_table.SCALES[args.scale]
    cfg = tdb_table.model_config(row, scale)
    task = tdb_table.train_config(scale, 0).task_config()
    batch = rooms.generate(task, scale.batch, 0)
    inputs = (batch.tokens, batch.targets, rooms.loss_mask(batch, "observations"), None)
    return cfg, tdb_table.build_model(row, scale, backend=args.backend), inputs


def bench(model_name, args):
    """(config, median seconds per step, seconds per op of one more step) of model_name
    (navigation_model's or rooms_model's, by --task): loss, backward, AdamW and the model
    kind's after-step hook (TDB's teacher EMA)."""
    gc.collect()  # the last model (its layers hold cycles), its outputs back to the pool,
    _C.release_pool()  # and the pool emptied: each model's peak on its own
    cfg, model, inputs = (rooms_model if args.task == "rooms" else navigation_model)(
        model_name, args)
    after_step = model_kind(cfg).after_step or (lambda model: None)
    opt = AdamW(model, TrainConfig())
    sync = model.ops.xp.cuda.get_current_stream().synchronize if args.backend == "cuda" \
        else lambda: None

    def step():
        model.loss(*inputs)
        model.backward()
        opt.step(1e-4)
        after_step(model)

    times = []
    for i in range(args.warmup + args.repeats):
        t0 = clock()
        step()
        sync()
        if i >= args.warmup:
            times.append(clock() - t0)
    sync()
    timer = OpTimer(model.ops, sync)
    try:
        step()
    finally:
        timer.restore()
    return cfg, float(np.median(times)), dict(timer.totals)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=("navigation", "rooms"), default="navigation",
                   help="navigation (2D, the default), or rooms: the rows of TDB's Table 1 on "
                        "their rooms task at --scale (mapformer.reproduce.tdb), whose batch, "
                        "walk length and model sizes are the scale's")
    p.add_argument("--scale", choices=sorted(tdb_table.SCALES), default="cpu",
                   help="with --task rooms: the scale of TDB's Table 1 (default cpu)")
    for flag, default in SIZES.items():
        p.add_argument(flag, type=int, default=None,
                       help=f"default {default} (navigation; with --task rooms the scale's)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps per model (the first model of a run pays for the "
                        "output pool and page faults: with 2, MapWM measured first was 10%% "
                        "slower)")
    p.add_argument("--product-rows", type=int, default=16384,
                   help="rows of the (rows, 512) x (512, 512) product whose rate is the "
                        "product bound on a CPU kernel set (cuda: cuBLAS's 2048^3)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or the process's CPU time (for one-thread figures on a "
                        "shared machine)")
    p.add_argument("--backend", choices=("c", "cuda"), default="c",
                   help="c (the default), or cuda: the CUDA backend on a GPU")
    p.add_argument("--kernel-sets", default=None,
                   help=f"comma-separated CPU kernel sets to run the steps on, of "
                        f"{', '.join(_C.kernel_sets())} (this CPU's; default all of them, "
                        f"the active one, {_C.kernels()}, first)")
    p.add_argument("--models", default=None,
                   help=f"comma-separated model presets, of {', '.join(MODELS)}, each "
                        "optionally with another positional scheme: preset/scheme (e.g. "
                        "rope/ape_seq); default mapwm,rope. With --task rooms, rows of TDB's "
                        f"Table 1, of {', '.join(ROOM_ROWS)} (default all of them)")
    add_json_option(p)
    args = p.parse_args()
    sizes = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in SIZES}
    if args.task == "rooms":
        given = [flag for flag, value in sizes.items() if value is not None]
        if given:
            p.error(f"{given[0]}: with --task rooms the sizes are the scale's ({args.scale})")
        scale = tdb_table.SCALES[args.scale]
        sizes = {"--batch": scale.batch, "--tokens": 2 * scale.room.steps,
                 "--d-model": scale.d_model, "--heads": scale.n_heads,
                 "--layers": scale.n_layers}
        args.models = args.models or ",".join(ROOM_ROWS)
    for flag, value in sizes.items():
        setattr(args, flag[2:].replace("-", "_"), SIZES[flag] if value is None else value)
    args.models = args.models or "mapwm,rope"
    on_gpu = args.backend == "cuda"
    if on_gpu and args.clock == "cpu":
        p.error("--backend cuda times the wall clock: --clock cpu would leave out the GPU")
    if on_gpu and args.kernel_sets:
        p.error("--kernel-sets names CPU kernel sets: not with --backend cuda")
    if on_gpu:
        try:
            backend.get("cuda")
        except RuntimeError as error:
            p.error(str(error))
    for name in args.models.split(","):
        if args.task == "rooms" and name not in ROOM_ROWS:
            p.error(f"--models: no row {name!r} in TDB's Table 1 (of {', '.join(ROOM_ROWS)})")
        if args.task == "navigation" and name.partition("/")[0] not in MODELS:
            p.error(f"--models: no preset {name.partition('/')[0]!r} (of {', '.join(MODELS)})")
    active = _C.kernels()
    kernel_sets = (["cuda"] if on_gpu else args.kernel_sets.split(",") if args.kernel_sets
                   else [active] + [k for k in _C.kernel_sets() if k != active])
    for name in kernel_sets:
        if not on_gpu and name not in _C.kernel_sets():
            p.error(f"--kernel-sets: {name!r} is not a kernel set this CPU runs "
                    f"({', '.join(_C.kernel_sets())})")
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    figures = {"bench": "train_step", "backend": args.backend, "clock": args.clock,
               "task": args.task, **({"scale": args.scale} if args.task == "rooms" else {}),
               "batch": args.batch, "tokens": args.tokens, "d_model": args.d_model,
               "heads": args.heads, "layers": args.layers, "repeats": args.repeats,
               "warmup": args.warmup, "product_rows": args.product_rows,
               "models": args.models.split(",")}
    peak = {} if on_gpu else fma_peak()  # GFLOP/s by vector width (none on a GPU)
    if peak:
        figures["fma_gflops"] = peak
        print("multiply-add peak, GFLOP/s on every thread: "
              + ", ".join(f"{bits}-bit {rate:.1f}" for bits, rate in peak.items()))
    widest = next((bits for bits in ("512", "256", "128") if peak.get(bits)), None)
    figures["kernel_sets"] = {}
    try:
        for name in kernel_sets:
            if not on_gpu:
                _C.set_kernels(name)
            rate = product_rate(args.product_rows, 15, on_gpu)
            results = [bench(model_name, args) for model_name in figures["models"]]
            if "peak_rss_mb" not in figures:  # the first set's, before the second product
                figures["peak_rss_mb"] = round(
                    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
            rate = max(rate, product_rate(args.product_rows, 15, on_gpu))
            fma = peak.get(SET_WIDTH.get(name, widest))
            entry = {"product_gflops": round(rate, 1),
                     "fma_gflops": None if fma is None else round(fma, 1), "models": {}}
            shape = (f"{GPU_PRODUCT}^3" if on_gpu else
                     f"({args.product_rows}, {PRODUCT_WIDTH}) x {PRODUCT_WIDTH}^2")
            print(f"{name}: product {shape} {rate:.1f} GFLOP/s (best of 30, before and after)"
                  + ("" if fma is None else f", multiply-add peak {fma:.1f} GFLOP/s"))
            for model_name, (cfg, seconds, ops) in zip(figures["models"], results):
                flops = step_flops(cfg, args.batch, args.tokens)
                product_bound = flops / (rate * 1e9)
                row = {"ms_per_step": round(seconds * 1e3, 1), "gflop": round(flops / 1e9, 2),
                       "product_bound_ms": round(product_bound * 1e3, 1),
                       "over_product": round(seconds / product_bound, 2)}
                line = (f"  {model_name}: {seconds * 1e3:.1f} ms/step (median of "
                        f"{args.repeats}), {flops / 1e9:.1f} GFLOP of matmul; product bound "
                        f"{product_bound * 1e3:.1f} ms, ratio {seconds / product_bound:.2f}")
                if fma:
                    fma_bound = flops / (fma * 1e9)
                    row.update(fma_bound_ms=round(fma_bound * 1e3, 1),
                               over_fma=round(seconds / fma_bound, 2))
                    line += (f"; multiply-add bound {fma_bound * 1e3:.1f} ms, ratio "
                             f"{seconds / fma_bound:.2f}")
                print(line)
                for op, t in sorted(ops.items(), key=lambda kv: -kv[1]):
                    print(f"      {op:<28} {t * 1e3:8.1f} ms")
                row["op_ms"] = {k: round(v * 1e3, 1) for k, v in ops.items()}
                entry["models"][model_name] = row
            figures["kernel_sets"][name] = entry
    finally:
        if not on_gpu:
            _C.set_kernels(active)
    emit(figures, args.json)


if __name__ == "__main__":
    main()
