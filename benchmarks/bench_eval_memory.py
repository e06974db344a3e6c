"""Peak memory and time of an evaluation forward with and without kept activations.

`Transformer.loss(..., keep=True)` (mode "keep": a training forward) keeps every layer's
activations for backward(); `keep=False` (mode "none": the inference path, mapformer.nn.Keeping)
frees each layer's as soon as it returns; mode "delta" keeps only Delta where a scheme traces
it (`keep=("delta",)`: MapWM, MapEM; else False), what an evaluation that reads Delta needs.
This script measures the three on long navigation sequences (default:
batch 8, 4,096 steps = 8,192 tokens, d_model 128, 2 heads, 2 layers: the OOD sets' length) and
checks that they give the same loss and logits bit for bit.

Each (model, mode) runs in a fresh process, so that the C core's pool of freed blocks starts
empty; processes alternate between modes, `--rounds` times, and the figures are medians over
rounds. Peak: the process's resident-set high-water mark (VmHWM, reset through
/proc/self/clear_refs before the forwards) minus its resident set just before them, in MB.
Time: the median of `--repeats` forwards after one warm-up, wall clock. The CPU, the kernel
set and the thread count are printed; prints one JSON line at the end (with --json FILE, also
written there with the run's provenance).

    python benchmarks/bench_eval_memory.py --models mapwm,mapem_os,rope,mamba,mampa
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from report import ROOT, add_json_option, emit  # the checkout first on sys.path

MODES = ("keep", "none", "delta")


def status_mb(field):
    """A field of /proc/self/status (VmRSS, VmHWM) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(args):
    """One (model, mode) in this process: prints {"peak_mb", "ms", "loss", "logits_sha256"}."""
    import numpy as np

    from mapformer.models import ModelConfig, Transformer
    from mapformer.tasks import navigation
    from mapformer.train import DeltaByToken

    task = navigation.NavigationConfig(dims=2, steps=args.steps, grid_size=64)
    config = ModelConfig.for_task(args.model, task, d_model=args.d_model, n_heads=args.heads,
                                  n_layers=args.layers)
    model = Transformer(config, seed=0)
    model.train(False)
    batch = navigation.generate(task, args.batch, 0)
    inputs = (batch.tokens, batch.targets, batch.mask, navigation.token_coordinates(batch))
    keep = {"keep": True, "none": False,
            "delta": ("delta",) if DeltaByToken(model, task.vocab_size).layers else False
            }[args.mode]
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        pass
    base = status_mb("VmRSS")
    times = []
    for _ in range(1 + args.repeats):
        start = time.perf_counter()
        loss = model.loss(*inputs, keep=keep)
        times.append(time.perf_counter() - start)
    logits = np.ascontiguousarray(model.ops.to_numpy(model.logits))
    print(json.dumps({"peak_mb": status_mb("VmHWM") - base,
                      "ms": statistics.median(times[1:]) * 1e3, "loss": float(loss),
                      "logits_sha256": hashlib.sha256(logits.tobytes()).hexdigest()}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mapwm,mapem_os,rope,mamba,mampa",
                   help="comma-separated model presets")
    p.add_argument("--modes", default="keep,none,delta",
                   help=f"comma-separated modes, of {', '.join(MODES)}")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=4096, help="navigation steps (2 tokens each)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed forwards per process")
    p.add_argument("--rounds", type=int, default=3, help="processes per (model, mode)")
    add_json_option(p)
    p.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.model, args.mode = args.child
        return child(args)
    from mapformer import _C
    from mapformer.experiments.records import provenance
    from mapformer.models import MODELS

    models, modes = args.models.split(","), args.modes.split(",")
    for name in models:
        if name not in MODELS:
            p.error(f"--models: no preset {name!r} (of {', '.join(MODELS)})")
    for mode in modes:
        if mode not in MODES:
            p.error(f"--modes: no mode {mode!r} (of {', '.join(MODES)})")
    info = _C.info()
    prov = provenance()
    print(f"CPU {prov['cpu']}, kernels {info['kernels']}, {info['threads']} threads; batch "
          f"{args.batch}, {2 * args.steps} tokens, d_model {args.d_model}, {args.layers} layers")
    shared = ["--batch", str(args.batch), "--steps", str(args.steps), "--d-model",
              str(args.d_model), "--heads", str(args.heads), "--layers", str(args.layers),
              "--repeats", str(args.repeats)]
    runs = {(m, mode): [] for m in models for mode in modes}
    for _ in range(args.rounds):
        for model in models:
            for mode in modes:
                out = subprocess.run([sys.executable, __file__, *shared, "--child", model, mode],
                                     capture_output=True, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
                if out.returncode:
                    last = (out.stderr.strip().splitlines() or ["no message"])[-1]
                    sys.exit(f"bench_eval_memory: {model} {mode} failed: {last}")
                runs[(model, mode)].append(json.loads(out.stdout.splitlines()[-1]))
    figures = {"bench": "eval_memory", "batch": args.batch, "tokens": 2 * args.steps,
               "d_model": args.d_model, "heads": args.heads, "layers": args.layers,
               "repeats": args.repeats, "rounds": args.rounds, "models": {}}
    for model in models:
        hashes = {r["logits_sha256"] for mode in modes for r in runs[(model, mode)]}
        losses = {r["loss"] for mode in modes for r in runs[(model, mode)]}
        row = {mode: {key: round(statistics.median(r[key] for r in runs[(model, mode)]), 1)
                      for key in ("peak_mb", "ms")} for mode in modes}
        row["same_bits"] = len(hashes) == 1 and len(losses) == 1
        figures["models"][model] = row
        line = ", ".join(f"{mode} {row[mode]['peak_mb']:.0f} MB {row[mode]['ms']:.0f} ms"
                         for mode in modes)
        if "keep" in modes:
            line += "; against keep: " + ", ".join(
                f"{mode} {row[mode]['peak_mb'] / row['keep']['peak_mb']:.2f}x memory "
                f"{row[mode]['ms'] / row['keep']['ms']:.2f}x time"
                for mode in modes if mode != "keep")
        print(f"  {model}: {line}; logits and loss the same bits: {row['same_bits']}")
    emit(figures, args.json)


if __name__ == "__main__":
    main()
