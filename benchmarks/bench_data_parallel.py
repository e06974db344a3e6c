"""Data-parallel training's step time and scaling (mapformer.parallel), one JSON line per
config, then all of them as one line (with --json FILE, also written there with the run's
provenance: benchmarks/report.py).

    python benchmarks/bench_data_parallel.py                     # 1x1, 1x2, 2x1
    python benchmarks/bench_data_parallel.py --configs 1x1,2x1,4x1

A config KxN is K ranks (mpiexec -n K; K = 1: one process, no MPI) of N OpenMP threads each.
Each run times --steps training steps (the batch drawn, the shard's forward and backward, the
Allreduce of the flat gradient buffer, AdamW) after --warmup, at the MapFormer paper's scale
(batch 128, 256 tokens, d_model 128, 2 heads, 1 layer, MapWM on 2D navigation), and reports
the median step, the median Allreduce and its share of the step, and the scaling efficiency
against the first config per core: t(first) cores(first) / (t cores). Name the CPU (lscpu) with the figures.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from report import add_json_option, emit  # the checkout first on sys.path


def steps(args, parallel):
    """Median step and Allreduce seconds of this process (one rank, or alone)."""
    from mapformer.models import ModelConfig, Transformer
    from mapformer.train import AdamW, TrainConfig, learning_rate, task_module

    config = TrainConfig(batch_size=args.batch, steps=args.tokens, sequences=args.batch * 10**6)
    task = config.task_config()
    module = task_module(task)
    model = Transformer(ModelConfig.for_task("mapwm", task, d_model=args.d_model, n_heads=2),
                        seed=0)
    optimizer = AdamW(model, config)
    step_s, reduce_s = [], []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        batch = module.generate(task, args.batch, np.random.default_rng([0, step]))
        mask = module.loss_mask(batch, config.loss_positions)
        inputs = [batch.tokens, batch.targets, mask]
        if parallel is not None:
            rows = parallel.rows(args.batch)
            inputs = [a[rows] for a in inputs]
        model.loss(*inputs)
        model.backward(float(mask.sum()))
        t1 = time.perf_counter()
        if parallel is not None:
            parallel.allreduce(model.params.grad)
        t2 = time.perf_counter()
        optimizer.step(learning_rate(config, step))
        if step >= args.warmup:
            step_s.append(time.perf_counter() - t0)
            reduce_s.append(t2 - t1)
    return float(np.median(step_s)), float(np.median(reduce_s))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="1x1,1x2,2x1", help="RANKSxTHREADS, ...")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128, help="walk steps (256 tokens)")
    parser.add_argument("--d-model", type=int, default=128)
    add_json_option(parser)
    parser.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job:  # one rank (or the single process) of a measurement
        parallel = None
        if os.environ.get("PMI_RANK") is not None:
            from mapformer.parallel import DataParallel
            parallel = DataParallel()
        step, reduce = steps(args, parallel)
        if parallel is None or parallel.root:
            print(json.dumps({"step_s": step, "allreduce_s": reduce}))
        return
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    base, rows = None, []
    flags = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--batch={args.batch}",
             f"--tokens={args.tokens}", f"--d-model={args.d_model}", "--rank-job"]
    for k, threads in configs:
        command = [sys.executable, __file__, *flags]
        if k > 1:
            command = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(k),
                       *command]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": "1"}
        out = json.loads(subprocess.run(command, env=env, capture_output=True, text=True,
                                        check=True).stdout.strip().splitlines()[-1])
        base = base or out["step_s"] * k * threads
        efficiency = base / (k * threads * out["step_s"])
        row = {"ranks": k, "threads_per_rank": threads, **out,
               "allreduce_share": out["allreduce_s"] / out["step_s"],
               "scaling_efficiency": efficiency}
        rows.append(row)
        print(json.dumps(row), flush=True)
    emit({"bench": "data_parallel", "batch": args.batch, "tokens": 2 * args.tokens,
          "d_model": args.d_model, "steps": args.steps, "warmup": args.warmup,
          "configs": rows}, args.json)


if __name__ == "__main__":
    main()
