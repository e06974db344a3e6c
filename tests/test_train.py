"""Training loop, evaluation metrics, checkpoints and the command line, on tiny runs."""
import json
import subprocess
import sys

import numpy as np
import pytest

from dataclasses import fields, replace

from conftest import subprocess_env
from mapformer.__main__ import build_parser
from mapformer.models import ModelConfig, Transformer
from mapformer.registry import registered_options
from mapformer.tasks import navigation, selective_copy
from mapformer.train import (TrainConfig, check_resume, decay_mask, evaluate, learning_rate,
                             load_checkpoint, save_checkpoint, top_k_hits, train)

TINY_TASK = dict(dims=1, steps=12, grid_size=6, p_empty=0.5, n_objects=5)
QUIET = dict(progress=False, log=lambda *a: None)

SCALING = {"attn_scale": 1.0, "attn_log_scale": 0, "attn_log_clamp": True,
           "attn_mask": "causal", "attn_prefix": 0}  # defaults


def tiny_configs(**train_fields):
    train_config = TrainConfig(**{**TINY_TASK, "sequences": 96, "batch_size": 16,
                                  "eval_sequences": 8, **train_fields})
    model_config = ModelConfig.preset("mapwm", train_config.task_config().vocab_size,
                                      d_model=32, n_heads=2, omega_grid=6.0)
    return model_config, train_config


def constant_model(task, token):
    """A model whose logits favour ``token`` at every position, whatever the input."""
    model = Transformer(ModelConfig(vocab_size=task.vocab_size, d_model=16, n_heads=1,
                                    positional="rope"))
    head_w, head_b = model.params.params["head.weight"], model.params.params["head.bias"]
    head_w.value[...] = 0.0
    head_b.value[...] = 0.0
    head_b.value[token] = 10.0
    return model


def test_evaluate_scores_all_revisits_and_object_recalls():
    task = navigation.NavigationConfig(dims=2, steps=40, grid_size=5, p_empty=0.5, n_objects=4)
    always_blank = evaluate(constant_model(task, task.blank_id), {"iid": task}, sequences=24)
    r = always_blank["iid"]
    assert r["floor_token"] == "blank" and r["accuracy"] == pytest.approx(r["floor"])
    assert 0.3 < r["floor"] < 0.7
    assert r["object_accuracy"] == 0.0
    assert r["positions"] > r["object_positions"] > 0
    first_object = min(task.object_ids())
    always_object = evaluate(constant_model(task, first_object), {"iid": task}, sequences=24)
    o = always_object["iid"]
    # the same evaluation set: the object positions are the non-blank ones
    assert o["object_positions"] == r["object_positions"]
    assert o["accuracy"] * o["positions"] == pytest.approx(
        o["object_accuracy"] * o["object_positions"])
    assert 0.0 < o["object_accuracy"] <= o["object_floor"] < 0.5


def test_top_k_hits_rank_the_target_among_the_scores():
    scores = np.array([[0.1, 0.9, 0.5, 0.3], [2.0, 2.0, 2.0, 1.0], [0.0, 1.0, 2.0, 3.0]])
    targets = np.array([2, 1, 0])
    # row 0: one class above the target; row 1: a tie (none above); row 2: three above
    assert top_k_hits(scores, targets, 1).tolist() == [False, True, False]
    assert top_k_hits(scores, targets, 2).tolist() == [True, True, False]
    assert top_k_hits(scores, targets, 4).tolist() == [True, True, True]


def test_evaluate_reports_top5_accuracy_from_the_logits():
    """A model whose logits rank every token the same way at every position: Acc@5 is the
    share of targets among its five best tokens, Acc@1 that of its best."""
    task = navigation.NavigationConfig(dims=2, steps=40, grid_size=5, p_empty=0.5, n_objects=8)
    model = constant_model(task, task.blank_id)
    best = sorted(task.object_ids())[:4]
    model.params.params["head.bias"].value[best] = 5.0  # below the blank's 10
    r = evaluate(model, {"iid": task}, sequences=24)["iid"]
    ids = navigation.eval_set(task, 24, 0, 32)
    targets = np.concatenate([b.targets[b.mask] for b in ids])
    assert r["accuracy"] == pytest.approx(np.mean(targets == task.blank_id))
    assert r["accuracy_top5"] == pytest.approx(np.isin(targets, [task.blank_id, *best]).mean())
    assert r["accuracy"] < r["accuracy_top5"] < 1.0


def test_evaluate_counts_object_recalls_by_lag():
    task = navigation.NavigationConfig(dims=2, steps=40, grid_size=5, p_empty=0.5, n_objects=4)
    first_object = min(task.object_ids())
    r = evaluate(constant_model(task, first_object), {"iid": task}, sequences=24)["iid"]
    by_lag = r["object_recalls_by_lag"]
    positions, hits = np.array(by_lag["positions"]), np.array(by_lag["hits"])
    assert positions.sum() == r["object_positions"] and positions[:2].sum() == 0
    assert hits.sum() == round(r["object_accuracy"] * r["object_positions"])
    # the same counts, slowly: each object recall's lag and whether first_object was right
    want_n, want_hits = np.zeros(41, np.int64), np.zeros(41, np.int64)
    for batch in navigation.eval_set(task, 24, 0, 32):
        lags = navigation.visit_lags(batch)
        for b, i in zip(*np.nonzero(batch.mask)):
            if batch.targets[b, i] != task.blank_id:
                want_n[lags[b, i // 2]] += 1
                want_hits[lags[b, i // 2]] += batch.targets[b, i] == first_object
    np.testing.assert_array_equal(np.pad(positions, (0, 41 - positions.size)), want_n)
    np.testing.assert_array_equal(np.pad(hits, (0, 41 - hits.size)), want_hits)
    for k in navigation.SCORED_LAGS:
        assert r[f"object_accuracy_lag_gt{k}"] == pytest.approx(
            want_hits[k + 1:].sum() / want_n[k + 1:].sum())
    assert r["object_accuracy_lag_gt2"] != r["object_accuracy"]


def test_evaluate_records_delta_by_input_token():
    """delta_abs_by_token: per path-integrating layer, the mean |Delta| of each input token
    id over the evaluation set, as analysis.integration_times reads the same forwards."""
    from mapformer.analysis import integration_times

    task = selective_copy.SelectiveCopyConfig(n_copy=5, n_blanks=3, n_symbols=6)
    model = Transformer(ModelConfig.for_task("mapem_s", task, d_model=32, n_heads=2,
                                             n_layers=2), seed=3)
    got = evaluate(model, {"iid": task}, sequences=20, batch_size=8)["iid"]
    sums, counts = np.zeros((2, task.vocab_size)), np.zeros(task.vocab_size)
    for batch in selective_copy.eval_set(task, 20, 0, 8):
        for layer in range(2):
            delta = np.abs(integration_times(model, batch, layer)["delta"]).mean(axis=(2, 3))
            np.add.at(sums[layer], batch.tokens, delta)
        np.add.at(counts, batch.tokens, 1)
    assert counts.all()  # every id occurs: data, blank and separator
    np.testing.assert_allclose(np.array(got["delta_abs_by_token"]), sums / counts, rtol=1e-12)
    assert len(set(np.round(got["delta_abs_by_token"][0], 9))) == task.vocab_size
    for layer in range(2):  # selective copy's reading: blank over the symbols' mean
        assert got[f"delta_blank_over_data_layer{layer}"] == pytest.approx(
            sums[layer, 6] / counts[6] / np.mean(sums[layer, :6] / counts[:6]), rel=1e-12)
    # a model without Delta records none; an id the set never shows is None
    rope = Transformer(ModelConfig.for_task("rope", task, d_model=32, n_heads=2), seed=0)
    assert "delta_abs_by_token" not in evaluate(rope, {"iid": task}, sequences=4)["iid"]
    unseen = evaluate(model, {"iid": replace(task, n_blanks=0)}, sequences=4)["iid"]
    assert unseen["delta_abs_by_token"][1][task.n_symbols] is None  # no blank shown
    assert not any(k.startswith("delta_blank") for k in unseen)  # so no reading of blanks


def test_learning_rate_schedules():
    linear = TrainConfig(sequences=1000, batch_size=100, lr=1e-3)
    assert [learning_rate(linear, s) for s in (0, 5, 9)] == pytest.approx([1e-3, 5e-4, 1e-4])
    cosine = TrainConfig(sequences=1000, batch_size=100, lr=1e-3, schedule="cosine",
                         warmup_steps=2)
    assert learning_rate(cosine, 0) == pytest.approx(5e-4)
    assert learning_rate(cosine, 1) == pytest.approx(1e-3)
    assert learning_rate(cosine, 2) == pytest.approx(1e-3)
    assert learning_rate(cosine, 6) == pytest.approx(5e-4)


@pytest.mark.parametrize("field, value", [("sequences", 0), ("batch_size", 0), ("lr", -1.0),
                                          ("beta1", 1.0), ("schedule", "step"),
                                          ("task", "maze"), ("seed", -1)])
def test_bad_train_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def test_vocab_mismatch_raises():
    model_config, train_config = tiny_configs()
    wrong = ModelConfig(**{**model_config.to_dict(), "vocab_size": model_config.vocab_size + 1})
    with pytest.raises(ValueError, match="vocab_size"):
        train(wrong, train_config, **QUIET)


def test_resume_continues_exactly(tmp_path):
    """Stopped after step 2 of 6 and resumed, a run ends with the same bits as one that was
    never stopped: the batches, learning rates and AdamW moments all carry over."""
    model_config, train_config = tiny_configs(checkpoint_every=2, eval_every=2)
    whole = train(model_config, train_config, out_dir=tmp_path / "whole", **QUIET)

    calls = []

    def crash_at_second_eval(*args):
        calls.append(args)
        # the two start lines (run, evaluation sets), the step-2 evaluation, the step-4 one
        if len(calls) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(model_config, train_config, out_dir=tmp_path / "cut", progress=False,
              log=crash_at_second_eval)
    checkpoint = tmp_path / "cut" / "checkpoint.npz"
    assert load_checkpoint(checkpoint)[3] == 2
    resumed = train(model_config, train_config, out_dir=tmp_path / "cut", resume=checkpoint,
                    **QUIET)
    np.testing.assert_array_equal(resumed["model"].params.data, whole["model"].params.data)
    assert resumed["eval"] == whole["eval"]
    lines = [json.loads(l) for l in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 6 and "eval" in lines[-1]


def test_checkpoint_round_trip_and_mismatch(tmp_path):
    model_config, train_config = tiny_configs()
    result = train(model_config, train_config, out_dir=tmp_path, **QUIET)
    model, optimizer, loaded_train, step = load_checkpoint(tmp_path / "checkpoint.npz")
    assert step == train_config.total_steps and loaded_train == train_config
    assert model.config == model_config
    np.testing.assert_array_equal(model.params.data, result["model"].params.data)
    assert optimizer.step_count == step and np.any(optimizer.v > 0)

    other_model = ModelConfig(**{**model_config.to_dict(), "d_model": 64,
                                 "options": {"omega_max": 2.0}})
    other_train = TrainConfig(**{**train_config.to_dict(), "lr": 1e-3})
    with pytest.raises(ValueError) as info:
        check_resume(tmp_path / "checkpoint.npz", other_model, other_train)
    for difference in ("model.d_model", "model.options.omega_max", "model.options.omega_grid",
                       "train.lr"):
        assert difference in str(info.value)
    check_resume(tmp_path / "checkpoint.npz", model_config, train_config)  # same: no error

    # a checkpoint whose parameters do not fit its own model config is refused
    bad = tmp_path / "bad.npz"
    save_checkpoint(bad, model, optimizer, train_config, step)
    with np.load(bad) as f:
        arrays = dict(f)
    arrays["params"] = arrays["params"][:-1]
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match=rf"the saved configuration does not describe the "
                       rf"{model.params.size - 1} parameters that params holds"):
        load_checkpoint(bad)


def rewrite_meta(path, edit):
    """The checkpoint at ``path`` rewritten with ``edit(meta)`` applied to its metadata."""
    with np.load(path) as f:
        arrays = dict(f)
    meta = json.loads(str(arrays["meta"]))
    edit(meta)
    arrays["meta"] = json.dumps(meta)
    np.savez(path, **arrays)


def assert_refused(path, model_config, train_config, match):
    """Loading and resuming from ``path`` both raise ValueError matching ``match``."""
    for read in (lambda: load_checkpoint(path),
                 lambda: check_resume(path, model_config, train_config)):
        with pytest.raises(ValueError, match=match):
            read()


def test_checkpoint_of_an_older_version_is_refused_clearly(tmp_path):
    model_config, train_config = tiny_configs(sequences=16)
    train(model_config, train_config, out_dir=tmp_path, **QUIET)
    path = tmp_path / "checkpoint.npz"
    # version 2 (no dropout generator state) is still read
    rewrite_meta(path, lambda meta: meta.update(version=1))
    assert_refused(path, model_config, train_config, "written by an older mapformer")


def test_checkpoint_of_mapem_nc_before_its_layout_change_is_refused(tmp_path):
    """Version 3 mapem_nc checkpoints (quaternion path) hold block-major weights; other
    version 3 checkpoints are still read."""
    model_config, train_config = tiny_configs(sequences=16)
    train(model_config, train_config, out_dir=tmp_path, **QUIET)
    path = tmp_path / "checkpoint.npz"
    rewrite_meta(path, lambda meta: meta.update(version=3))
    load_checkpoint(path)  # not mapem_nc: read

    def as_nc(meta):
        meta["model"]["positional"] = "mapem_nc"
        meta["model"]["options"].update(nc_block=4, nc_generators=0)
    rewrite_meta(path, as_nc)
    assert_refused(path, model_config, train_config, "quaternion path")


def test_cli_flags_mirror_the_configs():
    """Every config field and every option of every registered scheme, mixer and bottleneck
    is a flag of train, with its help text."""
    train_help = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    names = [f.name for f in fields(ModelConfig) + fields(TrainConfig)
             if f.name not in ("vocab_size", "options")]
    options = registered_options()
    assert {"delta_rank", "rope_base", "cope_positions", "mapem_mode"} <= set(options)
    for name in names + list(options):
        assert "--" + name.replace("_", "-") in train_help, name
    for option in options.values():
        assert option.help.split()[0] in train_help, option.name
    assert "--model" in train_help


def test_cli_train_then_eval(tmp_path):
    env = subprocess_env(1)
    common = [sys.executable, "-m", "mapformer"]
    args = ["train", "--dims", "1", "--steps", "12", "--grid-size", "6", "--n-objects", "5",
            "--sequences", "64", "--batch-size", "16", "--eval-sequences", "8",
            "--d-model", "32", "--n-heads", "2", "--positional", "mapwm",
            "--out", str(tmp_path), "--no-progress", "--json"]
    trained = subprocess.run(common + args, env=env, capture_output=True, text=True,
                             check=True, cwd=tmp_path)
    result = json.loads(trained.stdout.strip().splitlines()[-1])
    assert result["steps"] == 4 and result["sequences"] == 64
    assert "iid" in trained.stdout and "objects" in trained.stdout  # the printed evaluation
    evaluated = subprocess.run(common + ["eval", str(tmp_path / "checkpoint.npz"), "--json"],
                               env=env, capture_output=True, text=True, check=True,
                               cwd=tmp_path)
    again = json.loads(evaluated.stdout)
    for preset in ("iid", "ood_dense", "ood_sparse"):
        assert again[preset]["accuracy"] == pytest.approx(result["eval"][preset]["accuracy"])
    bad = subprocess.run(common + ["train", "--positional", "alibi", "--sequences", "16"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "positional" in bad.stderr


def cli_train(argv, tmp_path):
    """main(argv) with a tiny 1D task; returns the JSON result line."""
    from mapformer.__main__ import main
    main(["train", "--dims", "1", "--steps", "6", "--grid-size", "4", "--n-objects", "3",
          "--sequences", "8", "--batch-size", "8", "--eval-sequences", "2", "--d-model", "32",
          "--n-heads", "2", "--no-progress", "--json", "--out", str(tmp_path), *argv])
    return load_checkpoint(tmp_path / "checkpoint.npz")[0].config


def test_cli_model_presets_and_options(tmp_path, capsys):
    config = cli_train(["--model", "mapem_os", "--mapem-mode", "sum"], tmp_path)
    assert (config.mixer, config.positional, config.label) == ("conjunctive", "mapem",
                                                               "mapem_os")
    assert config.options["mapem_mode"] == "sum"
    assert config.options["omega_grid"] == 4.0  # from the task's grid
    config = cli_train(["--model", "mapem_s", "--mapem-separate-start", "true"], tmp_path)
    assert config.options["mapem_scores"] == "positional" and config.label == "mapem_s"
    assert config.options["mapem_separate_start"] is True
    config = cli_train(["--model", "cope"], tmp_path)
    assert config.options == {**SCALING, "cope_positions": 12, "gelu": "tanh"}  # the length
    config = cli_train(["--model", "mapem_s", "--mixer", "attention", "--positional", "rope",
                        "--rope-base", "100"], tmp_path)
    assert config.label == "rope"
    assert config.options == {**SCALING, "rope_base": 100.0, "rope_trainable": False,
                              "gelu": "tanh"}
    capsys.readouterr()


@pytest.mark.parametrize("argv, message", [
    (["--model", "rope", "--delta-rank", "3"],
     "--delta-rank is an option of positional scheme 'mapem' (and 'mapem_b4', 'mapem_sln', "
     "'mapwm'), not of "
     "positional scheme 'rope'"),
    (["--mapem-mode", "sum"],
     "--mapem-mode is an option of mixer 'conjunctive', not of mixer 'attention'"),
    (["--model", "mapem_os", "--mixer", "attention"],
     "mixer 'attention' takes positional schemes of kind"),
    (["--model", "mapwm", "--omega-grid", "-1"], "omega_grid must be a finite number > 0"),
])
def test_cli_refuses_options_of_other_components(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_train(argv, tmp_path)
    assert message in capsys.readouterr().err


def test_ood_sets_follow_the_training_task_by_the_paper_ratios():
    """The default preset's derived OOD sets are the paper's; a smaller training task gets
    them scaled (the rule the reproduction uses); overrides replace single fields."""
    paper = TrainConfig().eval_tasks()
    assert paper == {name: navigation.preset(name) for name in ("iid", "ood_dense",
                                                                 "ood_sparse")}
    for dims in (3, 5):
        assert TrainConfig(dims=dims).eval_tasks() == {
            name: navigation.preset(name, dims=dims) for name in paper}
    small = TrainConfig(steps=32, grid_size=16, n_objects=5).eval_tasks()
    assert (small["ood_dense"].steps, small["ood_dense"].grid_size,
            small["ood_dense"].p_empty, small["ood_dense"].n_objects) == (16, 8, 0.2, 5)
    assert (small["ood_sparse"].steps, small["ood_sparse"].grid_size,
            small["ood_sparse"].p_empty) == (128, 32, 0.8)
    edited = TrainConfig(steps=32, grid_size=16, ood_sparse="steps=100, p_empty=0.9",
                         ood_dense="grid_size=5").eval_tasks()
    assert (edited["ood_sparse"].steps, edited["ood_sparse"].grid_size,
            edited["ood_sparse"].p_empty) == (100, 32, 0.9)
    assert (edited["ood_dense"].steps, edited["ood_dense"].grid_size) == (16, 5)
    copy = TrainConfig(task="selective_copy").eval_tasks()
    assert copy == {name: selective_copy.preset(name) for name in paper}
    scaled = TrainConfig(task="selective_copy", n_copy=16, n_blanks=16).eval_tasks()
    assert [scaled[n].n_blanks for n in paper] == [16, 8, 32]


@pytest.mark.parametrize("field,value,message", [
    ("ood_sparse", "stepz=3", "ood_sparse: expected"),
    ("ood_dense", "steps", "ood_dense: expected"),
    ("ood_dense", "steps=two", "ood_dense: steps must be a int"),
    ("ood_sparse", "fixed_map=maybe", "ood_sparse: fixed_map must be true or false"),
    ("ood_sparse", "grid_size=1", "grid_size must be an integer >= 2"),
    ("loss_positions", "everything", "loss_positions must be one of"),
    ("decay", "matrices,,", "decay must be a comma-separated list"),
])
def test_bad_ood_loss_and_decay_fields_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value})


def test_loss_positions_choose_the_training_mask():
    task = navigation.NavigationConfig(dims=1, steps=10, grid_size=4)
    batch = navigation.generate(task, 3, 0)
    assert navigation.loss_mask(batch, "revisits") is batch.mask
    observations = navigation.loss_mask(batch, "observations")
    assert observations[:, 0::2].all() and not observations[:, 1::2].any()
    assert (observations | batch.mask).sum() == observations.sum()  # revisits are a subset
    assert navigation.loss_mask(batch, "all").all()
    with pytest.raises(ValueError, match="loss_positions must be one of"):
        TrainConfig(task="selective_copy", loss_positions="observations")
    copy_task = selective_copy.SelectiveCopyConfig(n_copy=3, n_blanks=2)
    assert selective_copy.loss_mask(selective_copy.generate(copy_task, 2, 0), "all").all()
    # a step on every observation sees a different loss than one on revisits only
    losses = {}
    for positions in ("revisits", "observations", "all"):
        model_config, train_config = tiny_configs(sequences=16, loss_positions=positions)
        losses[positions] = train(model_config, train_config, **QUIET)["loss"]
    assert len(set(losses.values())) == 3


def test_decay_rule_selects_parameters():
    model_config, train_config = tiny_configs()
    store = Transformer(model_config).params
    matrices = decay_mask(store, "matrices")
    assert np.array_equal(matrices, store.decay_mask) and matrices.any() and not matrices.all()
    omega = store.params["blocks.0.mixer.scheme.omega"]
    with_omega = decay_mask(store, "matrices,*.omega")
    assert with_omega[omega.offset:omega.offset + omega.size].all()
    assert with_omega.sum() == matrices.sum() + omega.size
    assert decay_mask(store, "all").all() and not decay_mask(store, "none").any()
    with pytest.raises(ValueError, match="'nothing.here' matches no parameter"):
        decay_mask(store, "matrices,nothing.here")
    # the rule reaches AdamW: decaying omega moves it where the default leaves it
    trained = {rule: train(model_config, TrainConfig(**{**train_config.to_dict(),
                                                        "decay": rule, "weight_decay": 50.0,
                                                        "sequences": 16}), **QUIET)["model"]
               for rule in ("matrices", "matrices,*.omega")}
    values = [m.params.params["blocks.0.mixer.scheme.omega"].value for m in trained.values()]
    assert not np.allclose(values[0], values[1])


def test_the_cli_reference_page_is_the_cli_usage(monkeypatch):
    """docs/reference/cli.md shows the usage of the program and of every command exactly as
    -h prints it (at 100 columns; the page is generated: python docs/gen_pages.py)."""
    from pathlib import Path

    monkeypatch.setenv("COLUMNS", "100")
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    page = (Path(__file__).resolve().parents[1] / "docs/reference/cli.md").read_text()
    for usage in [parser.format_usage()] + [p.format_usage() for p in commands.values()]:
        assert usage in page, f"docs/reference/cli.md lacks (run python docs/gen_pages.py):\n{usage}"
    assert set(commands) == {"train", "eval", "plot", "info", "map", "reproduce"}


def test_cli_info_names_the_kernels_and_threads():
    done = subprocess.run([sys.executable, "-m", "mapformer", "info"], capture_output=True,
                          text=True, check=True,
                          env={**subprocess_env(1), "MAPFORMER_KERNELS": "blas"})
    lines = dict(line.split(None, 1) for line in done.stdout.splitlines())
    assert lines["kernels"].startswith("blas (this CPU's best: ")
    assert lines["threads"].startswith("1 (OpenMP")
    assert "own threads: 1" in lines["blas"] and lines["mapformer"].startswith("0.")
    assert "MAPFORMER_POOL_MB" in lines["output"]
    assert lines["cuda"].startswith("unavailable: ") or "matrix products on" in lines["cuda"]


def test_cli_task_options_parse_numbers_and_names():
    """--task-options: integers, floats (rooms' noise) and names; a float reaches the rooms
    task as its noise, and the task names a value of the wrong type."""
    from mapformer.__main__ import parse_task_options
    assert parse_task_options("walks=8192, noise=0.25,topology=cube,x=inf,y=-3") == {
        "walks": 8192, "noise": 0.25, "topology": "cube", "x": "inf", "y": -3}
    config = TrainConfig(task="rooms", loss_positions="observations", steps=20,
                         task_options=parse_task_options("height=4,width=5,patch=2,noise=0.1"))
    assert config.task_config().noise == 0.1
    with pytest.raises(ValueError, match="noise must be a float"):
        TrainConfig(task="rooms", loss_positions="observations", steps=20,
                    task_options=parse_task_options("height=4,width=5,patch=2,noise=low"))
    with pytest.raises(ValueError, match="expected 'name=value"):
        parse_task_options("noise")
