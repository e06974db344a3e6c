"""What the reproductions' plots share: matplotlib without a display, a finished figure, and
the sweep plot (a metric against the value each part of a table stands for)."""
import numpy as np


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def finish(fig, axes, path):
    """Grid and legend on every axis that has lines, then the PNG at ``path``."""
    for ax in np.atleast_1d(axes):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def sweep(table, store, seeds, path, values, xlabel, panels=(("iid", "accuracy"),),
          log_x=True, title=None):
    """A panel per (column, metric) of ``panels``: the metric on that evaluation set against
    the sweep's values (``values``: {part: x}), a line per row with the seeds' mean and std
    as error bars; parts without records are left out."""
    plt = pyplot()
    cells = table.cells(store, seeds)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (column, metric) in zip(axes[0], panels):
        for row in table.rows:
            xs, means, stds = [], [], []
            for part in table.parts:
                found = cells[(part, row)]["values"][metric][column]
                if found:
                    xs.append(values[part])
                    means.append(np.mean(found))
                    stds.append(np.std(found))
            if xs:
                ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=row)
        ax.set(title=title or f"{table.title} ({table.scale} scale)", xlabel=xlabel,
               ylabel=f"{column} {metric.replace('_', ' ')}")
        if log_x:
            ax.set_xscale("log")
            ax.set_xticks(list(values.values()))
            ax.set_xticklabels([str(v) for v in values.values()])
            ax.minorticks_off()
    finish(fig, axes[0], path)
