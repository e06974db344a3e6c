"""What the task modules share: the integer argument check, the endless training stream and
the evaluation set of a generated task.

A generated task (navigation, selective copy, 4D rotations, ...) draws its training stream from
one generator seeded (seed, 0) and its evaluation set from one seeded (seed, 1), so the same
seed never gives the same sequences in both. Tasks with fixed splits (transduction, trees,
grids, digits) use :func:`endless` for training and take their evaluation sets from a split;
the transductions (sequences, trees, grids) draw and cut their split's rows with
:func:`split_batch` and :func:`split_eval_set`.
"""
import numbers
from collections.abc import Callable, Iterator

import numpy as np


def check_task_options(task: str, options: dict, kinds: dict, nullable=()) -> dict:
    """``options`` (TrainConfig.task_options) of task ``task`` checked against ``kinds``
    ({name: type}; ``nullable`` names may be None): ValueError naming the first unknown name
    or value of another type; a bool given as the command line gives it ("true", "false")
    becomes a bool. Returns the checked options."""
    checked = {}
    for key, value in options.items():
        kind = kinds.get(key)
        if kind is None:
            raise ValueError(f"task_options: task {task!r} has options {sorted(kinds)}, "
                             f"not {key!r}")
        if kind is bool and value in ("true", "false"):
            value = value == "true"
        if not (value is None and key in nullable) and (
                not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)):
            raise ValueError(f"task_options: {key} must be a {kind.__name__}, got {value!r}")
        checked[key] = value
    return checked


def check_int(name: str, value, low: int) -> None:
    """ValueError naming ``name`` unless value is an integer (not a bool) >= low."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def endless(generate: Callable, config, batch_size: int, seed: int | None) -> Iterator:
    """generate(config, batch_size, rng) forever, on one rng seeded (seed, 0) (None: fresh
    entropy): the endless training stream, reproducible from seed."""
    rng = np.random.default_rng(None if seed is None else [seed, 0])
    while True:
        yield generate(config, batch_size, rng)


def generated_eval_set(generate: Callable, config, n_sequences: int, seed: int,
                       batch_size: int) -> list:
    """A fixed evaluation set of n_sequences sequences: generate(config, size, rng) on one rng
    seeded (seed, 1), in batches of batch_size but the last, which holds the remainder; a
    function of its arguments only."""
    check_int("n_sequences", n_sequences, 1)
    check_int("batch_size", batch_size, 1)
    rng = np.random.default_rng([seed, 1])
    sizes = [batch_size] * (n_sequences // batch_size)
    if n_sequences % batch_size:
        sizes.append(n_sequences % batch_size)
    return [generate(config, size, rng) for size in sizes]


def split_batch(split_rows: Callable, make_batch: Callable, config, batch_size: int,
                rng: np.random.Generator | int | None) -> object:
    """A training batch of a task with fixed splits: batch_size rows drawn uniformly (with
    replacement) from the config's ``train_size`` training rows by ``rng`` (a Generator,
    advanced in place, a seed, or None). ``split_rows(config, split, count)`` gives the split's
    first count rows as a tuple of arrays of leading dimension count; ``make_batch(config,
    *arrays)`` builds the batch from the drawn rows."""
    check_int("batch_size", batch_size, 1)
    rng = np.random.default_rng(rng)
    rows = split_rows(config, "train", config.train_size)
    pick = rng.integers(0, config.train_size, size=batch_size)
    return make_batch(config, *(a[pick] for a in rows))


def split_eval_set(split_rows: Callable, make_batch: Callable, config, n_sequences: int,
                   batch_size: int) -> list:
    """The first n_sequences rows of the config's ``eval_split`` (``split_rows`` and
    ``make_batch`` as :func:`split_batch`) in batches of batch_size, the last holding the
    remainder: every run is scored on the same rows."""
    check_int("n_sequences", n_sequences, 1)
    check_int("batch_size", batch_size, 1)
    rows = split_rows(config, config.eval_split, n_sequences)
    return [make_batch(config, *(a[i:i + batch_size] for a in rows))
            for i in range(0, n_sequences, batch_size)]
