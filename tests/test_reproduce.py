"""MapFormer's tables as experiment specs (mapformer.reproduce.table over
mapformer.reproduce.mapformer.TABLES) on a few training sequences: every table's rows build and train,
the rendered table carries the paper's figures, Table 3 keeps its own task sets."""
from dataclasses import replace

import pytest

from mapformer import reproduce
from mapformer.experiments import RecordStore, run_all
from mapformer.reproduce.mapformer import COLUMNS, TABLES, mean_ci
from mapformer.train import TrainConfig


@pytest.mark.parametrize("name", ("1", "2", "2-modes", "3", "4"))  # figures: their own tests
def test_every_row_builds_and_trains(name, tmp_path):
    table = reproduce.table("mapformer", name, sequences=64, eval_sequences=4)
    store = RecordStore(tmp_path)
    runs = table.runs(1)
    assert len(runs) == len(table.parts) * len(table.rows)
    assert run_all(runs, store, progress=False) == {"held": 0, "ran": len(runs), "failed": []}
    for run in runs:
        record = store.get(run.id)
        assert run.train["sequences"] == 64 and run.model["positional"]
        for metric in ("accuracy", "object_accuracy"):
            values = [record["metrics"][c][metric] for c in COLUMNS]
            assert all(0.0 <= v <= 1.0 for v in values), (run.model, values)
    text = table.markdown(store, seeds=1)
    assert "every run trains on 64 sequences instead" in text
    for row in table.rows:
        assert text.count(f"| {row} |") == 1
    if name != "2-modes":  # the paper's figure beside each of its rows
        part, rows = next(iter(TABLES[name]["paper"].items()))
        row, figures = next(iter(rows.items()))
        assert f"[{figures[0]:.2f}]" in text.split(f"| {row} |")[1].split("\n")[0]


def test_rows_and_scales():
    assert reproduce.table("mapformer", "2-modes").rows == (
        "MapEM-os (score_product)", "MapEM-os (softmax_product)", "MapEM-os (sum)")
    paper = reproduce.table("mapformer", "2", scale="paper")
    run = paper.runs(1, rows=["MapWM"])[0]
    assert run.train["sequences"] == 200_000 and run.train["batch_size"] == 128
    assert run.model["d_model"] == 128 and run.model["options"]["delta_rank"] == 1
    with pytest.raises(ValueError, match="not 'x'"):
        reproduce.table("mapformer", "x")
    with pytest.raises(ValueError, match="has scales"):
        reproduce.table("mapformer", "1", scale="huge")


def test_table3_task_sets():
    """Table 3's sets are its own (OOD-sparse 2x, not 4x, the training steps)."""
    part = TABLES["3"]["scales"]["cpu"].parts["2D"]
    assert [(t.steps, t.grid_size, t.p_empty) for t in part["eval"].values()] == [
        (16, 64, 0.5), (8, 32, 0.2), (32, 128, 0.8)]
    run = reproduce.table("mapformer", "3").runs(1, rows=["Mamba"])[0]
    assert run.model["mixer"] == "mamba"
    assert [(e["steps"], e["grid_size"]) for e in run.evals.values()] == [
        (16, 64), (8, 32), (32, 128)]


def test_mean_ci():
    """Mean and the 95% t interval's half-width (t = 4.303 at 3 values: 1 * 4.303 / sqrt(3)),
    at the digits asked for; one value: its mean alone."""
    assert mean_ci([1.0, 2.0, 3.0]) == "2.00 ± 2.48"
    assert mean_ci([1.0, 2.0, 3.0], digits=3) == "2.000 ± 2.484"
    assert mean_ci([0.5]) == "0.50"


def test_runs_of_named_parts_and_default_rows():
    """runs(parts=) keeps the named parts; a table's default_rows are what runs without
    rows named (GridPE's navigation: its seven default rows of twelve)."""
    table = reproduce.table("mapformer", "2")
    runs = table.runs(1, rows=["MapWM"], parts=["1D"])
    assert len(runs) == 1 and runs[0].train["dims"] == 1
    assert len(table.runs(1)) == len(table.parts) * len(table.rows)
    from mapformer.reproduce.gridpe import DEFAULT_ROWS
    grid = reproduce.table("gridpe", "navigation")
    assert len(grid.rows) > len(DEFAULT_ROWS) and grid.default_rows == DEFAULT_ROWS
    assert [r.model["positional"] for r in grid.runs(1)] == [
        grid.make_run("", row, 0).model["positional"] for row in DEFAULT_ROWS]


def test_fig4_and_5d_data_sweeps(tmp_path):
    """Fig. 4's three sweeps vary what the paper varies and hold the rest (cpu: head sizes
    16-128 at 64 steps, lengths 16-128 at head size 48, objects 10-10,000 at head size 32 and
    16 steps; 2 heads, r = 2); the 5D sweep is Table 4's 5D task at 6,400-204,800 sequences;
    at the tiny scale every row trains and both plots' panels draw from the records."""
    shapes = {}
    for name in ("fig4a", "fig4b", "fig4c"):
        runs = reproduce.table("mapformer", name).runs(1, rows=["MapWM"])
        shapes[name] = [(r.model["d_model"], r.train["steps"], r.train["grid_size"],
                         r.train["n_objects"]) for r in runs]
        assert all(r.model["n_heads"] == 2 and r.model["options"]["delta_rank"] == 2
                   for r in runs)
    assert shapes["fig4a"] == [(32, 64, 32, 10), (64, 64, 32, 10), (128, 64, 32, 10),
                               (256, 64, 32, 10)]
    assert shapes["fig4b"] == [(96, 16, 8, 10), (96, 32, 16, 10), (96, 64, 32, 10),
                               (96, 128, 64, 10)]
    assert shapes["fig4c"] == [(64, 16, 8, n) for n in (10, 100, 1000, 10000)]
    data = reproduce.table("mapformer", "5d-data").runs(1, rows=["CoPE (1L)", "MapEM-os"])
    assert [r.train["sequences"] for r in data[::2]] == [6400 * 2 ** k for k in range(6)]
    assert {(r.train["dims"], r.train["steps"], r.train["grid_size"]) for r in data} == {
        (5, 16, 5)}
    assert data[0].model["options"]["delta_rank"] == 5 and data[1].model["mixer"] == "attention"
    store = RecordStore(tmp_path)
    for name in ("fig4a", "5d-data"):
        table = reproduce.table("mapformer", name, "tiny", eval_sequences=4)
        assert run_all(table.runs(1), store, progress=False)["failed"] == []
        table.plot(table, store, 1, tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_by_lag_view_reads_table_2s_records(tmp_path):
    """'2-by-lag' is Table 2's runs (the same ids, so the same records) read at the object
    recalls of lag above 2 and 4, which the records' per-lag counts give again; its plot
    draws from those counts."""
    import numpy as np

    view = reproduce.table("mapformer", "2-by-lag", sequences=64, eval_sequences=8)
    base = reproduce.table("mapformer", "2", sequences=64, eval_sequences=8)
    runs = view.runs(1, rows=["RoPE (1L)", "MapWM"], parts=["2D"])
    assert [r.id for r in runs] == [r.id for r in base.runs(1, rows=["RoPE (1L)", "MapWM"],
                                                             parts=["2D"])]
    store = RecordStore(tmp_path)
    assert run_all(runs, store, progress=False)["failed"] == []
    for run in runs:
        for column, m in store.get(run.id)["metrics"].items():
            positions = np.array(m["object_recalls_by_lag"]["positions"])
            hits = np.array(m["object_recalls_by_lag"]["hits"])
            assert positions.sum() == m["object_positions"] and (hits <= positions).all()
            for k in (2, 4):
                assert m[f"object_accuracy_lag_gt{k}"] == pytest.approx(
                    hits[k + 1:].sum() / positions[k + 1:].sum())
    value = store.get(runs[1].id)["metrics"]["iid"]["object_accuracy_lag_gt2"]
    text = view.markdown(store, seeds=1)
    assert "object_accuracy_lag_gt2" in text and f"| MapWM | - | - | - | {value:.2f} (n=1)" in text
    view.plot(view, store, 1, tmp_path / "lag.png")
    assert (tmp_path / "lag.png").read_bytes()[:4] == b"\x89PNG"


def test_delta_view_reads_table_1s_records(tmp_path):
    """'1-delta' is Table 1's runs of the rows that integrate Delta (the same ids), read at
    the blanks' |Delta| over the data tokens' per layer; no paper figure beside those."""
    view = reproduce.table("mapformer", "1-delta", sequences=64, eval_sequences=8)
    base = reproduce.table("mapformer", "1", sequences=64, eval_sequences=8)
    assert view.rows == ("MapEM-s", "MapWM", "MapEM-os")  # MapEM-o integrates no Delta
    runs = view.runs(1, rows=["MapEM-s"])
    assert [r.id for r in runs] == [r.id for r in base.runs(1, rows=["MapEM-s"])]
    store = RecordStore(tmp_path)
    assert run_all(runs, store, progress=False)["failed"] == []
    metrics = store.get(runs[0].id)["metrics"]["iid"]
    by_token = metrics["delta_abs_by_token"]
    blank = 16  # the cpu scale's 16 symbols: the blank's id
    for layer in range(2):
        want = by_token[layer][blank] / sum(by_token[layer][:blank]) * blank
        assert metrics[f"delta_blank_over_data_layer{layer}"] == pytest.approx(want)
    text = view.markdown(store, seeds=1, metric="delta_blank_over_data_layer0")
    assert f"| MapEM-s | {metrics['delta_blank_over_data_layer0']:.2f} (n=1)" in text
    assert "[" not in text.split("| MapEM-s |")[1].splitlines()[0]  # no paper figure


def test_delta_steps_view_evaluates_through_training(tmp_path):
    """'1-delta-steps' runs Table 1's rows with evaluations every few steps (their own ids),
    and its curves end at the final evaluation; the plot draws them."""
    import numpy as np

    from mapformer.reproduce.mapformer import delta_curves, delta_steps

    base = reproduce.table("mapformer", "1", sequences=192, eval_sequences=8)
    view = delta_steps(base, every=1)
    run = view.runs(1, rows=["MapEM-s"])[0]
    assert run.train["eval_every"] == 1 and run.id != base.runs(1, rows=["MapEM-s"])[0].id
    assert reproduce.table("mapformer", "1-delta-steps").runs(1)[0].train["eval_every"] == 50
    store = RecordStore(tmp_path)
    assert run_all([run], store, progress=False)["failed"] == []
    record = store.get(run.id)
    steps, accuracy, ratio = delta_curves(record)
    np.testing.assert_array_equal(steps, [1, 2, 3])
    assert accuracy[-1] == record["metrics"]["iid"]["accuracy"]
    assert ratio[0, 1] == record["evals"][0]["eval"]["iid"]["delta_blank_over_data_layer1"]
    view.plot(view, store, 1, tmp_path / "steps.png")
    assert (tmp_path / "steps.png").read_bytes()[:4] == b"\x89PNG"


def test_lag_shares_and_predictions(tmp_path):
    """lag_shares: the share of a task's object recalls per lag bucket (none at lag 1-2 on
    walks that never backtrack, most of them there on uniform 1D walks); predicted_by_lag
    weights a row's recorded per-bucket accuracy by another task's shares."""
    import numpy as np
    from mapformer.reproduce.mapformer import bucket_counts, lag_shares, predicted_by_lag
    from mapformer.tasks import navigation

    uniform = navigation.NavigationConfig(dims=1, steps=32, grid_size=16)
    straight = navigation.NavigationConfig(dims=2, steps=32, grid_size=16, walk="no_backtrack")
    for task in (uniform, straight):
        assert lag_shares(task, 64).sum() == pytest.approx(1.0)
    assert lag_shares(straight, 64)[0] == 0.0 and lag_shares(uniform, 64)[0] > 0.5
    view = reproduce.table("mapformer", "2-by-lag", sequences=64, eval_sequences=8)
    store = RecordStore(tmp_path)
    assert run_all(view.runs(1, rows=["RoPE (1L)"], parts=["1D"]), store,
                   progress=False)["failed"] == []
    record = store.get(view.make_run("1D", "RoPE (1L)", 0).id)
    counts = record["metrics"]["iid"]["object_recalls_by_lag"]
    n, k = (bucket_counts(np.array(counts[key])) for key in ("positions", "hits"))
    want = (lag_shares(uniform) * k / np.maximum(n, 1)).sum()
    got = predicted_by_lag(view, store, 1, {("1D", "iid"): uniform}, rows=["RoPE (1L)"])
    assert got == {("1D", "RoPE (1L)", "iid"): pytest.approx(want)}


def test_task_readings_are_tables_of_their_own_runs():
    """2-no-backtrack and 2-action-repeat: Table 2's rows on the task under a reading (its
    option in every training and evaluation set and in the run's task_options), runs of
    their own; the action-repeat reading puts fewer object recalls at lag 1-2 than single
    actions do (0.24 / 0.31 IID against 0.65 / 0.59 at cpu scale, 1D / 2D)."""
    from mapformer.reproduce.mapformer import ACTION_REPEAT, lag_shares

    plain = reproduce.table("mapformer", "2")
    for name, parts, option in (("2-no-backtrack", ("2D",), {"walk": "no_backtrack"}),
                                ("2-action-repeat", ("1D", "2D"),
                                 {"action_repeat": ACTION_REPEAT})):
        reading = reproduce.table("mapformer", name)
        assert reading.parts == parts and reading.rows == plain.rows
        for part in parts:
            run = reading.make_run(part, "RoPE (1L)", 0)
            assert run.train["task_options"] == option
            assert run.id != plain.make_run(part, "RoPE (1L)", 0).id
            (key, value), = option.items()
            tasks = TrainConfig.from_dict(run.train).eval_tasks()
            assert {getattr(task, key) for task in tasks.values()} == {value}
    for part, uniform_share, repeat_share in (("1D", 0.65, 0.24), ("2D", 0.59, 0.31)):
        iid = TrainConfig.from_dict(plain.make_run(part, "MapWM", 0).train).eval_tasks()["iid"]
        assert lag_shares(iid)[0] == pytest.approx(uniform_share, abs=0.03)
        repeated = replace(iid, action_repeat=ACTION_REPEAT)
        assert lag_shares(repeated)[0] == pytest.approx(repeat_share, abs=0.03)


def test_fig5a_reads_observations_over_actions_through_training(tmp_path):
    """'fig5a': Table 2's 2D runs of the Delta rows evaluated every 50 steps (their own ids);
    each evaluation holds the observations' mean |Delta| over the actions' (navigation's
    delta_metrics, from the per-token means), and the plot draws the curves."""
    import numpy as np

    from mapformer.reproduce.mapformer import delta_curves, delta_steps
    from mapformer.tasks import navigation

    assert reproduce.table("mapformer", "fig5a").parts == ("2D",)
    assert reproduce.table("mapformer", "fig5a").runs(1)[0].train["eval_every"] == 50
    base = reproduce.table("mapformer", "2", sequences=128, eval_sequences=8)
    view = delta_steps(base, every=1, name="fig5a", parts=("2D",))
    run = view.runs(1, rows=["MapWM"])[0]
    store = RecordStore(tmp_path)
    assert run_all([run], store, progress=False)["failed"] == []
    record = store.get(run.id)
    metrics = record["metrics"]["iid"]
    means = metrics["delta_abs_by_token"][0]
    task = TrainConfig.from_dict(run.train).eval_tasks()["iid"]
    want = (np.mean([m for m in means[task.n_actions:] if m is not None])
            / np.mean(means[:task.n_actions]))
    assert metrics["delta_observation_over_action_layer0"] == pytest.approx(want)
    assert navigation.delta_metrics(task, [None, means]) == {
        "delta_observation_over_action_layer1": pytest.approx(want)}
    steps, accuracy, ratio = delta_curves(record, prefix="delta_observation_over_action",
                                          layers=1)
    np.testing.assert_array_equal(steps, [1, 2])
    assert ratio[-1, 0] == metrics["delta_observation_over_action_layer0"]
    view.plot(view, store, 1, tmp_path / "fig5a.png")
    assert (tmp_path / "fig5a.png").read_bytes()[:4] == b"\x89PNG"


def test_fig6_positions_and_the_omega_max_sweep(tmp_path):
    """'fig6': Table 2's 1D runs of the Delta rows (r = 1) as runs of their own kind, whose
    records add the position readings to every set's metrics and keep the histogram;
    'fig6-omega': Table 2's 2D runs with omega_max swept, whose pi part is Table 2's own runs;
    both plots draw from the records."""
    import math

    from mapformer.reproduce.mapformer_fig6 import KIND, OMEGA_MAX, POSITION_METRICS

    table2 = reproduce.table("mapformer", "2")
    fig6 = reproduce.table("mapformer", "fig6")
    run = fig6.make_run("1D", "MapWM", 0)
    assert run.kind == KIND and run.model["options"]["delta_rank"] == 1
    assert run.model == table2.make_run("1D", "MapWM", 0).model
    sweep = reproduce.table("mapformer", "fig6-omega")
    assert [sweep.make_run(p, "MapEM-s", 0).model["options"]["omega_max"]
            for p in sweep.parts] == list(OMEGA_MAX.values())
    assert sweep.make_run("omega_max pi", "MapEM-os", 2).id == table2.make_run(
        "2D", "MapEM-os", 2).id
    assert sweep.make_run("omega_max 2pi", "MapEM-os", 2).model["options"]["omega_max"] == (
        2 * math.pi)
    store = RecordStore(tmp_path)
    small = reproduce.table("mapformer", "fig6", sequences=128, eval_sequences=8)
    assert run_all(small.runs(1, rows=["MapEM-s"]), store, progress=False)["failed"] == []
    record = store.get(small.make_run("1D", "MapEM-s", 0).id)
    for column in COLUMNS:
        reading = record["positions"][column]
        assert set(POSITION_METRICS) <= set(record["metrics"][column])
        assert record["metrics"][column]["r2"] == reading["r2"] <= 1.0
        assert sum(reading["counts"]) == 8 * 2 * record["run"]["evals"][column]["steps"]
    assert len(record["frequencies"]) == 2  # (H, NB)
    small.plot(small, store, 1, tmp_path / "fig6.png")
    assert (tmp_path / "fig6.png").read_bytes()[:4] == b"\x89PNG"
    omega = reproduce.table("mapformer", "fig6-omega", sequences=64, eval_sequences=4)
    runs = [omega.make_run(p, "MapWM", 0) for p in ("omega_max 1", "omega_max 4pi")]
    assert run_all(runs, store, progress=False)["failed"] == []
    omega.plot(omega, store, 1, tmp_path / "omega.png")
    assert (tmp_path / "omega.png").read_bytes()[:4] == b"\x89PNG"


def test_fig7a_at_the_papers_length():
    """'fig7a-128': Fig. 7a's rows and widths at 128 steps on a grid of 64, the scale's
    budget; 'fig7a' keeps its 32 steps on 16."""
    long, short = (reproduce.table("mapformer", n) for n in ("fig7a-128", "fig7a"))
    assert long.parts == short.parts and long.rows == short.rows
    for table, steps, grid in ((long, 128, 64), (short, 32, 16)):
        runs = table.runs(1)
        assert {(r.train["steps"], r.train["grid_size"], r.train["sequences"])
                for r in runs} == {(steps, grid, 25_600)}
        assert f"{steps} steps" in table.title
