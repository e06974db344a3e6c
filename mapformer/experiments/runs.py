"""A run: a pure, hashable description of one training run, and what executes it.

A run's ``kind`` names its executor function: a key of :data:`KINDS` ("train": train a model on
its task and evaluate it on ``evals``; :func:`register_kind` adds one in this process), or
"module:function", imported where the run executes (a worker process of a pool or cluster
knows only what it imports: a kind of one's own that runs there is named this way). The id is
the first 16 hex digits of the SHA-256 of the run's canonical JSON (sorted keys, no spaces),
so the same description has the same id in every process and on every machine.
"""
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields

from ..tasks import digits, grid2d, navigation, rotation4d, selective_copy, transduction, trees

# the task config classes an evaluation set may be, by name (their dataclass fields as JSON)
TASK_CONFIGS = {cls.__name__: cls for cls in (
    navigation.NavigationConfig, selective_copy.SelectiveCopyConfig,
    rotation4d.Rotation4DConfig, transduction.TransductionConfig, digits.DigitsConfig,
    trees.TreeConfig, grid2d.GridConfig)}


def canonical(value):
    """The canonical JSON text of ``value`` (sorted keys, no spaces): what ids hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# fields added to a task config after records of it existed, at the value that behaves as
# before the field: left out of the description there, so the runs' ids stay what they were
ADDED_FIELDS = {"NavigationConfig": {"walk": "uniform"}}


def task_to_dict(config):
    """{"config": class name, **fields} of a task config (one of :data:`TASK_CONFIGS`); a
    field of :data:`ADDED_FIELDS` at its old behaviour's value is left out."""
    name = type(config).__name__
    if name not in TASK_CONFIGS:
        raise TypeError(f"an evaluation set must be one of {sorted(TASK_CONFIGS)}, got {name}")
    values = json.loads(json.dumps(asdict(config)))
    for key, old in ADDED_FIELDS.get(name, {}).items():
        if values.get(key) == old:
            del values[key]
    return {"config": name, **values}


def task_from_dict(values):
    """The task config :func:`task_to_dict` wrote (JSON's lists back to the tuples they
    were)."""
    values = dict(values)
    name = values.pop("config", None)
    if name not in TASK_CONFIGS:
        raise ValueError(f"unknown task config {name!r}: one of {sorted(TASK_CONFIGS)}")
    cls = TASK_CONFIGS[name]
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{name} has no field {unknown[0]!r}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


@dataclass(frozen=True)
class Run:
    """One run. model: ModelConfig.to_dict(); train: TrainConfig.to_dict() (its seed is the
    run's seed); evals: {name: task_to_dict(config)} evaluated after training (empty: the
    train config's own sets, TrainConfig.eval_tasks); kind: the key of :data:`KINDS` that
    executes it; extra: whatever else the kind reads (JSON values)."""

    model: dict
    train: dict
    evals: dict = field(default_factory=dict)
    kind: str = "train"
    extra: dict = field(default_factory=dict)

    def to_dict(self):
        return json.loads(canonical(asdict(self)))

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"a run has no field {unknown[0]!r}")
        return cls(**values)

    @property
    def id(self):
        """16 hex digits: SHA-256 of the canonical JSON of the whole description."""
        return hashlib.sha256(canonical(self.to_dict()).encode()).hexdigest()[:16]

    @property
    def seed(self):
        return self.train.get("seed", 0)

    def __hash__(self):
        return hash(self.id)

    @classmethod
    def of(cls, model_config, train_config, evals=None, kind="train", **extra):
        """The run of a ModelConfig and TrainConfig, evaluated on ``evals`` ({name: task
        config}; None: the train config's own sets)."""
        return cls(model=model_config.to_dict(), train=train_config.to_dict(),
                   evals={k: task_to_dict(v) for k, v in (evals or {}).items()}, kind=kind,
                   extra=extra)


def run_directory(run):
    """Where a run whose kind checkpoints (the OOD diagnosis, TDB's table) keeps its training
    checkpoint: ``$MAPFORMER_RUNS/<run id>`` (default ``runs/<run id>``), so that an interrupted
    run resumes there when it is executed again and a finished one is read back."""
    from pathlib import Path
    return Path(os.environ.get("MAPFORMER_RUNS", "runs"), run.id)


def json_safe(value):
    """``value`` with NumPy scalars and arrays as Python numbers and lists, tuples as lists."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist")
                                 else str(v)))


CLOCK = ("elapsed", "seq_per_s")  # the training log's clock readings: not in the record


def train_run(run):
    """Train run.model on run.train's task and evaluate it on run.evals: what
    :func:`mapformer.train.train` returns (the model under "model")."""
    from ..models import ModelConfig
    from ..train import TrainConfig, train

    evals = {k: task_from_dict(v) for k, v in run.evals.items()} or None
    return train(ModelConfig.from_dict(run.model), TrainConfig.from_dict(run.train),
                 progress=False, log=lambda *a: None, eval_tasks=evals)


def train_record(run, result):
    """The result part of a "train" record from what :func:`train_run` returned:
    {"metrics": {set: {metric: value}}, "final_train_loss", "steps", "sequences",
    "eval_seed", "wall_s", "log": the training log (every log_every steps: loss, accuracy,
    lr, grad_norm, code usage; not the clock's readings, so a record's contents are the same
    wherever it ran, but for wall_s), "evals": the evaluations every eval_every steps}."""
    from ..train import TrainConfig, eval_seed

    return json_safe({"metrics": result["eval"], "final_train_loss": result["loss"],
                      "steps": result["steps"], "sequences": result["sequences"],
                      "eval_seed": eval_seed(TrainConfig.from_dict(run.train)),
                      "wall_s": result["wall_s"],
                      "log": [{k: v for k, v in entry.items() if k not in CLOCK}
                              for entry in result["log"]], "evals": result["evals"]})


def execute_train(run):
    """Kind "train": train run.model on run.train's task, evaluate on run.evals; the record's
    result part is :func:`train_record`'s."""
    return train_record(run, train_run(run))


KINDS = {"train": execute_train}


def register_kind(name, function):
    """Make ``function(run) -> result dict`` (JSON values, a "metrics" entry among them) the
    executor of runs of kind ``name``."""
    KINDS[name] = function
    return function


def kind_function(kind):
    """The function that executes runs of ``kind`` (a :data:`KINDS` key or
    "module:function")."""
    if kind in KINDS:
        return KINDS[kind]
    module, sep, name = kind.partition(":")
    if sep and module and name:
        import importlib
        return getattr(importlib.import_module(module), name)
    raise ValueError(f"unknown run kind {kind!r}: one of {sorted(KINDS)} or 'module:function' "
                     "(mapformer.experiments.register_kind adds one)")


def execute(run):
    """The record of ``run``: {"id", "run", **its kind's result, "provenance"} (see
    :func:`mapformer.experiments.records.provenance`)."""
    from .records import provenance

    result = kind_function(run.kind)(run)
    return {"id": run.id, "run": run.to_dict(), **result, "provenance": provenance()}
