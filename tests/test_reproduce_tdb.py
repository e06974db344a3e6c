"""benchmarks/reproduce_tdb_table1.py at a scale smaller than tiny: every kind of row runs,
each run is saved as it finishes, and a rerun skips finished runs."""
import importlib.util
import json
from dataclasses import replace
from pathlib import Path


SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "reproduce_tdb_table1.py"


def load_script():
    spec = importlib.util.spec_from_file_location("reproduce_tdb_table1", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_run_save_and_are_skipped(tmp_path, monkeypatch, capsys):
    r = load_script()
    tiny = r.SCALES["tiny"]
    monkeypatch.setitem(r.SCALES, "tiny", replace(
        tiny, room=replace(tiny.room, steps=24), train_walks=16, test_walks=4, iterations=3,
        context=4))
    rows = "lstm,tdb_s1_enc_m1,tdb_s3_m4,mapwm_angles"
    results = r.main(["--scale", "tiny", "--seeds", "1", "--rows", rows, "--out",
                      str(tmp_path), "--rollouts", "5", "--plan-problems", "2"])
    assert sorted(x["row"] for x in results) == sorted(rows.split(","))
    for x in results:
        assert 0.0 <= x["TestAccu"] <= 100.0 and x["problems"] <= 4
        assert (tmp_path / f"{x['row']}_seed0.json").exists()
    tdb = [x for x in results if x["row"].startswith("tdb")]
    assert all(0.0 <= x["NormGED"] <= 1.0 for x in tdb)
    assert (tmp_path / "tdb_s3_m4_seed0.npz").exists()
    assert "| tdb_s3_m4 |" in capsys.readouterr().out
    # a rerun trains nothing and reads the same results back
    again = r.main(["--scale", "tiny", "--seeds", "1", "--rows", rows, "--out",
                    str(tmp_path)])
    assert "done" in capsys.readouterr().out
    assert json.dumps(sorted(again, key=lambda x: x["row"]), sort_keys=True) == json.dumps(
        sorted(results, key=lambda x: x["row"]), sort_keys=True)
    lstm = next(x for x in results if x["row"] == "lstm")  # planned by rollouts
    assert lstm["rollouts"] == 5 and lstm["problems"] <= 2
    assert 0 <= lstm["returned_valid"] <= lstm["returned"]
    assert 0.0 <= lstm["ImpFallback"] <= 100.0
    mapwm = next(x for x in results if x["row"] == "mapwm_angles")  # map from its angles
    assert mapwm["clusters"] >= 1 and 0.0 <= mapwm["NormGED"] <= 1.0
    assert mapwm["angle_places"] == r.SCALES["tiny"].codes  # the default: TDB's codes
    from mapformer.tdb import load_checkpoint
    assert load_checkpoint(tmp_path / "mapwm_angles_seed0.npz")[1]["angle_places"] == \
        r.SCALES["tiny"].codes  # what map reads as its default
    # weights saved but the evaluation lost: a rerun evaluates them, the same numbers
    (tmp_path / "tdb_s3_m4_seed0.json").unlink()
    (tmp_path / "mapwm_angles_seed0.json").unlink()
    resumed = r.main(["--scale", "tiny", "--seeds", "1", "--rows", "tdb_s3_m4,mapwm_angles",
                      "--out", str(tmp_path)])
    assert capsys.readouterr().out.count("evaluating") == 2
    before = [x for x in results if x["row"] in ("tdb_s3_m4", "mapwm_angles")]
    after = [x for x in resumed if x["row"] in ("tdb_s3_m4", "mapwm_angles")]
    assert len(after) == 2 and json.dumps(sorted(after, key=lambda x: x["row"]),
                                          sort_keys=True) == json.dumps(
        sorted(before, key=lambda x: x["row"]), sort_keys=True)
