"""Training and evaluation on the tasks (forced navigation, selective copy, TDB's rooms, ...):
AdamW over the flat parameter buffer, learning-rate schedules, accuracy on the IID and OOD
presets beside the trivial floor, checkpoints, a JSONL metrics log and a progress line.

The batch of step s is generated from ``default_rng([seed, s])``, so a resumed run sees
exactly the batches the uninterrupted run would have seen.

One loop trains every kind of model (:data:`MODEL_KINDS`: the Transformer, TDB), each keeping
a small protocol: ``params`` (a ParameterStore), ``ops``, ``config`` (its kind's config class:
``to_dict``/``from_dict``, ``vocab_size``, ``dropout``, ``label``), ``rng`` (the dropout
generator), ``train(mode)``, ``loss(tokens, targets, mask, coordinates, prefix, pool)``
(a float; keeps what backward needs) and ``backward(scored)`` (the gradient into
``params.grad``, zeroed first). What differs between kinds (building one, reading its
predictions and code usage, an after-step hook such as TDB's teacher EMA, the state beyond
the parameters a checkpoint holds) is the kind's :class:`ModelKind` entry; a model's kind is
found by its config's class, and a checkpoint names it.
"""
import dataclasses
import fnmatch
import json
import math
import os
import time
import zipfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from .models import ModelConfig, Transformer
from .tasks import (digits, ginc, grid2d, navigation, rooms, rotation4d, selective_copy,
                    transduction, trees)
from .tasks.stream import check_task_options
from .tdb import TDB, TDBConfig

TASKS = {"navigation": navigation, "selective_copy": selective_copy,
         "rotation4d": rotation4d, "rooms": rooms, "ginc": ginc,
         **{op: transduction for op in transduction.OPERATIONS},
         **{name: digits for name in digits.VARIANTS},
         **{name: trees for name in trees.TASK_NAMES},
         **{name: grid2d for name in grid2d.TASK_NAMES}}
SCHEDULES = ("linear", "cosine", "constant")
EVAL_SETS = ("iid", "ood_dense", "ood_sparse")
PRESETS = EVAL_SETS + ("table3",)  # training presets: navigation's "table3" has its own OOD sets
# 2: ModelConfig names mixer, positional scheme, bottleneck, options; 3: + the dropout
# generator's state (a version 2 checkpoint resumes exactly only without dropout); 4: mapem_nc's
# quaternion path (b 4, K 6) holds its step map's columns and p* feature-major (the nc op's
# layout), so its version 2-3 checkpoints are refused (their weights mean another model)
CHECKPOINT_VERSION = 4
READABLE_VERSIONS = (2, 3, 4)


@dataclass(frozen=True)
class TrainConfig:
    """A training run. Defaults are the MapFormer paper's recipe (section 5.2): AdamW,
    lr 3e-4, weight decay 0.05, batch 128, gradient clipping at 1.0, linear decay to 0 and
    no warmup, on the 2D ``iid`` preset (128 steps, p_empty 0.5, grid 64).

    task: 'navigation', 'rotation4d', 'selective_copy', one of APE's sequence
    transductions 'copy', 'repeat', 'reverse', or the image classifications 'digits' (8x8
    digits, 64 pixel tokens) and 'digits16' (pasted at random offsets on a 16x16 canvas; see
    :mod:`mapformer.tasks.digits`), or APE's tree transductions 'tree_copy', 'tree_rotate',
    'tree_c3', 'tree_ops' (see :mod:`mapformer.tasks.trees`), or the 2D grid transductions
    'grid_copy', 'grid_transpose', 'grid_rotate90', 'grid_flip' (see
    :mod:`mapformer.tasks.grid2d`), or 'rooms', the walks of one of TDB's aliased rooms (a
    fixed pool of training walks, the room's test walks as the evaluation set: see
    :class:`mapformer.tasks.rooms.RoomsTask`; the room's seed is the run's); preset: 'iid',
    'ood_dense', 'ood_sparse' or (navigation) 'table3', the SSM comparison's 16-step training
    set (transduction, trees, grids, rooms: 'iid' only).
    dims, steps, grid_size, p_empty, n_objects: navigation (see
    :func:`mapformer.tasks.navigation.preset`); n_copy, n_blanks, n_symbols: selective copy
    (see :func:`mapformer.tasks.selective_copy.preset`); steps, p_empty, n_objects, planes:
    4D-rotation navigation (see :mod:`mapformer.tasks.rotation4d`); mean_length, n_symbols:
    transduction (see :mod:`mapformer.tasks.transduction`); tree_depth (the mean depth),
    tree_order ('breadth' or 'depth', the target's order): the tree tasks; grid_side (the
    mean grid side, sides within +-1 of it), n_symbols: the grid tasks; steps (the walk's
    observations N): rooms. None keeps the preset's value.
    task_options: {name: value}, the options of a task that has them beyond these fields
    (rooms: :data:`mapformer.tasks.rooms.TASK_OPTIONS`: height, width, n_obs, patch,
    topology, walks, context; navigation: :data:`mapformer.tasks.navigation.TASK_OPTIONS`:
    fixed_map, action_repeat, map_seed, walk), validated by the task; None for the others. It is written by
    :meth:`to_dict` only when set, so the description (and a run's id) of a config without it
    is what it was before the field existed.
    ood_dense, ood_sparse: overrides ("field=value,...", e.g. "steps=256,p_empty=0.9") of the
    OOD test sets, which are derived from the training task by the paper's ratios (see
    :meth:`eval_tasks`). sequences: training sequences in all (rounded up to whole batches).
    loss_positions: where the training loss is taken: 'revisits' (the task's scored
    positions, as the paper trains; evaluation always scores these), 'observations' (every
    position whose target is an observation, first visits included: navigation only) or
    'all' (every position). decay: which parameters AdamW's weight decay applies to, a
    comma-separated union of 'matrices' (the weights of linear maps, embedding tables,
    CoPE's position embeddings and TAPE's head mix: the library's rule), 'all', 'none', and
    glob patterns of parameter names (e.g. 'matrices,*.omega' also decays MapWM's
    frequencies, as a public reproduction does). schedule: 'linear' (decay from lr to 0) or
    'cosine' (linear warmup over ``warmup_steps``, then cosine to 0) or 'constant' (lr
    throughout, TDB's recipe). eval_every: optimizer
    steps between evaluations (0: only at the end). eval_sequences: sequences per set in
    each evaluation (fixed set from ``seed``).
    """

    task: str = "navigation"
    preset: str = "iid"
    dims: int = 2
    steps: int = None
    grid_size: int = None
    p_empty: float = None
    n_objects: int = 16
    planes: str = None
    n_copy: int = None
    n_blanks: int = None
    n_symbols: int = None
    mean_length: int = None
    tree_depth: int = None
    tree_order: str = None
    grid_side: int = None
    task_options: dict = field(default=None, hash=False)
    ood_dense: str = None
    ood_sparse: str = None
    sequences: int = 200_000
    batch_size: int = 128
    loss_positions: str = "revisits"
    lr: float = 3e-4
    weight_decay: float = 0.05
    decay: str = "matrices"
    beta1: float = 0.9
    beta2: float = 0.999
    clip: float = 1.0
    schedule: str = "linear"
    warmup_steps: int = 0
    seed: int = 0
    eval_every: int = 0
    eval_sequences: int = 256
    eval_batch_size: int = 32
    log_every: int = 10
    checkpoint_every: int = 0

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {self.task!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.task_options is not None and (self.task not in ("rooms", "navigation", "ginc")
                                              or not isinstance(self.task_options, dict)):
            raise ValueError(f"task_options must be None for task {self.task!r} (only 'rooms', "
                             f"'navigation' and 'ginc' have options) or a dict, got "
                             f"{self.task_options!r:.80}")
        if self.task == "navigation" and self.task_options:
            self.task_options.update(check_task_options("navigation", self.task_options,
                                                        navigation.TASK_OPTIONS))
        if not isinstance(self.decay, str) or not all(t.strip() for t in self.decay.split(",")):
            raise ValueError("decay must be a comma-separated list of 'matrices', 'all', "
                             f"'none' or parameter-name patterns, got {self.decay!r}")
        for name in ("sequences", "batch_size", "eval_sequences", "eval_batch_size",
                     "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("lr", "weight_decay", "clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        positions = task_module(self.task_config()).LOSS_POSITIONS  # validates the task fields
        if self.loss_positions not in positions:
            raise ValueError(f"loss_positions must be one of {positions} for task "
                             f"{self.task!r}, got {self.loss_positions!r}")
        self.eval_tasks()  # validates the OOD overrides

    @property
    def total_steps(self):
        return -(-self.sequences // self.batch_size)

    def task_config(self, preset=None):
        """The task config of ``preset`` (default: the training preset) with this run's
        overrides. Other presets take only the vocabulary overrides (n_objects, n_symbols)
        and keep their own lengths, as the paper's OOD sets do."""
        name = preset or self.preset
        if self.task == "rooms":
            return rooms.task_preset(name, seed=self.seed, steps=self.steps,
                                     **(self.task_options or {}))
        if self.task == "ginc":
            return ginc.task_preset(name, **(self.task_options or {}))
        if self.task == "navigation":
            shape, vocab = ("steps", "grid_size", "p_empty"), {"n_objects": self.n_objects}
        elif self.task == "rotation4d":
            if self.grid_size is not None:
                raise ValueError("grid_size is not a field of task 'rotation4d' (its cells "
                                 "are the group's elements)")
            shape = ("steps", "p_empty")
            vocab = {"n_objects": self.n_objects, "planes": self.planes}
        elif self.task in transduction.OPERATIONS:
            shape, vocab = ("mean_length",), {"n_symbols": self.n_symbols}
        elif self.task in digits.VARIANTS:
            return digits.preset(name, canvas=digits.VARIANTS[self.task])
        elif self.task in trees.TASK_NAMES:
            shape, vocab = ("tree_depth",), {"order": self.tree_order}
        elif self.task in grid2d.TASK_NAMES:
            shape, vocab = ("grid_side",), {"n_symbols": self.n_symbols}
        else:
            shape, vocab = ("n_copy", "n_blanks"), {"n_symbols": self.n_symbols}
        overrides = {k: v for k, v in vocab.items() if v is not None}
        if name == self.preset:
            overrides.update({k: getattr(self, k) for k in shape if getattr(self, k) is not None})
        if self.task == "navigation":
            return navigation.preset(name, dims=self.dims, **overrides,
                                     **(self.task_options or {}))
        if self.task == "rotation4d":
            return rotation4d.preset(name, **overrides)
        if self.task in transduction.OPERATIONS:
            return transduction.preset(name, operation=self.task, **overrides)
        if self.task in trees.TASK_NAMES:
            if "tree_depth" in overrides:
                overrides["mean_depth"] = overrides.pop("tree_depth")
            return trees.preset(name, operation=trees.TASK_NAMES[self.task], **overrides)
        if self.task in grid2d.TASK_NAMES:
            if "grid_side" in overrides:
                overrides["mean_side"] = overrides.pop("grid_side")
            return grid2d.preset(name, operation=grid2d.TASK_NAMES[self.task], **overrides)
        return selective_copy.preset(name, **overrides)

    def eval_tasks(self):
        """{name: task config} evaluated at the end of training: 'iid', the training task;
        'ood_dense' and 'ood_sparse', derived from it by the paper's ratios (the task
        module's ``ood_sets``: navigation halves steps and grid with p_empty 0.2, and takes 4x
        the steps and 2x the grid with p_empty 0.8; selective copy halves and doubles the
        blanks; navigation's "table3" preset: Table 3's ratios, see
        navigation.table3_ood_sets; transduction: 'iid' the test split, 'dev' and
        'ood_long', twice the source length), then with the ``ood_dense`` / ``ood_sparse``
        overrides. For the paper's presets these are its OOD presets."""
        task = self.task_config()
        sets = {"iid": task, **task_module(task).ood_sets(task)}
        if self.task == "navigation" and self.preset == "table3":
            sets.update(navigation.table3_ood_sets(task))
        for name in ("ood_dense", "ood_sparse"):
            if getattr(self, name):
                if name not in sets:
                    raise ValueError(f"{name}: task {self.task!r} has no {name} set (its "
                                     f"evaluation sets are {list(sets)})")
                sets[name] = dataclasses.replace(
                    sets[name], **parse_overrides(getattr(self, name), sets[name], name))
        return sets

    def to_dict(self):
        """The fields as a dict; ``task_options`` only when set (see the class)."""
        values = asdict(self)
        if values["task_options"] is None:
            del values["task_options"]
        return values

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def parse_overrides(text, config, name):
    """'field=value,...' -> {field: value} for the dataclass ``config``, each value parsed as
    its field's type (int, float or bool). ValueError naming ``name`` for an unknown field or
    a bad value."""
    types = {f.name: type(getattr(config, f.name)) for f in fields(config)}
    values = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise ValueError(f"{name}: expected 'field=value,...' with fields among "
                             f"{sorted(types)}, got {item!r}")
        if types[key] is bool:
            if value.strip().lower() not in ("true", "false"):
                raise ValueError(f"{name}: {key} must be true or false, got {value!r}")
            values[key] = value.strip().lower() == "true"
            continue
        try:
            values[key] = types[key](value)
        except ValueError:
            raise ValueError(f"{name}: {key} must be a {types[key].__name__}, got "
                             f"{value!r}") from None
    return values


def decay_mask(store, rule):
    """bool (P,): the entries of the parameter store that AdamW decays under ``rule`` (see
    TrainConfig.decay), never a VQ codebook's (``*.codebook``). ValueError for a pattern that
    matches no parameter."""
    mask = store.ops.zeros(store.size, dtype=bool)
    for term in (t.strip() for t in rule.split(",")):
        if term == "matrices":
            mask |= store.decay_mask
        elif term != "none":
            matched = [p for p in store.params.values()
                       if term == "all" or fnmatch.fnmatchcase(p.name, term)]
            if not matched:
                raise ValueError(f"decay: the pattern {term!r} matches no parameter; the "
                                 f"parameters are {list(store.params)}")
            for p in matched:
                mask[p.offset:p.offset + p.size] = True
    for p in store.params.values():  # VQ codebooks never decay, whatever the rule
        if p.name.endswith(".codebook"):
            mask[p.offset:p.offset + p.size] = False
    return mask


def learning_rate(config, step):
    """The learning rate of optimizer step ``step`` (0-based)."""
    total = config.total_steps
    if config.schedule == "linear":
        return config.lr * (1.0 - step / total)
    if config.schedule == "constant":
        return config.lr
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(total - config.warmup_steps, 1)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


class AdamW:
    """AdamW over a model's flat parameter buffer: one op call per step."""

    def __init__(self, model, config):
        self.model, self.config = model, config
        self.decay_mask = decay_mask(model.params, config.decay)
        self.m = model.ops.zeros_like(model.params.data)
        self.v = model.ops.zeros_like(model.params.data)
        self.step_count = 0

    def step(self, lr):
        """Clip the gradient's global norm, then update; returns the pre-clip norm."""
        ops, store, c = self.model.ops, self.model.params, self.config
        norm = ops.clip_grad_norm(store.grad, c.clip) if c.clip > 0 else ops.global_norm(
            store.grad)
        self.step_count += 1
        ops.adamw_step(store.data, store.grad, self.m, self.v, self.decay_mask, lr=lr,
                       step=self.step_count, beta1=c.beta1, beta2=c.beta2, eps=1e-8,
                       weight_decay=c.weight_decay)
        return norm


def task_module(task):
    """The module (navigation, rotation4d, selective_copy, transduction, digits, trees,
    grid2d or rooms) that generates batches of a task config."""
    if isinstance(task, rooms.RoomsTask):
        return rooms
    if isinstance(task, (ginc.GincTask, ginc.GincPrompts)):
        return ginc
    if isinstance(task, rotation4d.Rotation4DConfig):
        return rotation4d
    if isinstance(task, transduction.TransductionConfig):
        return transduction
    if isinstance(task, digits.DigitsConfig):
        return digits
    if isinstance(task, trees.TreeConfig):
        return trees
    if isinstance(task, grid2d.GridConfig):
        return grid2d
    return navigation if isinstance(task, navigation.NavigationConfig) else selective_copy


def batch_prefix(module, batch):
    """The task's prefix length of each sequence of ``batch``, int (B,) (transduction: its
    source and separator, the part a prefix LM reads bidirectionally; what attention with
    ``attn_mask='prefix'`` sees in full), or None when the task module defines none
    (``attention_prefix(batch)``)."""
    read = getattr(module, "attention_prefix", None)
    return None if read is None else read(batch)


def batch_pool(module):
    """How the model pools its features for the task module: 'mean' for classification
    tasks (one class per sequence: the module's ``POOL``), else None (a prediction per
    token)."""
    return getattr(module, "POOL", None)


def predicted_accuracy(pred, batch):
    """Fraction of masked positions whose prediction pred int (B, T) equals the target."""
    return float((pred == batch.targets)[batch.mask].mean()) if batch.mask.any() else math.nan


# ---- the kinds of model the loop trains --------------------------------------------------
@dataclass(frozen=True)
class ModelKind:
    """What the training loop, evaluation and checkpoints need of one kind of model beyond
    the protocol every model keeps (see the module).

    name: the kind's name (a checkpoint's "kind"); config: its config class; build(config,
    seed=0, backend="c", declare_only=None) -> model (declare_only=P: only declare at most P
    parameters, as a checkpoint is checked); scores(model, batch) -> float (B, T, V): the
    logits of the last loss, aligned with ``batch.targets`` (their argmax the predictions,
    :func:`predictions`; 0 where the model predicts nothing); usage(model) -> [code
    usage since the last call, one entry per VQ bottleneck]; after_step(model), or None:
    called after every optimizer step (TDB: the teacher's EMA); state(model) -> (meta,
    {name: array}) and restore(model, meta, arrays), or None: what a checkpoint holds beside
    the parameters and moments for an exact resume, its arrays named in ``state_arrays``;
    data_parallel: whether mapformer.parallel may train it."""

    name: str
    config: type
    build: Callable
    scores: Callable
    usage: Callable
    after_step: Callable = None
    state: Callable = None
    restore: Callable = None
    state_arrays: tuple = ()
    data_parallel: bool = False


def transformer_scores(model, batch):
    """float (B, T, V): a Transformer's last logits, shaped as ``batch.mask`` plus V."""
    return model.ops.to_numpy(model.logits).reshape(batch.mask.shape + (-1,))


def predictions(scores):
    """int (B, T): the argmax of scores (B, T, V) (the first of equal maxima)."""
    return scores.argmax(-1)


def top_k_hits(scores, targets, k):
    """bool (n,): whether each target int (n,) is among the k highest of its scores (n, V):
    fewer than k classes score above it (a tie counts for the target)."""
    target = np.take_along_axis(scores, targets[:, None], axis=-1)
    return (scores > target).sum(-1) < k


def bottleneck_usage(model):
    """Each block's VQ bottleneck's code usage since the last call (blocks without one give
    nothing)."""
    return [u for u in (getattr(b.bottleneck, "usage", lambda: None)() for b in model.blocks)
            if u is not None]


MODEL_KINDS = {
    "transformer": ModelKind("transformer", ModelConfig, Transformer, transformer_scores,
                             bottleneck_usage, data_parallel=True),
    "tdb": ModelKind("tdb", TDBConfig, TDB, lambda model, batch: model.token_scores(),
                     lambda model: [model.vq.usage()], after_step=TDB.update_teacher,
                     state=TDB.checkpoint_state, restore=TDB.restore_state,
                     state_arrays=TDB.STATE_ARRAYS),
}
STATE_ARRAYS = tuple(dict.fromkeys(a for k in MODEL_KINDS.values() for a in k.state_arrays))


def model_kind(config):
    """The :class:`ModelKind` whose config class ``config`` is (TypeError naming the kinds
    otherwise)."""
    for kind in MODEL_KINDS.values():
        if type(config) is kind.config:
            return kind
    raise TypeError(f"a model config must be one of "
                    f"{', '.join(k.config.__name__ for k in MODEL_KINDS.values())} (the kinds "
                    f"{', '.join(MODEL_KINDS)}), got {type(config).__name__}")


def eval_seed(train_config):
    """The seed of a run's evaluation sets: fixed by the run, distinct from its batches."""
    return train_config.seed + 1_000_003


def evaluate(model, tasks, sequences=256, seed=0, batch_size=32):
    """Masked accuracy, loss and floor of ``model`` on fixed evaluation sets.

    tasks: {name: task config}. Returns {name: {"accuracy", "accuracy_top5", "loss", "floor",
    "floor_token", "object_accuracy", "object_floor", "sequences", "positions",
    "object_positions"}}:
    - accuracy over every masked position (for navigation: every revisit); the floor is the
      accuracy of always predicting the most frequent target (the always-blank floor);
      accuracy_top5 counts a position right when its target is among the 5 highest logits
      (GridPE's Acc@5; a tie counts for the target); loss is the mean cross-entropy;
    - object_accuracy over the masked positions whose target is not the blank token (the
      revisits of cells that hold an object), beside its floor: always the most frequent
      object. Blank-free tasks (selective copy) give the same number twice;
    - a task without a blank token (``blank_id`` None: rooms) counts every target as an
      object;
    - a task module with ``eval_metrics(loss, exact, sequences)`` (transduction: perplexity
      and sequence_accuracy) adds its metrics, from the mean loss and the count of sequences
      whose masked positions are all right;
    - a model with path-integrating layers (a scheme that traces Delta: MapWM, MapEM) adds
      "delta_abs_by_token": per layer, None where the layer integrates no Delta, else per input
      token id the mean |Delta| over the positions holding it (every head and block; None for
      an id the set never shows): which tokens move the map (navigation: the actions;
      selective copy: the data tokens, not the blanks, if the positions count only data),
      and a task module's ``delta_metrics(task, by_token)`` its readings of them (selective
      copy: blank over data, per layer; navigation: observations over actions);
    - a task module with ``recall_lags(batch)`` (navigation: steps since the revisited cell was
      last seen) adds "object_recalls_by_lag" ({"positions", "hits"}: lists indexed by lag,
      the object recalls of each lag and how many were right) and, for each k of its
      ``SCORED_LAGS``, "object_accuracy_lag_gt{k}": the object recalls whose lag exceeds k
      (None when there is none);
    - a task module with ``timesteps(batch)`` (rooms: the index of the observation each
      position predicts) adds "accuracy_by_timestep" ({"positions", "hits"}: lists indexed by
      that index, the scored positions and how many were right).

    ValueError when ``sequences`` < 1 or a task's vocabulary exceeds the model's.
    """
    if sequences < 1:
        raise ValueError(f"sequences must be >= 1, got {sequences!r}")
    for name, task in tasks.items():
        if task.vocab_size > model.config.vocab_size:
            raise ValueError(f"{name}: the task's vocabulary ({task.vocab_size}) exceeds the "
                             f"model's ({model.config.vocab_size})")
    kind = model_kind(model.config)
    model.train(False)
    results = {}
    for name, task in tasks.items():
        hits = object_hits = top5_hits = total = exact = rows = 0
        loss_sum = 0.0
        counts = np.zeros(task.vocab_size, dtype=np.int64)
        module = task_module(task)
        lags_of = getattr(module, "recall_lags", None)
        lag_positions = lag_hits = np.zeros(0, dtype=np.int64)
        steps_of = getattr(module, "timesteps", None)
        step_positions = step_hits = np.zeros(0, dtype=np.int64)
        delta_sums = DeltaByToken(model, task.vocab_size)
        for batch in module.eval_set(task, sequences, seed, batch_size):
            n = int(batch.mask.sum())
            if n == 0:
                continue
            loss_sum += model.loss(batch.tokens, batch.targets, batch.mask,
                                   module.token_coordinates(batch),
                                   batch_prefix(module, batch), batch_pool(module)) * n
            delta_sums.add(batch.tokens)  # the forward of the loss left its traces
            scores = kind.scores(model, batch)
            correct = (predictions(scores) == batch.targets) & batch.mask
            top5_hits += int(top_k_hits(scores[batch.mask], batch.targets[batch.mask], 5).sum())
            hits += int(correct.sum())
            scored = batch.mask.any(axis=1)
            exact += int((correct == batch.mask).all(axis=1)[scored].sum())
            rows += int(scored.sum())
            object_hits += int(correct.sum() if task.blank_id is None
                               else correct[batch.targets != task.blank_id].sum())
            counts += np.bincount(batch.targets[batch.mask], minlength=task.vocab_size)
            total += n
            if lags_of is not None:
                is_object = batch.mask & (batch.targets != task.blank_id)
                lag = lags_of(batch)
                lag_positions = add_histogram(lag_positions, lag[is_object])
                lag_hits = add_histogram(lag_hits, lag[is_object & correct])
            if steps_of is not None:
                steps = steps_of(batch)
                step_positions = add_histogram(step_positions, steps[batch.mask])
                step_hits = add_histogram(step_hits, steps[correct])
        majority = int(counts.argmax())
        objects = counts if task.blank_id is None else np.delete(counts, task.blank_id)
        n_objects = int(objects.sum())
        results[name] = {"accuracy": hits / max(total, 1),
                         "accuracy_top5": top5_hits / max(total, 1),
                         "loss": loss_sum / max(total, 1),
                         "floor": int(counts[majority]) / max(total, 1),
                         "floor_token": "blank" if majority == task.blank_id else majority,
                         "object_accuracy": object_hits / max(n_objects, 1),
                         "object_floor": int(objects.max(initial=0)) / max(n_objects, 1),
                         "sequences": sequences, "positions": total,
                         "object_positions": n_objects}
        if lags_of is not None:
            results[name].update(lag_metrics(lag_positions, lag_hits, module.SCORED_LAGS))
        if steps_of is not None:
            results[name]["accuracy_by_timestep"] = {
                "positions": step_positions.tolist(),
                "hits": np.pad(step_hits, (0, step_positions.size - step_hits.size)).tolist()}
        if delta_sums.layers:
            by_token = results[name]["delta_abs_by_token"] = delta_sums.means()
            readings = getattr(module, "delta_metrics", None)
            if readings is not None:
                results[name].update(readings(task, by_token))
        extra = getattr(module, "eval_metrics", None)
        if extra is not None:
            results[name].update(extra(results[name]["loss"], exact, rows))
    model.train(True)
    return results


class DeltaByToken:
    """Sums of |Delta| per input token id over the path-integrating layers of ``model``
    (``layers``: their indices; empty for a model without one), from the traces its last
    forward left."""

    def __init__(self, model, vocab_size):
        blocks = getattr(model, "blocks", ())
        self.model, self.n_layers = model, len(blocks)
        self.layers = [i for i, b in enumerate(blocks)
                       if "delta" in getattr(getattr(b.mixer, "scheme", None), "traces", ())]
        self.sums = np.zeros((len(self.layers), vocab_size))
        self.counts = np.zeros(vocab_size, dtype=np.int64)

    def add(self, tokens):
        """tokens int (B, T): the input of the forward just run."""
        if not self.layers:
            return
        ids = np.asarray(tokens).ravel()
        self.counts += np.bincount(ids, minlength=self.counts.size)
        for row, i in enumerate(self.layers):
            delta = np.abs(self.model.ops.to_numpy(self.model.blocks[i].mixer.scheme.delta))
            per_position = delta.reshape(ids.size, -1).mean(axis=1, dtype=np.float64)
            self.sums[row] += np.bincount(ids, weights=per_position,
                                          minlength=self.counts.size)

    def means(self):
        """Per layer None (no Delta) or a list per token id of its mean |Delta| (None: the
        id never occurred)."""
        out = [None] * self.n_layers
        for row, i in enumerate(self.layers):
            out[i] = [float(s / n) if n else None for s, n in zip(self.sums[row], self.counts)]
        return out


def add_histogram(counts, values):
    """counts (L,) int64 plus the histogram of the non-negative ints ``values``, grown to fit."""
    more = np.bincount(values.ravel(), minlength=counts.size)
    more[:counts.size] += counts
    return more


def lag_metrics(positions, hits, thresholds):
    """{"object_recalls_by_lag": {"positions", "hits"} (lists indexed by lag), and
    "object_accuracy_lag_gt{k}" for each k of ``thresholds``: hits over positions of the lags
    above k (None when none: a table leaves it out)}. positions, hits: int64 (L,) counts per
    lag."""
    hits = np.pad(hits, (0, positions.size - hits.size))
    metrics = {"object_recalls_by_lag": {"positions": positions.tolist(),
                                         "hits": hits.tolist()}}
    for k in thresholds:
        n = int(positions[k + 1:].sum())
        metrics[f"object_accuracy_lag_gt{k}"] = int(hits[k + 1:].sum()) / n if n else None
    return metrics


def format_eval(results):
    """One line per evaluation set: accuracy beside its floor, then the object recalls (and
    the perplexity and exact match of the tasks that report them)."""
    return "\n".join(f"  {name:<10} accuracy {r['accuracy']:.3f}   always-{r['floor_token']} "
                     f"floor {r['floor']:.3f}   objects {r['object_accuracy']:.3f} (floor "
                     f"{r['object_floor']:.3f})   loss {r['loss']:.3f}   "
                     + (f"perplexity {r['perplexity']:.3f}   exact match "
                        f"{r['sequence_accuracy']:.3f}   " if "perplexity" in r else "")
                     + f"({r['positions']} positions)" for name, r in results.items())


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not hold a consistent training state (the
    message names the file and the field)."""


CHECKPOINT_ARRAYS = ("params", "m", "v")  # float32 (P,) each: parameters, AdamW moments
# beside them: "meta" (JSON: version, kind, configs, step, parameter names, dropout generator,
# the kind's "state") and the kind's state arrays (ModelKind.state_arrays)


def temp_path(path):
    """Where a checkpoint is written before it is renamed over ``path``."""
    return Path(path).with_suffix(".tmp.npz")


def nonfinite_tensor(store, flat):
    """The name of the first parameter whose entries in ``flat`` (a NumPy array of the
    parameter store's layout, (P,)) are not all finite, or None."""
    for p in store.params.values():
        if not np.isfinite(flat[p.offset:p.offset + p.size]).all():
            return p.name
    return None


def check_finite_state(model, optimizer, step):
    """FloatingPointError naming the step and the tensor (parameter, and whether its value or
    an AdamW moment) when the training state is not finite."""
    to_numpy = model.ops.to_numpy
    for label, flat in (("parameter", model.params.data), ("AdamW first moment (m) of",
                                                            optimizer.m),
                        ("AdamW second moment (v) of", optimizer.v)):
        name = nonfinite_tensor(model.params, to_numpy(flat))
        if name is not None:
            raise FloatingPointError(f"training diverged at step {step}: the {label} {name!r} "
                                     "holds non-finite values")


def save_checkpoint(path, model, optimizer, train_config, step):
    """Write the model's kind and config, flat parameters, AdamW moments, the dropout
    generator's state, the step and the kind's state (:class:`ModelKind`: TDB's teacher and VQ
    state) to ``path`` (.npz), atomically: to a temporary file, synced, then renamed over
    ``path``, so that ``path`` always holds the last complete checkpoint. A non-finite
    parameter or moment is never written (FloatingPointError naming the step and the
    tensor)."""
    check_finite_state(model, optimizer, step)
    kind = model_kind(model.config)
    meta = {"version": CHECKPOINT_VERSION, "kind": kind.name, "model": model.config.to_dict(),
            "train": train_config.to_dict(), "step": step,
            "param_names": list(model.params.params),
            "dropout_rng": model.rng.bit_generator.state}
    state, state_arrays = kind.state(model) if kind.state is not None else ({}, {})
    if kind.state is not None:
        meta["state"] = state
    to_numpy = model.ops.to_numpy
    write_npz(path, meta=json.dumps(meta), **state_arrays, **{  # host float32, any backend
        name: np.asarray(to_numpy(a), np.float32) for name, a in (
            ("params", model.params.data), ("m", optimizer.m), ("v", optimizer.v))})


def write_npz(path, **arrays):
    """Write ``arrays`` to an .npz file at exactly ``path`` (no suffix added), atomically: to
    a temporary file (:func:`temp_path`), synced, then renamed over ``path``, so that ``path``
    always holds the last complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_npz(path, names, optional=()):
    """{name: array} of the .npz file ``path``: the members ``names`` (each required) and
    those of ``optional`` it holds, every one read (so that a truncated file or a bad CRC shows
    here). CheckpointError with one line naming the file for a missing file, a bare .npy, a
    missing member or anything unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        f = np.load(path, allow_pickle=False)
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise CheckpointError(f"{path} is not a checkpoint: a bare array, not an .npz")
        with f:
            missing = [k for k in names if k not in f.files]
            if missing:
                raise CheckpointError(f"{path} is not a mapformer checkpoint: it lacks "
                                      f"{', '.join(missing)}")
            return {k: f[k] for k in (*names, *optional) if k in f.files}
    except CheckpointError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated: "
                              f"{type(exc).__name__}: {exc})") from None


def json_object(path, arrays, name):
    """The dict stored as JSON text in the member ``name`` of ``arrays`` (CheckpointError
    naming it otherwise)."""
    value = arrays[name]
    if value.shape != () or value.dtype.kind != "U":
        raise CheckpointError(f"{path}: {name} must be JSON text, got {value.dtype} of shape "
                              f"{value.shape}")
    try:
        obj = json.loads(str(value))
    except ValueError as exc:
        raise CheckpointError(f"{path}: {name} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: {name} must be a JSON object, got "
                              f"{type(obj).__name__}")
    return obj


def check_arrays(path, arrays, names, declare):
    """Check a checkpoint's flat arrays ``names`` against the model its config describes,
    before that model is built: ``declare(P)`` declares the model's parameters, ValueError
    past P of them, P the length of the first array (a ParameterStore, nothing allocated:
    e.g. ``Transformer(config, backend="numpy", declare_only=P).params``). CheckpointError
    naming what differs, unless every array is float32 of shape (the parameter count,) with
    finite values. Returns the declared store (names and offsets)."""
    first = arrays[names[0]]
    if first.dtype != np.float32 or first.ndim != 1:
        raise CheckpointError(f"{path}: {names[0]} must be a float32 vector (P,), got "
                              f"{first.dtype} of shape {first.shape}")
    try:
        store = declare(first.shape[0])
    except ValueError as exc:
        raise CheckpointError(f"{path}: the saved configuration does not describe the "
                              f"{first.shape[0]} parameters that {names[0]} holds: "
                              f"{exc}") from None
    for name in names:
        a = arrays[name]
        if a.dtype != np.float32 or a.shape != (store.size,):
            raise CheckpointError(f"{path}: {name} must be float32 of shape ({store.size},) "
                                  f"(the parameters the saved config describes), got "
                                  f"{a.dtype} of shape {a.shape}")
        tensor = nonfinite_tensor(store, a)
        if tensor is not None:
            raise CheckpointError(f"{path}: {name} holds non-finite values (in {tensor!r})")
    return store


def read_checkpoint(path):
    """(meta, {name: array}) of a training checkpoint file (:func:`read_npz`; meta a JSON
    object)."""
    arrays = read_npz(path, ("meta", *CHECKPOINT_ARRAYS), optional=STATE_ARRAYS)
    return json_object(path, arrays, "meta"), arrays


def check_version(path, meta):
    """ValueError unless ``meta`` is of a version this mapformer reads."""
    version = meta.get("version")
    if version not in READABLE_VERSIONS:
        raise CheckpointError(
            f"{path} is a version {version} checkpoint, written by "
            + ("an older mapformer (before ModelConfig named a mixer, a positional scheme and "
               "a bottleneck with one options dict): retrain it, or read it with that version"
               if isinstance(version, int) and version < min(READABLE_VERSIONS)
               else "another mapformer")
            + f"; this one reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    model = meta.get("model")
    if version < 4 and isinstance(model, dict) and model.get("positional") == "mapem_nc":
        options = model.get("options") if isinstance(model.get("options"), dict) else {}
        b, k = options.get("nc_block", 4), options.get("nc_generators", 0)
        if b == 4 and k in (0, 6):
            raise CheckpointError(
                f"{path} is a version {version} checkpoint of mapem_nc's quaternion path (b 4, "
                "K 6), whose weights were laid out block-major; this mapformer's nc op is "
                "feature-major, so they would mean another model: retrain it, or read it with "
                "the mapformer that wrote it")


def checkpoint_kind(path, meta):
    """The :class:`ModelKind` a checkpoint's ``meta`` names ("kind"; absent: a Transformer,
    as every checkpoint was before TDB's), or CheckpointError naming it."""
    name = meta.get("kind", "transformer")
    if not isinstance(name, str) or name not in MODEL_KINDS:
        raise CheckpointError(f"{path}: meta field 'kind' must be one of "
                              f"{', '.join(MODEL_KINDS)}, got {name!r:.80}")
    return MODEL_KINDS[name]


def checkpoint_meta(path):
    """The metadata of a checkpoint (configs, step, parameter names), or ValueError if it is
    unreadable or another version of mapformer wrote it."""
    meta, _ = read_checkpoint(path)
    check_version(path, meta)
    return meta


def load_checkpoint(path, backend="c"):
    """Load a checkpoint onto ``backend`` (any: a checkpoint holds host float32 arrays,
    whichever backend saved it): returns (model, optimizer, train_config, step); the model is
    of the checkpoint's kind (a Transformer or a TDB). Every field is checked (CheckpointError
    naming it): the kind, the configs, the step (an int in [0, total steps]), the arrays'
    dtype (float32) and shape (P,) for the P parameters the config describes (before the
    model is built: :func:`check_arrays`), finite parameters and moments, the parameter
    names, v >= 0, the dropout generator's state and the kind's state."""
    meta, arrays = read_checkpoint(path)
    check_version(path, meta)
    kind = checkpoint_kind(path, meta)

    def field(name, expected):
        if not isinstance(meta.get(name), expected):
            raise CheckpointError(f"{path}: meta field {name!r} must be a "
                                  f"{getattr(expected, '__name__', 'dict')}, got "
                                  f"{meta.get(name)!r:.80}")
        return meta[name]

    try:
        model_config = kind.config.from_dict(field("model", dict))
        train_config = TrainConfig.from_dict(field("train", dict))
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: the saved configuration is invalid: {exc}") from None
    step = field("step", int)
    if isinstance(step, bool) or not 0 <= step <= train_config.total_steps:
        raise CheckpointError(f"{path}: step must be an int in [0, {train_config.total_steps}] "
                              f"(the run's total steps), got {step!r}")
    store = check_arrays(path, arrays, CHECKPOINT_ARRAYS, lambda limit: kind.build(
        model_config, backend="numpy", declare_only=limit).params)
    names = list(store.params)
    if field("param_names", list) != names:
        raise CheckpointError(f"{path}: parameters {meta['param_names'][:3]}... do not match "
                              f"the model's {names[:3]}... ({store.size} values)")
    if (arrays["v"] < 0).any():
        raise CheckpointError(f"{path}: v (AdamW's second moment) must be >= 0")
    model = kind.build(model_config, backend=backend)
    if "dropout_rng" in meta:  # version 2 did not save it
        try:
            model.rng.bit_generator.state = field("dropout_rng", dict)
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: dropout_rng is not a state of "
                                  f"{type(model.rng.bit_generator).__name__}: {exc}") from None
    asarray = model.ops.asarray
    model.params.data[:] = asarray(arrays["params"])
    optimizer = AdamW(model, train_config)
    optimizer.m[:], optimizer.v[:] = asarray(arrays["m"]), asarray(arrays["v"])
    optimizer.step_count = step
    if kind.restore is not None:
        try:
            kind.restore(model, field("state", dict), arrays)
        except ValueError as exc:
            raise CheckpointError(f"{path}: the {kind.name} state: {exc}") from None
    return model, optimizer, train_config, step


def check_resume(path, model_config, train_config):
    """Raise ValueError naming every field (and model option) where a checkpoint's configs
    differ from these."""
    def flat(model_dict):  # options.<name> beside the fields (a Transformer's)
        values = dict(model_dict)
        values.update({f"options.{k}": v for k, v in values.pop("options", {}).items()})
        return values

    meta = checkpoint_meta(path)
    kind, saved_kind = model_kind(model_config), checkpoint_kind(path, meta)
    if saved_kind is not kind:
        raise ValueError(f"{path} does not match this run:\n  kind: checkpoint "
                         f"{saved_kind.name!r} != {kind.name!r}")
    saved = meta["model"]
    try:  # options completed with today's defaults: an option added since is no difference
        saved = kind.config.from_dict(saved).to_dict()
    except (TypeError, ValueError, KeyError):
        pass  # compared as written: the differences name what no longer fits
    saved, ours = flat(saved), flat(model_config.to_dict())
    differences = [f"model.{k}: checkpoint {saved.get(k)!r} != {ours.get(k)!r}"
                   for k in dict.fromkeys([*ours, *saved]) if saved.get(k) != ours.get(k)]
    differences += [f"train.{k}: checkpoint {meta['train'].get(k)!r} != {v!r}"
                    for k, v in train_config.to_dict().items()
                    if k not in ("eval_every", "log_every", "checkpoint_every")
                    and meta["train"].get(k) != v]
    if differences:
        raise ValueError(f"{path} does not match this run:\n  " + "\n  ".join(differences))


def check_scored_positions(train_config, task, module, start):
    """ValueError when the training loss has no position to score: the batches of the first
    (up to 4) steps from ``start`` all have empty loss masks (e.g. a walk of one step has no
    revisit)."""
    for step in range(start, min(start + 4, train_config.total_steps)):
        batch = module.generate(task, train_config.batch_size,
                                np.random.default_rng([train_config.seed, step]))
        if module.loss_mask(batch, train_config.loss_positions).any():
            return
    if start < train_config.total_steps:
        raise ValueError(f"the training task {task} has no position to score with "
                         f"loss_positions={train_config.loss_positions!r} (its first batches "
                         "are all unscored): lengthen the walk (steps) or choose other "
                         "loss_positions")


def train(model_config, train_config, out_dir=None, resume=None, progress=True, log=print,
          eval_tasks=None, backend="c", parallel=None):
    """Train a model on ``train_config``'s task and evaluate it.

    model_config: ModelConfig or TDBConfig, the model's kind (:data:`MODEL_KINDS`; its
    vocab_size must equal the task's). out_dir: where
    ``checkpoint.npz`` and ``metrics.jsonl`` go (None: nothing written; a ``checkpoint.npz``
    there that is not a file is a ValueError before training). resume: a checkpoint to
    continue from (its configs must equal these). eval_tasks: {name: task config} (default:
    the three presets, see TrainConfig.eval_tasks). backend: the model's ('c', 'cuda',
    'numpy' or a backend object: mapformer.backend.get). parallel: a
    mapformer.parallel.DataParallel: this process is one of its ranks, training on its share
    of every batch (rank 0 alone logs, shows progress, writes ``out_dir`` and evaluates).
    Returns a dict with the final evaluation, the last training loss, wall time, steps,
    sequences, the model, ``log`` (the records logged every ``log_every`` steps: step, loss,
    accuracy, lr, grad_norm, ...) and ``evals`` ([{"step", "eval"}] of the evaluations every
    ``eval_every`` steps, the final one excluded)."""
    task = train_config.task_config()
    module = task_module(task)
    kind = model_kind(model_config)
    eval_tasks = eval_tasks or train_config.eval_tasks()
    if parallel is not None:
        from .parallel import check_data_parallel
        if not kind.data_parallel:
            raise ValueError(f"--data-parallel: a {kind.name} model trains in one process")
        check_data_parallel(model_config)
        parallel.rows(train_config.batch_size)  # every rank has a row
        if not parallel.root:
            out_dir, progress, log = None, False, lambda *a: None

    def run_eval():
        if parallel is not None and not parallel.root:
            return parallel.broadcast(None)
        results = evaluate(model, eval_tasks, train_config.eval_sequences,
                           eval_seed(train_config), train_config.eval_batch_size)
        return results if parallel is None else parallel.broadcast(results)

    if model_config.vocab_size != task.vocab_size:
        raise ValueError(f"model vocab_size {model_config.vocab_size} != the task's vocab_size "
                         f"{task.vocab_size} ({task})")
    if resume:
        check_resume(resume, model_config, train_config)
        model, optimizer, _, start = load_checkpoint(resume, backend)
        if model_config.dropout > 0 and checkpoint_meta(resume).get("dropout_rng") is None:
            log(f"warning: {resume} (version 2) does not hold the dropout generator's state: "
                "the resumed run's dropout masks differ from the uninterrupted run's")
    else:
        model = kind.build(model_config, seed=train_config.seed, backend=backend)
        optimizer, start = AdamW(model, train_config), 0
    total = train_config.total_steps
    check_scored_positions(train_config, task, module, start)
    out_dir = Path(out_dir) if out_dir else None
    metrics = None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = out_dir / "checkpoint.npz"
        if checkpoint.exists() and not checkpoint.is_file():  # found now, not after training
            raise ValueError(f"out_dir: {checkpoint} is not a file, so the checkpoint cannot "
                             "be written there")
        stale = temp_path(checkpoint)
        if stale.exists():  # left by a run killed while writing its checkpoint
            stale.unlink()
            log(f"removed {stale}, an incomplete checkpoint of an interrupted run")
        metrics = open(out_dir / "metrics.jsonl", "a" if resume else "w")
    log(f"training {model_config.label} ({model.params.size} parameters) on {task}: "
        f"{total} steps of {train_config.batch_size} sequences, "
        f"{task.seq_len} tokens each" + (f", resuming at step {start}" if start else ""))
    log("evaluating on " + "; ".join(f"{name} ({task_module(config).describe(config)})"
                                     for name, config in eval_tasks.items()))
    # tqdm.auto: a widget in notebooks, a bar on a terminal; metrics.jsonl is the record
    bar = tqdm(total=total, initial=start, disable=not progress, unit="step",
               dynamic_ncols=True, mininterval=0.5)
    t0 = time.perf_counter()
    record = None
    history, evals = [], []
    try:
        for step in range(start, total):
            batch = module.generate(task, train_config.batch_size,
                                    np.random.default_rng([train_config.seed, step]))
            mask = module.loss_mask(batch, train_config.loss_positions)
            inputs = [batch.tokens, batch.targets, mask, module.token_coordinates(batch),
                      batch_prefix(module, batch)]
            scored = float(np.sum(mask))  # the whole batch's: the loss is a mean over it
            if parallel is not None:  # this rank's rows; the gradient of the whole batch's
                rows = parallel.rows(train_config.batch_size)  # mean, once summed
                inputs = [None if a is None else a[rows] for a in inputs]
                batch = parallel.share(batch)
            loss = model.loss(*inputs, batch_pool(module))
            model.backward(scored)
            if parallel is not None:
                parallel.allreduce(model.params.grad)
                loss = parallel.sum(loss * float(np.sum(inputs[2]))) / max(scored, 1.0)
            lr = learning_rate(train_config, step)
            norm = optimizer.step(lr)
            if kind.after_step is not None:
                kind.after_step(model)
            done = step + 1
            if not (math.isfinite(loss) and math.isfinite(norm)):
                raise FloatingPointError(
                    f"training diverged at step {done}: the loss is {loss} and the gradient "
                    f"norm {norm}" + (f"; {out_dir / 'checkpoint.npz'} keeps the last good "
                                      "state" if out_dir and train_config.checkpoint_every
                                      else ""))
            if done % train_config.log_every == 0 or done == total:
                elapsed = time.perf_counter() - t0
                accuracy = predicted_accuracy(predictions(kind.scores(model, batch)), batch)
                if parallel is not None:  # over the whole batch's scored positions
                    shared = np.count_nonzero(batch.mask)
                    accuracy = parallel.sum(accuracy * shared if shared else 0.0) / max(
                        parallel.sum(shared), 1)
                record = {"step": done, "sequences": done * train_config.batch_size,
                          "loss": loss, "accuracy": accuracy,
                          "lr": lr, "grad_norm": norm, "elapsed": elapsed,
                          "seq_per_s": (done - start) * train_config.batch_size / elapsed}
                usage = kind.usage(model)
                if usage:  # VQ bottlenecks: perplexity and dead codes since the last record
                    record["code_usage"] = usage
                history.append(record)
                bar.set_postfix(loss=f"{loss:.4f}", acc=f"{record['accuracy']:.3f}",
                                seq_per_s=f"{record['seq_per_s']:.0f}")
                if metrics:
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
            bar.update(1)
            if train_config.eval_every and done % train_config.eval_every == 0 and done < total:
                results = run_eval()
                evals.append({"step": done, "eval": results})
                log(f"step {done}:\n{format_eval(results)}")
                if metrics:
                    metrics.write(json.dumps({"step": done, "eval": results}) + "\n")
            every = train_config.checkpoint_every
            if out_dir and every and done % every == 0:
                save_checkpoint(out_dir / "checkpoint.npz", model, optimizer, train_config, done)
        bar.close()
        wall = time.perf_counter() - t0
        results = run_eval()
        log(f"final ({total} steps, {total * train_config.batch_size} sequences, "
            f"{wall:.0f}s):\n{format_eval(results)}")
        if out_dir:
            save_checkpoint(out_dir / "checkpoint.npz", model, optimizer, train_config, total)
            metrics.write(json.dumps({"step": total, "eval": results, "wall_s": wall}) + "\n")
    finally:
        bar.close()
        if metrics:
            metrics.close()
    return {"eval": results, "loss": record["loss"] if record else None, "wall_s": wall,
            "steps": total, "sequences": total * train_config.batch_size, "model": model,
            "log": history, "evals": evals}

