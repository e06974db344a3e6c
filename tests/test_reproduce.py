"""The reproduction scripts' machinery on a few training sequences: every table's rows build
and train, the printed table carries the paper's numbers, the JSON record is complete."""
import json

import pytest

from mapformer import reproduce
from mapformer.reproduce import COLUMNS, METRICS, TABLES, format_table, main


@pytest.mark.parametrize("table_id", sorted(TABLES))
def test_every_row_builds_and_trains(table_id, tmp_path, capsys):
    table = TABLES[table_id]
    out = tmp_path / "result.json"
    measured = main(table_id, ["--seeds", "1", "--sequences", "64", "--eval-sequences", "4",
                               "--out", str(out)]
                    + (["--no-ablation"] if "ablation" in table else []))
    parts = list(table["scales"]["cpu"].parts)
    assert sorted(measured) == sorted(parts)
    for part in parts:
        assert sorted(measured[part]) == sorted(r.label for r in table["rows"])
        for accs in measured[part].values():
            for metric in ("accuracy", "object_accuracy"):
                assert sorted(accs[0][metric]) == sorted(COLUMNS)
                assert all(0.0 <= a <= 1.0 for a in accs[0][metric].values())
    record = json.loads(out.read_text())
    assert record["sequences"] == 64 and record["seeds"] == 1
    assert len(record["runs"]) == len(parts) * len(table["rows"])
    run = record["runs"][0]
    assert run["train"]["sequences"] == 64 and run["model"]["positional"]
    assert sorted(run["object_floor"]) == sorted(COLUMNS)
    printed = capsys.readouterr().out
    first = table["rows"][0].label
    assert printed.count(f"| {first} |") == len(table["metrics"])
    assert "sequences overridden to 64" in printed
    for metric in table["metrics"]:
        assert METRICS[metric] in printed


def test_ablation_rows_and_row_filter(capsys):
    measured = main("2", ["--seeds", "1", "--sequences", "64", "--eval-sequences", "4",
                          "--rows", "MapEM-os (sum),MapWM"])
    assert sorted(measured["1D"]) == ["MapEM-os (sum)", "MapWM"]
    with pytest.raises(SystemExit):
        main("2", ["--rows", "no such row"])


def test_format_table_mean_spread_and_paper():
    table = TABLES["1"]
    row = table["rows"][0]
    seeds = [{"accuracy": {"iid": 0.5, "ood_dense": 0.25, "ood_sparse": 1.0},
              "object_accuracy": {"iid": 0.1, "ood_dense": 0.2, "ood_sparse": 0.3}},
             {"accuracy": {"iid": 0.7, "ood_dense": 0.25, "ood_sparse": 1.0},
              "object_accuracy": {"iid": 0.3, "ood_dense": 0.2, "ood_sparse": 0.3}}]
    measured = {"": {row.label: seeds}}
    text = format_table("t", [""], [row], measured, table["paper"])
    assert f"| {row.label} | 0.60 ± 0.10 (0.11) | 0.25 ± 0.00 (0.08) | 1.00 ± 0.00 (0.07) |" in text
    text = format_table("t", [""], [row], measured, table["paper"], "object_accuracy")
    assert f"| {row.label} | 0.20 ± 0.10 (0.11) | 0.20 ± 0.00 (0.08) | 0.30 ± 0.00 (0.07) |" in text


def test_table3_records_every_run_and_resumes(tmp_path, capsys, monkeypatch):
    """Table 3's task sets are its own (OOD-sparse 2x, not 4x, the training steps); the
    record is written after each run and --resume reuses the runs it holds."""
    part = TABLES["3"]["scales"]["cpu"].parts["2D"]
    assert [(t.steps, t.grid_size, t.p_empty) for t in part["eval"].values()] == [
        (16, 64, 0.5), (8, 32, 0.2), (32, 128, 0.8)]
    out = tmp_path / "t3.json"
    common = ["--sequences", "32", "--eval-sequences", "4", "--rows", "Mamba", "--out",
              str(out)]
    main("3", ["--seeds", "1", *common])
    first = json.loads(out.read_text())["runs"]
    assert [r["row"] for r in first] == ["Mamba"] and first[0]["model"]["mixer"] == "mamba"
    main("3", ["--seeds", "2", "--resume", *common])
    runs = json.loads(out.read_text())["runs"]
    assert [r["seed"] for r in runs] == [0, 1] and runs[0] == first[0]
    assert "from the earlier record" in capsys.readouterr().out
    # running another row with --resume keeps the earlier rows' runs, in the record and table
    main("3", ["--seeds", "1", "--resume", *common[:-3], "MAMPa", *common[-2:]])
    record = json.loads(out.read_text())
    assert [(r["row"], r["seed"]) for r in record["runs"]] == [
        ("Mamba", 0), ("Mamba", 1), ("MAMPa", 0)]
    assert record["runs"][:2] == runs
    assert "| Mamba | " in record["markdown"] and "| MAMPa | " in record["markdown"]
    # a rerun interrupted before it reaches a held run keeps that run in the file
    monkeypatch.setattr(reproduce, "run_row", lambda *a, **k: (_ for _ in ()).throw(
        KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        main("3", ["--seeds", "3", "--resume", *common[:-3], "Mamba,MAMPa", *common[-2:]])
    assert json.loads(out.read_text())["runs"] == record["runs"]
    with pytest.raises(ValueError, match="use another --out"):
        main("3", ["--seeds", "1", "--resume", *common[:1], "64", *common[2:]])


def test_mean_ci():
    """Mean and the 95% t interval's half-width (t = 4.303 at 3 values: 1 * 4.303 / sqrt(3)),
    at the digits asked for; one value: its mean alone."""
    assert reproduce.mean_ci([1.0, 2.0, 3.0]) == "2.00 ± 2.48"
    assert reproduce.mean_ci([1.0, 2.0, 3.0], digits=3) == "2.000 ± 2.484"
    assert reproduce.mean_ci([0.5]) == "0.50"
