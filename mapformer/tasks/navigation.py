"""Forced navigation on an n-dimensional torus (MapFormer paper, section 5.2 and appendix 10.3).

An agent walks on a torus of ``grid_size`` cells per axis (``dims`` axes, wrap-around). Each
cell holds one object or nothing (blank). A sequence of T steps is the 2T tokens

    a_1, o_1, a_2, o_2, ..., a_T, o_T

where a_t moves the agent one cell along one axis, to p_t, and o_t is the content of p_t.
Every time the agent comes back to a cell it has already observed, the model must recall
what it saw there: those are the only positions scored.

Vocabulary (n = dims, K = n_objects):

    0 .. 2n-1          actions: id 2j is +1 on axis j, id 2j+1 is -1 on axis j
    2n .. 2n+K-1       the K objects
    2n+K               blank (an empty cell)
    vocab_size = 2n + K + 1

Targets and mask are aligned with the input tokens for next-token prediction:
``targets[:, i] = tokens[:, i+1]`` (the last target is the blank id), and ``mask[:, i]`` is
True iff token i+1 is an observation o_t of a cell observed earlier in the same sequence
(p_t == p_s for some s < t; the start cell counts only once it has been observed). The mask
therefore sits on action positions 2t-2 (0-based); the target there is the cell's content.

Maps: by default every sequence draws its own map, lazily, only for the cells it visits (each
cell blank with probability ``p_empty``, else a uniform object), so memory does not grow with
``grid_size ** dims``. With ``fixed_map=True`` one map, drawn from ``map_seed``, is shared by
every sequence of every batch (see ``fixed_map``).
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
MAX_FIXED_MAP_CELLS = 10_000_000
WALKS = ("uniform", "no_backtrack")
"""NavigationConfig.walk's readings. "uniform" is the library's (and the current tables');
"no_backtrack" removes the revisits of a step and its inverse, which a model with fixed
relative positions recalls without a map (the cell two steps back is always two tokens
pairs back)."""
TASK_OPTIONS = {"fixed_map": bool, "action_repeat": int, "map_seed": int, "walk": str}
"""The fields a training config sets through TrainConfig.task_options (its own fields carry
dims, steps, grid_size, p_empty and n_objects)."""
SCORED_LAGS = (2, 4)
"""The scoring readings besides "every revisit" (issue 34): object recalls whose lag (steps
since the cell was last visited, :func:`visit_lags`) exceeds 2 (no step straight back) or 4
(no smallest 2D loop either); :func:`mapformer.train.evaluate` reports each as
``object_accuracy_lag_gt{k}`` beside the per-lag counts."""
_MAX_KEY = 2**62


@dataclass(frozen=True)
class NavigationConfig:
    """One forced-navigation dataset.

    Fields:
        dims: number of torus axes n, >= 1.
        steps: T, steps per sequence (a sequence is 2T tokens), >= 1.
        grid_size: cells per axis, >= 2.
        p_empty: probability that a cell is blank, in [0, 1].
        n_objects: K, number of object tokens, >= 1.
        fixed_map: if True every sequence walks on the same map (grid_size**dims <= 10_000_000).
        action_repeat: actions come in runs of uniform length 1..action_repeat, >= 1
            (1 gives i.i.d. uniform actions).
        map_seed: seed of the shared map when fixed_map is True, >= 0; unused otherwise.
        walk: how actions follow each other (a reading of the paper's task; see WALKS):
            "uniform" (the default: i.i.d. actions, so a step is undone by the next with
            probability 1 / (2 dims), and many revisits are the cell two steps back) or
            "no_backtrack" (an action is never the inverse of the one before it; with
            action_repeat, of the run before it).
    """

    dims: int = 2
    steps: int = 128
    grid_size: int = 64
    p_empty: float = 0.5
    n_objects: int = 16
    fixed_map: bool = False
    action_repeat: int = 1
    map_seed: int = 0
    walk: str = "uniform"

    def __post_init__(self) -> None:
        if self.walk not in WALKS:
            raise ValueError(f"walk must be one of {WALKS}, got {self.walk!r}")
        check_int("dims", self.dims, 1)
        check_int("steps", self.steps, 1)
        check_int("grid_size", self.grid_size, 2)
        check_int("n_objects", self.n_objects, 1)
        check_int("action_repeat", self.action_repeat, 1)
        check_int("map_seed", self.map_seed, 0)
        p = self.p_empty
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p_empty must be a number in [0, 1], got {p!r}")
        if not isinstance(self.fixed_map, bool):
            raise ValueError(f"fixed_map must be True or False, got {self.fixed_map!r}")
        if self.fixed_map and self.n_cells > MAX_FIXED_MAP_CELLS:
            raise ValueError(
                f"grid_size**dims must be <= {MAX_FIXED_MAP_CELLS} with fixed_map=True, "
                f"got {self.grid_size}**{self.dims} = {self.n_cells}"
            )

    @property
    def n_actions(self) -> int:
        """Number of action tokens, 2 * dims."""
        return 2 * self.dims

    @property
    def blank_id(self) -> int:
        """Id of the blank token, 2 * dims + n_objects."""
        return 2 * self.dims + self.n_objects

    @property
    def vocab_size(self) -> int:
        """Number of token ids, 2 * dims + n_objects + 1."""
        return self.blank_id + 1

    @property
    def seq_len(self) -> int:
        """Tokens per sequence, 2 * steps."""
        return 2 * self.steps

    @property
    def coord_dims(self) -> int:
        """The dimension of the token coordinates the task supplies (a scheme reading them:
        gridpe, ape_grid): the torus's dims."""
        return self.dims

    @property
    def coord_extent(self) -> int:
        """Positions a coordinate takes per axis: the grid side."""
        return self.grid_size

    @property
    def walk_extent(self) -> int:
        """The longest distance a path covers (MapFormer appendix 10.2, omega's grid): the grid
        side."""
        return self.grid_size

    @property
    def n_cells(self) -> int:
        """Cells on the torus, grid_size ** dims (a Python int: it may exceed int64)."""
        return self.grid_size**self.dims

    def action_ids(self) -> range:
        """Ids of the action tokens: 0 .. 2*dims - 1."""
        return range(0, self.n_actions)

    def object_ids(self) -> range:
        """Ids of the object tokens: 2*dims .. 2*dims + n_objects - 1."""
        return range(self.n_actions, self.blank_id)


PRESETS: dict[str, dict] = {
    "iid": dict(steps=128, p_empty=0.5, grid_size=64),
    "ood_dense": dict(steps=64, p_empty=0.2, grid_size=32),
    "ood_sparse": dict(steps=512, p_empty=0.8, grid_size=128),
    "table3": dict(steps=16, p_empty=0.5, grid_size=64),
}
"""The paper's 1D and 2D settings (section 5.2): train on "iid", test on the two OOD sets.
"table3" is the training set of the SSM comparison (appendix 10.1, Table 3: sequences of 16
steps; p_empty and grid as "iid", our reading), whose OOD sets are :func:`table3_ood_sets`."""


def scaled_presets(steps: int, grid_size: int) -> dict[str, dict]:
    """Presets around an IID set of ``steps`` and ``grid_size`` at the paper's 2D ratios:
    ood_dense halves steps and grid_size (rounded half up, at least 2) with p_empty 0.2,
    ood_sparse has 4x the steps and 2x the grid_size with p_empty 0.8."""
    return {
        "iid": dict(steps=steps, p_empty=0.5, grid_size=grid_size),
        "ood_dense": dict(steps=max(1, steps // 2), p_empty=0.2, grid_size=max(2, (grid_size + 1) // 2)),
        "ood_sparse": dict(steps=4 * steps, p_empty=0.8, grid_size=2 * grid_size),
    }


def describe(config: NavigationConfig) -> str:
    """A short description of a task config for logs: '2D, 128 steps, grid 64, p_empty 0.5',
    then the other fields that differ from their defaults."""
    text = f"{config.dims}D, {config.steps} steps, grid {config.grid_size}, p_empty {config.p_empty}"
    defaults = NavigationConfig()
    rest = ("n_objects", "fixed_map", "action_repeat", "map_seed", "walk")
    extra = [f"{f} {getattr(config, f)}" for f in rest if getattr(config, f) != getattr(defaults, f)]
    return ", ".join([text, *extra])


def ood_sets(config: NavigationConfig) -> dict[str, NavigationConfig]:
    """The OOD test sets of a training set ``config`` at the paper's ratios
    (:func:`scaled_presets`): {"ood_dense": ..., "ood_sparse": ...}, every other field (dims,
    n_objects, fixed_map, ...) kept. For the paper's presets these are its OOD presets."""
    sets = scaled_presets(config.steps, config.grid_size)
    return {name: replace(config, **sets[name]) for name in ("ood_dense", "ood_sparse")}


def table3_ood_sets(config: NavigationConfig) -> dict[str, NavigationConfig]:
    """Table 3's OOD sets of a training set ``config``: "ood_dense" as :func:`ood_sets`
    (half the steps and grid, p_empty 0.2), "ood_sparse" with 2x the steps (not 4x: the paper
    tests 16-step training on 32 steps), 2x the grid and p_empty 0.8. For the "table3" preset:
    8 steps / grid 32 / 0.2 and 32 steps / grid 128 / 0.8."""
    sets = ood_sets(config)
    sets["ood_sparse"] = replace(sets["ood_sparse"], steps=2 * config.steps)
    return sets


LOSS_POSITIONS = ("revisits", "observations", "all")
"""The choices of :func:`loss_mask` for this task."""


def loss_mask(batch: Batch, positions: str) -> np.ndarray:
    """bool (B, 2T): the columns a training loss is taken on. "revisits": the scored positions
    (an action whose next observation is of a cell seen before, ``batch.mask``);
    "observations": every action column (its target is the next observation, first visits
    included); "all": every column."""
    if positions == "revisits":
        return batch.mask
    mask = np.ones_like(batch.mask)
    if positions == "observations":
        mask[:, 1::2] = False
    return mask


PRESETS_BY_DIMS: dict[int, dict[str, dict]] = {
    3: scaled_presets(steps=256, grid_size=16),
    5: scaled_presets(steps=16, grid_size=5),
}
"""Settings for 3D and 5D (appendix 10.3).

The paper gives only the IID numbers (3D: 256 steps, grid 16; 5D: 16 steps, grid 5) and keeps
p_empty = 0.5 implicit. The OOD sets are our reading, scaled from the IID set as the 2D presets
are (:func:`scaled_presets`).
3D: ood_dense 128 steps, grid 8; ood_sparse 1024 steps, grid 32.
5D: ood_dense 8 steps, grid 3; ood_sparse 64 steps, grid 10.
"""


def preset(name: str, dims: int = 2, **overrides) -> NavigationConfig:
    """The config of a named preset ("iid", "ood_dense", "ood_sparse") in ``dims`` dimensions.

    dims 3 and 5 use ``PRESETS_BY_DIMS``; every other dims uses the paper's 1D/2D numbers
    ``PRESETS``. Keyword overrides replace any field, e.g. ``preset("iid", fixed_map=True)``.
    Raises ValueError for an unknown name.
    """
    table = PRESETS_BY_DIMS.get(dims, PRESETS)
    if name not in table:
        raise ValueError(f"unknown preset {name!r}; the presets are {sorted(table)}")
    return NavigationConfig(dims=dims, **{**table[name], **overrides})


@dataclass
class Batch:
    """A batch of B sequences of T steps.

    Attributes:
        tokens: int32 (B, 2T), a_1, o_1, ..., a_T, o_T.
        targets: int32 (B, 2T), tokens shifted left by one; the last column is the blank id.
        mask: bool (B, 2T), True where the target is the observation of a revisited cell.
        positions: int64 (B, T, dims), the agent's coordinates p_t after each action a_t.
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    positions: np.ndarray


@functools.lru_cache(maxsize=4)
def _fixed_map_flat(dims: int, grid_size: int, p_empty: float, n_objects: int, map_seed: int) -> np.ndarray:
    rng = np.random.default_rng(map_seed)
    n = grid_size**dims
    cells = _draw_contents(rng, n, 2 * dims, n_objects, p_empty)
    cells.flags.writeable = False
    return cells


def fixed_map(config: NavigationConfig) -> np.ndarray:
    """The shared map of a ``fixed_map=True`` config: read-only int32 (grid_size,) * dims.

    ``fixed_map(config)[tuple(p)]`` is the token observed at cell p. The map depends only on
    dims, grid_size, p_empty, n_objects and map_seed, and is cached.
    """
    if not config.fixed_map:
        raise ValueError("fixed_map(config) needs a config with fixed_map=True")
    flat = _fixed_map_flat(config.dims, config.grid_size, config.p_empty, config.n_objects, config.map_seed)
    return flat.reshape((config.grid_size,) * config.dims)


def _draw_contents(rng: np.random.Generator, n: int, first_object: int, n_objects: int, p_empty: float) -> np.ndarray:
    """Contents of n cells: int32 (n,), blank (first_object + n_objects) w.p. p_empty, else an object."""
    objects = rng.integers(first_object, first_object + n_objects, size=n, dtype=np.int32)
    return np.where(rng.random(n) < p_empty, np.int32(first_object + n_objects), objects)


def _no_backtrack(rng: np.random.Generator, n_actions: int, shape: tuple) -> np.ndarray:
    """Actions int32 (B, T), each uniform among the n_actions - 1 that do not undo the one
    before it (the inverse of 2j is 2j + 1 and back); the first uniform among all."""
    actions = np.empty(shape, dtype=np.int32)
    actions[:, 0] = rng.integers(0, n_actions, size=shape[0], dtype=np.int32)
    draws = rng.integers(0, n_actions - 1, size=(shape[0], shape[1] - 1), dtype=np.int32)
    for t in range(1, shape[1]):
        inverse = actions[:, t - 1] ^ 1
        actions[:, t] = draws[:, t - 1] + (draws[:, t - 1] >= inverse)
    return actions


def _draw_actions(rng: np.random.Generator, config: NavigationConfig, batch_size: int) -> np.ndarray:
    """Actions int32 (B, T): i.i.d. uniform (walk "uniform") or never undoing the previous
    one ("no_backtrack"), in runs of uniform length 1..action_repeat."""
    shape = (batch_size, config.steps)
    if config.walk == "no_backtrack":
        actions = _no_backtrack(rng, config.n_actions, shape)
    else:
        actions = rng.integers(0, config.n_actions, size=shape, dtype=np.int32)
    if config.action_repeat == 1:
        return actions
    lengths = rng.integers(1, config.action_repeat + 1, size=shape)
    starts = np.cumsum(lengths, axis=1) - lengths  # (B, T) first step of each run
    rows, runs = np.nonzero(starts < config.steps)
    is_start = np.zeros(shape, dtype=np.int32)
    is_start[rows, starts[rows, runs]] = 1
    run_of_step = np.cumsum(is_start, axis=1) - 1  # (B, T) index of the run each step belongs to
    return np.take_along_axis(actions, run_of_step, axis=1)


def generate(config: NavigationConfig, batch_size: int, rng: np.random.Generator | int | None = None) -> Batch:
    """Draw a batch of B = batch_size sequences.

    Args:
        config: the dataset.
        batch_size: B >= 1.
        rng: a Generator (advanced in place), a seed, or None for fresh entropy.
    Returns:
        Batch with tokens/targets/mask (B, 2T) and positions (B, T, dims).
    Raises ValueError if batch_size < 1, or if grid_size**dims * batch_size exceeds 2**62
    (the (sequence, cell) keys would overflow int64).
    """
    check_int("batch_size", batch_size, 1)
    if config.n_cells * batch_size > _MAX_KEY:
        raise ValueError(
            f"grid_size**dims * batch_size must be <= 2**62, got "
            f"{config.grid_size}**{config.dims} * {batch_size}"
        )
    rng = np.random.default_rng(rng)
    B, T, n, G = batch_size, config.steps, config.dims, config.grid_size

    actions = _draw_actions(rng, config, B)  # (B, T)
    start = rng.integers(0, G, size=(B, n))  # (B, n)
    axis, sign = actions // 2, (1 - 2 * (actions % 2)).astype(np.int8)
    positions = np.empty((B, T, n), dtype=np.int64)
    cell = np.zeros((B, T), dtype=np.int64)  # row-major linear index of p_t
    for j in range(n):
        walk = np.cumsum(np.where(axis == j, sign, np.int8(0)), axis=1, dtype=np.int64)
        positions[..., j] = (start[:, j, None] + walk) % G
        cell = cell * G + positions[..., j]

    # One key per (sequence, cell): np.unique's index is the first occurrence in row-major
    # (b, t) order, i.e. each sequence's first visit of the cell.
    key = (np.arange(B, dtype=np.int64)[:, None] * config.n_cells + cell).ravel()
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    revisit = (first[inverse] != np.arange(B * T)).reshape(B, T)
    if config.fixed_map:
        obs = fixed_map(config).ravel()[cell]
    else:
        contents = _draw_contents(rng, first.size, config.n_actions, config.n_objects, config.p_empty)
        obs = contents[inverse].reshape(B, T)

    tokens = np.empty((B, 2 * T), dtype=np.int32)
    tokens[:, 0::2] = actions
    tokens[:, 1::2] = obs
    targets = np.empty_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    targets[:, -1] = config.blank_id
    mask = np.zeros((B, 2 * T), dtype=bool)
    mask[:, 0::2] = revisit
    return Batch(tokens=tokens, targets=targets, mask=mask, positions=positions)


def batches(config: NavigationConfig, batch_size: int, seed: int | None = None) -> Iterator[Batch]:
    """Endless training stream of batches of B = batch_size sequences, reproducible from seed.

    The stream is seeded with (seed, 0) and ``eval_set`` with (seed, 1), so the same seed never
    gives the same sequences in both.
    """
    return stream.endless(generate, config, batch_size, seed)


def eval_set(config: NavigationConfig, n_sequences: int, seed: int, batch_size: int = 128) -> list[Batch]:
    """A fixed evaluation set: n_sequences sequences in ceil(n_sequences / batch_size) Batches.

    Every batch holds batch_size sequences but the last, which holds the remainder. The set is a
    function of (config, n_sequences, seed, batch_size) only.
    """
    return stream.generated_eval_set(generate, config, n_sequences, seed, batch_size)


def token_coordinates(batch: Batch) -> np.ndarray:
    """The cell of every token: int64 (B, 2T, dims); a_t and o_t both sit at p_t (the action
    moves the agent there, the observation is what it sees there)."""
    return np.repeat(batch.positions, 2, axis=1)


def visit_lags(batch: Batch) -> np.ndarray:
    """Steps since each position's cell was last visited: int64 (B, T), t - s for the latest
    s < t with p_s == p_t, 0 where p_t is visited the first time (the start cell counts from
    its first observation, as the mask does).

    ``visit_lags(batch) > 0`` is the mask's revisit pattern, ``batch.mask[:, 0::2]``."""
    pos = np.asarray(batch.positions)
    n_seq, steps, dims = pos.shape
    base = int(pos.max(initial=0)) + 1  # every coordinate lies in [0, grid_size)
    cell = np.zeros((n_seq, steps), dtype=np.int64)
    for j in range(dims):
        cell = cell * base + pos[..., j]
    key = (np.arange(n_seq, dtype=np.int64)[:, None] * base**dims + cell).ravel()
    order = np.argsort(key, kind="stable")  # visits of one (sequence, cell) in time order
    previous = np.full(key.size, -1, dtype=np.int64)
    repeat = key[order[1:]] == key[order[:-1]]
    previous[order[1:][repeat]] = order[:-1][repeat]
    index = np.arange(key.size, dtype=np.int64)
    return np.where(previous >= 0, index - previous, 0).reshape(n_seq, steps)


def recall_lags(batch: Batch) -> np.ndarray:
    """The lag of each scored position: int64 (B, 2T), :func:`visit_lags` at the masked
    action positions (whose target is the revisited cell's content), 0 elsewhere."""
    lags = np.zeros(batch.mask.shape, dtype=np.int64)
    lags[:, 0::2] = visit_lags(batch)
    return np.where(batch.mask, lags, 0)


def unwrapped_displacement(batch: Batch, dims: int) -> np.ndarray:
    """The walk's displacement from its start after each step, not wrapped round the torus:
    int64 (B, T, dims), the running sum of the steps (action 2j is +1 on axis j, 2j + 1 is
    -1)."""
    actions = np.asarray(batch.tokens)[:, 0::2]
    steps = np.stack([(actions == 2 * j).astype(np.int64) - (actions == 2 * j + 1)
                      for j in range(dims)], axis=-1)
    return np.cumsum(steps, axis=1)


def wrapped_recalls(batch: Batch, config: NavigationConfig) -> np.ndarray:
    """Which scored positions recall a cell the agent reached again by going round the torus:
    bool (B, 2T), True where the walk's unwrapped displacement (the sum of its steps) since the
    cell's last visit (:func:`recall_lags`) is not zero. A model whose positions are periodic
    with the training torus's period recognises these only on a torus of that size."""
    unwrapped = unwrapped_displacement(batch, config.dims)
    lags = recall_lags(batch)
    b, i = np.nonzero(batch.mask)
    t = i // 2  # the step whose observation is recalled
    moved = np.abs(unwrapped[b, t] - unwrapped[b, t - lags[b, i]]).sum(axis=-1) != 0
    out = np.zeros(batch.mask.shape, dtype=bool)
    out[b, i] = moved
    return out


def delta_metrics(config: NavigationConfig, by_token: list) -> dict:
    """What a path-integrating model's integration times Delta say about actions and
    observations (the paper's Fig. 5a: a map is learned once observations stop rotating it),
    for ``train.evaluate``: {"delta_observation_over_action_layer{i}": the mean |Delta| of the
    observation tokens (objects and blank) over that of the action tokens (per-token means
    averaged) for each layer i that integrates Delta}. 0: observations leave the position
    untouched.

    by_token: per layer None or a list per token id of the mean |Delta| (None: unseen)."""
    out = {}
    for i, means in enumerate(by_token):
        if means is None:
            continue
        actions = [means[t] for t in range(config.n_actions) if means[t] is not None]
        observations = [means[t] for t in range(config.n_actions, config.vocab_size)
                        if means[t] is not None]
        if actions and observations:
            out[f"delta_observation_over_action_layer{i}"] = (float(np.mean(observations))
                                                              / float(np.mean(actions)))
    return out


def blank_floor(batch: Batch, blank_id: int) -> float:
    """Fraction of masked targets that are blank: the accuracy of always answering blank.

    nan if the batch has no masked position.
    """
    scored = batch.targets[batch.mask]
    return float(np.mean(scored == blank_id)) if scored.size else math.nan


def recall_accuracy(logits_or_predictions: np.ndarray, batch: Batch) -> float:
    """Accuracy over the masked (revisit) positions.

    Args:
        logits_or_predictions: integer predictions (B, 2T), or logits (B, 2T, V) reduced by argmax.
        batch: the batch they were made on.
    Returns:
        the fraction of masked positions predicted right, nan if there is none.
    """
    pred = np.asarray(logits_or_predictions)
    if pred.ndim == 3:
        pred = pred.argmax(axis=-1)
    if pred.shape != batch.targets.shape:
        raise ValueError(
            f"logits_or_predictions must have shape {batch.targets.shape} or "
            f"{batch.targets.shape} + (V,), got {np.shape(logits_or_predictions)}"
        )
    scored = batch.mask.sum()
    return float((pred == batch.targets)[batch.mask].sum() / scored) if scored else math.nan
