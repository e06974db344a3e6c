"""Image classification on scikit-learn's 8x8 handwritten digits, one token per pixel with its
2D coordinates: the cpu-scale stand-in for APE's table (c) (CIFAR-10) and GridPE's image rows
(ImageNet-100), neither of which is available offline.

Data: the 1797 images of ``sklearn.datasets.load_digits`` (8x8 grey levels 0..16, 10 classes),
read from the copy shipped in ``mapformer/data/digits.npz`` (benchmarks/make_digits_npz.py
wrote it; BSD 3-Clause, mapformer/data/DIGITS_LICENSE.txt), so no download and no
scikit-learn at run time.

Two variants (``canvas``):
- ``digits`` (canvas 8): the image itself, 64 tokens;
- ``digits16`` (canvas 16): the digit pasted at a random offset (row and column uniform in
  0..8) on a 16x16 canvas of grey level 0, 256 tokens: the class no longer sits at fixed
  token indices, which punishes absolute positional codes and rewards relative 2D ones.
  Training batches draw a fresh offset every time (augmentation); evaluation sets use a
  fixed offset per image (from data_seed).

Tokens, row-major over the canvas: ids 0..16 are the grey levels (a value embedding), ids
17..26 the classes (only ever targets); vocab_size 27. Each batch gives the tokens' (row,
column) on the canvas (:func:`token_coordinates`, for schemes with 2D positions); the token
index is row * canvas + column. The model is a classifier: a non-causal encoder
(``attention_mask`` 'none', the default the attention mixers' ``attn_mask`` takes from this
task) whose final features are mean-pooled over the tokens before the head (``POOL``: the
model's ``pool='mean'``), so targets and mask are (B, 1): the class of each image.

Splits: one permutation of the 1797 images from data_seed: test the first 360, dev the next
180, train the remaining 1257 (70 / 10 / 20 %). Evaluation sets are the first N images of
``eval_split`` (all of it when N is larger). Metric: accuracy (train.evaluate's), chance 0.1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from . import stream
from .stream import check_int
DATA = Path(__file__).resolve().parents[1] / "data" / "digits.npz"
LEVELS = 17  # grey levels 0..16
CLASSES = 10
SIZES = {"test": 360, "dev": 180}  # the rest (1257) is train
VARIANTS = {"digits": 8, "digits16": 16}  # task name -> canvas side
POOL = "mean"  # the model pools its features over the tokens: one class per sequence

PRESETS: dict[str, dict] = {"iid": {}}
"""One preset, the data's own distribution; the canvas is the task name's (VARIANTS)."""

LOSS_POSITIONS = ("revisits",)
"""The loss is on the class of each image ('revisits': train.py's name for the scored
positions)."""


@dataclass(frozen=True)
class DigitsConfig:
    """One digits dataset.

    Fields:
        canvas: side of the square canvas, 8 (the image) or more (pasted at a random offset).
        data_seed: the seed of the split and of the evaluation offsets.
        eval_split: the split evaluation sets read, 'test' or 'dev'.
    """

    canvas: int = 8
    data_seed: int = 42
    eval_split: str = "test"

    def __post_init__(self) -> None:
        for name, low in (("canvas", 8), ("data_seed", 0)):
            check_int(name, getattr(self, name), low)
        if self.eval_split not in ("dev", "test"):
            raise ValueError(f"eval_split must be 'dev' or 'test', got {self.eval_split!r}")

    @property
    def vocab_size(self) -> int:
        """17 grey levels and 10 classes."""
        return LEVELS + CLASSES

    @property
    def blank_id(self) -> int:
        """train.evaluate's 'blank': grey level 0, never a target (object accuracy is the
        accuracy)."""
        return 0

    @property
    def seq_len(self) -> int:
        """Tokens per image: canvas^2."""
        return self.canvas * self.canvas

    @property
    def coord_dims(self) -> int:
        """The tokens' coordinates are 2D (row, column): the coord_dims of the schemes that
        read them (sinusoidal becomes the 2D sinusoidal code, ape_grid and gridpe 2D)."""
        return 2

    @property
    def coord_extent(self) -> int:
        """Positions per coordinate axis: the canvas side."""
        return self.canvas

    @property
    def attention_mask(self) -> str:
        """The attention mask a classifier of this task uses: 'none' (every pixel sees every
        other; the default of the attention mixers' attn_mask for this task)."""
        return "none"


@dataclass
class DigitsBatch:
    """B images on the canvas.

    Attributes:
        tokens: int32 (B, canvas^2), grey levels row-major.
        targets: int32 (B, 1), the class id LEVELS + digit.
        mask: bool (B, 1), all True.
        coordinates: float64 (B, canvas^2, 2), (row, column) of each token.
        labels: int64 (B,), the digits.
        offsets: int64 (B, 2), where the image's top-left pixel lies on the canvas.
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    coordinates: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray


def preset(name: str, **overrides) -> DigitsConfig:
    """The config of a named preset ('iid'), keyword overrides replacing fields, e.g.
    ``preset("iid", canvas=16)``. ValueError for another name."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} for the digits tasks; the presets are "
                         f"{sorted(PRESETS)}")
    return DigitsConfig(**{**PRESETS[name], **overrides})


def describe(config: DigitsConfig) -> str:
    """e.g. 'digits 8x8 on a 16x16 canvas, test split'."""
    return f"digits 8x8 on a {config.canvas}x{config.canvas} canvas, {config.eval_split} split"


def ood_sets(config: DigitsConfig) -> dict[str, DigitsConfig]:
    """The evaluation sets besides "iid" (the test split): {"dev": the dev split}."""
    return {"dev": replace(config, eval_split="dev")}


@functools.lru_cache(maxsize=1)
def load() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (1797, 8, 8) in 0..16, labels uint8 (1797,)), read-only."""
    with np.load(DATA) as data:
        images, labels = data["images"], data["labels"]
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


@functools.lru_cache(maxsize=4)
def split_indices(data_seed: int, split: str) -> np.ndarray:
    """int64: the images of ``split`` ('train', 'dev' or 'test') under data_seed, disjoint."""
    order = np.random.default_rng([data_seed, 7]).permutation(len(load()[1]))
    test, dev = SIZES["test"], SIZES["dev"]
    parts = {"test": order[:test], "dev": order[test:test + dev], "train": order[test + dev:]}
    if split not in parts:
        raise ValueError(f"split must be one of {sorted(parts)}, got {split!r}")
    return parts[split]


def make_batch(config: DigitsConfig, index: np.ndarray, offsets: np.ndarray) -> DigitsBatch:
    """The batch of images ``index`` (int (B,)) pasted at ``offsets`` (int (B, 2), each in
    0..canvas-8) on the config's canvas."""
    images, labels = load()
    index = np.asarray(index, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64).reshape(len(index), 2)
    c, b = config.canvas, len(index)
    if offsets.min(initial=0) < 0 or offsets.max(initial=0) > c - 8:
        raise ValueError(f"offsets must lie in [0, {c - 8}], got {offsets.tolist()}")
    canvas = np.zeros((b, c, c), dtype=np.int32)
    rows = offsets[:, 0, None, None] + np.arange(8)[None, :, None]
    cols = offsets[:, 1, None, None] + np.arange(8)[None, None, :]
    canvas[np.arange(b)[:, None, None], rows, cols] = images[index]
    grid = np.stack(np.meshgrid(np.arange(c), np.arange(c), indexing="ij"), -1).reshape(-1, 2)
    label = labels[index].astype(np.int64)
    return DigitsBatch(tokens=canvas.reshape(b, c * c),
                       targets=(LEVELS + label[:, None]).astype(np.int32),
                       mask=np.ones((b, 1), dtype=bool),
                       coordinates=np.broadcast_to(grid.astype(np.float64), (b, c * c, 2)),
                       labels=label, offsets=offsets)


def generate(config: DigitsConfig, batch_size: int,
             rng: np.random.Generator | int | None = None) -> DigitsBatch:
    """A training batch: B = batch_size training images drawn uniformly with replacement by
    ``rng`` (a Generator, advanced in place, a seed, or None), each at a fresh random offset
    when the canvas is larger than the image."""
    check_int("batch_size", batch_size, 1)
    rng = np.random.default_rng(rng)
    train = split_indices(config.data_seed, "train")
    pick = train[rng.integers(0, len(train), size=batch_size)]
    offsets = rng.integers(0, config.canvas - 8 + 1, size=(batch_size, 2))
    return make_batch(config, pick, offsets)


def batches(config: DigitsConfig, batch_size: int, seed: int | None = None):
    """Endless stream of training batches, reproducible from seed."""
    return stream.endless(generate, config, batch_size, seed)


def eval_set(config: DigitsConfig, n_sequences: int, seed: int = 0,
             batch_size: int = 128) -> list[DigitsBatch]:
    """The first n_sequences images of the config's ``eval_split`` (all of it when fewer),
    each at its fixed offset, in batches of batch_size. ``seed`` is not used: the set is
    fixed by data_seed."""
    index = split_indices(config.data_seed, config.eval_split)[:n_sequences]
    rng = np.random.default_rng([config.data_seed, 11, config.canvas])
    offsets = rng.integers(0, config.canvas - 8 + 1, size=(len(load()[1]), 2))[index]
    return [make_batch(config, index[i:i + batch_size], offsets[i:i + batch_size])
            for i in range(0, len(index), batch_size)]


def loss_mask(batch: DigitsBatch, positions: str) -> np.ndarray:
    """bool (B, 1): the class of each image ('revisits')."""
    if positions != "revisits":
        raise ValueError(f"loss_positions {positions!r} is not defined for digits (its loss "
                         "is on the class: 'revisits')")
    return batch.mask


def token_coordinates(batch: DigitsBatch) -> np.ndarray:
    """float (B, T, 2): each token's (row, column) on the canvas."""
    return batch.coordinates
