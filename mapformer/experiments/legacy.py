"""Records of the harness the experiment layer replaced (results/table{1,2,3,4}_*.json: one
file per table, a run per (part, row, seed) with its configs and accuracies) converted to one
record per run. Their provenance was never recorded: a converted record says so (commit and
dirty "unknown", the file it came from), and a table marks its cells (§).

    python -m mapformer.experiments.legacy results/table1_cpu.json ... --records DIR
"""
import argparse
import json
from pathlib import Path

from dataclasses import fields

from ..models import ModelConfig, options_of, preset_parts
from .. import reproduce
from ..reproduce.mapformer import TABLES, recorded_configs
from .records import RecordStore, unknown_provenance
from .runs import Run

METRICS = ("accuracy", "object_accuracy", "floor", "object_floor")


def upgrade_model(values):
    """A model dict of the flat formats (every scheme's option a field of ModelConfig, before
    ModelConfig held ``options``; in the oldest, ``positional`` named the model preset) in
    today's: the options the model's components declare moved into ``options``, the others
    (of components it does not have) dropped."""
    known = {f.name for f in fields(ModelConfig)}
    base = {k: v for k, v in values.items() if k in known}
    preset = {}
    if "mixer" not in base:  # the oldest format: "positional" named the model preset
        base["mixer"], base["positional"], base["bottleneck"], preset = preset_parts(
            base["positional"])
    declared = options_of(base["mixer"], base["positional"], base.get("bottleneck", "none"))
    base["options"] = {**preset, **base.get("options", {}),
                       **{k: v for k, v in values.items() if k not in known and k in declared}}
    return base


def convert(path):
    """[(record, whether its run is the current spec's)] of the legacy file at ``path``: the
    run is the table spec's for (part, row, seed) at the file's scale and sequences when the
    recorded configs equal the spec's (read as the current library reads them), else the
    recorded configs themselves with the spec's evaluation sets."""
    legacy = json.loads(Path(path).read_text())
    name, scale = legacy["table"], legacy["scale"]
    default = TABLES[name]["scales"][scale].sequences
    sequences = None if legacy["sequences"] == default else legacy["sequences"]
    ablation = {r.label for r in TABLES[name].get("ablation", [])}
    out = []
    for old in legacy["runs"]:
        table = reproduce.table("mapformer", "2-modes" if old["row"] in ablation else name, scale,
                            sequences=sequences, eval_sequences=legacy["eval_sequences"])
        run = table.make_run(old["part"], old["row"], old["seed"])
        same = recorded_configs({**old, "model": upgrade_model(old["model"])}) == (
            run.model, run.train)
        if not same:
            run = Run(model=old["model"], train=old["train"], evals=run.evals)
        columns = old["accuracy"]
        out.append(({"id": run.id, "run": run.to_dict(),
                     "metrics": {c: {m: old[m][c] for m in METRICS} for c in columns},
                     "wall_s": old["wall_s"],
                     "provenance": unknown_provenance(path, "the harness")}, same))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--records", default="results/records/mapformer-legacy")
    args = parser.parse_args(argv)
    store = RecordStore(args.records)
    for path in args.files:
        converted = convert(path)
        for record, _ in converted:
            store.put(record)
        matching = sum(same for _, same in converted)
        print(f"{path}: {len(converted)} records, {matching} of today's spec runs, "
              f"{len(converted) - matching} of configs the specs no longer make")


if __name__ == "__main__":
    main()
