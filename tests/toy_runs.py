"""A run kind for the experiment layer's tests (tests/test_experiments.py), named
"toy_runs:sleepy" so that worker processes import it: it sleeps run.extra["sleep"] seconds,
appends "start ID" and "end ID" lines to the ledger file run.extra["ledger"], and returns
metrics drawn from the run's seed (the same bits wherever it runs)."""
import os
import time

import numpy as np


def note(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def sleepy(run):
    ledger = run.extra["ledger"]
    note(ledger, f"start {run.id} {os.getpid()}")
    time.sleep(run.extra.get("sleep", 0.0))
    rng = np.random.default_rng(run.seed)
    metrics = {c: {"accuracy": float(rng.random())} for c in ("iid", "ood_dense", "ood_sparse")}
    note(ledger, f"end {run.id} {os.getpid()}")
    return {"metrics": metrics, "wall_s": 0.0}
