"""One rank of tests/test_parallel.py's data-parallel runs (run under mpiexec, or alone for
one process): MapWM on 16-step 2D navigation, batch 8, 20 steps; each rank saves its final
parameters to OUT/params_<K>_<rank>.npy. --stop-at N: rank 0 stops the job after step N's
evaluation (checkpoints every 5 steps, evaluations every 10)."""
import argparse
import sys

import numpy as np

from mapformer.models import ModelConfig
from mapformer.train import TrainConfig, train


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--parallel", action="store_true")
    parser.add_argument("--checkpoints", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--stop-at", type=int, default=None)
    args = parser.parse_args()
    config = TrainConfig(sequences=20 * 8, batch_size=8, steps=16, grid_size=8, seed=3,
                         eval_sequences=8, log_every=5, checkpoint_every=5, eval_every=10)
    model = ModelConfig.for_task("mapwm", config.task_config(), d_model=32, n_heads=2)
    parallel = None
    if args.parallel:
        from mapformer.parallel import DataParallel
        parallel = DataParallel()

    def log(message):  # rank 0's only (the others' is silent)
        if args.stop_at is not None and message.startswith(f"step {args.stop_at}:"):
            if parallel is not None:
                parallel.comm.Abort(3)  # as a killed job: every rank ends now
            sys.exit(3)

    result = train(model, config, out_dir=args.checkpoints, resume=args.resume, progress=False,
                   log=log, parallel=parallel)
    ranks, rank = (parallel.size, parallel.rank) if parallel else (1, 0)
    np.save(f"{args.out}/params_{ranks}_{rank}.npy", result["model"].params.data)
    print(rank, result["eval"]["iid"]["accuracy"], result["loss"])


if __name__ == "__main__":
    main()
