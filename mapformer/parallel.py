"""Data-parallel training over MPI (mpi4py; the ``mpi`` extra installs it with the ``mpich``
wheel, no system MPI needed):

    mpiexec -n K python -m mapformer train ... --data-parallel

Every rank draws the whole batch of each step from the run's generator (the generator is
seeded by (seed, step), so every rank draws the same batch) and takes its share of the rows
(contiguous blocks, sizes differing by at most one); its gradient is scaled by the whole
batch's count of scored positions, so one ``Allreduce`` (sum) of the flat gradient buffer
gives every rank the gradient one process would compute on the whole batch, up to the order
of the float32 sums. Every rank then takes the same AdamW step: their parameters stay
bit-identical. Rank 0 alone shows progress, writes the checkpoint and metrics, and evaluates
(the results are broadcast). A checkpoint resumes on any K: the batches depend only on the
seed and the step.

Refused (ValueError): dropout (each rank would draw its own masks) and bottlenecks (the VQ
codebooks' restarts and usage counts are per rank).
"""
import dataclasses

import numpy as np


class DataParallel:
    """The ranks of ``comm`` (default MPI.COMM_WORLD) training one model together."""

    def __init__(self, comm=None):
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise ImportError("data-parallel training needs mpi4py: pip install \".[mpi]\" "
                              "(mpi4py with the mpich wheel), then mpiexec -n K ...") from exc
        self.mpi = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    @property
    def root(self):
        """Whether this is rank 0 (the one that writes and reports)."""
        return self.rank == 0

    def rows(self, batch_size):
        """This rank's rows of a batch of ``batch_size``: slice(lo, hi), the K blocks
        contiguous, their sizes differing by at most one. ValueError when a rank would get
        no row."""
        if batch_size < self.size:
            raise ValueError(f"batch_size {batch_size} < {self.size} ranks: every rank needs "
                             "at least one row")
        lo = batch_size * self.rank // self.size
        return slice(lo, batch_size * (self.rank + 1) // self.size)

    def share(self, batch):
        """This rank's rows of ``batch`` (a task's batch dataclass): every array field whose
        first axis is the batch's taken at :meth:`rows`, the others as they are."""
        size = len(batch.tokens)
        rows = self.rows(size)
        return dataclasses.replace(batch, **{
            f.name: getattr(batch, f.name)[rows] for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), np.ndarray)
            and getattr(batch, f.name).ndim >= 1 and len(getattr(batch, f.name)) == size})

    def allreduce(self, array):
        """array (any shape, float32, contiguous) <- its sum over the ranks, in place."""
        self.comm.Allreduce(self.mpi.IN_PLACE, array, op=self.mpi.SUM)
        return array

    def sum(self, value):
        """A float's sum over the ranks (the same on every rank)."""
        return self.comm.allreduce(float(value), op=self.mpi.SUM)

    def broadcast(self, value):
        """Rank 0's ``value`` on every rank."""
        return self.comm.bcast(value, root=0)


def check_data_parallel(model_config):
    """ValueError for a model data-parallel training cannot reproduce (see the module)."""
    if model_config.dropout > 0:
        raise ValueError(f"--data-parallel: dropout {model_config.dropout} is drawn per rank; "
                         "train data-parallel with dropout 0")
    if model_config.bottleneck != "none":
        raise ValueError(f"--data-parallel: the {model_config.bottleneck!r} bottleneck keeps "
                         "per-rank state (codebook usage, restarts); train it in one process")
