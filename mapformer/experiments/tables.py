"""Tables: declarative specs of runs whose cells are rendered from records only, and
:func:`run_all`, which executes the runs a record store lacks."""
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .executors import Serial

T975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306,
        10: 2.262}  # Student's t, 97.5% quantile, by sample size (normal beyond)


def run_all(runs, store, executor=None, force=False, progress=True):
    """Execute the runs whose record ``store`` lacks (all of them with ``force``) on
    ``executor`` (default: Serial), writing each record as it finishes. Returns {"held": runs
    whose record existed, "ran": runs executed, "failed": [(run id, error text)]}; progress: a
    tqdm bar of runs done, with the counts running (started, not finished), pending (not
    started) and failed."""
    executor = executor or Serial()
    runs = list(dict.fromkeys(runs))  # one of each id, in order
    todo = runs if force else [r for r in runs if r.id not in store]
    if force:
        for run in todo:
            store.path(run.id).unlink(missing_ok=True)
    summary = {"held": len(runs) - len(todo), "ran": 0, "failed": []}
    bar = None
    if progress and todo:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc=f"runs ({executor.name})", file=sys.stderr,
                   unit="run")
    try:
        for run, outcome in executor.execute(todo, str(store.directory)):
            if isinstance(outcome, BaseException):
                summary["failed"].append((run.id, f"{type(outcome).__name__}: {outcome}"))
            else:
                if run.id not in store:  # the worker's directory may not be this one
                    store.put(outcome)
                summary["ran"] += 1
            if bar is not None:
                bar.update()
                running = min(executor.running(), len(todo) - bar.n)
                bar.set_postfix(running=running, pending=len(todo) - bar.n - running,
                                failed=len(summary["failed"]))
    finally:
        if bar is not None:
            bar.close()
    return summary


def spread_of(values, statistic="std"):
    """(mean, spread) of seeds' values: the population std, or with statistic "ci95" the
    half-width of the 95% t interval; one value: spread 0."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return float(values.mean()), 0.0
    if statistic == "ci95":
        return (float(values.mean()),
                T975.get(len(values), 1.96) * values.std(ddof=1) / math.sqrt(len(values)))
    return float(values.mean()), float(values.std())


def mean_spread(values, statistic="std", digits=2):
    """'mean ± std' (population std over seeds) or, with statistic "ci95", 'mean ± half-width
    of the 95% t interval'; one value: the value alone."""
    mean, spread = spread_of(values, statistic)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {spread:.{digits}f}"


STANDINGS = ("uncontested top", "among the best", "within the interval of the top", "behind")


def standing(cells, champions):
    """Where the ``champions`` stand among the cells of one setup, in the classes of the APE
    paper's count ("uncontested top in 8, among the best in 3, within the confidence margin of
    the top performer in one"), lower being better: ``cells`` {row: (mean, spread)}; the top
    is the least mean; "uncontested top" when it is a champion's and no other row's interval
    (mean - spread) reaches it, "among the best" when it is a champion's and another's does
    (ties included), "within the interval of the top" when a champion's interval reaches
    another's top, "behind" otherwise. Returns (class, the top row); (None, None) when the
    champions or their rivals have no cell."""
    if not any(r in cells for r in champions) or not any(r not in champions for r in cells):
        return None, None
    top = min(cells, key=lambda r: (cells[r][0], r not in champions))
    best = cells[top][0]
    if top in champions:
        tied = any(m - h <= best for r, (m, h) in cells.items() if r not in champions)
        return STANDINGS[1] if tied else STANDINGS[0], top
    reached = any(m - h <= best for r, (m, h) in cells.items() if r in champions)
    return STANDINGS[2] if reached else STANDINGS[3], top


def paper_figure(figure, digits=2):
    """The text of one of the paper's figures: a number, (mean, spread) or None (empty)."""
    if figure is None:
        return ""
    if isinstance(figure, (tuple, list)):
        return f"{figure[0]:.{digits}f} ± {figure[1]:.{digits}f}"
    return f"{figure:.{digits}f}"


def overridden(sequences):
    """The end of a table's note when its runs train on ``sequences`` training sequences
    instead of their scale's budget (``--sequences``; None: the scale's, no text)."""
    return (f"; here every run trains on {sequences:,} sequences instead (--sequences)"
            if sequences else "")


@dataclass(frozen=True)
class Table:
    """A table (or figure) of one paper at one scale: parts x rows x seeds, each cell a run
    per seed, each column an evaluation set, read at ``metrics``.

    make_run(part, row, seed) -> Run; reference: the paper's figures {part: {row: (figure
    per column)}}, a figure being a number, (mean, spread) or None (the paper has none);
    reference_metrics: the metrics the paper's figures are of (None: shown beside every
    metric); statistic: how a cell aggregates its seeds ("std": mean ± std, "ci95": mean ±
    the 95% t interval's half-width), always with n; digits: decimals shown; default_rows:
    the rows :meth:`runs` executes when none are named (None: every row; a table may show
    rows beyond them, optional ablations run by name); plot:
    plot(table, store, seeds, path) draws the paper's plot from the records as a PNG (None:
    the paper shows a table); derive: derive(record) -> {column: {metric: value}}, the
    values a view computes from a record (e.g. from its training log) in place of the
    record's own "metrics" (None: the record's); contest: (name, champion rows, rival rows)
    for :meth:`standings` (None: the table counts no standing)."""

    paper: str
    name: str
    title: str
    scale: str
    note: str
    parts: tuple
    rows: tuple
    columns: tuple
    metrics: tuple
    make_run: Callable = field(compare=False, repr=False)
    reference: dict = field(default_factory=dict, compare=False, repr=False)
    statistic: str = "std"
    reference_metrics: tuple = None
    digits: int = 2
    plot: Callable = field(default=None, compare=False, repr=False)
    default_rows: tuple = None
    derive: Callable = field(default=None, compare=False, repr=False)
    contest: tuple = None


    def values_of(self, record):
        """{column: {metric: value}} of a record: :attr:`derive`'s, else its "metrics"."""
        return self.derive(record) if self.derive else record["metrics"]

    def keys(self, seeds):
        """(part, row, seed) of every run, in order."""
        return [(p, r, s) for p in self.parts for r in self.rows for s in range(seeds)]

    def runs(self, seeds, rows=None, parts=None):
        """The runs of ``seeds`` seeds (0, 1, ...) of ``rows`` (default: :attr:`default_rows`,
        or every row) on ``parts`` (default: every part)."""
        rows = rows or self.default_rows or self.rows
        return [self.make_run(p, r, s) for p, r, s in self.keys(seeds)
                if r in rows and (parts is None or p in parts)]

    def records(self, store, seeds):
        """{(part, row, seed): record} of the runs whose record ``store`` holds."""
        found = {}
        for key in self.keys(seeds):
            record = store.get(self.make_run(*key).id)
            if record is not None:
                found[key] = record
        return found

    def cells(self, store, seeds):
        """{(part, row): {"n": records found, "missing": seeds without one, "values":
        {metric: {column: [value per found seed that has it]}}, "commits": the records' commits,
        "dirty": whether one came from a dirty tree, "unknown": whether one's provenance is
        unknown (converted from an older harness: mapformer.experiments.legacy), "kernels":
        the kernel sets the records were trained on (where their provenance names one)}}, read
        from ``store`` only."""
        cells = {}
        for part, row, seed in self.keys(seeds):
            cell = cells.setdefault((part, row), {
                "n": 0, "missing": [], "commits": set(), "dirty": False, "unknown": False,
                "kernels": set(),
                "values": {m: {c: [] for c in self.columns} for m in self.metrics}})
            record = store.get(self.make_run(part, row, seed).id)
            if record is None:
                cell["missing"].append(seed)
                continue
            cell["n"] += 1
            if record["provenance"].get("kernels"):
                cell["kernels"].add(record["provenance"]["kernels"])
            commit = record["provenance"]["commit"]
            if commit == "unknown":
                cell["unknown"] = True
            else:
                cell["commits"].add(commit)
                cell["dirty"] |= record["provenance"]["dirty"] is not False
            values = self.values_of(record)
            for m in self.metrics:  # a record without a metric (an older diagnosis) adds none
                for c in self.columns:
                    value = values.get(c, {}).get(m)
                    if value is not None:
                        cell["values"][m][c].append(value)
        return cells

    def markdown(self, store, seeds, metric=None):
        """Markdown of ``metric`` (default: the first): a line per row, a cell per part and
        column: mean ± spread (n) of the seeds' records, the paper's figure in parentheses.
        A cell whose records come from more than one commit is marked †, one with a record
        from a dirty tree ‡, one with a record of unknown provenance §, one whose records were
        trained on more than one kernel set ¶ (their products round differently, and a
        training can follow another trajectory from the same seed); a cell without records is
        '-'. A last line names the kernel sets of the records shown."""
        metric = metric or self.metrics[0]
        cells = self.cells(store, seeds)
        beside = self.reference_metrics is None or metric in self.reference_metrics
        head = [f"{p} {c}".strip() for p in self.parts for c in self.columns]
        lines = [f"**{self.title}** ({metric}; scale {self.scale}: {self.note})", "",
                 "| model | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
        marks, kernels = set(), {}
        for row in self.rows:
            out = []
            for part in self.parts:
                cell = cells[(part, row)]
                ref = self.reference.get(part, {}).get(row) if beside else None
                for i, column in enumerate(self.columns):
                    values = cell["values"][metric][column]
                    if not values:
                        out.append("-")
                        continue
                    mark = ("†" if len(cell["commits"]) > 1 else "") + \
                        ("‡" if cell["dirty"] else "") + ("§" if cell["unknown"] else "") + \
                        ("¶" if len(cell["kernels"]) > 1 else "")
                    marks.update(mark)
                    for k in cell["kernels"]:
                        kernels.setdefault(k, set()).add(row)
                    text = (f"{mean_spread(values, self.statistic, self.digits)} "
                            f"(n={len(values)}){mark}")
                    figure = paper_figure(ref[i], self.digits) if ref is not None else ""
                    out.append(text + (f" [{figure}]" if figure else ""))
            lines.append(f"| {row} | " + " | ".join(out) + " |")
        lines += ["", ("Paper in brackets; " if self.reference else "") + (
            "mean ± std over seeds" if self.statistic == "std" else "mean ± 95% t interval")
            + "."]
        if "†" in marks:
            lines.append("† records from more than one commit.")
        if "‡" in marks:
            lines.append("‡ a record from a tree with uncommitted changes.")
        if "§" in marks:
            lines.append("§ records of unknown provenance (converted from the harness before "
                         "the experiment layer).")
        if "¶" in marks:
            lines.append("¶ records trained on more than one kernel set.")
        if kernels:
            def which(rows):
                return ("every row" if len(rows) == len(self.rows)
                        else ", ".join(r for r in self.rows if r in rows))
            lines.append("Kernel sets: " + "; ".join(
                f"{k} ({which(rows)})" for k, rows in sorted(kernels.items())) + ".")
        contest = self.contest and beside and self.standings_markdown(store, seeds)
        return "\n".join(lines + (["", contest] if contest else []))

    def standings(self, store, seeds, metric=None, column=None):
        """{part: (ours, paper)}: :func:`standing` of the contest's champions among its rows
        on each part at ``column`` (default: the first) in ``metric`` (default: the first of
        the paper's), from the records (mean ± the table's spread over seeds; rows without
        records left out) and from the paper's figures of the same rows (those with records
        here: the paper's other columns left out too); each a (class, top row) pair."""
        _, champions, rivals = self.contest
        metric = metric or (self.reference_metrics or self.metrics)[0]
        column = column or self.columns[0]
        i = self.columns.index(column)
        cells = self.cells(store, seeds)
        out = {}
        for part in self.parts:
            ours, paper = {}, {}
            for row in champions + rivals:
                values = cells[(part, row)]["values"][metric][column]
                if values:
                    ours[row] = spread_of(values, self.statistic)
                figure = self.reference.get(part, {}).get(row)
                if row in ours and figure is not None and figure[i] is not None:
                    f = figure[i]
                    paper[row] = tuple(f) if isinstance(f, (tuple, list)) else (f, 0.0)
            out[part] = (standing(ours, champions), standing(paper, champions))
        return out

    def standings_markdown(self, store, seeds):
        """A line per part: where the contest's champions stand here and in the paper, and the
        counts of each class over the parts both have."""
        name, champions, _ = self.contest
        metric = (self.reference_metrics or self.metrics)[0]
        rows = self.standings(store, seeds)
        lines = [f"**Standing of {name}** ({', '.join(champions)}) by mean {metric} on "
                 f"{self.columns[0]}, lower better, among the rows with records here, "
                 "and the paper's figures of the same rows (the paper's classes; an interval "
                 "reaching the top ties):", "",
                 "| part | here | top here | paper | top in the paper |", "|---|---|---|---|---|"]
        counts = {"here": dict.fromkeys(STANDINGS, 0), "paper": dict.fromkeys(STANDINGS, 0)}
        for part, ((ours, top), (theirs, paper_top)) in rows.items():
            if ours is None:
                continue
            lines.append(f"| {part} | {ours} | {top} | {theirs or '-'} | {paper_top or '-'} |")
            counts["here"][ours] += 1
            if theirs is not None:
                counts["paper"][theirs] += 1
        n = sum(counts["here"].values())
        if not n:
            return ""
        lines += ["", "Here " + ", ".join(f"{k} in {v}" for k, v in counts["here"].items())
                  + f" of {n}; the paper on the same parts " + ", ".join(
                      f"{k} in {v}" for k, v in counts["paper"].items()) + "."]
        return "\n".join(lines)

    def measured_metrics(self, store, seeds):
        """The metrics of which ``store`` holds at least one value."""
        cells = self.cells(store, seeds).values()
        return tuple(m for m in self.metrics
                     if any(v for cell in cells for v in cell["values"][m].values()))

    def to_json(self, store, seeds):
        """The table as JSON values: spec fields, the paper's figures, and per cell the
        seeds' values, commits and missing seeds."""
        cells = self.cells(store, seeds)
        return {"paper": self.paper, "table": self.name, "title": self.title,
                "scale": self.scale, "note": self.note, "seeds": seeds,
                "columns": list(self.columns), "metrics": list(self.metrics),
                "reference": json.loads(json.dumps(self.reference)),
                "cells": [{"part": p, "row": r, "n": c["n"], "missing": c["missing"],
                           "commits": sorted(c["commits"]), "dirty": c["dirty"],
                           "unknown_provenance": c["unknown"],
                           "values": c["values"]} for (p, r), c in cells.items()]}
