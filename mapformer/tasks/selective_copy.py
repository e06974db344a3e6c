"""Selective copying (Mamba; used by CoPE and the MapFormer paper, sections 3.1 and 5.1).

A sequence holds n_copy data tokens, each uniform over ``n_symbols`` symbols, with n_blanks
blank tokens inserted among them (every interleaving equally likely), then a separator, then
the data tokens in order: the model must copy the non-blank tokens and ignore the blanks,
e.g. ``C F E A B A B B B B C B F | C F E A A C F`` (B blank, | separator).

Vocabulary (S = n_symbols):

    0 .. S-1    data symbols
    S           blank
    S+1         separator
    vocab_size = S + 2

Layout for next-token prediction (C = n_copy, N = n_copy + n_blanks = ``separator_index``).
The full sequence is ``x_0 .. x_{N-1}, SEP, a_0 .. a_{C-1}`` (x: data and blanks interleaved,
a: the C data tokens in order); the model's input is all of it but the last token:

    columns 0 .. N-1        x_0 .. x_{N-1}
    column  N               SEP
    columns N+1 .. N+C-1    a_0 .. a_{C-2}
    seq_len L = N + C = 2 * n_copy + n_blanks

``targets[:, i]`` is the full sequence's token i+1, i.e. ``targets[:, :-1] = tokens[:, 1:]``
and the last column is a_{C-1}. ``mask`` is True exactly on the last C columns N .. L-1, where
the target of column N+k is the answer token a_k; every other column (predicting the next
data/blank token or the separator) is unscored.

Scoring: ``token_accuracy`` is the fraction of masked positions predicted right (all answer
tokens of all sequences pooled); ``sequence_accuracy`` is the fraction of sequences whose C
answer tokens are all right.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from . import stream
from .stream import check_int
@dataclass(frozen=True)
class SelectiveCopyConfig:
    """One selective-copy dataset.

    Fields:
        n_copy: C, data tokens to copy per sequence, >= 1.
        n_blanks: blank tokens inserted among them, >= 0.
        n_symbols: S, number of data symbols, >= 1.
    """

    n_copy: int = 128
    n_blanks: int = 128
    n_symbols: int = 16

    def __post_init__(self) -> None:
        check_int("n_copy", self.n_copy, 1)
        check_int("n_blanks", self.n_blanks, 0)
        check_int("n_symbols", self.n_symbols, 1)

    @property
    def blank_id(self) -> int:
        """Id of the blank token, n_symbols."""
        return self.n_symbols

    @property
    def separator_id(self) -> int:
        """Id of the separator token, n_symbols + 1."""
        return self.n_symbols + 1

    @property
    def vocab_size(self) -> int:
        """Number of token ids, n_symbols + 2."""
        return self.n_symbols + 2

    @property
    def separator_index(self) -> int:
        """Column of the separator, n_copy + n_blanks (the length of the data-and-blanks part)."""
        return self.n_copy + self.n_blanks

    @property
    def seq_len(self) -> int:
        """Input tokens per sequence, 2 * n_copy + n_blanks."""
        return self.separator_index + self.n_copy


PRESETS: dict[str, dict] = {
    "iid": dict(n_copy=128, n_blanks=128),
    "ood_dense": dict(n_copy=128, n_blanks=64),
    "ood_sparse": dict(n_copy=128, n_blanks=256),
}
"""The paper's settings (section 5.1, Table 1): train on "iid", test on the two OOD sets."""


def describe(config: SelectiveCopyConfig) -> str:
    """A short description of a task config for logs, e.g. '128 tokens among 128 blanks, 16
    symbols'."""
    return f"{config.n_copy} tokens among {config.n_blanks} blanks, {config.n_symbols} symbols"


def ood_sets(config: SelectiveCopyConfig) -> dict[str, SelectiveCopyConfig]:
    """The OOD test sets of a training set ``config`` at the paper's ratios:
    {"ood_dense": half the blanks, "ood_sparse": twice the blanks}, n_copy and n_symbols kept.
    For the paper's "iid" preset these are its OOD presets."""
    return {"ood_dense": replace(config, n_blanks=config.n_blanks // 2),
            "ood_sparse": replace(config, n_blanks=2 * config.n_blanks)}


def delta_metrics(config: SelectiveCopyConfig, by_token: list) -> dict:
    """What a path-integrating model's integration times Delta say about the blanks, for
    ``train.evaluate``: {"delta_blank_over_data_layer{i}": mean |Delta| on blank tokens over the
    mean |Delta| on data tokens (the per-symbol means averaged; a data token counted wherever
    it is an input, before the separator or as an answer) for each layer i that integrates
    Delta}. 0 means the blanks do not move the positions: positions then count data tokens
    only, and an answer can find its token by position alone.

    by_token: per layer None or a list per token id of the mean |Delta| (None: unseen)."""
    out = {}
    for i, means in enumerate(by_token):
        if means is None or means[config.blank_id] is None:
            continue
        data = [m for m in means[:config.n_symbols] if m is not None]
        if data:
            out[f"delta_blank_over_data_layer{i}"] = (means[config.blank_id]
                                                      / float(np.mean(data)))
    return out


LOSS_POSITIONS = ("revisits", "all")
"""The choices of :func:`loss_mask` for this task."""


def loss_mask(batch: SelectiveCopyBatch, positions: str) -> np.ndarray:
    """bool (B, L): the columns a training loss is taken on. "revisits" (the scored
    positions): the answer columns, ``batch.mask``; "all": every column. A selective-copy
    sequence has no observations: "observations" raises ValueError."""
    if positions == "revisits":
        return batch.mask
    if positions == "all":
        return np.ones_like(batch.mask)
    raise ValueError(f"loss_positions {positions!r} is not defined for selective copy (use "
                     "'revisits', its answer columns, or 'all')")


def preset(name: str, **overrides) -> SelectiveCopyConfig:
    """The config of a named preset ("iid", "ood_dense", "ood_sparse").

    Keyword overrides replace any field, e.g. ``preset("iid", n_symbols=8)``.
    Raises ValueError for an unknown name.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; the presets are {sorted(PRESETS)}")
    return SelectiveCopyConfig(**{**PRESETS[name], **overrides})


@dataclass
class SelectiveCopyBatch:
    """A batch of B selective-copy sequences (C = n_copy, L = seq_len; layout in the module doc).

    The field names match ``navigation.Batch``, so code that reads only tokens, targets and
    mask takes either.

    Attributes:
        tokens: int32 (B, L), data and blanks, separator, answer but its last token.
        targets: int32 (B, L), the next token of the full sequence at every column.
        mask: bool (B, L), True on the C columns whose target is an answer token.
        positions: int64 (B, C), column of each data token in the input, increasing along a
            row: ``tokens[b, positions[b, k]]`` is answer token k.
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    positions: np.ndarray


def generate(
    config: SelectiveCopyConfig, batch_size: int, rng: np.random.Generator | int | None = None
) -> SelectiveCopyBatch:
    """Draw a batch of B = batch_size sequences.

    Args:
        config: the dataset.
        batch_size: B >= 1.
        rng: a Generator (advanced in place), a seed, or None for fresh entropy.
    Returns:
        SelectiveCopyBatch with tokens/targets/mask (B, L) and positions (B, C).
    Raises ValueError if batch_size < 1.
    """
    check_int("batch_size", batch_size, 1)
    rng = np.random.default_rng(rng)
    B, C, N = batch_size, config.n_copy, config.separator_index

    data = rng.integers(0, config.n_symbols, size=(B, C), dtype=np.int32)  # (B, C)
    # Each row shuffles C Trues among N slots independently: a uniform interleaving.
    is_data = rng.permuted(np.broadcast_to(np.arange(N) < C, (B, N)), axis=1)  # (B, N)
    positions = np.nonzero(is_data)[1].astype(np.int64).reshape(B, C)  # row-major: increasing

    tokens = np.full((B, config.seq_len), config.blank_id, dtype=np.int32)
    tokens[:, :N][is_data] = data.ravel()
    tokens[:, N] = config.separator_id
    tokens[:, N + 1 :] = data[:, :-1]
    targets = np.empty_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    targets[:, -1] = data[:, -1]
    mask = np.zeros(tokens.shape, dtype=bool)
    mask[:, N:] = True
    return SelectiveCopyBatch(tokens=tokens, targets=targets, mask=mask, positions=positions)


def token_coordinates(batch: SelectiveCopyBatch) -> None:
    """None: a token's position is its index (schemes that read coordinates use it)."""
    return None


def batches(
    config: SelectiveCopyConfig, batch_size: int, seed: int | None = None
) -> Iterator[SelectiveCopyBatch]:
    """Endless training stream of batches of B = batch_size sequences, reproducible from seed.

    The stream is seeded with (seed, 0) and ``eval_set`` with (seed, 1), so the same seed never
    gives the same sequences in both.
    """
    return stream.endless(generate, config, batch_size, seed)


def eval_set(
    config: SelectiveCopyConfig, n_sequences: int, seed: int, batch_size: int = 128
) -> list[SelectiveCopyBatch]:
    """A fixed evaluation set: n_sequences sequences in ceil(n_sequences / batch_size) batches.

    Every batch holds batch_size sequences but the last, which holds the remainder. The set is a
    function of (config, n_sequences, seed, batch_size) only.
    """
    return stream.generated_eval_set(generate, config, n_sequences, seed, batch_size)


def _hits(logits_or_predictions: np.ndarray, batch: SelectiveCopyBatch) -> np.ndarray:
    """bool (B, C): whether each answer token is predicted right."""
    pred = np.asarray(logits_or_predictions)
    if pred.ndim == 3:
        pred = pred.argmax(axis=-1)
    if pred.shape != batch.targets.shape:
        raise ValueError(
            f"logits_or_predictions must have shape {batch.targets.shape} or "
            f"{batch.targets.shape} + (V,), got {np.shape(logits_or_predictions)}"
        )
    return (pred == batch.targets)[batch.mask].reshape(batch.positions.shape)


def token_accuracy(logits_or_predictions: np.ndarray, batch: SelectiveCopyBatch) -> float:
    """Fraction of answer tokens (masked positions, all sequences pooled) predicted right.

    Args:
        logits_or_predictions: integer predictions (B, L), or logits (B, L, V) reduced by argmax.
        batch: the batch they were made on.
    """
    return float(_hits(logits_or_predictions, batch).mean())


def sequence_accuracy(logits_or_predictions: np.ndarray, batch: SelectiveCopyBatch) -> float:
    """Fraction of sequences whose n_copy answer tokens are all predicted right (exact match).

    Args: as ``token_accuracy``.
    """
    return float(_hits(logits_or_predictions, batch).all(axis=1).mean())
