"""Sequence transduction: copy, repeat and reverse (APE, Kogkalidis et al., NeurIPS 2024,
section 4 and appendix 9), as a causal prefix-LM.

A source w of n symbols (uniform over ``n_symbols``) is followed by a separator and its
target y, which the model predicts token by token:

    copy      y = w                  (m = n)
    repeat    y = w w                (m = 2n)
    reverse   y = w[::-1]            (m = n)

e.g. reverse: ``C A D B | B D A C``. Vocabulary (S = n_symbols): 0 .. S-1 symbols, S the
separator, S+1 padding; vocab_size = S + 2.

What the paper fixes and what we chose. The paper: vocabulary 20, source lengths
int(Normal(100, 10)), 6000 / 2000 / 2000 train / dev / test sequences from one data seed (42),
an encoder-decoder with teacher forcing, metric: perplexity on the target tokens. Here:
lengths int(Normal(mean_length, length_std)) (truncated toward zero as Python's int, then
clipped to [ceil(mean - 4 std), floor(mean + 4 std)], at least 1), length_std = mean_length
/ 10 by default (the paper's ratio), mean 32 at cpu scale; 20 symbols for all three tasks
(the paper's code draws repeat and reverse over 19 and wraps copy in SOS/EOS: we use no
SOS/EOS); the same train_size (6000) and data seed (42). **Formulation (not the paper's):**
one decoder over ``w SEP y``, causal by default, so the source is read causally too (no
bidirectional encoder, no cross-attention); with the attention option ``attn_mask=prefix``
the source and separator are read bidirectionally (a prefix LM: :func:`attention_prefix`
gives each sequence's n + 1) and the target causally. The first target token is predicted
from the separator (the paper's decoder is given it).

Layout for next-token prediction, one sequence (n source, m target tokens): the full
sequence is ``w_0 .. w_{n-1}, SEP, y_0 .. y_{m-1}`` (n + 1 + m tokens), the input is all of it
but the last token (n + m columns), ``targets[:, i]`` is the full sequence's token i+1, and
``mask`` is True exactly on columns n .. n+m-1, whose targets are y_0 .. y_{m-1}: the loss
and every metric are on the target tokens only.

Padding. Lengths vary within a batch: every row is padded on the right with the padding
token (as input and as target, mask False) to the batch's longest row, so a batch is (B, L)
with L = max(n_b + m_b). Since every mixer is causal (or, with the prefix mask, sees only
the source beyond the causal keys), a real column never sees a padding column (they all come
after it): padding changes no logit and no loss of a real position, exactly. ``seq_len`` is the longest input a config can produce (the bound, not every batch's
width).

Splits. A source's split is a hash of its symbols and length (60 / 20 / 20 buckets: train,
dev, test, the paper's 6000 : 2000 : 2000), so the splits are disjoint by construction, for
every length distribution at once (the OOD-length set draws from the test buckets) and for
all three operations (a source lands in the same split whichever the task). Each split's
sequences are drawn from ``default_rng([data_seed, split])`` in fixed chunks, kept if their
bucket is the split's, de-duplicated, and the first N kept: the data are a function of the
config only, not of the training seed (as in the paper, where model seeds vary and the data
do not). Training batches sample ``train_size`` fixed training sequences uniformly with
replacement (the paper passes over them in epochs); evaluation sets are the first N
sequences of the dev or test split (``eval_split``).

Evaluation sets of a training config (:func:`ood_sets`): "iid" (train.py's name for the
training distribution) reads the test split; "dev" the dev split; "ood_long" the test split
at twice the mean length and spread (longer than every training sequence but the tail's):
length generalisation, what positional encodings are judged on.

Metrics: ``perplexity`` exp(mean cross-entropy over the target tokens, padding excluded: the
paper's), ``sequence_accuracy`` (every target token of a sequence right, teacher-forced argmax:
exact match), ``token_accuracy``.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from . import stream
from .stream import check_int
OPERATIONS = ("copy", "repeat", "reverse")
SPLITS = ("train", "dev", "test")
BUCKETS = {"train": range(0, 6), "dev": range(6, 8), "test": range(8, 10)}  # of 10
CHUNK = 4096  # candidates drawn per round when building a split (fixed: prefixes agree)


def check_split_fields(config) -> None:
    """ValueError unless config.train_size >= 1, config.data_seed >= 0 and config.eval_split
    is 'dev' or 'test' (the fields of every task whose data are fixed splits: transduction,
    trees)."""
    check_int("train_size", config.train_size, 1)
    check_int("data_seed", config.data_seed, 0)
    if config.eval_split not in ("dev", "test"):
        raise ValueError(f"eval_split must be 'dev' or 'test', got {config.eval_split!r}")


@dataclass(frozen=True)
class TransductionConfig:
    """One transduction dataset.

    Fields:
        operation: 'copy', 'repeat' or 'reverse'.
        mean_length: mean source length, >= 1.
        length_std: spread of the source length (a negative value, the default, means
            mean_length / 10, the paper's ratio).
        n_symbols: S, source symbols, >= 1.
        train_size: training sequences (the fixed set batches sample), >= 1.
        data_seed: the seed of every split.
        eval_split: the split evaluation sets read, 'test' or 'dev'.
    """

    operation: str = "reverse"
    mean_length: int = 32
    length_std: float = -1.0
    n_symbols: int = 20
    train_size: int = 6000
    data_seed: int = 42
    eval_split: str = "test"

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, got {self.operation!r}")
        check_int("mean_length", self.mean_length, 1)
        check_int("n_symbols", self.n_symbols, 1)
        check_split_fields(self)
        std = self.length_std
        if isinstance(std, bool) or not isinstance(std, numbers.Real) or not math.isfinite(std):
            raise ValueError(f"length_std must be a finite number, got {std!r}")
        if std < 0:  # the default: the paper's ratio (std 10 at mean 100)
            object.__setattr__(self, "length_std", self.mean_length / 10)
        else:
            object.__setattr__(self, "length_std", float(std))

    @property
    def separator_id(self) -> int:
        """Id of the separator, n_symbols."""
        return self.n_symbols

    @property
    def pad_id(self) -> int:
        """Id of the padding token, n_symbols + 1 (never a scored target)."""
        return self.n_symbols + 1

    @property
    def blank_id(self) -> int:
        """The token train.evaluate treats as 'blank': padding, which is never scored, so its
        object accuracy equals its accuracy."""
        return self.pad_id

    @property
    def vocab_size(self) -> int:
        """Number of token ids, n_symbols + 2."""
        return self.n_symbols + 2

    @property
    def min_length(self) -> int:
        """Shortest source: max(1, ceil(mean - 4 std))."""
        return max(1, math.ceil(self.mean_length - 4 * self.length_std))

    @property
    def max_length(self) -> int:
        """Longest source: max(min_length, floor(mean + 4 std))."""
        return max(self.min_length, math.floor(self.mean_length + 4 * self.length_std))

    @property
    def target_factor(self) -> int:
        """m / n: 2 for repeat, else 1."""
        return 2 if self.operation == "repeat" else 1

    @property
    def seq_len(self) -> int:
        """The widest input a batch can have: max_length * (1 + target_factor)."""
        return self.max_length * (1 + self.target_factor)


PRESETS: dict[str, dict] = {"iid": {}}
"""One preset, the cpu-scale defaults (mean length 32); the paper's is mean_length=100."""

LOSS_POSITIONS = ("revisits", "all")
"""The choices of :func:`loss_mask` for this task ('revisits': train.py's name for the scored
positions, here the target tokens)."""


def preset(name: str, **overrides) -> TransductionConfig:
    """The config of a named preset ("iid"), keyword overrides replacing fields, e.g.
    ``preset("iid", operation="copy", mean_length=100)``. ValueError for another name."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} for the transduction tasks; the presets are "
                         f"{sorted(PRESETS)}")
    return TransductionConfig(**{**PRESETS[name], **overrides})


def describe(config: TransductionConfig) -> str:
    """A short description for logs, e.g. 'reverse, source length 32 +- 3.2 in [20, 44], 20
    symbols, test split'."""
    return (f"{config.operation}, source length {config.mean_length} +- {config.length_std:g} "
            f"in [{config.min_length}, {config.max_length}], {config.n_symbols} symbols, "
            f"{config.eval_split} split")


def ood_sets(config: TransductionConfig) -> dict[str, TransductionConfig]:
    """The evaluation sets besides "iid" (the test split): {"dev": the dev split, "ood_long":
    the test split at twice the mean length and spread}."""
    return {"dev": replace(config, eval_split="dev"),
            "ood_long": replace(config, mean_length=2 * config.mean_length,
                                length_std=2 * config.length_std)}


@dataclass
class TransductionBatch:
    """A batch of B sequences padded to L = max(n_b + m_b) (layout in the module doc).

    Attributes:
        tokens: int32 (B, L), source, separator, target but its last token, padding.
        targets: int32 (B, L), the next token of the full sequence (padding past its end).
        mask: bool (B, L), True on the m_b columns whose target is a target token.
        lengths: int64 (B,), source lengths n_b.
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray


def split_of(sources: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64 (N,): the bucket (0..9) of each source, a hash of its first lengths[i] symbols and
    its length. sources: int (N, W), W >= max(lengths) (entries past a length ignored)."""
    n, width = sources.shape
    live = np.arange(width) < lengths[:, None]
    h = np.where(live, sources.astype(np.uint64) + np.uint64(1), np.uint64(0))
    weights = np.full(width, 0x9E3779B97F4A7C15, dtype=np.uint64) ** np.arange(
        1, width + 1, dtype=np.uint64)  # wraps mod 2^64
    with np.errstate(over="ignore"):
        x = (h * weights).sum(axis=1, dtype=np.uint64) ^ lengths.astype(np.uint64)
        x ^= x >> np.uint64(31)  # splitmix64's finaliser
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(10)).astype(np.int64)


def draw_sources(config: TransductionConfig, count: int, rng: np.random.Generator):
    """(sources int32 (count, max_length) padded with pad_id, lengths int64 (count,)): fresh
    random sources of the config's length distribution, no split applied."""
    lengths = np.clip(np.trunc(rng.normal(config.mean_length, config.length_std, count)),
                      config.min_length, config.max_length).astype(np.int64)
    sources = rng.integers(0, config.n_symbols, size=(count, config.max_length), dtype=np.int32)
    sources[np.arange(config.max_length) >= lengths[:, None]] = config.pad_id
    return sources, lengths


def distinct_rows(draw, count: int, shortfall) -> tuple[np.ndarray, ...]:
    """The first ``count`` distinct rows of repeated ``draw()`` calls: each returns a tuple of
    arrays with one row per candidate (already filtered to the split), the first array's rows
    the key; duplicates of an earlier key are dropped (first occurrences kept, in order).
    ValueError(shortfall(found)) once three rounds in a row add nothing new. (Shared by the
    transduction and tree tasks' splits.)"""
    kept = None
    stalled = 0
    while kept is None or len(kept[0]) < count:
        if stalled == 3:  # three rounds found no new row: (nearly) all are drawn
            raise ValueError(shortfall(len(kept[0])))
        new = draw()
        before = 0 if kept is None else len(kept[0])
        kept = new if kept is None else tuple(np.concatenate(ab) for ab in zip(kept, new))
        _, first = np.unique(kept[0], axis=0, return_index=True)
        first = np.sort(first)  # duplicates dropped, the first occurrences in order
        kept = tuple(a[first] for a in kept)
        stalled = stalled + 1 if len(kept[0]) == before else 0
    return tuple(a[:count] for a in kept)


@functools.lru_cache(maxsize=16)
def _split_sources(config: TransductionConfig, split: str, count: int):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([config.data_seed, SPLITS.index(split)])

    def draw():
        sources, lengths = draw_sources(config, CHUNK, rng)
        return (sources[np.isin(split_of(sources, lengths), BUCKETS[split])],)

    (kept,) = distinct_rows(draw, count, lambda found: (
        f"fewer than {count} distinct {split} sources of length {config.min_length} "
        f"to {config.max_length} over {config.n_symbols} symbols exist (found "
        f"{found}): lower train_size or the evaluation sequences, or lengthen "
        "the sources"))
    kept.setflags(write=False)
    return kept, (kept != config.pad_id).sum(axis=1).astype(np.int64)


def split_sources(config: TransductionConfig, split: str, count: int):
    """(sources int32 (count, max_length) padded with pad_id, lengths int64 (count,)): the
    first ``count`` distinct sources of ``split`` ('train', 'dev' or 'test'), a function of
    (data_seed, n_symbols, length distribution, split, count) only; the first k of a larger
    count are the same k. Read-only arrays (cached)."""
    check_int("count", count, 1)
    # keyed by what the sources depend on, so the three operations share one cache entry
    return _split_sources(replace(config, operation="copy", train_size=1, eval_split="test"),
                          split, count)


def make_batch(config: TransductionConfig, sources: np.ndarray,
               lengths: np.ndarray) -> TransductionBatch:
    """The batch of these sources (int (B, W) with W >= max(lengths); lengths int (B,) >= 1)
    under the config's operation, padded to the batch's longest row."""
    lengths = np.asarray(lengths, dtype=np.int64)
    sources = np.asarray(sources)
    n = lengths[:, None]  # (B, 1)
    m = config.target_factor * n
    width = int((n + m).max())  # input columns L
    j = np.arange(width + 1)[None, :]  # column of the full sequence, (1, L + 1)
    k = j - n - 1  # index into the target y
    if config.operation == "reverse":
        src = n - 1 - k
    elif config.operation == "repeat":
        src = k % n
    else:
        src = k
    src = np.where(j < n, j, src)
    gather = np.take_along_axis(sources, np.clip(src, 0, sources.shape[1] - 1), axis=1)
    full = np.where(j == n, config.separator_id,
                    np.where(j <= n + m, gather, config.pad_id)).astype(np.int32)
    cols = np.arange(width)[None, :]
    tokens = np.where(cols < n + m, full[:, :-1], config.pad_id).astype(np.int32)  # y_{m-1}
    return TransductionBatch(tokens=tokens,  # is a target only: padding as input
                             targets=np.ascontiguousarray(full[:, 1:]),
                             mask=(cols >= n) & (cols < n + m), lengths=lengths.copy())


def generate(config: TransductionConfig, batch_size: int,
             rng: np.random.Generator | int | None = None) -> TransductionBatch:
    """A training batch: B = batch_size sequences drawn uniformly (with replacement) from the
    config's ``train_size`` training sequences by ``rng`` (a Generator, advanced in place, a
    seed, or None)."""
    return stream.split_batch(split_sources, make_batch, config, batch_size, rng)


def batches(config: TransductionConfig, batch_size: int,
            seed: int | None = None) -> Iterator[TransductionBatch]:
    """Endless stream of training batches, reproducible from seed."""
    return stream.endless(generate, config, batch_size, seed)


def eval_set(config: TransductionConfig, n_sequences: int, seed: int = 0,
             batch_size: int = 128) -> list[TransductionBatch]:
    """The first n_sequences sequences of the config's ``eval_split`` in batches of
    batch_size (the last holds the remainder). ``seed`` is not used: the split is fixed by
    the config's data_seed (every run is scored on the same sequences)."""
    return stream.split_eval_set(split_sources, make_batch, config, n_sequences, batch_size)


def loss_mask(batch: TransductionBatch, positions: str, tasks: str = "transduction"
              ) -> np.ndarray:
    """bool (B, L): the columns a training loss is taken on. "revisits" (the scored
    positions): the target tokens, ``batch.mask``; "all": every column but padding (the
    source's next-token loss too). ``tasks`` names the tasks in the error message (the tree
    tasks share this)."""
    if positions == "revisits":
        return batch.mask
    if positions == "all":  # the real columns: 0 .. n + m - 1
        last = (batch.lengths + batch.mask.sum(axis=1))[:, None]
        return np.arange(batch.tokens.shape[1])[None, :] < last
    raise ValueError(f"loss_positions {positions!r} is not defined for {tasks} (use "
                     "'revisits', its target tokens, or 'all')")


def attention_prefix(batch: TransductionBatch) -> np.ndarray:
    """int64 (B,): each sequence's source and separator, n_b + 1 columns: what a prefix LM
    (attention with ``attn_mask='prefix'``) reads bidirectionally. The separator's column,
    whose target is y_0, then sees the whole source; every target column stays causal, so no
    target token is visible before it is predicted. (With ``loss_positions='all'`` the
    source's own next-token targets are visible inside the prefix: that part of the loss is
    trivial under this mask.)"""
    return batch.lengths + 1


def token_coordinates(batch: TransductionBatch) -> None:
    """None: a token's position is its index."""
    return None


def eval_metrics(loss: float, exact: int, sequences: int) -> dict:
    """The paper's metric and exact match, from train.evaluate's sums: {"perplexity":
    exp(loss), loss the mean cross-entropy over target tokens; "sequence_accuracy": exact /
    sequences}."""
    return {"perplexity": math.exp(loss), "sequence_accuracy": exact / max(sequences, 1)}


def _predictions(logits_or_predictions: np.ndarray, batch: TransductionBatch) -> np.ndarray:
    pred = np.asarray(logits_or_predictions)
    if pred.ndim == 3:
        pred = pred.argmax(axis=-1)
    if pred.shape != batch.targets.shape:
        raise ValueError(f"logits_or_predictions must have shape {batch.targets.shape} or "
                         f"{batch.targets.shape} + (V,), got {np.shape(logits_or_predictions)}")
    return pred


def token_accuracy(logits_or_predictions: np.ndarray, batch: TransductionBatch) -> float:
    """Fraction of target tokens (masked positions, pooled) predicted right; predictions
    (B, L) or logits (B, L, V) reduced by argmax."""
    return float((_predictions(logits_or_predictions, batch) == batch.targets)[batch.mask]
                 .mean())


def sequence_accuracy(logits_or_predictions: np.ndarray, batch: TransductionBatch) -> float:
    """Fraction of sequences whose target tokens are all predicted right (exact match,
    teacher-forced)."""
    right = (_predictions(logits_or_predictions, batch) == batch.targets) | ~batch.mask
    return float(right.all(axis=1).mean())


def perplexity(logits: np.ndarray, batch: TransductionBatch) -> float:
    """exp(mean cross-entropy of logits (B, L, V) over the target tokens), in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(logp, batch.targets[..., None].astype(np.int64), axis=-1)[..., 0]
    return float(np.exp(-picked[batch.mask].mean()))
