"""Tree transduction: copy, rotation, C3 reduction and tree operations (APE, Kogkalidis et
al., NeurIPS 2024, section 4 and appendix 9, "Tree Task Descriptions"), as a prefix-LM over
``source SEP target`` with every tree token carrying its node's heap number.

Trees. Binary trees (every node a leaf or with two children) are held as heap arrays: int16
(N, W), entry h the label of node h (root 1, children 2h and 2h + 1; level of h =
floor(log2 h), root level 0), -1 where there is no node; W = 2^(max_level + 1), entry 0
unused. A random tree of exact depth d is the public code's ``random_tree``, drawn level by
level for all trees at once: a node with depth budget b = 0 is a leaf; with b > 0 it draws
r uniform in 0..b-1, f = b-1 if r < b-1 else uniform in 0..b-1, and its children get the
budgets (r, f) or (f, r) with probability 1/2 each (so one child reaches depth b-1 exactly);
labels are uniform over the task's leaf and operator labels. Depths are
int(Normal(mean_depth, depth_std)) (truncated toward zero, as Python's int), clipped to
[min_depth, max_depth] = [max(2, ceil(mean - 2 std)), floor(mean + 2 std)]; the paper draws
depths from N(7, 1) (unclipped); cpu scale mean 5.

Tasks (labels 0-based here; the paper's 1-based in parentheses):
- ``copy``: leaves 0..9, operators 10..19 (20 labels); y = x.
- ``rotate`` (the paper's rotation*): same labels; y = rot(x), the public code's rule
  rot(B(a, B(p, l, r), R)) = B(p, rot(l), B(a, rot(r), rot(R))), every other tree
  unchanged (a leaf, or a node whose left child is a leaf: then its right subtree is not
  visited). The paper's text says "recursively right-rotating all subtrees up to a
  fixpoint"; this is our reading of it, the code's one pass (so our numbers compare with
  its table). The output can be deeper than the input.
- ``c3``: leaves 0, 1, 2 (the elements of the cyclic group C3; the paper's 1, 2, 3 with value
  v - 1), one operator 3 (the group operation); y = one reduction step: every node whose two
  children are leaves a, b becomes the leaf (a + b) mod 3, all other nodes stay where they
  are (4 labels).
- ``ops`` (tree operations): a base tree of depth d - 1 with unique labels (leaves drawn
  without replacement from 0..63, operators from 64..123), a node s picked uniformly among
  its nodes (ptr = its label) and an operation o uniform in 0..3: x = B(124 + o, Leaf(ptr),
  base); y = 0 extract: the subtree at s; 1 flip-extract: that subtree with its two top
  children swapped (not recursively); 2 truncate: the base with s's subtree replaced by
  Leaf(ptr) (s loses its descendants and keeps its label); 3 no-op: the base (128 labels).
  The public code's meta-operator 124 + o (1-based) overlaps its last operator label for
  o = 0; here the four meta-operators 124..127 are their own labels. Base trees with more
  than 64 leaves or 60 operators cannot have unique labels: they are redrawn.

Serialisation. The source is always breadth-first (increasing heap number), as in the
paper; the target is breadth-first or depth-first pre-order (``order``). Tokens: labels
0..n_labels-1, the separator n_labels, padding n_labels + 1. Positions
(:func:`token_coordinates`, (B, L, 1) int32): a source token carries its node's heap number in
the source tree, a target token its heap number in the target tree (root 1, as the paper's
``bf_enum``), the separator and padding 0 (``ape_tree``: the identity, the paper gives its SOS
position 0). Schemes of sequences (rope, sinusoidal, ape_seq, ...) see the token index: the
config's ``coord_source`` is 'index', the default of the coordinate-reading schemes'
``coord_source`` option for these tasks (``--coord-source task`` feeds them the heap numbers).
``tree_levels`` (the deepest level of any source or target node) is ape_tree's
``ape_tree_depth`` for the task.

Formulation (the prefix LM; no new mask). The paper trains an encoder-decoder: the input
tree read bidirectionally by the encoder, the output tree decoded with teacher forcing from an
SOS at position 0, each output node attending to the nodes whose enumeration number (heap
number for breadth-first, pre-order counter for depth-first) is at most its own, plus the
SOS, and to the whole input by cross-attention. Since the target is emitted in exactly that
enumeration order, that decoder mask is the causal mask over the target; so the faithful
decoder-only reading is the prefix LM (``attn_mask=prefix``: source and separator
bidirectional, the target causal, seeing the whole source), with the separator in the SOS's
role. No "tree decoding order" mask is needed. Differences left: one stack with one softmax
over source and target keys in place of separate self- and cross-attention; with the default
``attn_mask=causal`` the source is read causally as well.

Layout, padding, loss and metrics as :mod:`mapformer.tasks.transduction`: the input is the
full sequence but its last token, ``targets`` the next token, ``mask`` True on the m target
tokens' columns, perplexity on them (the paper's metric), exact match, token accuracy.

Data and splits. Each split draws candidates from ``default_rng([data_seed, split])`` in
fixed chunks; a candidate is kept if the hash of its source tree falls in the split's buckets
(6 / 2 / 2 of 10 hash buckets: the paper's 6000 : 2000 : 2000), its source and target have at most
``max_nodes`` nodes and levels at most ``max_level``, and it is not a duplicate of an earlier
one: the splits are disjoint by construction and a function of the config only (not of the
training seed). Training batches sample ``train_size`` fixed training examples with
replacement; evaluation reads the first N examples of ``eval_split``.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from . import stream, transduction
from .stream import check_int
from .transduction import BUCKETS, SPLITS, check_split_fields, distinct_rows, split_of
# the prefix LM's n_b + 1 columns and the metrics are transduction's:
from .transduction import attention_prefix, eval_metrics  # noqa: F401

OPERATIONS = ("copy", "rotate", "c3", "ops")
TASK_NAMES = {f"tree_{op}": op for op in OPERATIONS}
"""The training task names (``--task tree_copy`` ...) and their operations."""
ORDERS = ("breadth", "depth")
LABELS = {"copy": (10, 10), "rotate": (10, 10), "c3": (3, 1), "ops": (64, 60)}
"""(leaf labels, operator labels) per operation; ops adds 4 meta-operators."""
CHUNK = 2048  # candidates drawn per round when building a split (fixed: prefixes agree)


@dataclass(frozen=True)
class TreeConfig:
    """One tree transduction dataset.

    Fields:
        operation: 'copy', 'rotate', 'c3' or 'ops'.
        order: the target's order, 'breadth' (breadth-first) or 'depth' (pre-order).
        mean_depth: mean tree depth (ops: of the input tree, the base one level less), >= 2.
        depth_std: spread of the depth, >= 0.
        max_nodes: the most nodes of a source or target tree (larger examples are redrawn).
        max_level: the deepest level (root 0) of a source or target node (deeper examples
            are redrawn); a negative value, the default, means max_depth, or max_depth + 1
            for rotate (whose outputs can be deeper than their inputs; about 2% of the
            rotations are then redrawn at mean depth 5).
        train_size, data_seed, eval_split: as :class:`transduction.TransductionConfig`.
    """

    operation: str = "copy"
    order: str = "breadth"
    mean_depth: int = 5
    depth_std: float = 1.0
    max_nodes: int = 63
    max_level: int = -1
    train_size: int = 6000
    data_seed: int = 42
    eval_split: str = "test"

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise ValueError(f"operation must be one of {OPERATIONS}, got {self.operation!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        check_int("mean_depth", self.mean_depth, 2)
        check_int("max_nodes", self.max_nodes, 3)
        check_split_fields(self)
        std = self.depth_std
        if (isinstance(std, bool) or not isinstance(std, numbers.Real) or not math.isfinite(std)
                or std < 0):
            raise ValueError(f"depth_std must be a finite number >= 0, got {std!r}")
        object.__setattr__(self, "depth_std", float(std))
        if isinstance(self.max_level, bool) or not isinstance(self.max_level, numbers.Integral):
            raise ValueError(f"max_level must be an integer, got {self.max_level!r}")
        if self.max_level < 0:
            object.__setattr__(self, "max_level",
                               self.max_depth + (self.operation == "rotate"))
        if self.max_level < self.max_depth:
            raise ValueError(f"max_level must be >= max_depth = {self.max_depth}, got "
                             f"{self.max_level}")

    @property
    def min_depth(self) -> int:
        """Shallowest tree: max(2, ceil(mean - 2 std))."""
        return max(2, math.ceil(self.mean_depth - 2 * self.depth_std))

    @property
    def max_depth(self) -> int:
        """Deepest tree: max(min_depth, floor(mean + 2 std))."""
        return max(self.min_depth, math.floor(self.mean_depth + 2 * self.depth_std))

    @property
    def n_labels(self) -> int:
        """Node labels: 20 (copy, rotate), 4 (c3), 128 (ops)."""
        leaves, operators = LABELS[self.operation]
        return leaves + operators + (4 if self.operation == "ops" else 0)

    @property
    def separator_id(self) -> int:
        return self.n_labels

    @property
    def pad_id(self) -> int:
        return self.n_labels + 1

    @property
    def blank_id(self) -> int:
        """train.evaluate's 'blank': padding, never scored."""
        return self.pad_id

    @property
    def vocab_size(self) -> int:
        return self.n_labels + 2

    @property
    def width(self) -> int:
        """W: heap array width, 2^(max_level + 1)."""
        return 2 ** (self.max_level + 1)

    @property
    def seq_len(self) -> int:
        """The widest input a batch can have: 2 max_nodes (source, separator, target but its
        last token)."""
        return 2 * self.max_nodes

    @property
    def tree_levels(self) -> int:
        """The deepest level of any node (ape_tree's ``ape_tree_depth`` for this task)."""
        return self.max_level

    @property
    def coord_source(self) -> str:
        """'index': schemes of sequences and grids read the token index on these tasks."""
        return "index"


PRESETS: dict[str, dict] = {"iid": {}}
"""One preset, the cpu-scale defaults (mean depth 5); the paper's is mean_depth=7."""

LOSS_POSITIONS = ("revisits", "all")
"""As transduction: 'revisits' the target tokens, 'all' every real column."""


def preset(name: str, **overrides) -> TreeConfig:
    """The config of a named preset ("iid") with keyword overrides, e.g.
    ``preset("iid", operation="rotate", order="depth")``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r} for the tree tasks; the presets are "
                         f"{sorted(PRESETS)}")
    return TreeConfig(**{**PRESETS[name], **overrides})


def describe(config: TreeConfig) -> str:
    """A short description for logs."""
    return (f"tree {config.operation}, {config.order}-first target, depth "
            f"{config.mean_depth} +- {config.depth_std:g} in [{config.min_depth}, "
            f"{config.max_depth}], at most {config.max_nodes} nodes and level "
            f"{config.max_level}, {config.eval_split} split")


def ood_sets(config: TreeConfig) -> dict[str, TreeConfig]:
    """The evaluation sets besides "iid" (the test split): {"dev": the dev split}."""
    return {"dev": replace(config, eval_split="dev")}


# ---------------------------------------------------------------- trees as heap arrays

def _level_slots(k: int) -> np.ndarray:
    return np.arange(2 ** k, 2 ** (k + 1))


def random_trees(depths: np.ndarray, leaves: int, operators: int, width: int,
                 rng: np.random.Generator, label_offset: int = 0) -> np.ndarray:
    """int16 (N, width): random binary trees of exact depths ``depths`` (int (N,), each
    2^(depth + 1) <= width) by the public code's rule (module doc); leaf labels uniform in
    0..leaves-1, operator labels in leaves..leaves+operators-1."""
    depths = np.asarray(depths, dtype=np.int64)
    n = len(depths)
    budget = np.full((n, width), -1, dtype=np.int64)
    budget[:, 1] = depths
    labels = np.full((n, width), -1, dtype=np.int16)
    for k in range(int(depths.max(initial=0)) + 1):
        slots = _level_slots(k)
        b = budget[:, slots]
        leaf_labels = rng.integers(0, leaves, size=b.shape)
        op_labels = leaves + rng.integers(0, operators, size=b.shape)
        labels[:, slots] = np.where(b == 0, leaf_labels, np.where(b > 0, op_labels, -1))
        if 2 ** (k + 2) > width:
            continue
        bb = np.maximum(b, 1)
        r = np.floor(rng.random(b.shape) * bb).astype(np.int64)
        f = np.where(r < bb - 1, bb - 1, np.floor(rng.random(b.shape) * bb).astype(np.int64))
        swap = rng.random(b.shape) < 0.5
        inner = b > 0
        budget[:, 2 * slots] = np.where(inner, np.where(swap, f, r), -1)
        budget[:, 2 * slots + 1] = np.where(inner, np.where(swap, r, f), -1)
    return labels + np.int16(label_offset) * (labels >= 0)


def levels(width: int) -> np.ndarray:
    """int64 (width,): the level of each heap number (entry 0: -1)."""
    h = np.arange(width)
    out = np.full(width, -1, dtype=np.int64)
    out[1:] = np.floor(np.log2(h[1:])).astype(np.int64)
    return out


def _children_present(labels: np.ndarray) -> np.ndarray:
    """bool (N, W): node h has children (2h < W and node 2h present)."""
    n, w = labels.shape
    out = np.zeros((n, w), dtype=bool)
    out[:, 1:w // 2] = labels[:, 2:w:2] >= 0
    return out


def relocate(labels: np.ndarray, rows: np.ndarray, src: np.ndarray, dst: np.ndarray,
             out: np.ndarray) -> np.ndarray:
    """Copy the subtree rooted at heap ``src[i]`` of tree ``rows[i]`` to heap ``dst[i]`` of
    ``out[rows[i]]`` (descendant src 2^k + j goes to dst 2^k + j), in place. Returns bool
    (len(rows),): True where a node would land beyond out's width (not written)."""
    w_in, w_out = labels.shape[1], out.shape[1]
    overflow = np.zeros(len(rows), dtype=bool)
    k = 0
    while len(rows) and (src.min() << k) < w_in:
        j = np.arange(2 ** k)[None, :]
        s = (src[:, None] << k) + j
        d = (dst[:, None] << k) + j
        ok = s < w_in
        lab = np.where(ok, labels[rows[:, None], np.minimum(s, w_in - 1)], -1)
        present = lab >= 0
        overflow |= (present & (d >= w_out)).any(axis=1)
        put = present & (d < w_out)
        rr = np.broadcast_to(rows[:, None], put.shape)
        out[rr[put], d[put]] = lab[put]
        k += 1
    return overflow


def rotate(labels: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(int16 (N, width) the rotated trees, bool (N,) True where a node fell beyond width):
    the public code's rot (module doc), all trees at once, frame by frame."""
    n, w = labels.shape
    has = _children_present(labels)
    out = np.full((n, width), -1, dtype=np.int16)
    overflow = np.zeros(n, dtype=bool)
    rows, src, dst = np.arange(n), np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64)
    while len(rows):
        left = np.minimum(2 * src, w - 1)
        turn = has[rows, src] & has[rows, left] & (2 * src < w)
        keep = ~turn  # a leaf or a node with a leaf on the left: copied as it is
        overflow[rows[keep]] |= relocate(labels, rows[keep], src[keep], dst[keep], out)
        r, s, t = rows[turn], src[turn], dst[turn]
        for where, what in ((t, labels[r, 2 * s]), (2 * t + 1, labels[r, s])):
            fits = where < width
            overflow[r[~fits]] = True
            out[r[fits], where[fits]] = what[fits]
        rows = np.concatenate([r, r, r])
        src = np.concatenate([4 * s, 4 * s + 1, 2 * s + 1])
        dst = np.concatenate([2 * t, 4 * t + 2, 4 * t + 3])
    return out, overflow


def reduce_c3(labels: np.ndarray) -> np.ndarray:
    """int16 (N, W): one C3 reduction step: every node whose two children are leaves
    a, b (labels 0..2) becomes the leaf (a + b) mod 3."""
    has = _children_present(labels)
    n, w = labels.shape
    out = labels.copy()
    h = np.arange(1, w // 2)
    reducible = has[:, h] & ~has[:, 2 * h] & ~has[:, 2 * h + 1]
    value = (labels[:, 2 * h].astype(np.int64) + labels[:, 2 * h + 1]) % 3
    out[:, h] = np.where(reducible, value, out[:, h])
    for child in (2 * h, 2 * h + 1):
        out[:, child] = np.where(reducible, -1, out[:, child])
    return out


def _unique_labels(base: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(labels, ok): the base trees relabelled with distinct labels (leaves 0..63 and
    operators 64..123, each drawn without replacement), ok False where there are too many."""
    present = base >= 0
    leaf = present & ~_children_present(base)
    inner = present & ~leaf
    out = base.copy()
    ok = np.ones(len(base), dtype=bool)
    for mask, count, offset in ((leaf, 64, 0), (inner, 60, 64)):
        perm = np.argsort(rng.random((len(base), count)), axis=1)
        rank = np.cumsum(mask, axis=1) - 1
        ok &= mask.sum(axis=1) <= count
        picked = np.take_along_axis(perm, np.clip(rank, 0, count - 1), axis=1) + offset
        out = np.where(mask, picked, out).astype(np.int16)
    return out, ok


def tree_ops(base: np.ndarray, node: np.ndarray, op: np.ndarray,
             width: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) int16 (N, width) of the tree-operations task: ``base`` (N, W) trees with unique
    labels, ``node`` (N,) the heap number of the picked node in each, ``op`` (N,) in 0..3."""
    n = len(base)
    rows = np.arange(n)
    ptr = base[rows, node]
    x = np.full((n, width), -1, dtype=np.int16)
    x[:, 1] = 124 + op
    x[:, 2] = ptr
    relocate(base, rows, np.ones(n, dtype=np.int64), np.full(n, 3), x)
    y = np.full((n, width), -1, dtype=np.int16)
    ext = np.flatnonzero(op == 0)
    relocate(base, ext, node[ext], np.ones(len(ext), dtype=np.int64), y)
    flip = np.flatnonzero(op == 1)
    y[flip, 1] = base[flip, node[flip]]
    inner = flip[2 * node[flip] < base.shape[1]]
    relocate(base, inner, 2 * node[inner], np.full(len(inner), 3), y)
    relocate(base, inner, 2 * node[inner] + 1, np.full(len(inner), 2), y)
    whole = np.flatnonzero(op >= 2)
    relocate(base, whole, np.ones(len(whole), dtype=np.int64), np.ones(len(whole), np.int64), y)
    cut = np.flatnonzero(op == 2)
    lv, h = levels(width), np.arange(width)
    shift = lv[None, :] - lv[node[cut]][:, None]
    below = (shift > 0) & ((h[None, :] >> np.maximum(shift, 0)) == node[cut][:, None])
    y[cut] = np.where(below, np.int16(-1), y[cut])
    return x, y


def order_keys(width: int, order: str) -> np.ndarray:
    """int64 (width,): the sort key of each heap number in ``order``: breadth-first the heap
    number itself, depth-first pre-order (a node before its subtree, left before right)."""
    h = np.arange(width, dtype=np.int64)
    if order == "breadth":
        return h
    top = int(np.log2(width)) - 1
    lv = np.maximum(levels(width), 0)
    return ((h << (top - lv)) * (top + 1) + lv) if top >= 0 else h


def serialise(labels: np.ndarray, order: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens int16 (N, W), heaps int32 (N, W), counts int64 (N,)): each tree's labels and
    heap numbers in ``order`` ('breadth' or 'depth'), padded with -1 / 0 past counts[i]."""
    n, w = labels.shape
    present = labels >= 0
    key = np.where(present, order_keys(w, order)[None, :], np.iinfo(np.int64).max)
    idx = np.argsort(key, axis=1, kind="stable")
    counts = present.sum(axis=1)
    live = np.arange(w)[None, :] < counts[:, None]
    tokens = np.where(live, np.take_along_axis(labels, idx, axis=1), -1).astype(np.int16)
    heaps = np.where(live, idx, 0).astype(np.int32)
    return tokens, heaps, counts


def examples(config: TreeConfig, count: int, rng: np.random.Generator):
    """(x, y) int16 (count, W): fresh random examples of the config's operation (before the
    size limits, no split applied), and bool (count,) True where y overflows W."""
    depths = np.clip(np.trunc(rng.normal(config.mean_depth, config.depth_std, count)),
                     config.min_depth, config.max_depth).astype(np.int64)
    w = config.width
    leaves, operators = LABELS[config.operation]
    overflow = np.zeros(count, dtype=bool)
    if config.operation == "ops":
        base = random_trees(depths - 1, leaves, operators, w, rng)
        base, ok = _unique_labels(base, rng)
        present = base >= 0
        pick = np.floor(rng.random(count) * present.sum(axis=1)).astype(np.int64)
        node = np.argmax(np.cumsum(present, axis=1) > pick[:, None], axis=1)
        op = rng.integers(0, 4, size=count)
        x, y = tree_ops(base, node, op, w)
        return x, y, ~ok
    x = random_trees(depths, leaves, operators, w, rng)
    if config.operation == "copy":
        y = x.copy()
    elif config.operation == "rotate":
        y, overflow = rotate(x, w)
    else:
        y = reduce_c3(x)
    return x, y, overflow


@functools.lru_cache(maxsize=16)
def _split(config: TreeConfig, split: str, count: int):
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([config.data_seed, SPLITS.index(split)])
    w = config.width

    def draw():
        x, y, bad = examples(config, CHUNK, rng)
        bucket = split_of((x + 1).astype(np.int64), np.full(len(x), w, dtype=np.int64))
        keep = (np.isin(bucket, BUCKETS[split]) & ~bad
                & ((x >= 0).sum(axis=1) <= config.max_nodes)
                & ((y >= 0).sum(axis=1) <= config.max_nodes))
        return x[keep], y[keep]

    return distinct_rows(draw, count, lambda found: (
        f"fewer than {count} distinct {split} trees found ({found}): lower train_size or the "
        "evaluation sequences, or deepen the trees"))


@functools.lru_cache(maxsize=16)
def _serialised(config: TreeConfig, split: str, count: int):
    x, y = _split(replace(config, order="breadth"), split, count)  # the trees: any order
    out = serialise(x, "breadth") + serialise(y, config.order)
    for array in out:
        array.setflags(write=False)
    return out


def split_examples(config: TreeConfig, split: str, count: int):
    """(source tokens, source heaps, source counts, target tokens, target heaps, target
    counts): the first ``count`` distinct examples of ``split`` serialised (source
    breadth-first, target in the config's order), as :func:`serialise`; a function of the
    config (but train_size and eval_split), the split and count; the first k of a larger
    count are the same k. Read-only (cached)."""
    check_int("count", count, 1)
    return _serialised(replace(config, train_size=1, eval_split="test"), split, count)


@dataclass
class TreeBatch:
    """A batch of B examples padded to L = max(n_b + m_b) (layout as transduction's).

    Attributes:
        tokens, targets: int32 (B, L); mask: bool (B, L), True on the target tokens' columns;
        lengths: int64 (B,) source node counts n_b; coordinates: int32 (B, L, 1) each input
        token's heap number (source tree, target tree; 0 for the separator and padding).
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    coordinates: np.ndarray


def make_batch(config: TreeConfig, src, src_heaps, n, tgt, tgt_heaps, m) -> TreeBatch:
    """The batch of serialised examples (as :func:`split_examples` gives, rows picked)."""
    n = np.asarray(n, dtype=np.int64)[:, None]
    m = np.asarray(m, dtype=np.int64)[:, None]
    width = int((n + m).max())
    j = np.arange(width + 1)[None, :]
    w = src.shape[1]
    si = np.clip(j, 0, w - 1)
    ti = np.clip(j - n - 1, 0, w - 1)
    sep, pad = config.separator_id, config.pad_id
    full = np.where(j < n, np.take_along_axis(src, si, axis=1),
                    np.where(j == n, sep, np.where(j <= n + m, np.take_along_axis(tgt, ti, 1),
                                                   pad))).astype(np.int32)
    heaps = np.where(j < n, np.take_along_axis(src_heaps, si, axis=1),
                     np.where((j > n) & (j <= n + m), np.take_along_axis(tgt_heaps, ti, 1), 0))
    cols = np.arange(width)[None, :]
    real = cols < n + m
    tokens = np.where(real, full[:, :-1], pad).astype(np.int32)
    coordinates = np.where(real, heaps[:, :-1], 0).astype(np.int32)[..., None]
    return TreeBatch(tokens=tokens, targets=np.ascontiguousarray(full[:, 1:]),
                     mask=(cols >= n) & real, lengths=n[:, 0].copy(),
                     coordinates=np.ascontiguousarray(coordinates))


def generate(config: TreeConfig, batch_size: int,
             rng: np.random.Generator | int | None = None) -> TreeBatch:
    """A training batch: batch_size examples drawn uniformly (with replacement) from the
    config's ``train_size`` training examples by ``rng``."""
    return stream.split_batch(split_examples, make_batch, config, batch_size, rng)


def batches(config: TreeConfig, batch_size: int,
            seed: int | None = None) -> Iterator[TreeBatch]:
    """Endless stream of training batches, reproducible from seed."""
    return stream.endless(generate, config, batch_size, seed)


def eval_set(config: TreeConfig, n_sequences: int, seed: int = 0,
             batch_size: int = 128) -> list[TreeBatch]:
    """The first n_sequences examples of the config's ``eval_split`` in batches (``seed``
    unused: every run is scored on the same examples)."""
    return stream.split_eval_set(split_examples, make_batch, config, n_sequences, batch_size)


def loss_mask(batch: TreeBatch, positions: str) -> np.ndarray:
    """bool (B, L): 'revisits' the target tokens, 'all' every real column (as transduction's)."""
    return transduction.loss_mask(batch, positions, "the tree tasks")


def token_coordinates(batch: TreeBatch) -> np.ndarray:
    """int32 (B, L, 1): the tokens' heap numbers (0: separator, padding)."""
    return batch.coordinates
