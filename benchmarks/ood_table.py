"""The table of `benchmarks/diagnose_ood.py`'s results: per run name (config, model, rank of
Delta, training variant) and evaluation variant, the mean and standard deviation over seeds of
the object-recall accuracy on iid, ood_dense and ood_sparse, and ood_sparse per seed.

    python benchmarks/ood_table.py [--results results/ood] [--markdown]

Run names are the JSON files' names without the seed (``table1_mapwm_r1_trainlog``: Table 1's
config, MapWM, r = 1, trained with unclamped log-length scaling); evaluation variants are
``T=c`` (every attention logit times c) and ``,log`` (log-length scaling at test time only).
"""
import argparse
import collections
import glob
import json
import os

import numpy as np

SETS = ("iid", "ood_dense", "ood_sparse")


def collect(results):
    """{(run name, eval variant): [(seed, (iid, ood_dense, ood_sparse) accuracies)]}."""
    rows = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        name, _, seed = os.path.basename(path)[:-len(".json")].rpartition("_s")
        variants = json.load(open(path))["diagnosis"]["variants"]
        for variant, sets in variants.items():
            accs = tuple(sets[s]["accuracy"]["object_accuracy"] for s in SETS)
            rows[(name, variant)].append((int(seed), accs))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default="results/ood")
    p.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = p.parse_args()
    rows = collect(args.results)
    if args.markdown:
        print("| run | eval | seeds | iid | ood_dense | ood_sparse | ood_sparse per seed |")
        print("|---|---|---|---|---|---|---|")
    for (name, variant), runs in rows.items():
        runs.sort()
        accs = np.array([a for _, a in runs])
        cells = [f"{m:.3f} ± {s:.3f}" for m, s in zip(accs.mean(0), accs.std(0))]
        per_seed = " / ".join(f"{a[2]:.2f}" for a in accs)
        seeds = ",".join(str(s) for s, _ in runs)
        if args.markdown:
            print(f"| {name} | {variant} | {seeds} | " + " | ".join(cells) + f" | {per_seed} |")
        else:
            print(f"{name:30s} {variant:8s} seeds {seeds:6s} " + "  ".join(cells)
                  + f"   ood_sparse per seed {per_seed}")


if __name__ == "__main__":
    main()
