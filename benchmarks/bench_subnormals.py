"""The ops' subnormal modes against each other: the time of the same calls with subnormal
floats kept (IEEE) and flushed (the default, csrc/ops/subnormals.c), interleaved.

    OMP_NUM_THREADS=1 python benchmarks/bench_subnormals.py
    OMP_NUM_THREADS=1 python benchmarks/bench_subnormals.py --checkpoint runs/<id>/checkpoint.npz

Ops: a linear layer's forward and backward at a TDB head's shape (3200 rows, 128 -> 256) and
the exact GELU's forward and backward over the same rows, whose inputs hold a share of
subnormal entries (``--shares``; the rest standard normal): what a trained model's confident
softmax leaves in its gradients. With ``--checkpoint``, also a whole training step (loss and
backward, no optimizer) of the library checkpoint's model on the batch of its next step:
where a trained run's subnormals come from. Each row alternates the two modes for
``--rounds`` rounds of ``--repeats`` calls; its figure is the median over rounds of each
round's median, in the process's CPU time, and the ratio keep / flush. Prints one JSON line
at the end (with --json FILE, also writes it there with the run's provenance)."""
import argparse
import statistics
import time

import numpy as np

from report import add_json_option, emit  # the checkout first on sys.path

from mapformer import _C

MODES = ("keep", "flush")


def alternate(fn, repeats, rounds):
    """{mode: median over rounds of each round's median ms} of fn in each mode, alternated."""
    per_round = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            _C.set_subnormals(mode)
            fn()
            times = []
            for _ in range(repeats):
                start = time.process_time()
                fn()
                times.append(time.process_time() - start)
            per_round[mode].append(statistics.median(times) * 1e3)
    _C.set_subnormals("flush")
    return {m: statistics.median(v) for m, v in per_round.items()}


def op_rows(share, rows, repeats, rounds):
    """The ops at one share of subnormal inputs."""
    rng = np.random.default_rng(0)

    def with_subnormals(*shape):
        a = rng.standard_normal(shape).astype(np.float32)
        a[rng.random(shape) < share] = np.float32(3e-39)
        return a

    x, w, dy = with_subnormals(rows, 128), with_subnormals(256, 128), with_subnormals(rows, 256)
    dw = np.zeros_like(w)
    calls = {"linear forward": lambda: _C.linear_forward(x, w),
             "linear backward": lambda: _C.linear_backward(dy, x, w, dw),
             "gelu forward": lambda: _C.gelu_forward(dy, approximate="none"),
             "gelu backward": lambda: _C.gelu_backward(dy, dy, approximate="none")}
    out = []
    for name, fn in calls.items():
        ms = alternate(fn, repeats, rounds)
        out.append({"name": name, "share": share, "keep_ms": ms["keep"],
                    "flush_ms": ms["flush"], "ratio": ms["keep"] / ms["flush"]})
    return out


def step_row(path, repeats, rounds):
    """A training step of a checkpoint's model, on the batch of its next step."""
    from mapformer.train import load_checkpoint, task_module

    model, _, config, step = load_checkpoint(path)
    task = config.task_config()
    module = task_module(task)
    batch = module.generate(task, config.batch_size, np.random.default_rng([config.seed, step]))
    mask = module.loss_mask(batch, config.loss_positions)

    def one():
        model.loss(batch.tokens, batch.targets, mask, module.token_coordinates(batch))
        model.backward(float(mask.sum()))

    ms = alternate(one, repeats, rounds)
    return {"name": f"training step of {model.config.label} at step {step}", "checkpoint":
            str(path), "keep_ms": ms["keep"], "flush_ms": ms["flush"],
            "ratio": ms["keep"] / ms["flush"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", default="0,0.01,0.1",
                        help="comma-separated shares of subnormal inputs (default 0,0.01,0.1)")
    parser.add_argument("--rows", type=int, default=3200)
    parser.add_argument("--checkpoint", action="append", default=[],
                        help="a library checkpoint whose training step to time (repeatable)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args(argv)
    try:
        shares = [float(s) for s in args.shares.split(",")]
    except ValueError:
        parser.error(f"--shares must be comma-separated numbers, got {args.shares!r}")
    if any(not 0 <= s <= 1 for s in shares):
        parser.error(f"--shares must lie in [0, 1], got {args.shares!r}")
    if args.rows < 1 or args.repeats < 1 or args.rounds < 1:
        parser.error("--rows, --repeats and --rounds must be >= 1")
    rows = [r for s in shares for r in op_rows(s, args.rows, args.repeats, args.rounds)]
    steps = [step_row(p, args.repeats, args.rounds) for p in args.checkpoint]
    for r in rows + steps:
        print(f"{r['name']:<48} {r.get('share', ''):>5} keep {r['keep_ms']:9.2f} ms  flush "
              f"{r['flush_ms']:9.2f} ms  {r['ratio']:5.2f}x")
    emit({"benchmark": "subnormals", "rows": rows, "steps": steps}, args.json)


if __name__ == "__main__":
    main()
