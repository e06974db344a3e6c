"""Milliseconds per training step (forward + backward + clipping + AdamW) at the MapFormer
paper's scale, against the step's sgemm-bound time.

Defaults: batch 128, 256 tokens, d_model 128, 2 heads (head dim 64), 1 layer, navigation
tokens. The same run measures the machine's sgemm rate (a large square sgemm through the C
core's own OpenBLAS) and reports the step's matrix-multiply flops at that rate (the
"sgemm-bound" time) and the ratio step / bound. Peak RSS is ru_maxrss of this process after
the steps (the first sgemm's matrices are freed before them).

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
APE's generator side runs on NumPy's OpenBLAS: set OPENBLAS_NUM_THREADS=1 for it (its own
threads fight the C core's OpenMP ones).

With --backend cuda the same steps run on the CUDA backend (a CUDA build, CuPy and a GPU;
wall clock, the stream synchronized after each step), the sgemm rate is cuBLAS's float32 one
through CuPy (CUDA events), and the per-op table's step synchronizes after every op (so its
ops' times add up to more than the step's, which overlaps launches with the GPU's work).

Prints one JSON line at the end.
"""
import argparse
import gc
import json
import resource
import time
from collections import defaultdict

import numpy as np

from mapformer import _C, backend
from mapformer.models import MODELS, ModelConfig, Transformer, forward_flops
from mapformer.tasks import navigation
from mapformer.train import AdamW, TrainConfig


def step_flops(cfg, batch, tokens):
    """Matmul flops of one step: 3x the forward's (backward = 2 forward)."""
    return 3 * forward_flops(cfg, batch, tokens)


# the clock every figure is taken with: wall time, or with --clock cpu the process's CPU time
# (all threads'; on a shared machine a one-thread run's figures then leave out the time the
# thread waited for a core)
clock = time.perf_counter


def sgemm_rate(size, repeats, on_gpu=False):
    """Best GFLOP/s of a size^3 sgemm through the C core's linear op (its OpenBLAS, split over
    the OpenMP threads as the model's products are), or on_gpu through CuPy's cuBLAS. The best
    of many runs is the machine's capability; on a shared machine it makes the sgemm-bound
    time the conservative one."""
    if on_gpu:
        import cupy

        x, w = (cupy.random.default_rng(0).standard_normal((size, size), cupy.float32)
                for _ in range(2))
        x @ w
        times = []
        for _ in range(repeats):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            x @ w
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
        return 2 * size**3 / min(times) / 1e9
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size)).astype(np.float32)
    w = rng.standard_normal((size, size)).astype(np.float32)
    backend.C.linear_forward(x, w)
    times = []
    for _ in range(repeats):
        t0 = clock()
        backend.C.linear_forward(x, w)
        times.append(clock() - t0)
    return 2 * size**3 / min(times) / 1e9


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


def bench(model_name, args):
    """model_name: a preset, or 'preset/scheme' for the preset with another positional scheme
    (e.g. rope/ape_seq); the tokens' coordinates (the agent's cells) go to the model, for the
    schemes that read them (gridpe, ape_grid)."""
    gc.collect()  # the last model (its layers hold cycles), its outputs back to the pool,
    _C.release_pool()  # and the pool emptied: each model's peak on its own
    task = navigation.NavigationConfig(dims=2, steps=args.tokens // 2, grid_size=64)
    preset, _, positional = model_name.partition("/")
    cfg = ModelConfig.for_task(preset, task, d_model=args.d_model, n_heads=args.heads,
                               n_layers=args.layers,
                               **({"positional": positional} if positional else {}))
    model = Transformer(cfg, seed=0, backend=args.backend)
    opt = AdamW(model, TrainConfig())
    sync = model.ops.xp.cuda.get_current_stream().synchronize if args.backend == "cuda" \
        else lambda: None
    batch = navigation.generate(task, args.batch, np.random.default_rng(0))
    coordinates = navigation.token_coordinates(batch)
    times = []
    for i in range(args.warmup + args.repeats):
        t0 = clock()
        model.loss(batch.tokens, batch.targets, batch.mask, coordinates)
        model.backward()
        opt.step(1e-4)
        sync()
        if i >= args.warmup:
            times.append(clock() - t0)
    sync()
    timer = OpTimer(model.ops, sync)
    try:
        model.loss(batch.tokens, batch.targets, batch.mask, coordinates)
        model.backward()
        opt.step(1e-4)
    finally:
        timer.restore()
    return cfg, float(np.median(times)), dict(timer.totals)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps per model (the first model of a run pays for the "
                        "output pool and page faults: with 2, MapWM measured first was 10%% "
                        "slower)")
    p.add_argument("--sgemm-size", type=int, default=2048)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or the process's CPU time (for one-thread figures on a "
                        "shared machine)")
    p.add_argument("--backend", choices=("c", "cuda"), default="c",
                   help="c (the default), or cuda: the CUDA backend on a GPU")
    p.add_argument("--models", default="mapwm,rope",
                   help=f"comma-separated model presets, of {', '.join(MODELS)}, each "
                        "optionally with another positional scheme: preset/scheme (e.g. "
                        "rope/ape_seq)")
    args = p.parse_args()
    on_gpu = args.backend == "cuda"
    if on_gpu and args.clock == "cpu":
        p.error("--backend cuda times the wall clock: --clock cpu would leave out the GPU")
    if on_gpu:
        try:
            backend.get("cuda")
        except RuntimeError as error:
            p.error(str(error))
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    rate = sgemm_rate(args.sgemm_size, 15, on_gpu)
    figures = {"backend": args.backend, "clock": args.clock, "batch": args.batch,
               "tokens": args.tokens, "d_model": args.d_model, "heads": args.heads,
               "layers": args.layers}
    results = [bench(model_name, args) for model_name in args.models.split(",")]
    # the steps' peak, before the second sgemm (whose matrices would sit on the output pool)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rate = max(rate, sgemm_rate(args.sgemm_size, 15, on_gpu))  # measured before and after
    figures["sgemm_gflops"] = round(rate, 1)
    print(f"sgemm {args.sgemm_size}^3: {rate:.1f} GFLOP/s (best of 30, before and after)")
    for model_name, (cfg, seconds, ops) in zip(args.models.split(","), results):
        flops = step_flops(cfg, args.batch, args.tokens)
        bound = flops / (rate * 1e9)
        print(f"{model_name}: {seconds * 1e3:.1f} ms/step (median of {args.repeats}), "
              f"{flops / 1e9:.1f} GFLOP of matmul, sgemm-bound {bound * 1e3:.1f} ms, "
              f"ratio {seconds / bound:.2f}")
        for name, t in sorted(ops.items(), key=lambda kv: -kv[1]):
            print(f"    {name:<28} {t * 1e3:8.1f} ms")
        figures[model_name] = {"ms_per_step": round(seconds * 1e3, 1),
                               "gflop": round(flops / 1e9, 2),
                               "sgemm_bound_ms": round(bound * 1e3, 1),
                               "ratio": round(seconds / bound, 2),
                               "op_ms": {k: round(v * 1e3, 1) for k, v in ops.items()}}
    figures["peak_rss_mb"] = round(peak_rss_mb, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
