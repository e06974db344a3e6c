"""The map-free baselines' rollout planning (mapformer/rollouts.py, TDB appendix D) on one
cpu-scale problem of TDB's Table 1 (mapformer/reproduce/tdb.py; a 10 x 15 room, walks of 200 steps,
C = 25, width 128, 2 layers, 4 heads; untrained models, whose greedy predictions cost what a
trained model's do): seconds of the recomputed rollouts (a forward of every prefix per
generated observation) and of the decoded ones (a KV cache; the LSTM's state), for the
rollouts alone (step 2) and the whole planner (with the tail evaluation of every candidate:
an untrained model predicts one symbol, so when that is the goal's every rollout is a
candidate at every length, the tail evaluation's worst case), their ratio in CPU time, and
whether the two give the same predictions and plans (the rollouts of one seed).

    python benchmarks/rollout_decoding.py                         # 10 rollouts, both models
    python benchmarks/rollout_decoding.py --rollouts 100 --rows transformer

The recomputed cost grows as (N - 2C)^2 / 2 x rollouts tokens, the decoded one as
2 (N - 2C) x rollouts (plus the attention on the cache), so the ratio depends little on
the number of rollouts; at 100 rollouts the recomputation takes minutes.
"""
import argparse
import os
import time

import numpy as np

from mapformer import _C, rollouts
from mapformer.reproduce.tdb import SCALES, build_model
from mapformer.tasks import rooms


def cpu_seconds(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    parser.add_argument("--rollouts", type=int, default=10)
    parser.add_argument("--rows", default="transformer,lstm")
    parser.add_argument("--problem", type=int, default=0, help="which test walk")
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    room = rooms.make_room(scale.room)
    walk = rooms.walks(scale.room, room, args.problem + 1, [0, 2])
    tokens = walk.tokens(scale.room.n_obs)[args.problem]
    n_obs, C = scale.room.n_obs, scale.context
    print(f"{args.scale} scale: N = {scale.room.steps}, C = {C}, {args.rollouts} rollouts, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, kernels "
          f"{_C.kernels()}")
    for row in args.rows.split(","):
        model = build_model(row, scale, seed=0)
        actions = np.random.default_rng(0).integers(0, rooms.N_ACTIONS,
                                                    (args.rollouts, len(tokens) // 2 - 2 * C))
        runs = {}
        for name, predict, rolls in (
                ("recomputed", rollouts.greedy_predictor(model, n_obs), rollouts._Recomputed),
                ("decoded", rollouts.greedy_decoder(model, n_obs), rollouts._Decoded)):
            runs[name] = (cpu_seconds(lambda: rolls(predict, tokens[:2 * C + 1], actions,
                                                    n_obs).predicted[:, :-1]),
                          cpu_seconds(lambda: rollouts.rollout_plans(
                              predict, tokens, C, n_obs, args.rollouts, seed=0)))
        for i, what in enumerate(("rollouts (step 2)", "whole planner")):
            (out_r, wall_r, cpu_r), (out_d, wall_d, cpu_d) = (runs["recomputed"][i],
                                                              runs["decoded"][i])
            same = np.array_equal(out_r, out_d) if i == 0 else out_r == out_d
            print(f"{row:11s} {what:17s} recomputed {wall_r:7.2f} s ({cpu_r:7.2f} s CPU)  "
                  f"decoded {wall_d:6.2f} s ({cpu_d:6.2f} s CPU)  speedup {cpu_r / cpu_d:5.1f}x "
                  f"CPU  same {'predictions' if i == 0 else 'plans'}: {same}"
                  + (f" ({len(out_r)} plans)" if i else ""))


if __name__ == "__main__":
    main()
