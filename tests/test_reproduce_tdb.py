"""TDB's Table 1 on the experiment layer (mapformer.reproduce.tdb) at a scale smaller than
tiny: every kind of row runs through run_all on the library's training loop, a record holds the
room its seed used, a TDB run resumes from its library checkpoint to the parameters of an
uninterrupted run, and the records converted from the old harness render its numbers."""
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from mapformer import reproduce
from mapformer.experiments import RecordStore, run_all
from mapformer.reproduce import tdb, tdb_training
from mapformer.tasks import rooms
from mapformer.train import TrainConfig, load_checkpoint, train

ROOT = Path(__file__).resolve().parents[1]
# rollouts, codes (enc; a product quantiser; the paper's full-width codebooks), angles
ROWS = ["lstm", "tdb_s1_enc_m1", "tdb_s3_m4", "tdb_s3_m4_full", "mapwm_angles"]


@pytest.fixture
def micro(monkeypatch):
    """A scale smaller than tiny: walks of 24 in a 6 x 8 room, 16 training walks, 4 test
    walks, 3 steps; 5 rollouts on 2 problems; 16 codes, dead ones restarted every 2 steps."""
    tiny = tdb.SCALES["tiny"]
    scale = replace(tiny, room=replace(tiny.room, steps=24), train_walks=16, test_walks=4,
                    iterations=3, context=4, codes=16, restart_dead=2, rollouts=5,
                    plan_problems=2)
    monkeypatch.setitem(tdb.SCALES, "micro", scale)
    return scale


def test_every_kind_of_row_runs_and_records_its_room(micro, tmp_path):
    table = reproduce.table("tdb", "1", "micro")
    store = RecordStore(tmp_path)
    summary = run_all(table.runs(1, ROWS), store, progress=False)
    assert summary["ran"] == len(ROWS) and not summary["failed"]
    records = {row: store.get(table.make_run("", row, 0).id) for row in ROWS}
    for row, record in records.items():
        run = record["run"]
        assert run["kind"] == tdb.KIND and run["train"]["task"] == "rooms"
        assert 0.0 <= record["metrics"]["TestAccu"]["test"] <= 100.0
        assert record["metrics"]["TestAccu"]["test"] == pytest.approx(
            100 * record["eval"]["iid"]["accuracy"])
        # the room this seed used, as the task generates it
        task = TrainConfig.from_dict(run["train"]).task_config()
        room = rooms.make_room(task.room)
        assert record["room"]["obs"] == room.obs.tolist()
        assert record["room"]["config"]["seed"] == 0 and record["seeds"]["test_walks"] == [0, 2]
        assert record["provenance"]["commit"] != "unknown"
        assert len(record["log"]) == 3 and "elapsed" not in record["log"][0]
    for row in ("tdb_s1_enc_m1", "tdb_s3_m4", "tdb_s3_m4_full"):  # maps from codes
        assert 0.0 <= records[row]["metrics"]["NormGED"]["test"] <= 1.0
        assert records[row]["evaluation"]["problems"] <= 4
        assert records[row]["log"][-1]["code_usage"]
        by_step = records[row]["evaluation"]["by_timestep"]
        assert by_step["teleport_by_timestep"]["positions"] == [0, 0] + [4] * 23
        assert sum(by_step["codes"]["count"]) == 4 * 24
    assert records["tdb_s3_m4_full"]["run"]["model"]["codebook_width"] == "full"
    assert "codebook_width" not in records["tdb_s3_m4"]["run"]["model"]
    for record in records.values():  # 4 test walks score x_2 .. x_24
        assert record["eval"]["iid"]["accuracy_by_timestep"]["positions"] == [0, 0] + [4] * 23
    lstm = records["lstm"]  # planned by rollouts, on 2 problems
    assert lstm["evaluation"]["rollouts"] == 5 and lstm["evaluation"]["problems"] == 2
    assert 0 <= lstm["evaluation"]["returned_valid"] <= lstm["evaluation"]["returned"]
    assert np.isnan(lstm["metrics"]["NormGED"]["test"])  # no map
    mapwm = records["mapwm_angles"]  # a map from its angles, as many places as codes
    assert mapwm["evaluation"]["angle_places"] == micro.codes
    assert 1 <= mapwm["evaluation"]["clusters"] <= micro.codes
    assert "| tdb_s3_m4 | " in table.markdown(store, 1)
    # the views of the same records: Table 4 from the logs, Figs. 9-11 from the counts
    table4 = reproduce.table("tdb", "4", "micro")
    assert table4.runs(1, ["tdb_s3_m4"]) == table.runs(1, ["tdb_s3_m4"])
    record = records["tdb_s3_m4"]
    assert json.dumps(table4.values_of(record)) == json.dumps(tdb_training.derive_4(record))
    logged = {**record, "log": [{"step": 1, "accuracy": 0.97}, {"step": 2, "accuracy": 0.981},
                                {"step": 3, "accuracy": 0.99}]}
    assert tdb_training.derive_4(logged) == {"TrainingAbove98": {"test": 2},
                                             "per cell": {"test": 2 / 48}}
    assert tdb_training.training_above({**record, "log": logged["log"][:1]}) is None
    assert "| tdb_s3_m4 | - | - |" in table4.markdown(store, 1)  # 3 steps never reach 98%
    timesteps = reproduce.table("tdb", "1-by-timestep", "micro")
    values = timesteps.values_of(records["tdb_s3_m4"])
    hits = records["tdb_s3_m4"]["eval"]["iid"]["accuracy_by_timestep"]["hits"]
    assert values["TestAccu x>30"]["test"] is None  # walks of 24: nothing after the 30th
    assert tdb_training.share_after({"positions": [0, 0] + [4] * 23, "hits": hits}, 10) == \
        pytest.approx(100 * sum(hits[11:]) / (4 * 14))
    # reweighted to walks of 400: x_2 .. x_100 as counted, x_101 .. x_400 as x_61 .. x_100
    counts = {"positions": [0, 0] + [4] * 99, "hits": [0, 0] + [2] * 9 + [4] * 90}
    assert tdb_training.as_paper_walks(counts) == pytest.approx(
        100 * (9 * 0.5 + 90 + 300) / 399)
    assert tdb_training.as_paper_walks({"positions": [0, 0, 4], "hits": [0, 0, 4]}) is None
    timesteps.plot(timesteps, store, 1, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 10000
    # a rerun executes nothing
    assert run_all(table.runs(1, ROWS), store, progress=False)["held"] == len(ROWS)


def test_torus_table_and_run_options(micro):
    """1-torus trains in the same rooms with their edges joined; rollouts and plan_problems
    are run options of the transformer's and LSTM's rows only; sequences round up to whole
    batches."""
    flat, torus = tdb.table("1", "micro"), tdb.table("1-torus", "micro")
    run = torus.make_run("", "tdb_s3_m1", 1)
    task = TrainConfig.from_dict(run.train).task_config()
    assert task.room.topology == "torus" and task.room.seed == 1
    assert run.id != flat.make_run("", "tdb_s3_m1", 1).id and not torus.reference
    more = tdb.table("1", "micro", rollouts=7, plan_problems=3)
    assert more.make_run("", "transformer", 0).extra["rollouts"] == 7
    assert more.make_run("", "lstm", 0).extra["plan_problems"] == 3
    assert more.make_run("", "tdb_s3_m1", 0) == flat.make_run(
        "", "tdb_s3_m1", 0)  # the planner's options are not a TDB run's
    longer = tdb.table("1", "micro", sequences=10).make_run("", "lstm", 0)
    assert TrainConfig.from_dict(longer.train).total_steps == 2  # 10 / batch 8, rounded up
    with pytest.raises(ValueError, match="tables 1, 1-torus"):
        tdb.table("2")


def test_cube_table_trains_and_plans_on_the_cube(micro, tmp_path, monkeypatch):
    """Table 7: the rows of the paper's Table 7 in the aliased cube of the seed (no patch),
    each planned as in Table 1 (TDB's map of codes, the transformer's rollouts); the cube's
    map pictures draw."""
    monkeypatch.setitem(tdb.CUBES, "micro", (2, 3, 16, 3))
    cube = tdb.table("7", "micro")
    assert cube.rows == tdb.CUBE_ROWS and cube.reference[""]["tdb_s3_m1"][1] == 99.05
    assert cube.note.startswith("cube of edge 2 (24 cells, 8 a symbol), O = 3")
    store = RecordStore(tmp_path)
    assert run_all(cube.runs(1, ["tdb_s3_m1", "transformer"]), store, progress=False)[
        "ran"] == 2
    record = store.get(cube.make_run("", "tdb_s3_m1", 0).id)
    assert record["room"]["config"]["topology"] == "cube"
    assert len(record["room"]["obs"]) == 4 and len(record["room"]["obs"][0]) == 6
    assert 0.0 <= record["metrics"]["NormGED"]["test"] <= 1.0
    assert store.get(cube.make_run("", "transformer", 0).id)["evaluation"]["rollouts"] == 5
    with pytest.raises(ValueError, match="table 7 has scales"):
        tdb.table("7", "cpu")


def test_symbols_table_is_table_1_with_twelve_symbols(micro):
    """Table 8: Table 1's room of the seed with O = 12, the rows of the paper's Table 8 (its
    M = 4 rows in the full-width reading), the paper's figures beside them."""
    eight, one = tdb.table("8", "micro"), tdb.table("1", "micro")
    assert eight.rows == tuple(tdb.PAPER_8) and "tdb_s1_enc_m4_full" not in one.rows
    run = eight.make_run("", "tdb_s1_enc_m4_full", 2)
    assert run.model["codebooks"] == 4 and run.model["codebook_width"] == "full"
    assert run.model["enc"] and run.model["n_obs"] == 12 and run.model["steps"] == 1
    task = TrainConfig.from_dict(run.train).task_config()
    clean = TrainConfig.from_dict(one.make_run("", "tdb_s3_m1", 2).train).task_config()
    assert task.room == replace(clean.room, n_obs=12)
    assert eight.reference[""]["tdb_s1_m4_full"] == (99.75, 59.37, 1.00, 0.033)


def test_noise_table_trains_on_a_noisy_pool_and_tests_clean(micro, tmp_path):
    """Table 3: a part per noise level of the paper, 8192 training walks with that noise,
    the test walks and the room those of Table 1's run of the seed; a run executes."""
    noisy = tdb.table("3", "micro")
    assert noisy.parts == ("0.10", "0.15", "0.20", "0.25", "0.30")
    assert noisy.reference["0.30"]["tdb_s3_m1"] == ((93.92, 0.33), (58.20, 2.80))
    run = noisy.make_run("0.20", "tdb_s3_m1", 1)
    task = TrainConfig.from_dict(run.train).task_config()
    clean = TrainConfig.from_dict(tdb.table("1", "micro").make_run(
        "", "tdb_s3_m1", 1).train).task_config()
    assert task.noise == 0.2 and task.walks == 8192 and task.room == clean.room
    assert task.map_meta(4)["noise"] == 0.2 and "noise" not in clean.map_meta(4)
    store = RecordStore(tmp_path)
    small = replace(noisy, make_run=lambda part, row, seed: tdb.tdb_run(
        row, micro, seed, noise=float(part)))
    assert run_all(small.runs(1, ["tdb_s3_m1"], ["0.30"]), store, progress=False)["ran"] == 1
    record = store.get(small.make_run("0.30", "tdb_s3_m1", 0).id)
    assert record["run"]["train"]["task_options"]["noise"] == 0.3
    assert 0 <= record["metrics"]["ImpFallback"]["test"] <= 100


def test_tdb_resumes_from_the_library_checkpoint(micro, tmp_path):
    """Stopped after step 2 of 6 and resumed from train's checkpoint, a TDB(1, enc, 1) run (its
    EMA teacher, dead codes restarted every 2 steps) ends with the bits of one never stopped."""
    scale = replace(micro, iterations=6)
    config = tdb.model_config("tdb_s1_enc_m1", scale)
    train_config = replace(tdb.train_config(scale, 0), checkpoint_every=2, eval_every=2)
    quiet = dict(progress=False, log=lambda *a: None)
    whole = train(config, train_config, out_dir=tmp_path / "whole", **quiet)
    calls = []

    def crash_at_second_eval(*args):  # two start lines, the step-2 evaluation, the step-4 one
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, train_config, out_dir=tmp_path / "cut", progress=False,
              log=crash_at_second_eval)
    checkpoint = tmp_path / "cut" / "checkpoint.npz"
    model, _, saved, step = load_checkpoint(checkpoint)
    assert step == 2 and saved == train_config and model.config == config
    resumed = train(config, train_config, out_dir=tmp_path / "cut", resume=checkpoint, **quiet)
    for a, b in ((resumed["model"], whole["model"]),
                 (resumed["model"].teacher, whole["model"].teacher)):
        np.testing.assert_array_equal(a.params.data, b.params.data)
    np.testing.assert_array_equal(resumed["model"].vq.restart_counts,
                                  whole["model"].vq.restart_counts)
    assert resumed["eval"] == whole["eval"]


def test_a_run_dir_checkpoints_and_a_rerun_evaluates_it(micro, tmp_path, monkeypatch):
    """A run leaves its checkpoint in $MAPFORMER_RUNS/<run id> (map draws it); executed again it
    evaluates those weights without training: the same metrics."""
    from mapformer.__main__ import main
    monkeypatch.setenv("MAPFORMER_RUNS", str(tmp_path))
    # no dead-code restarts: the VQ restarts on evaluation forwards too (it counts every
    # forward), so with restarts every 2 forwards the evaluation itself would move the codes
    monkeypatch.setitem(tdb.SCALES, "micro", replace(micro, restart_dead=0))
    run = tdb.table("1", "micro").make_run("", "tdb_s3_m4", 0)
    first = tdb.execute(run)
    checkpoint = tmp_path / run.id / "checkpoint.npz"
    assert load_checkpoint(checkpoint)[3] == micro.iterations
    again = tdb.execute(run)
    assert json.dumps(again["metrics"]) == json.dumps(first["metrics"])
    assert again["log"] == []  # nothing trained
    assert main(["map", str(checkpoint), "--out", str(tmp_path / "map")]) == 0
    assert (tmp_path / "map" / "cogmap.png").stat().st_size > 0


def test_legacy_files_convert_to_spec_runs(tmp_path):
    """A file of benchmarks/reproduce_tdb_table1.py (a torus folder's: the file does not say)
    becomes the record of today's spec run, its provenance unknown and of the old loop."""
    scale = asdict(tdb.SCALES["cpu"])  # as the script wrote it: the room a template (seed 0)
    for name in ("restart_dead", "plan_problems", "rollouts"):
        del scale[name]
    old = {"row": "mapwm_angles", "seed": 1, "scale": scale, "train_s": 100.0, "TestAccu": 70.0,
        "ImpFallback": 0.0, "RatioSP": float("nan"), "NormGED": 0.8, "problems": 252,
        "clusters": 40, "angle_places": 500, "restart_dead": 200}
    path = tmp_path / "tdb_table1_cpu_torus" / "mapwm_angles_seed1.json"
    path.parent.mkdir()
    path.write_text(json.dumps(old))
    record, same = tdb.convert_legacy(path)
    assert same and record["id"] == tdb.table("1-torus", "cpu").make_run(
        "", "mapwm_angles", 1).id
    assert record["provenance"]["commit"] == "unknown" and "old loop" in \
        record["provenance"]["loop"]
    assert record["metrics"]["NormGED"]["test"] == 0.8
    assert record["evaluation"]["clusters"] == 40
    assert np.isnan(record["metrics"]["RatioSP"]["test"])
    assert record["room"]["config"]["topology"] == "torus" and record["wall_s"] == 100.0


def test_the_converted_records_render_the_old_numbers(capsys):
    """results/records/tdb-legacy: the old harness's cpu-scale Table 1, as README showed it."""
    from mapformer.__main__ import main
    assert main(["reproduce", "tdb", "1", "--render-only", "--records",
                 str(ROOT / "results" / "records" / "tdb-legacy")]) == 0
    lines = {line.split(" | ")[0]: line for line in capsys.readouterr().out.splitlines()
             if line.startswith("| ")}
    assert "| 57.28 ± 5.61 (n=3)§ [99.55] |" in lines["| tdb_s3_m1"]
    assert "| 14.29 ± 1.98 (n=3)§ [99.20] |" in lines["| tdb_s1_enc_m1"]
    assert "| 11.14 ± 7.87 (n=3)§ [96.59] |" in lines["| tdb_s3_m4"]
    assert "| 100.00 ± 0.00 (n=3)§ [31.97] |" in lines["| lstm"]
    torus = tdb.table("1-torus", "cpu").cells(
        RecordStore(ROOT / "results" / "records" / "tdb-legacy"), 2)[("", "mapwm_angles")]
    assert torus["n"] == 2 and torus["unknown"]


def test_the_rollout_oracle_table_plans_each_room_with_the_rooms_predictions(
        micro, tmp_path, monkeypatch):
    """Table 1-rollout-oracle trains nothing: a record per room and seed holds the rollout
    planner's metrics with rollouts.room_oracle on the room's test walks, the numbers
    evaluate_rollouts("oracle", ...) gives on them; it takes no scale."""
    from mapformer import rollouts

    monkeypatch.setattr(tdb, "ORACLE_ROWS", ("micro",))
    table = reproduce.table("tdb", "1-rollout-oracle", rollouts=30)
    store = RecordStore(tmp_path)
    summary = run_all(table.runs(2), store, progress=False)
    assert summary["ran"] == 2 and not summary["failed"]
    for seed in range(2):
        record = store.get(table.make_run("", "micro", seed).id)
        assert record["run"]["kind"] == tdb.ORACLE_KIND
        task = TrainConfig.from_dict(record["run"]["train"]).task_config()
        room = rooms.make_room(task.room)
        want = rollouts.evaluate_rollouts("oracle", rooms.evaluation_walks(task, 4), room,
                                          task.room.n_symbols, 4, 30, seed=[seed, 4])
        assert record["evaluation"] == pytest.approx(want, nan_ok=True)
        assert record["metrics"]["ImpFallback"]["test"] == pytest.approx(want["ImpFallback"])
        assert 0 < want["problems"] <= 4 and want["rollouts"] == 30
        assert record["seeds"]["rollouts"] == f"problem w: default_rng([[{seed}, 4], w])"
    with pytest.raises(ValueError, match="no scale"):
        reproduce.table("tdb", "1-rollout-oracle", "small")


def test_ginc_table_runs_every_row_and_reads_the_prompt_sets(tmp_path):
    """Table 9 at scale tiny: each row trains on GINC's documents through the library's loop
    and its record holds the accuracy of every (k, n) prompt set that fits the window (NaN
    for the others); the paper's figures sit beside them."""
    nine = reproduce.table("tdb", "9", "tiny")
    assert nine.rows == ("lstm", "transformer", "tdb_s3_m4_full", "tdb_s5_m1")
    assert len(nine.columns) == 32 and nine.reference[""]["tdb_s5_m1"][-1] == 0.956
    store = RecordStore(tmp_path)
    assert run_all(nine.runs(1), store, progress=False)["ran"] == 4
    for row in nine.rows:
        record = store.get(nine.make_run("", row, 0).id)
        fits = record["metrics"]["k3 n4"]["test"]  # 4 x 4 + 2 = 18 symbols <= 32
        assert 0.0 <= fits <= 1.0 and fits == record["eval"]["k3_n4"]["accuracy"]
        assert np.isnan(record["metrics"]["k3 n8"]["test"])  # 8 x 4 + 2 = 34 > 32
    tdb_run = store.get(nine.make_run("", "tdb_s5_m1", 0).id)["run"]
    assert tdb_run["model"]["steps"] == 5 and tdb_run["model"]["n_actions"] == 1
    assert "| tdb_s5_m1 | " in nine.markdown(store, 1)
    with pytest.raises(ValueError, match="table 9 has scales"):
        tdb.table("9", "small")
