"""Reproduce the MapFormer paper's Fig. 7 (appendix 10.4): `python benchmarks/reproduce_fig7.py
--scale cpu` (or `--scale paper`, or `--scale tiny` to check the script). Writes
results/fig7_<scale>.json (every run: panel, model, width, seed, final evaluation, the
evaluations through training) after every run, and results/fig7_<scale>.png, and prints the
figure's numbers as markdown tables (mean ± std over seeds); a rerun skips the runs that file
already holds (so a scale can span several sittings; with every run done it only prints).

Fig. 7a: MapEM-b2 (`mapem`), -b4, -NC (blocks of 4, K = 6; NC-L), -SLN, all MapEM-s
(positional scores only), on 2D navigation, IID accuracy against model width (the paper's
x-axis is unstated; our reading: d_model, 2 heads). Fig. 7b-d: MapEM-NC-L, MapEM-NC-NL, RoPE and
MapEM-s with blocks of 4 on 4D-rotation navigation (`rotation4d`, planes 12,23), trained on 16
steps, IID accuracy through training and OOD accuracy at 32 steps ("ood_sparse").
The paper gives no numbers; its claims: b4 worse than b2, NC about b2, SLN solves it; only
NC-NL holds its OOD accuracy.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mapformer.models import ModelConfig  # noqa: E402
from mapformer.train import TrainConfig, train  # noqa: E402

MAPEM_S = {"mixer": "conjunctive", "options": {"mapem_scores": "positional"}}
FIG7A = {"MapEM-b2": ("mapem", {}), "MapEM-b4": ("mapem_b4", {}),
         "MapEM-NC": ("mapem_nc", {"nc_map": "linear"}), "MapEM-SLN": ("mapem_sln", {})}
FIG7BD = {"MapEM-NC-L": ("conjunctive", "mapem_nc", {"nc_map": "linear"}),
          "MapEM-NC-NL": ("conjunctive", "mapem_nc", {"nc_map": "mlp"}),
          "RoPE": ("attention", "rope", {}),
          "MapEM-s (b4)": ("conjunctive", "mapem_b4", {})}
SCALES = {  # 7a: steps, grid, widths, sequences; 7b-d: width, sequences, eval_every
    "paper": dict(a_steps=128, a_grid=64, widths=(32, 64, 128, 256), a_sequences=200_000,
                  bd_width=128, bd_sequences=200_000, eval_every=100, batch=128),
    "cpu": dict(a_steps=32, a_grid=16, widths=(32, 64, 128), a_sequences=64 * 400,
                bd_width=64, bd_sequences=64 * 400, eval_every=50, batch=64),
    "tiny": dict(a_steps=4, a_grid=4, widths=(32,), a_sequences=16, bd_width=32,
                 bd_sequences=16, eval_every=1, batch=8),
}


def run(mixer, positional, options, width, train_config, out_dir):
    """Train one model; returns (final evaluation, [(step, evaluation)] through training)."""
    task = train_config.task_config()  # delta_rank stays 2: 2D, and the 2 generators of 4D
    preset = "mapem_s" if mixer == "conjunctive" else "rope"
    config = ModelConfig.for_task(preset, task, d_model=width, n_heads=2, mixer=mixer,
                                  positional=positional, **options)
    result = train(config, train_config, out_dir=out_dir, progress=False, log=lambda *a: None)
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    curve = [(r["step"], r["eval"]) for r in map(json.loads, lines) if "eval" in r]
    return result["eval"], curve


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--panels", default="a,bd", help="a, bd or both (a,bd)")
    p.add_argument("--out", default=str(ROOT / "results"))
    args = p.parse_args(argv)
    s = SCALES[args.scale]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fig7_{args.scale}.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    done = {(r["panel"], r["model"], r["width"], r["seed"]) for r in runs}

    def record(run_):
        runs.append(run_)
        path.write_text(json.dumps({"scale": args.scale, "settings": s, "runs": runs},
                                   indent=1))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            if "a" in args.panels.split(","):
                for label, (positional, options) in FIG7A.items():
                    for width in s["widths"]:
                        if ("7a", label, width, seed) in done:
                            continue
                        tc = TrainConfig(task="navigation", dims=2, steps=s["a_steps"],
                                         grid_size=s["a_grid"], sequences=s["a_sequences"],
                                         batch_size=s["batch"], seed=seed)
                        final, _ = run(MAPEM_S["mixer"], positional,
                                       {**MAPEM_S["options"], **options}, width, tc, tmp)
                        record(dict(panel="7a", model=label, width=width, seed=seed,
                                    eval=final))
                        print(f"7a {label} width {width} seed {seed}: iid "
                              f"{final['iid']['accuracy']:.3f}", flush=True)
            if "bd" in args.panels.split(","):
                for label, (mixer, positional, options) in FIG7BD.items():
                    if ("7bd", label, s["bd_width"], seed) in done:
                        continue
                    tc = TrainConfig(task="rotation4d", sequences=s["bd_sequences"],
                                     batch_size=s["batch"], seed=seed,
                                     eval_every=s["eval_every"])
                    opts = dict(options)
                    if mixer == "conjunctive":
                        opts.update(MAPEM_S["options"])
                    final, curve = run(mixer, positional, opts, s["bd_width"], tc, tmp)
                    record(dict(panel="7bd", model=label, width=s["bd_width"], seed=seed,
                                eval=final, curve=curve))
                    print(f"7b-d {label} seed {seed}: iid {final['iid']['accuracy']:.3f} "
                          f"ood (2x length) {final['ood_sparse']['accuracy']:.3f}", flush=True)
    plot(runs, out / f"fig7_{args.scale}.png")
    print(summary(runs))
    return runs


def summary(runs):
    """Markdown: 7a's final IID accuracy per model and width, 7b-d's final IID and OOD (2x
    length) accuracy per model; mean +- std over the seeds (their number in each cell). A
    panel without runs is left out."""
    import numpy as np

    def cell(values):
        return f"{np.mean(values):.3f} ± {np.std(values):.3f} ({len(values)})"

    tables = []
    widths = sorted({r["width"] for r in runs if r["panel"] == "7a"})
    if widths:
        lines = ["| Fig. 7a model | " + " | ".join(f"d_model {w}" for w in widths) + " |",
                 "|---|" + "---|" * len(widths)]
        for label in FIG7A:
            rows = [r for r in runs if r["panel"] == "7a" and r["model"] == label]
            if rows:
                lines.append(f"| {label} | " + " | ".join(
                    cell([r["eval"]["iid"]["accuracy"] for r in rows if r["width"] == w])
                    for w in widths) + " |")
        tables.append("\n".join(lines))
    if any(r["panel"] == "7bd" for r in runs):
        lines = ["| Fig. 7b-d model | IID (16 steps) | OOD (32 steps) |", "|---|---|---|"]
        for label in FIG7BD:
            rows = [r for r in runs if r["panel"] == "7bd" and r["model"] == label]
            if rows:
                lines.append(f"| {label} | {cell([r['eval']['iid']['accuracy'] for r in rows])}"
                             f" | {cell([r['eval']['ood_sparse']['accuracy'] for r in rows])} |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def plot(runs, path):
    """7a: mean IID accuracy against width per model; 7c: IID accuracy through training;
    7d: OOD (2x length) accuracy through training."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label in FIG7A:
        rows = [r for r in runs if r["panel"] == "7a" and r["model"] == label]
        widths = sorted({r["width"] for r in rows})
        if widths:
            means = [np.mean([r["eval"]["iid"]["accuracy"] for r in rows if r["width"] == w])
                     for w in widths]
            axes[0].plot(widths, means, "o-", label=label)
    axes[0].set(title="7a: 2D navigation", xlabel="d_model", ylabel="IID accuracy")
    for label in FIG7BD:
        rows = [r for r in runs if r["panel"] == "7bd" and r["model"] == label]
        if rows:
            steps = [step for step, _ in rows[0]["curve"]]
            for ax, column in ((axes[1], "iid"), (axes[2], "ood_sparse")):
                acc = np.mean([[e[column]["accuracy"] for _, e in r["curve"]] for r in rows],
                              axis=0)
                ax.plot(steps, acc, label=label)
    axes[1].set(title="7c: 4D rotations, IID (16 steps)", xlabel="step", ylabel="accuracy")
    axes[2].set(title="7d: 4D rotations, OOD (32 steps)", xlabel="step", ylabel="accuracy")
    for ax in axes:
        if ax.lines:  # a panel not run has nothing to label
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
