"""The papers' tables as :class:`~mapformer.experiments.Table` specs, by (paper, name).

MapFormer (mapformer.reproduce.TABLES: rows, the paper's figures, the ``paper`` and ``cpu``
scales): "1" selective copy, "2" 1D and 2D navigation, "2-modes" the MapEM-os combination-mode
ablation, "3" SSMs against MapFormers, "4" 3D and 5D navigation.
"""
from ..models import ModelConfig, options_of, preset_parts
from ..reproduce import COLUMNS, TABLES
from ..train import TrainConfig
from .runs import Run
from .tables import Table

PAPERS = {"mapformer": ("1", "2", "2-modes", "3", "4")}


def mapformer_run(row, part, scale, seed, sequences, eval_sequences):
    """The run of a MapFormer table row (reproduce.Row) on a part of a scale at a seed: the
    preset at the scale's width and heads, r = the world's dimension where the preset has a
    path-integration rank, trained on the part's task, evaluated on its three sets."""
    train_config = TrainConfig(**part["train_fields"], sequences=sequences,
                               batch_size=scale.batch_size, seed=seed,
                               eval_sequences=eval_sequences)
    task = part["train"]
    options = dict(row.options)
    if "delta_rank" in options_of(*preset_parts(row.model)[:3]):
        options.setdefault("delta_rank", getattr(task, "dims", 1))
    model_config = ModelConfig.for_task(row.model, task, d_model=scale.d_model,
                                        n_heads=scale.n_heads, n_layers=row.n_layers, **options)
    return Run.of(model_config, train_config, part["eval"])


def mapformer_table(name, scale="cpu", sequences=None, eval_sequences=256):
    """MapFormer table ``name`` at ``scale``; ``sequences`` overrides the scale's training
    sequences (then it is not a reproduction, and the note says so)."""
    key = "2" if name == "2-modes" else name
    if key not in TABLES or name not in PAPERS["mapformer"]:
        raise ValueError(f"MapFormer has tables {', '.join(PAPERS['mapformer'])}, not {name!r}")
    spec = TABLES[key]
    if scale not in spec["scales"]:
        raise ValueError(f"table {name} has scales {sorted(spec['scales'])}, not {scale!r}")
    at = spec["scales"][scale]
    n = sequences or at.sequences
    rows = {r.label: r for r in (spec["ablation"] if name == "2-modes" else spec["rows"])}
    note = at.note + (f"; training sequences overridden to {n}" if sequences else "")

    def make_run(part, label, seed):
        return mapformer_run(rows[label], at.parts[part], at, seed, n, eval_sequences)

    title = spec["title"] + (", MapEM-os combination modes" if name == "2-modes" else "")
    return Table("mapformer", name, title, scale, note, tuple(at.parts), tuple(rows), COLUMNS,
                 spec["metrics"], make_run, {} if name == "2-modes" else spec["paper"])


def table(paper, name, scale="cpu", **options):
    """The spec of ``paper``'s table ``name`` (see :data:`PAPERS`)."""
    if paper != "mapformer":
        raise ValueError(f"papers with table specs: {sorted(PAPERS)}, not {paper!r}")
    return mapformer_table(name, scale, **options)
