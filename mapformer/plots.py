"""Learning curves of training runs, from the ``metrics.jsonl`` files ``train`` writes.

A run directory holds ``metrics.jsonl``: one JSON record per line, either a training record
(``step``, ``loss``, ``accuracy``, ``lr``, ``grad_norm``, ``seq_per_s``, ...) every
``log_every`` steps, or an evaluation record (``step``, ``eval``: {set name: {"accuracy",
"object_accuracy", "loss", "floor", ...}}) every ``eval_every`` steps and at the end.

:func:`learning_curves` draws every run side by side (one colour per run): training loss,
training accuracy on the scored positions, and per evaluation set its accuracy (with the
always-blank floor dashed) and its object recalls. It needs matplotlib (``pip install
matplotlib``); ``python -m mapformer plot RUN_DIR ...`` saves the figure as a PNG.
"""
import itertools
import json
from pathlib import Path


def read_metrics(run_dir):
    """(training records, evaluation records) of ``run_dir/metrics.jsonl``, each a list of
    dicts in file order. A resumed run appends to the file: a step logged twice keeps its
    last record."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (write one with `python -m "
                                "mapformer train --out DIR`)")
    train, evals = {}, {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not a JSON record ({exc})") from None
        (evals if "eval" in record else train)[record["step"]] = record
    return ([train[s] for s in sorted(train)], [evals[s] for s in sorted(evals)])


def learning_curves(run_dirs, out=None, labels=None):
    """Plot the runs in ``run_dirs`` (paths) side by side and return the matplotlib Figure;
    with ``out`` also save it there (PNG). ``labels``: one legend entry per run (default:
    the directory names).

    Panels, x = optimizer step: training loss; training accuracy; then for each evaluation
    set (iid, ood_dense, ood_sparse, ...): accuracy over the scored positions with the
    always-blank floor dashed, and object recalls with their floor dotted."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("learning_curves needs matplotlib: pip install matplotlib") from None
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("learning_curves needs at least one run directory")
    labels = labels or [d.name or str(d) for d in run_dirs]
    runs = [read_metrics(d) for d in run_dirs]
    sets = list(dict.fromkeys(name for _, evals in runs for e in evals for name in e["eval"]))
    columns = 2 + 2 * len(sets)
    fig, axes = plt.subplots(1, columns, figsize=(3.2 * columns, 3.0), squeeze=False)
    axes = axes[0]
    colors = itertools.cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])
    for color, label, (train, evals) in zip(colors, labels, runs):
        steps = [r["step"] for r in train]
        axes[0].plot(steps, [r["loss"] for r in train], color=color, label=label)
        axes[1].plot(steps, [r["accuracy"] for r in train], color=color, label=label)
        for i, name in enumerate(sets):
            points = [(e["step"], e["eval"][name]) for e in evals if name in e["eval"]]
            x = [s for s, _ in points]
            for ax, metric, floor, style in ((axes[2 + 2 * i], "accuracy", "floor", "--"),
                                             (axes[3 + 2 * i], "object_accuracy",
                                              "object_floor", ":")):
                ax.plot(x, [r[metric] for _, r in points], color=color, marker="o",
                        markersize=3, label=label)
                ax.plot(x, [r[floor] for _, r in points], color=color, linestyle=style,
                        linewidth=0.8)
    titles = ["training loss", "training accuracy"] + [
        title for name in sets for title in (f"{name} accuracy", f"{name} objects")]
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    if out is not None:
        fig.savefig(out, dpi=110)
    return fig
