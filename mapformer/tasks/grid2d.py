"""2D grid transduction: copy, transpose, rotate by 90 degrees, flip (issue 12's "2D
transpose/rotate transduction task"), as a causal prefix-LM whose tokens carry their 2D
coordinates on a page.

A source grid g of H x W symbols (uniform over ``n_symbols``) is written row by row, each row
ended by a newline token, then a separator, then the target grid y the same way:

    copy       y = g                  (H x W)
    transpose  y[i, j] = g[j, i]      (W x H)
    rotate90   y = g turned 90 degrees clockwise, y[i, j] = g[H - 1 - j, i] (W x H;
               numpy.rot90(g, -1))
    flip       y[i, j] = g[H - 1 - i, j], the rows in reverse order (H x W; numpy.flipud)

e.g. transpose of a 2 x 3 grid: ``A B C / D E F / | A D / B E / C F /``. The newlines make the
grid's shape readable from the token sequence (without them a 1D model could not tell a 4 x 6
grid from a 6 x 4 one); they are predicted like the symbols. Vocabulary (S = n_symbols):
0 .. S-1 symbols, S the newline, S+1 the separator, S+2 padding; vocab_size S + 3.

Sizes. H and W are drawn independently and uniformly from the integers mean_side - spread ..
mean_side + spread (cpu default 5 +- 1: grids 4 x 4 to 6 x 6, 41 to 85 tokens a sequence).

Coordinates (:func:`token_coordinates`, int64 (B, L, 2), (row, column) on one page, read by
the 2D schemes: ``rope_axial``, ``ape_grid``, ``gridpe``, ``sinusoidal``; ``coord_dims`` 2 by
default on these tasks): the source cell g[r, c] sits at (r, c) and its row's newline at
(r, W); the separator at (H, 0), the row below the source; the target cell y[i, j] at its
output-grid coordinates shifted below the separator, (H + 1 + i, j), its row's newline at
(H + 1 + i, W'), W' the target's width. So source and target are told apart by the row offset
H + 1 (and by order), never by a segment token, and padding sits at (0, 0) (never scored, and
after every real token). Schemes of sequences (``rope``, ``learned_abs``) and
``--coord-source index --coord-dims 1`` read the token index instead.

What a relative 2D code buys here, and what it does not. Given the true coordinates, the grid's
shape, a token's row and column, and "the cell above / to the left" are relative offsets, so
``copy`` (target cell (i, j) under source cell (i, j), a displacement (H + 1, 0) fixed within a
sequence) is one attention hop by relative position. transpose, rotate90 and flip are not
translations of the page: the source cell a target cell copies is at a displacement that
depends on the target cell ((j - i - H - 1, i - j) for transpose), so no single attention
head whose score depends on the displacement alone (rope_axial, ape_grid, gridpe's rotate)
finds it in one hop; the model must combine heads or layers (e.g. a target token finding its
own row and column by attending along the page). With the 1D token index the same structure
is index arithmetic modulo the row width. Which scheme learns which operation is what the
comparison (``python -m mapformer reproduce gridpe grid_transpose``, and the other
operations: :mod:`mapformer.reproduce.gridpe`) measures.

Layout for next-token prediction, one sequence (n source tokens with newlines, m target
tokens): the input is the full sequence ``source SEP target`` but its last token (n + m
columns), ``targets[:, i]`` is the full sequence's token i+1, ``mask`` True exactly on columns
n .. n+m-1 (the target's symbols and newlines): loss and metrics on the target only, padding
on the right as :mod:`mapformer.tasks.transduction` (whose ``attention_prefix``, loss mask
and metrics, perplexity and exact match, these tasks share). With ``attn_mask=prefix`` the
source and the separator are read bidirectionally.

Splits. A source grid's split is a hash of its shape and symbols (6 / 2 / 2 of 10 buckets:
train, dev, test), so the splits are disjoint by construction and the same grid is in the same
split for every operation and size distribution. Each split draws candidates from
``default_rng([data_seed, split])`` in fixed chunks, keeps those of its buckets, drops
duplicates, and keeps the first N: a function of the config only, not of the training seed.
Training batches sample ``train_size`` training grids uniformly with replacement; evaluation
sets are the first N grids of ``eval_split``.

Evaluation sets (:func:`ood_sets`): "iid" the test split, "dev" the dev split, "ood_large" the
test split at mean side mean_side + 2 spread + 1 (sides larger than every training grid's:
7 to 9 for the default).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from . import stream, transduction
from .stream import check_int
from .transduction import (BUCKETS, SPLITS, check_split_fields, distinct_rows,
                           split_of)
# the prefix LM's n_b + 1 columns and the metrics are transduction's:
from .transduction import attention_prefix, eval_metrics  # noqa: F401

OPERATIONS = ("copy", "transpose", "rotate90", "flip")
TASK_NAMES = {f"grid_{op}": op for op in OPERATIONS}
"""The training task names (``--task grid_transpose`` ...) and their operations."""
CHUNK = 2048  # candidates drawn per round when building a split (fixed: prefixes agree)


@dataclass(frozen=True)
class GridConfig:
    """One 2D grid transduction dataset.

    Fields:
        operation: 'copy', 'transpose', 'rotate90' or 'flip'.
        mean_side: the middle of the range of grid sides, >= 2.
        spread: sides H and W uniform in mean_side - spread .. mean_side + spread, 0 <=
            spread < mean_side - 1 (every side >= 2).
        n_symbols: S, grid symbols, >= 2.
        train_size, data_seed, eval_split: as :class:`transduction.TransductionConfig`.
    """

    operation: str = "transpose"
    mean_side: int = 5
    spread: int = 1
    n_symbols: int = 20
    train_size: int = 6000
    data_seed: int = 42
    eval_split: str = "test"

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, got {self.operation!r}")
        check_int("mean_side", self.mean_side, 2)
        check_int("spread", self.spread, 0)
        if self.mean_side - self.spread < 2:
            raise ValueError(f"spread must leave every side >= 2: at most mean_side - 2 = "
                             f"{self.mean_side - 2}, got {self.spread}")
        check_int("n_symbols", self.n_symbols, 2)
        check_split_fields(self)

    @property
    def min_side(self) -> int:
        return self.mean_side - self.spread

    @property
    def max_side(self) -> int:
        return self.mean_side + self.spread

    @property
    def newline_id(self) -> int:
        return self.n_symbols

    @property
    def separator_id(self) -> int:
        return self.n_symbols + 1

    @property
    def pad_id(self) -> int:
        return self.n_symbols + 2

    @property
    def blank_id(self) -> int:
        """train.evaluate's 'blank': padding, never scored."""
        return self.pad_id

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + 3

    @property
    def seq_len(self) -> int:
        """The widest input a batch can have: 2 max_side (max_side + 1) (source and target
        with their newlines, the separator, less the last token)."""
        return 2 * self.max_side * (self.max_side + 1)

    @property
    def coord_dims(self) -> int:
        """2: the tokens' (row, column) on the page."""
        return 2

    @property
    def coord_extent(self) -> int:
        """Positions per axis the schemes should cover: the largest row (2 max_side) of this
        config's ood_large set, plus one (ape_grid tabulates twice this)."""
        return 2 * ood_sets(self)["ood_large"].max_side + 1


PRESETS: dict[str, dict] = {"iid": {}}
"""One preset, the cpu-scale defaults (sides 4 to 6)."""

LOSS_POSITIONS = ("revisits", "all")
"""As transduction: 'revisits' the target tokens, 'all' every real column."""


def preset(name: str, **overrides) -> GridConfig:
    """The config of a named preset ("iid") with keyword overrides, e.g.
    ``preset("iid", operation="rotate90", mean_side=4)``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} for the grid tasks; the presets are "
                         f"{sorted(PRESETS)}")
    return GridConfig(**{**PRESETS[name], **overrides})


def describe(config: GridConfig) -> str:
    """e.g. 'grid transpose, sides 4 to 6, 20 symbols, test split'."""
    return (f"grid {config.operation}, sides {config.min_side} to {config.max_side}, "
            f"{config.n_symbols} symbols, {config.eval_split} split")


def ood_sets(config: GridConfig) -> dict[str, GridConfig]:
    """The evaluation sets besides "iid": {"dev": the dev split, "ood_large": the test split
    at mean side mean_side + 2 spread + 1 (every side beyond the training range)}."""
    return {"dev": replace(config, eval_split="dev"),
            "ood_large": replace(config, mean_side=config.mean_side + 2 * config.spread + 1,
                                 eval_split="test")}


def draw_grids(config: GridConfig, count: int, rng: np.random.Generator):
    """(grids int32 (count, M, M) with -1 outside each grid, shapes int64 (count, 2) (H, W)):
    fresh random grids of the config's sizes, M = max_side; no split applied."""
    m = config.max_side
    shapes = rng.integers(config.min_side, m + 1, size=(count, 2))
    grids = rng.integers(0, config.n_symbols, size=(count, m, m), dtype=np.int32)
    r = np.arange(m)
    outside = (r[None, :, None] >= shapes[:, 0, None, None]) | \
        (r[None, None, :] >= shapes[:, 1, None, None])
    grids[outside] = -1
    return grids, shapes


def grid_keys(grids: np.ndarray, shapes: np.ndarray) -> np.ndarray:
    """int64 (N, 2 + M^2): each grid's shape then its cells (-1 outside): the rows whose
    hash decides the split and whose equality is a duplicate."""
    return np.concatenate([shapes, grids.reshape(len(grids), -1)], axis=1).astype(np.int64)


@functools.lru_cache(maxsize=16)
def _split(config: GridConfig, split: str, count: int):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([config.data_seed, SPLITS.index(split)])

    def draw():
        grids, shapes = draw_grids(config, CHUNK, rng)
        keys = grid_keys(grids, shapes)
        bucket = split_of(keys + 1, np.full(len(keys), keys.shape[1], dtype=np.int64))
        keep = np.isin(bucket, BUCKETS[split])
        return keys[keep], grids[keep], shapes[keep]

    _, grids, shapes = distinct_rows(draw, count, lambda found: (
        f"fewer than {count} distinct {split} grids of sides {config.min_side} to "
        f"{config.max_side} over {config.n_symbols} symbols found ({found}): lower "
        "train_size or the evaluation sequences, or enlarge the grids"))
    grids.setflags(write=False)
    shapes.setflags(write=False)
    return grids, shapes


def split_grids(config: GridConfig, split: str, count: int):
    """(grids int32 (count, M, M), -1 outside each grid; shapes int64 (count, 2)): the first
    ``count`` distinct grids of ``split`` ('train', 'dev' or 'test'), a function of
    (data_seed, n_symbols, sides, split, count) only (the same for every operation); the
    first k of a larger count are the same k. Read-only (cached)."""
    check_int("count", count, 1)
    return _split(replace(config, operation="copy", train_size=1, eval_split="test"),
                  split, count)


def target_source_cell(operation: str, h, w, i, j):
    """(row, column) of the source cell that target cell (i, j) copies, for source grids of
    shape (h, w) (arrays broadcast)."""
    if operation == "transpose":
        return j, i
    if operation == "rotate90":
        return h - 1 - j, i
    if operation == "flip":
        return h - 1 - i, j
    return i, j


def target_shape(operation: str, h, w):
    """(rows, columns) of the target grid of a source of shape (h, w)."""
    return (w, h) if operation in ("transpose", "rotate90") else (h, w)


@dataclass
class GridBatch:
    """A batch of B grids padded to L = max(n_b + m_b) (layout in the module doc).

    Attributes:
        tokens, targets: int32 (B, L); mask: bool (B, L), True on the target tokens' columns;
        lengths: int64 (B,) source tokens n_b = H (W + 1); coordinates: int64 (B, L, 2) each
        input token's (row, column) on the page; shapes: int64 (B, 2) the source grids' (H, W).
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    coordinates: np.ndarray
    shapes: np.ndarray


def make_batch(config: GridConfig, grids: np.ndarray, shapes: np.ndarray) -> GridBatch:
    """The batch of these grids (int (B, M, M), shapes int (B, 2)) under the config's
    operation, padded to the batch's longest row."""
    grids = np.asarray(grids)
    shapes = np.asarray(shapes, dtype=np.int64)
    h, w = shapes[:, 0, None], shapes[:, 1, None]  # (B, 1)
    th, tw = target_shape(config.operation, h, w)
    n, m = h * (w + 1), th * (tw + 1)
    width = int((n + m).max())
    j = np.arange(width + 1)[None, :]  # column of the full sequence
    b = np.arange(len(grids))[:, None]
    last = grids.shape[1] - 1
    # source: row r, column c (c == w: the newline)
    r, c = j // (w + 1), j % (w + 1)
    src_tok = np.where(c < w, grids[b, np.minimum(r, last), np.minimum(c, last)],
                       config.newline_id)
    # target: row i, column jj of the output grid
    k = j - n - 1
    i, jj = k // (tw + 1), k % (tw + 1)
    sr, sc = target_source_cell(config.operation, h, w, i, jj)
    tgt_tok = np.where(jj < tw, grids[b, np.clip(sr, 0, last), np.clip(sc, 0, last)],
                       config.newline_id)
    in_src, is_sep, in_tgt = j < n, j == n, (j > n) & (j <= n + m)
    full = np.where(in_src, src_tok, np.where(is_sep, config.separator_id,
                                              np.where(in_tgt, tgt_tok, config.pad_id)))
    row = np.where(in_src, r, np.where(is_sep, h, np.where(in_tgt, h + 1 + i, 0)))
    col = np.where(in_src, c, np.where(in_tgt, jj, 0))
    cols = np.arange(width)[None, :]
    real = cols < n + m
    tokens = np.where(real, full[:, :-1], config.pad_id).astype(np.int32)
    coordinates = np.stack([np.where(real, row[:, :-1], 0), np.where(real, col[:, :-1], 0)],
                           axis=-1).astype(np.int64)
    return GridBatch(tokens=tokens, targets=np.ascontiguousarray(full[:, 1:].astype(np.int32)),
                     mask=(cols >= n) & real, lengths=n[:, 0].copy(),
                     coordinates=coordinates, shapes=shapes.copy())


def generate(config: GridConfig, batch_size: int,
             rng: np.random.Generator | int | None = None) -> GridBatch:
    """A training batch: batch_size grids drawn uniformly (with replacement) from the config's
    ``train_size`` training grids by ``rng`` (a Generator, advanced in place, a seed, or
    None)."""
    return stream.split_batch(split_grids, make_batch, config, batch_size, rng)


def batches(config: GridConfig, batch_size: int,
            seed: int | None = None) -> Iterator[GridBatch]:
    """Endless stream of training batches, reproducible from seed."""
    return stream.endless(generate, config, batch_size, seed)


def eval_set(config: GridConfig, n_sequences: int, seed: int = 0,
             batch_size: int = 128) -> list[GridBatch]:
    """The first n_sequences grids of the config's ``eval_split`` in batches (``seed`` unused:
    every run is scored on the same grids)."""
    return stream.split_eval_set(split_grids, make_batch, config, n_sequences, batch_size)


def loss_mask(batch: GridBatch, positions: str) -> np.ndarray:
    """bool (B, L): 'revisits' the target tokens, 'all' every real column (as transduction's)."""
    return transduction.loss_mask(batch, positions, "the grid tasks")


def token_coordinates(batch: GridBatch) -> np.ndarray:
    """int64 (B, L, 2): each input token's (row, column) on the page (padding (0, 0))."""
    return batch.coordinates
