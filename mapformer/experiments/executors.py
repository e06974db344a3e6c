"""Executors: where runs execute, all behind one interface.

``executor.execute(runs, directory)`` yields ``(run, record or exception)`` as each run
finishes, in any order; ``executor.running()`` is the number of its runs started and not
finished. Every executor calls :func:`execute_into` on its worker, which first
looks for the run's record in ``directory`` (a retried task whose run had finished returns that
record: a finished run never runs twice) and writes the record there when it finishes (workers
of a cluster with a shared directory write their own; the client writes them too, so a
directory that workers cannot see still gets every record).

- :class:`Serial`: in this process, one run after another (the default: tests, debugging).
- :class:`Pool`: a local process pool, one run per worker process, ``threads`` OpenMP threads
  each.
- :class:`Dask`: Dask distributed: a ``LocalCluster`` of ``workers`` processes, a running
  scheduler's address (``dask scheduler`` / ``dask worker`` on any machines), or any cluster
  object (``dask_jobqueue.SLURMCluster``: :meth:`Dask.slurm`). A killed worker's runs are
  rescheduled by the scheduler; a run that raises is retried ``retries`` times. Needs the
  ``cluster`` extra (``pip install ".[cluster]"``).
"""
import contextlib
import os
from concurrent.futures import ProcessPoolExecutor, as_completed

from .records import RecordStore
from .runs import Run, execute


def execute_into(run_dict, directory=None):
    """The record of the run ``run_dict`` (a Run.to_dict()): the one in ``directory`` when it
    holds it, else executed and written there (None: not written)."""
    run = Run.from_dict(run_dict)
    store = RecordStore(directory) if directory is not None else None
    held = store.get(run.id) if store is not None else None
    if held is not None:
        return held
    record = execute(run)
    if store is not None:
        store.put(record)
    return record


@contextlib.contextmanager
def omp_threads(threads):
    """OMP_NUM_THREADS set to ``threads`` (None: unchanged) in this process's environment, for
    the worker processes started inside (they read it when they load the C core)."""
    before = os.environ.get("OMP_NUM_THREADS")
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before


class Serial:
    """Runs in this process, in order."""

    name = "serial"

    def running(self):
        return 0  # asked between runs: none is running

    def execute(self, runs, directory=None):
        for run in runs:
            try:
                yield run, execute_into(run.to_dict(), directory)
            except Exception as exc:  # a failed run is reported, the others go on
                yield run, exc

    def close(self):
        pass


def exit_with_parent(parent_pid, every_s=1.0):
    """A pool worker's initializer: a daemon thread that ends this process once its parent
    ``parent_pid`` is gone (killed by SIGTERM or SIGKILL, which leave a ProcessPoolExecutor's
    workers running and still writing records). Records are written by rename, so a worker
    ended mid-run leaves no partial record."""
    import threading
    import time

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


class Pool:
    """A local pool of ``workers`` processes (spawned: each loads its own C core), each with
    ``threads`` OpenMP threads (default: 1 when there are several workers). The workers end
    with this process, however it ends (:func:`exit_with_parent`)."""

    name = "pool"

    def __init__(self, workers=2, threads=None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.threads = threads if threads is not None else (1 if workers > 1 else None)
        self.futures = {}

    def running(self):
        return min(self.workers, sum(f.running() for f in self.futures))

    def execute(self, runs, directory=None):
        import multiprocessing

        with omp_threads(self.threads), ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
            futures = self.futures = {pool.submit(execute_into, run.to_dict(), directory): run
                                      for run in runs}
            for future in as_completed(futures):
                exc = future.exception()
                yield futures[future], exc if exc is not None else future.result()
            self.futures = {}

    def close(self):
        pass


class Dask:
    """Runs on a Dask cluster. scheduler: a running scheduler's address ("tcp://HOST:PORT");
    cluster: a cluster object (e.g. dask_jobqueue.SLURMCluster); neither: a LocalCluster of
    ``workers`` processes with ``threads`` OpenMP threads each (one Dask thread per worker:
    one run at a time). retries: reruns of a run that raised (a killed worker's runs are
    rescheduled by the scheduler, up to its allowed-failures)."""

    name = "dask"

    def __init__(self, scheduler=None, cluster=None, workers=2, threads=1, retries=1):
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:  # the optional extra
            raise ImportError("the dask executor needs Dask distributed: "
                              "pip install \".[cluster]\"") from exc
        self.retries = retries
        self.cluster = None
        if scheduler is not None:
            self.client = Client(scheduler)
            return
        if cluster is None:
            cluster = self.cluster = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True,
                env={"OMP_NUM_THREADS": str(threads)}, dashboard_address=None)
        self.client = Client(cluster)

    @classmethod
    def slurm(cls, jobs, partition=None, cores=2, memory="8GB", walltime="04:00:00",
              **options):
        """A SLURM cluster of ``jobs`` jobs (dask_jobqueue.SLURMCluster, one worker each, one
        run at a time with ``cores`` OpenMP threads); ``options`` go to SLURMCluster."""
        cluster = slurm_cluster(jobs, partition, cores, memory, walltime, **options)
        return cls(cluster=cluster)

    def running(self):
        """Runs the workers are processing (the scheduler's count)."""
        return sum(len(keys) for keys in self.client.processing().values())

    def execute(self, runs, directory=None):
        from distributed import as_completed as completed

        runs = list(runs)
        futures = {self.client.submit(execute_into, run.to_dict(), directory,
                                      key=f"run-{run.id}", retries=self.retries, pure=False):
                   run for run in runs}
        for future in completed(list(futures)):
            if future.status == "finished":
                yield futures[future], future.result()
            else:
                yield futures[future], future.exception()
            future.release()

    def close(self):
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def slurm_cluster(jobs, partition=None, cores=2, memory="8GB", walltime="04:00:00",
                  **options):
    """dask_jobqueue.SLURMCluster scaled to ``jobs`` jobs of one worker process each (one run
    at a time, ``cores`` OpenMP threads)."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError as exc:
        raise ImportError("the slurm executor needs dask-jobqueue: pip install "
                          "\".[cluster]\"") from exc
    cluster = SLURMCluster(queue=partition, cores=cores, processes=1, memory=memory,
                           walltime=walltime, job_script_prologue=[
                               f"export OMP_NUM_THREADS={cores}"], **options)
    cluster.scale(jobs=jobs)
    return cluster


def make_executor(name="serial", workers=2, threads=None, scheduler=None, jobs=None,
                  partition=None):
    """The executor the CLI names: serial, pool, dask (``scheduler``: a running one) or
    slurm (``jobs`` jobs on ``partition``)."""
    if name == "serial":
        return Serial()
    if name == "pool":
        return Pool(workers, threads)
    if name == "dask":
        return Dask(scheduler=scheduler, workers=workers, threads=threads or 1)
    if name == "slurm":
        return Dask.slurm(jobs or workers, partition, cores=threads or 2)
    raise ValueError(f"executor must be serial, pool, dask or slurm, got {name!r}")
