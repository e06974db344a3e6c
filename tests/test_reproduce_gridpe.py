"""GridPE's tables as experiment specs (mapformer.reproduce.gridpe): the rows build the old
script's configs (benchmarks/reproduce_gridpe.py, removed), a tiny table runs through run_all,
fig3's one run holds the e^(1/n) minimisers and draws its plot, and the converted records
render the old files' numbers."""
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from mapformer import reproduce
from mapformer.__main__ import main
from mapformer.experiments import RecordStore, run_all
from mapformer.reproduce import gridpe
from mapformer.reproduce.mapformer import mean_ci

ROOT = Path(__file__).resolve().parents[1]
LEGACY = RecordStore(ROOT / "results" / "records" / "gridpe-legacy")


def test_tables_and_rows():
    assert reproduce.table_names("gridpe") == ("fig3", "dims", "navigation", "digits",
                                               "digits16", "grid_transpose", "grid_rotate90",
                                               "grid_flip", "grid_copy", "digits-fig4",
                                               "digits16-fig4")
    for name in gridpe.TASKS:  # the task's default rows first, then every other row
        table = reproduce.table("gridpe", name)
        assert table.rows[:len(gridpe.TASKS[name][1])] == gridpe.TASKS[name][1]
        assert sorted(table.rows) == sorted(gridpe.ROWS) and table.parts == ("",)
        assert table.statistic == "ci95" and table.digits == 3
    assert reproduce.table("gridpe", "grid_flip").metrics == ("accuracy", "sequence_accuracy")
    assert reproduce.table("gridpe", "digits").columns == ("iid", "dev")
    curves = reproduce.table("gridpe", "digits16-fig4")
    assert curves.columns == ("iid", "dev") and curves.rows == reproduce.table(
        "gridpe", "digits16").rows and curves.plot is gridpe.plot_fig4
    assert reproduce.table("gridpe", "digits16").plot is None
    with pytest.raises(ValueError, match="not 'fig4'"):
        reproduce.table("gridpe", "fig4")
    with pytest.raises(ValueError, match="has scales"):
        reproduce.table("gridpe", "navigation", scale="huge")
    with pytest.raises(ValueError, match="unknown row 'alibi'"):
        gridpe.row_of("alibi")


def test_rows_build_the_scripts_configs():
    """What the old script built: navigation's variants on the true 2D coordinates, the
    image tasks non-causal on 360 images, the grid tasks prefix LMs (rope on the token
    index, rope_axial on the page), the decay and index rows' options, the cpu budget."""
    nav = reproduce.table("gridpe", "navigation")
    run = nav.make_run("", "gridpe_complex", 1)
    assert run.model["positional"] == "gridpe" and run.model["options"]["gridpe_variant"] \
        == "complex"
    assert run.model["options"]["coord_dims"] == 2 and run.model["options"]["coord_source"] \
        == "task"
    assert (run.train["seed"], run.train["sequences"], run.train["batch_size"],
            run.train["lr"], run.train["eval_sequences"]) == (1, 128_000, 64, 1e-3, 256)
    assert (run.train["steps"], run.train["grid_size"], run.model["d_model"],
            run.model["n_layers"]) == (32, 16, 64, 2)
    assert run.evals == {} and run.kind == "train"  # the train config's own sets
    index = nav.make_run("", "gridpe_rotate_index", 0).model["options"]
    assert index["coord_source"] == "index" and index["coord_dims"] == 1
    decay = nav.make_run("", "ape_grid_decay", 0).model
    assert decay["positional"] == "ape_grid" and decay["options"]["ape_decay"] == 0.98
    assert nav.make_run("", "mapwm", 0).model["positional"] == "mapwm"
    digits = reproduce.table("gridpe", "digits").make_run("", "gridpe_rotate", 0)
    assert digits.model["options"]["attn_mask"] == "none" and digits.train[
        "eval_sequences"] == 360
    grid = reproduce.table("gridpe", "grid_transpose")
    axial, rope = (grid.make_run("", r, 0).model for r in ("rope_axial", "rope"))
    assert axial["options"]["coord_dims"] == 2 and "coord_dims" not in rope["options"]
    assert axial["options"]["attn_mask"] == rope["options"]["attn_mask"] == "prefix"
    assert grid.make_run("", "rope", 0).train["grid_side"] == 5
    tiny = reproduce.table("gridpe", "grid_transpose", "tiny", sequences=16, eval_sequences=4)
    assert (tiny.make_run("", "rope", 0).train["grid_side"],
            tiny.make_run("", "rope", 0).train["eval_sequences"]) == (3, 4)
    assert "every run trains on 16 sequences instead" in tiny.note
    # the configs are the script's: the spec's runs are the converted records' ids
    for name, row, seed in (("navigation", "gridpe_rotate", 0), ("grid_copy", "rope", 2),
                            ("digits", "ape_grid", 1)):
        assert reproduce.table("gridpe", name).make_run("", row, seed).id in LEGACY
    # the curve tables: the task's runs evaluated every 20th of the training as well
    curves = reproduce.table("gridpe", "digits-fig4").make_run("", "ape_grid", 1)
    assert curves.train["eval_every"] == 100  # of 2000 steps
    assert replace(curves, train={**curves.train, "eval_every": 0}).id in LEGACY
    short = reproduce.table("gridpe", "digits16-fig4", sequences=32000).make_run("", "rope", 0)
    assert short.train["eval_every"] == 25  # 500 steps


def test_a_tiny_table_runs_through_run_all(tmp_path):
    table = reproduce.table("gridpe", "grid_transpose", "tiny", sequences=32,
                            eval_sequences=4)
    store = RecordStore(tmp_path)
    runs = table.runs(1, rows=["rope", "rope_axial"])
    assert run_all(runs, store, progress=False) == {"held": 0, "ran": 2, "failed": []}
    assert run_all(runs, store, progress=False)["held"] == 2
    record = store.get(runs[1].id)
    assert set(record["metrics"]) == {"iid", "dev", "ood_large"} and record["steps"] == 2
    assert 0.0 <= record["metrics"]["ood_large"]["sequence_accuracy"] <= 1.0
    text = table.markdown(store, 1, "sequence_accuracy")
    assert "| model | iid | ood_large |" in text and "| gridpe_rotate | - | - |" in text
    value = record["metrics"]["iid"]["sequence_accuracy"]
    assert f"| rope_axial | {value:.3f} (n=1)" in text


def test_digits_records_acc5_loss_and_curves_and_plots_fig4(tmp_path):
    """A digits run records the paper's Acc@1, Acc@5 and loss on both sets, and 19
    evaluations through training; the table renders all three metrics and plots the curves
    (the converted records, without curves, are left out of the plot)."""
    table = reproduce.table("gridpe", "digits-fig4", "tiny")
    store = RecordStore(tmp_path / "records")
    assert table.metrics == ("accuracy", "accuracy_top5", "loss")
    assert run_all(table.runs(1, rows=["rope"]), store, progress=False)["ran"] == 1
    record = next(iter(table.records(store, 1).values()))
    assert [e["step"] for e in record["evals"]] == list(range(1, 20))
    for column in ("iid", "dev"):
        m = record["metrics"][column]
        assert 0.0 <= m["accuracy"] <= m["accuracy_top5"] <= 1.0 and m["loss"] > 0.0
        assert set(record["evals"][0]["eval"][column]) >= {"accuracy", "accuracy_top5", "loss"}
    assert table.measured_metrics(store, 1) == table.metrics
    path = tmp_path / "fig4.png"
    table.plot(table, store, 1, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="evaluations through training"):
        table.plot(table, RecordStore(tmp_path / "empty"), 1, path)


def test_fig3_holds_the_minimisers_and_plots(tmp_path):
    """One deterministic run whatever the seeds; N(r) least at e^(1/n); the ring means below
    the kernel's 1 at 0; the plot is a PNG; no record, no plot."""
    table = reproduce.table("gridpe", "fig3", "tiny")
    store = RecordStore(tmp_path / "records")
    assert len(set(table.runs(3))) == 1
    assert run_all(table.runs(3), store, progress=False)["ran"] == 1
    record = next(iter(table.records(store, 1).values()))
    assert record["run"]["kind"] == "mapformer.reproduce.gridpe:execute_analysis"
    assert record["run"]["extra"] == {"area": 8, "points": 33, "planes": 12}
    for n in (1, 2, 3):
        for resolution in ("10", "10000"):
            assert record["metrics"]["ratios"][f"n={n} R={resolution}"] == pytest.approx(
                math.exp(1 / n), abs=1e-4)
    rings = [record["metrics"]["fig3"][f"r={r}"] for r in (0, 1, 2, 4, 8)]
    assert rings[0] == pytest.approx(1.0) and max(rings[1:]) < 0.5  # 4 scales: no smooth decay
    assert len(record["profile"]) == len(record["profile_x"]) == 33
    path = tmp_path / "fig3.png"
    table.plot(table, store, 1, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no record of gridpe fig3"):
        table.plot(table, RecordStore(tmp_path / "empty"), 1, tmp_path / "none.png")


def test_minimum_dimensions_follow_eqs_12_to_15(tmp_path):
    """d >= 2 n ln 10000 (18.42 n), rounded up to even: 20, 38, 56; each the least even d
    whose ratio 10000^(2/d) is at most e^(1/n); eq. 12's ratios at d = 128 and 512; the dims
    table reads them from fig3's record."""
    dims = gridpe.minimum_dimensions()
    assert [dims[f"n={n}"]["min_dim"] for n in (1, 2, 3)] == [20, 38, 56]
    for n in (1, 2, 3):
        d = dims[f"n={n}"]["min_dim"]
        assert dims[f"n={n}"]["min_dim_real"] == pytest.approx(18.4207 * n, abs=1e-3)
        assert 10000 ** (2 / d) <= math.exp(1 / n) < 10000 ** (2 / (d - 2))
    ratios = gridpe.sinusoidal_ratios()
    assert ratios["d=128"] == pytest.approx(1.1548, abs=1e-4)
    assert ratios["d=512"] == pytest.approx(1.0366, abs=1e-4)
    table = reproduce.table("gridpe", "dims", "tiny")
    store = RecordStore(tmp_path)
    assert run_all(table.runs(1), store, progress=False)["ran"] == 1
    row = next(line for line in table.markdown(store, 1, "min_dim").splitlines()
               if line.startswith("| base 10000 |"))
    assert [cell.strip().split(" ")[0] for cell in row.split("|")[2:5]] == [
        "20.00", "38.00", "56.00"]


def test_fig3_through_the_command_line(tmp_path, capsys):
    main(["reproduce", "gridpe", "fig3", "--scale", "tiny", "--seeds", "1", "--records",
          str(tmp_path), "--plot", str(tmp_path / "f.png"), "--no-progress"])
    out = capsys.readouterr().out
    assert out.startswith("1 runs executed") and "| GridPE code | 1.000 (n=1)" in out
    assert (tmp_path / "f.png").is_file()


def test_the_committed_fig3_record_is_the_old_analysis():
    """results/records/gridpe's cpu fig3 gives the old analysis.json's ring means."""
    table = reproduce.table("gridpe", "fig3")
    records = table.records(RecordStore(ROOT / "results" / "records" / "gridpe"), 1)
    assert len(records) == 1
    rings = next(iter(records.values()))["metrics"]["fig3"]
    assert [round(rings[f"r={r}"], 3) for r in (0, 1, 2, 4, 8, 16, 32)] == [
        1.0, 0.842, 0.760, 0.683, 0.574, 0.503, 0.409]


@pytest.mark.parametrize("name,sequences,metric,row,cells", [
    ("navigation", None, "accuracy", "gridpe_merge",
     ["1.000 ± 0.000", "1.000 ± 0.001", "0.742 ± 0.299"]),
    ("navigation", None, "accuracy", "learned_abs",
     ["0.684 ± 0.045", "0.668 ± 0.009", "0.792 ± 0.027"]),
    ("digits", None, "accuracy", "sinusoidal", ["0.564 ± 0.290", "0.594 ± 0.231"]),
    ("digits16", 32000, "accuracy", "rope_axial", ["0.343 ± 0.116", "0.307 ± 0.084"]),
    ("grid_transpose", None, "sequence_accuracy", "ape_grid",
     ["0.560 ± 1.214", "0.000 ± 0.000"]),
    ("grid_flip", None, "accuracy", "gridpe_rotate", ["0.974 ± 0.110", "0.392 ± 0.169"]),
])
def test_the_converted_records_render_the_old_numbers(name, sequences, metric, row, cells):
    """The old files' numbers (README's tables) from results/records/gridpe-legacy: every
    cell of a task's default rows has its 3 seeds, of unknown provenance."""
    table = reproduce.table("gridpe", name, sequences=sequences)
    text = table.markdown(LEGACY, 3, metric)
    line = next(line for line in text.splitlines() if line.startswith(f"| {row} |"))
    assert line == f"| {row} | " + " | ".join(f"{c} (n=3)§" for c in cells) + " |"
    found = table.cells(LEGACY, 3)
    assert all(found[("", r)]["n"] == 3 for r in gridpe.TASKS[name][1])


def write_legacy(directory, task, row, seed, model, train, accuracy):
    """A record of the old script's format."""
    sets = {"navigation": ("iid", "ood_dense", "ood_sparse")}[task]
    path = directory / f"{task}-{row}-seed{seed}.json"
    path.write_text(json.dumps({
        "task": task, "row": row, "seed": seed, "model": model, "train": train,
        "eval": {s: {"accuracy": accuracy, "loss": 1.0} for s in sets},
        "final_train_loss": 0.5, "wall_s": 3.0, "steps": 2}))


def test_legacy_records_convert_to_spec_runs(tmp_path):
    """A record of the spec's configs, written before TrainConfig.grid_side and rope_axial's
    rope_trainable existed (both at their defaults here), converts to the spec's run and
    renders its numbers; one of other configs keeps them (evaluated on the train config's
    own sets)."""
    table = reproduce.table("gridpe", "navigation", "tiny")
    for seed, accuracy in ((0, 0.25), (1, 0.75)):
        run = table.make_run("", "rope_axial", seed)
        model = {**run.model, "options": {k: v for k, v in run.model["options"].items()
                                          if k != "rope_trainable"}}
        train = {k: v for k, v in run.train.items() if k != "grid_side"}
        write_legacy(tmp_path, "navigation", "rope_axial", seed, model, train, accuracy)
    other = table.make_run("", "sinusoidal", 0)
    write_legacy(tmp_path, "navigation", "sinusoidal", 0, other.model,
                 {**other.train, "lr": 0.5}, 0.5)
    converted = gridpe.legacy_records(tmp_path, "tiny")
    assert [same for _, same in converted] == [True, True, False]
    store = RecordStore(tmp_path / "records")
    for record, _ in converted:
        store.put(record)
    assert converted[0][0]["id"] == table.make_run("", "rope_axial", 0).id
    assert converted[0][0]["provenance"]["commit"] == "unknown"
    assert converted[0][0]["steps"] == 2 and converted[0][0]["final_train_loss"] == 0.5
    moved = converted[2][0]["run"]
    assert moved["train"]["lr"] == 0.5 and moved["evals"] == {}
    text = table.markdown(store, 2)
    assert f"| rope_axial | {mean_ci([0.25, 0.75], 3)} (n=2)§ |" in text
    assert "| sinusoidal | - | - | - |" in text

