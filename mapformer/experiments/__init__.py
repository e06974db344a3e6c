"""Experiments: runs, their records, tables rendered from records, and executors.

A :class:`Run` is a pure description of one training run (model config, train config, the
evaluation sets, a kind naming what executes it): JSON-serialisable, hashable, with a stable
``id``. :func:`execute` runs it and returns its *record* (the run, every metric, wall time and
provenance: library version, git commit and dirty flag, kernel set, CPU, threads, NumPy and
OpenBLAS). A :class:`RecordStore` keeps one JSON file per run id, written atomically. A
:class:`Table` is a declarative spec (parts x rows x seeds at a scale, a metric per column,
the paper's figures beside it) whose cells are rendered from the store's records only.
:func:`run_all` executes the runs a store lacks on an executor (:mod:`.executors`: serial, a
local process pool, Dask distributed) and writes each record as it finishes, so a table can
span sittings and a rerun skips what is done.

    from mapformer import reproduce
    from mapformer.experiments import RecordStore, run_all
    table = reproduce.table("mapformer", "2", scale="cpu")   # every paper's: mapformer.reproduce
    store = RecordStore("records/mapformer")
    run_all(table.runs(seeds=3), store)          # serial; executor=Pool(2) or Dask(...)
    print(table.markdown(store, seeds=3))
"""
from .executors import Dask, Pool, Serial, make_executor
from .records import RecordStore, provenance
from .runs import KINDS, Run, execute, register_kind
from .tables import Table, run_all

__all__ = ["Dask", "KINDS", "Pool", "RecordStore", "Run", "Serial", "Table", "execute",
           "make_executor", "provenance", "register_kind", "run_all"]
