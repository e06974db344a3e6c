"""Views of TDB's Table 1 runs (the same runs, so the same records) read where the paper reads
its training and its test walks by timestep (Dedieu et al. 2024, appendices E and I.3):

- table "4": TrainingAbove98, the first training step at which the training accuracy
  exceeds 98 %, every TDB row. The paper evaluates the whole training set every 1000 of its
  25,000 steps; here it is read from the training log, every tenth of the run (400 steps at
  scale small), whose accuracy is that step's batch (32 walks of the training pool: an
  unbiased sample of the training-set accuracy, about 0.25 points of standard error at 98 %).
  Beside it the same step per cell of the room, the paper's being over its 300 cells;
- table "1-by-timestep": the test walks' accuracy after the 30th observation (the paper's
  Fig. 9: "above 99.50 % after the 30th observation") and the map's teleportation rate after
  the 60th (Fig. 11: "less than 1 % of the time after the 60th observation"), beside
  TestAccu over every observation, and TestAccu reweighted to the paper's walks of 400 (the
  accuracy of observations 2-100 as measured, that of the 61st-100th extended to the 101st-
  400th: an extrapolation the column's name says, for comparing with the paper's TestAccu,
  which is over walks four times as long as scale small's); its plot draws Figs. 9-11 (accuracy and teleportation by
  observation index, and each code's count against its mean timestep, retained or
  discarded by the map's thresholds). These read the records' per-timestep counts
  (``accuracy_by_timestep``, :func:`mapformer.train.evaluate`; ``by_timestep``,
  :func:`mapformer.cogmap.timestep_metrics`), which records made before they existed lack.
"""
from dataclasses import replace

import numpy as np

TABLE_NAMES = ("4", "1-by-timestep")
TDB_ROWS = ("tdb_s1_m1", "tdb_s1_enc_m1", "tdb_s3_m1", "tdb_s3_m4", "tdb_s3_m4_full")
PAPER_CELLS = 300  # the paper's 15 x 20 room
THRESHOLD = 0.98
ACCURACY_AFTER, TELEPORT_AFTER = 30, 60
PAPER_WALK, LATE = 400, 60  # the paper's walk length; "late": observations after the 60th

# the paper's Table 4 (mean over 10 rooms); its TDB(3, 4) is the "full" reading
PAPER_4 = {"tdb_s1_m1": 9400, "tdb_s1_enc_m1": 9300, "tdb_s3_m1": 8300, "tdb_s3_m4": 4000,
           "tdb_s3_m4_full": 4000}
# Figs. 9 and 11 are of TDB(3, 1) (Fig. 9's caption names TDB(3, 4)); their claims are bounds
FIGURE_BOUNDS = {"tdb_s3_m1": (99.50, 1.00)}


def training_above(record, threshold=THRESHOLD):
    """The first logged step whose training accuracy exceeds ``threshold`` (None if none)."""
    return next((entry["step"] for entry in record.get("log", ())
                 if entry["accuracy"] > threshold), None)


def cells_of(record):
    """The cells of the record's room."""
    config = record["room"]["config"]
    return config["height"] * config["width"]


def derive_4(record):
    """Table 4's columns of a Table 1 record."""
    steps = training_above(record)
    return {"TrainingAbove98": {"test": steps},
            "per cell": {"test": None if steps is None else steps / cells_of(record)}}


def share_after(counts, after):
    """100 x hits / positions over the indices above ``after`` of {"positions", "hits"}
    (None when there is none)."""
    if counts is None:
        return None
    n = int(np.sum(counts["positions"][after + 1:]))
    return 100.0 * int(np.sum(counts["hits"][after + 1:])) / n if n else None


def accuracy_counts(record):
    """The record's test-walk {"positions", "hits"} by observation index, or None."""
    return record.get("eval", {}).get("iid", {}).get("accuracy_by_timestep")


def teleport_counts(record):
    """The record's test-walk teleports {"positions", "hits"} by observation index, or None
    (a row without a map of codes)."""
    return record.get("evaluation", {}).get("by_timestep", {}).get("teleport_by_timestep")


def as_paper_walks(counts, length=PAPER_WALK, late=LATE):
    """100 x the accuracy of walks of ``length`` observations whose x_2 .. x_N score as
    ``counts`` ({"positions", "hits"} by observation index, N the last) and whose later
    observations score as those after the ``late``-th (None without counts, or when the
    walks are not longer than ``late``)."""
    if counts is None:
        return None
    n, k = np.asarray(counts["positions"], float), np.asarray(counts["hits"], float)
    scored = np.flatnonzero(n)
    if len(scored) == 0 or scored[-1] <= late:
        return None
    per_step = k[scored] / n[scored]
    tail = k[late + 1:].sum() / n[late + 1:].sum()
    return 100.0 * (per_step.sum() + (length - 1 - len(scored)) * tail) / (length - 1)


def derive_by_timestep(record):
    """The "1-by-timestep" columns of a Table 1 record (None where it lacks the counts)."""
    accuracy = accuracy_counts(record)
    return {"TestAccu": {"test": record["metrics"]["TestAccu"]["test"]},
            f"TestAccu x>{ACCURACY_AFTER}": {"test": share_after(accuracy, ACCURACY_AFTER)},
            f"TestAccu at N={PAPER_WALK}": {"test": as_paper_walks(accuracy)},
            f"Teleport x>{TELEPORT_AFTER}": {
                "test": share_after(teleport_counts(record), TELEPORT_AFTER)}}


def view(name, base, cells):
    """The view ``name`` (:data:`TABLE_NAMES`) of Table 1's spec ``base``, whose room has
    ``cells`` cells."""
    if name == "4":
        return replace(
            base, name="4", title="TDB Table 4: training steps until the training accuracy "
            "exceeds 98 %", columns=("TrainingAbove98", "per cell"), rows=TDB_ROWS,
            default_rows=TDB_ROWS, derive=derive_4, digits=1, plot=None,
            note=base.note + "; TrainingAbove98: the first logged step (every tenth of the "
            "run) whose batch accuracy exceeds 98 %, over the seeds that reach it (n: how "
            f"many do); per cell: that step over the room's {cells} cells (the paper's over "
            f"its {PAPER_CELLS})",
            reference={"": {row: (steps, steps / PAPER_CELLS) for row, steps in
                            PAPER_4.items()}})
    columns = ("TestAccu", f"TestAccu x>{ACCURACY_AFTER}", f"TestAccu at N={PAPER_WALK}",
               f"Teleport x>{TELEPORT_AFTER}")
    paper = {row: (figures[0],) + FIGURE_BOUNDS.get(row, (None, None))[:1] + (figures[0],)
             + FIGURE_BOUNDS.get(row, (None, None))[1:]
             for row, figures in base.reference.get("", {}).items()}
    return replace(
        base, name="1-by-timestep", title="TDB Table 1's test walks by timestep (the paper's "
        "Figs. 9-11)", columns=columns, derive=derive_by_timestep, plot=plot_by_timestep,
        note=base.note + f"; TestAccu x>{ACCURACY_AFTER}: over the observations after the "
        f"{ACCURACY_AFTER}th; TestAccu at N={PAPER_WALK}: reweighted to the paper's walks of "
        f"{PAPER_WALK}, the observations after the {LATE}th extended at their accuracy (an "
        f"extrapolation; the paper's TestAccu beside it); Teleport x>{TELEPORT_AFTER}: the "
        f"share of steps after the {TELEPORT_AFTER}th whose map node is neither the last one "
        "nor its successor (rows with a map of codes); the paper's figures for TDB(3, 1)'s "
        "x>30 and teleports are its Figs. 9 and 11's bounds (above 99.50, below 1)",
        reference={"": paper})


def pooled(records, counts_of):
    """(index, rate, how many records had counts) of the records' counts pooled over seeds
    (None when none has them)."""
    found = [c for c in map(counts_of, records) if c is not None]
    if not found:
        return None
    size = max(len(c["positions"]) for c in found)
    n, k = np.zeros(size), np.zeros(size)
    for c in found:
        n[:len(c["positions"])] += c["positions"]
        k[:len(c["hits"])] += c["hits"]
    index = np.flatnonzero(n)
    return index, k[index] / n[index], len(found)


def plot_by_timestep(table, store, seeds, path):
    """Three panels: per row the test accuracy by observation index (Fig. 9) and the map's
    teleportation rate by observation index (Fig. 11), the seeds pooled; and TDB(3, 1)'s
    codes on the test walks of its first seed with counts, their count against their mean
    timestep, green where the map retained them, red where it discarded them (Fig. 10)."""
    from .plots import finish, pyplot

    plt = pyplot()
    found = table.records(store, seeds)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for row in table.rows:
        records = [r for (_, w, _), r in sorted(found.items()) if w == row]
        for ax, counts_of in zip(axes[:2], (accuracy_counts, teleport_counts)):
            curve = pooled(records, counts_of)
            if curve is not None:
                ax.plot(curve[0], 100 * curve[1], label=f"{row} (n={curve[2]})", lw=1)
    axes[0].set(xlabel="observation index", ylabel="test accuracy (%)", ylim=(40, 100.5),
                title="Fig. 9: accuracy by timestep")
    axes[1].set(xlabel="observation index", ylabel="teleportation rate (%)", ylim=(0, None),
                title="Fig. 11: teleportation by timestep")
    codes = next((r["evaluation"]["by_timestep"]["codes"] for (_, w, _), r in
                  sorted(found.items()) if w == "tdb_s3_m1"
                  and "by_timestep" in r.get("evaluation", {})), None)
    if codes is not None:
        kept = np.array(codes["retained"])
        for mask, colour, label in ((kept, "green", "retained"), (~kept, "red", "discarded")):
            axes[2].scatter(np.array(codes["mean_timestep"])[mask],
                            np.array(codes["count"])[mask], s=8, c=colour, label=label)
        axes[2].legend(fontsize=8)
    axes[2].set(xlabel="mean observation index", ylabel="count on the test walks",
                yscale="log", title="Fig. 10: TDB(3, 1)'s codes (first seed)")
    fig.suptitle(f"{table.title} ({table.scale} scale)", fontsize=9)
    finish(fig, axes[:2], path)
