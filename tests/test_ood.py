"""mapformer.ood (issue 16's instruments) on hand-made inputs and tiny untrained models, the
query-scaling options of the attention mixers (numbers, gradients against finite differences,
C against the float64 reference) and the diagnosis spec
(mapformer.reproduce.mapformer_ood) at a tiny size."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mapformer import analysis as A
from mapformer import ood
from mapformer.mixers.base import query_scales
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import navigation, selective_copy
from mapformer.train import TrainConfig, check_resume, evaluate, train

NAV = navigation.NavigationConfig(dims=2, steps=24, grid_size=4, p_empty=0.3, n_objects=5)
COPY = selective_copy.SelectiveCopyConfig(n_copy=4, n_blanks=6, n_symbols=5)


def tiny(model, task, seed=3, backend="c", **options):
    config = ModelConfig.for_task(model, task, d_model=32, n_heads=2, **options)
    return Transformer(config, seed=seed, backend=backend)


def hand_walk():
    """1D, grid 4: cells 1, 2, 1, 0, 1, 2 (revisits at steps 2, 4, 5)."""
    task = navigation.NavigationConfig(dims=1, steps=6, grid_size=4, n_objects=3)
    cells = np.array([1, 2, 1, 0, 1, 2])
    content = {0: 3, 1: 2, 2: 5}  # objects 2, 3, 4; blank 5
    tokens = np.zeros((1, 12), np.int32)
    tokens[0, 0::2] = [0, 0, 1, 1, 0, 0]
    tokens[0, 1::2] = [content[c] for c in cells]
    targets = np.append(tokens[0, 1:], task.blank_id)[None]
    mask = np.zeros((1, 12), bool)
    mask[0, [4, 8, 10]] = True
    return task, navigation.Batch(tokens, targets.astype(np.int32), mask,
                                  cells.reshape(1, 6, 1))


# ---- recalls and buckets -------------------------------------------------------------------
def test_navigation_recalls_by_hand():
    task, batch = hand_walk()
    r = ood.recalls(batch, task)
    assert r.query.tolist() == [4, 8, 10]
    assert r.key.tolist() == [1, 5, 3]  # o_0 (cell 1), o_2 (cell 1), o_1 (cell 2)
    assert r.lag.tolist() == [2, 2, 4]
    assert r.target.tolist() == [2, 2, 5] and r.is_object.tolist() == [True, True, False]
    assert r.group.tolist() == [1, 1, 2]
    assert r.key_group[0].tolist() == [-1, 1, -1, 2, -1, 1, -1, 0, -1, 1, -1, 2]


def test_navigation_recalls_match_a_brute_force_search():
    batch = navigation.generate(NAV, 6, np.random.default_rng(1))
    r = ood.recalls(batch, NAV)
    assert r.query.size == batch.mask.sum() > 20
    for b, i, j, lag in zip(r.sequence, r.query, r.key, r.lag):
        t = i // 2
        s = max(s for s in range(t) if (batch.positions[b, s] == batch.positions[b, t]).all())
        assert (j, lag) == (2 * s + 1, t - s)
        assert j == A.recall_key(batch, (b, i))


def test_selective_copy_recalls_by_hand():
    task = selective_copy.SelectiveCopyConfig(n_copy=3, n_blanks=2, n_symbols=4)
    batch = selective_copy.generate(task, 2, np.random.default_rng(0))
    r = ood.recalls(batch, task)
    n = task.separator_index  # 5
    assert r.query.tolist() == [n, n + 1, n + 2] * 2
    assert r.key.tolist() == batch.positions.ravel().tolist()
    assert r.lag.tolist() == (r.query - batch.positions.ravel()).tolist()
    assert (batch.tokens[r.sequence, r.key] == r.target).all()
    assert r.group.tolist() == [0, 1, 2, 0, 1, 2] and r.is_object.all()
    assert (r.key_group[r.sequence, r.key] == r.group).all()
    assert (r.key_group >= 0).sum() == 6


def test_log2_edges_and_bucket_table():
    assert ood.log2_edges(8).tolist() == [1, 2, 4, 8, 16]
    assert ood.log2_edges(7).tolist() == [1, 2, 4, 8]
    table = ood.bucket_table([1, 2, 3, 4, 7, 8], {"x": [1, 0, 1, np.nan, 1, 0]},
                             ood.log2_edges(8))
    assert table == [{"lo": 1, "hi": 2, "n": 1, "x": 1.0}, {"lo": 2, "hi": 4, "n": 2, "x": 0.5},
                     {"lo": 4, "hi": 8, "n": 2, "x": 1.0}, {"lo": 8, "hi": 16, "n": 1, "x": 0.0}]
    assert ood.bucket_table([5], {"x": [np.nan]}, [1, 8]) == [{"lo": 1, "hi": 8, "n": 1,
                                                               "x": None}]


# ---- accuracy, attention, angles ------------------------------------------------------------
@pytest.mark.parametrize("task", [NAV, COPY], ids=["navigation", "selective_copy"])
def test_accuracy_tables_agree_with_evaluate(task):
    model = tiny("mapwm", task)
    batches = navigation.eval_set(task, 12, 5, 6) if task is NAV else \
        selective_copy.eval_set(task, 12, 5, 6)
    got = ood.accuracy_by_position_and_lag(model, batches, task)
    want = evaluate(model, {"x": task}, sequences=12, seed=5, batch_size=6)["x"]
    assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-12)
    assert got["object_accuracy"] == pytest.approx(want["object_accuracy"], abs=1e-12)
    assert got["n"] == want["positions"]
    for table in (got["by_position"], got["by_lag"]):
        assert sum(row["n"] for row in table) == got["n"]
        mean = sum(row["n"] * row["accuracy"] for row in table) / got["n"]
        assert mean == pytest.approx(got["accuracy"], abs=1e-12)


def test_key_statistics_by_hand():
    logits = np.log(np.array([[[1.0, 2.0, 5.0], [4.0, 1.0, 3.0]]]))  # H 1, P 2, T 3
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    group = np.array([[False, False, True], [True, False, True]])
    s = ood.key_statistics(probs, logits, key=np.array([2, 0]), query=np.array([2, 2]),
                           group_keys=group)
    assert s["mass"][:, 0].tolist() == pytest.approx([5 / 8, 4 / 8])
    assert s["group_mass"][:, 0].tolist() == pytest.approx([5 / 8, 7 / 8])
    assert s["wrong_max"][:, 0].tolist() == pytest.approx([2 / 8, 1 / 8])
    assert s["correct_logit"][:, 0].tolist() == pytest.approx([math.log(5), math.log(4)])
    assert s["wrong_lse"][:, 0].tolist() == pytest.approx([math.log(3), math.log(1)])
    assert s["wrong_max_logit"][:, 0].tolist() == pytest.approx([math.log(2), 0.0])
    assert np.isnan(s["alias_mass"]).all()
    none = ood.key_statistics(probs, None, np.array([2, 0]), np.array([2, 2]), group,
                              alias_keys=np.array([[True, True, False], [False, True, False]]))
    assert np.isnan(none["wrong_lse"]).all() and none["mass"][0, 0] == pytest.approx(5 / 8)
    assert none["alias_mass"][:, 0].tolist() == pytest.approx([3 / 8, 1 / 8])


def test_top_key_offsets_by_hand():
    task, batch = hand_walk()  # cells 1, 2, 1, 0, 1, 2 on grid 4; recalls at tokens 4, 8, 10
    r = ood.recalls(batch, task)
    top = np.array([[1, 0], [3, 5], [7, 1]])  # per recall, two heads' top keys
    got = ood.top_key_offsets(r, top, task)
    # o_0 is cell 1 (right), token 0 an action; o_1 cell 2 vs 1, o_2 cell 1; o_3 cell 0 vs 2
    # (torus distance 2), o_0 cell 1 vs 2
    assert np.isnan(got[0, 1]) and got[0, 0] == 0
    assert got[1].tolist() == [1, 0] and got[2].tolist() == [2, 1]
    copy = selective_copy.SelectiveCopyConfig(n_copy=3, n_blanks=2, n_symbols=4)
    cb = selective_copy.generate(copy, 1, np.random.default_rng(0))
    rc = ood.recalls(cb, copy)
    pos = cb.positions[0]
    blank = next(j for j in range(5) if j not in pos)
    top = np.array([[pos[0], pos[1]], [pos[0], blank], [pos[0], pos[2]]])
    got = ood.top_key_offsets(rc, top, copy)
    assert got[:, 0].tolist() == [0, -1, -2] and got[0, 1] == 1 and np.isnan(got[1, 1])
    assert got[2, 1] == 0
    net = tiny("mapwm", NAV)
    mass = ood.attention_mass(net, navigation.generate(NAV, 2, 0), NAV)
    tables = ood.attention_tables(mass)["0"]["head 0"]["by_lag"]
    assert all(0 <= row["top_right"] <= 1 and 0 <= row["top_near"] <= 1 for row in tables)
    offsets = mass["layers"][0]["top_offset"]
    right = np.where(np.isnan(offsets), 0.0, offsets == 0)[:, 0]
    assert sum(row["n"] * row["top_right"] for row in tables) == pytest.approx(right.sum())


def test_alias_cells_by_hand():
    task, batch = hand_walk()  # cells 1, 2, 1, 0, 1, 2 on grid 4
    keys, query = ood.alias_cells(batch, task, 2)  # modulo 2: 1, 0, 1, 0, 1, 0
    assert keys[0].tolist() == [-1, 1, -1, 0, -1, 1, -1, 0, -1, 1, -1, 0]
    assert query.tolist() == [1, 1, 0]  # the recalls at steps 2, 4, 5
    net = tiny("mapwm", task)
    mass = ood.attention_mass(net, batch, task, alias_grid=2)["layers"][0]
    # recall at step 5 (cell 2, token 10): its alias is cell 0 (o_3, token 7)
    row = A.attention_map(net, batch, 10)
    assert mass["alias_mass"][2] == pytest.approx(row[:, 7], abs=1e-12)
    assert mass["alias_mass"][0] == pytest.approx([0, 0])  # step 2: no other odd cell yet
    assert np.isnan(ood.attention_mass(net, batch, task)["layers"][0]["alias_mass"]).all()


@pytest.mark.parametrize("model,options", [("mapwm", {}), ("mapem_s", {}),
                                           ("mapem_os", {"mapem_mode": "sum"}),
                                           ("mapem_os", {"mapem_mode": "softmax_product"})])
def test_attention_mass_is_the_attention_maps_weight(model, options):
    net = tiny(model, NAV, n_layers=2, **options)
    batch = navigation.generate(NAV, 3, np.random.default_rng(2))
    mass = ood.attention_mass(net, batch, NAV)
    r = ood.recalls(batch, NAV)
    for layer in (0, 1):
        stats = mass["layers"][layer]
        assert stats["mass"].shape == (r.query.size, 2)
        for p in range(0, r.query.size, 7):
            row = A.attention_map(net, batch, (r.sequence[p], r.query[p]), layer=layer)
            assert stats["mass"][p] == pytest.approx(row[:, r.key[p]], abs=1e-12)
            group = [j for j in range(1, r.query[p] + 1, 2)
                     if (batch.positions[r.sequence[p], j // 2]
                         == batch.positions[r.sequence[p], r.query[p] // 2]).all()]
            assert stats["group_mass"][p] == pytest.approx(row[:, group].sum(-1), abs=1e-12)
        if options.get("mapem_mode") != "softmax_product":  # log p = logit - lse over all keys
            lse = np.logaddexp(stats["wrong_lse"], np.log(stats["group_mass"])
                               + stats["correct_logit"] - np.log(stats["mass"]))
            assert np.log(stats["mass"]) == pytest.approx(stats["correct_logit"] - lse,
                                                          abs=1e-9)
    tables = ood.attention_tables(mass)
    assert sorted(tables) == ["0", "1"] and sorted(tables["0"]) == ["best", "head 0", "head 1"]
    best = tables["1"]["best"]["by_keys"]
    assert sum(row["n"] for row in best) == r.query.size
    assert all(row["mass"] >= max(tables["1"][f"head {h}"]["by_keys"][k]["mass"]
                                  for h in (0, 1)) - 1e-12 for k, row in enumerate(best))


def test_angle_errors_measure_float32_and_closure():
    net = tiny("mapwm", NAV)
    batch = navigation.generate(NAV, 4, np.random.default_rng(3))
    out = ood.angle_errors(net, batch, NAV)
    # float32 against float64: tiny, but not zero (the C model rounds)
    assert 0 < out["model_error"].max() < 1e-4
    assert out["op_error"].shape == batch.tokens.shape and out["op_error"].max() < 1e-6
    # closure: the angle between two visits of a cell, as analysis.path_angles gives it
    r = ood.recalls(batch, NAV)
    omega = np.abs(net.blocks[0].mixer.scheme.frequencies)
    slowest = omega.argmin(-1)
    for p in range(0, r.query.size, 5):
        theta = A.path_angles(net, batch.tokens[r.sequence[p]])
        rel = A.wrap(theta[r.query[p]] - theta[r.key[p]])
        assert out["closure_slowest"][p] == pytest.approx(
            np.abs(rel[np.arange(2), slowest]), abs=1e-4)
        assert out["closure_mean"][p] == pytest.approx(np.abs(rel).mean(-1), abs=1e-4)
    # weighted closure: by |q_i,b| |k_j,b| of the rotated queries and keys
    mixer = net.blocks[0].mixer
    net.forward(batch.tokens)
    q, k = (np.asarray(x, np.float64).reshape(4, 48, 2, 8, 2) for x in (mixer.q_att,
                                                                         mixer.k_att))
    for p in range(0, r.query.size, 5):
        b, i, j = r.sequence[p], r.query[p], r.key[p]
        theta = A.path_angles(net, batch.tokens[b])
        closure = np.abs(A.wrap(theta[i] - theta[j]))
        w = np.linalg.norm(q[b, i], axis=-1) * np.linalg.norm(k[b, j], axis=-1)
        assert out["closure_weighted"][p] == pytest.approx((w * closure).sum(-1) / w.sum(-1),
                                                           abs=1e-4)
    # a twin whose frequencies are 0.1% off: the error is 0.1% of each relative angle
    twin = ood.float64_twin(net)
    scheme = twin.blocks[0].mixer.scheme
    scheme.omega.value[:] *= 1.001
    off = ood.angle_errors(net, batch, NAV, twin=twin)
    _ = ood.angle_errors(twin, batch, NAV)  # the twin's own angles, unwrapped through a forward
    theta64 = np.cumsum(twin.blocks[0].mixer.scheme.delta, axis=1) * scheme.omega.value / 1.001
    rel = theta64[r.sequence, r.query] - theta64[r.sequence, r.key]
    assert off["model_error"] == pytest.approx(np.abs(0.001 * rel).max(-1), rel=1e-3, abs=1e-5)
    tables = ood.angle_tables(out)
    assert sum(row["n"] for row in tables["head 0"]) == r.query.size
    assert sum(row["n"] for row in tables["op_by_position"]) == batch.tokens.size
    copy = ood.angle_errors(tiny("mapwm", COPY), selective_copy.generate(COPY, 2, 0), COPY)
    assert np.isnan(copy["closure_weighted"]).all() and copy["model_error"].max() < 1e-4


# ---- query scaling ---------------------------------------------------------------------------
def test_query_scales_numbers():
    options = {"attn_scale": 1.0, "attn_log_scale": 0, "attn_log_clamp": True}
    assert query_scales(options, 5) is None
    assert query_scales({**options, "attn_scale": 2.0}, 3).tolist() == [2.0, 2.0, 2.0]
    clamped = query_scales({**options, "attn_log_scale": 4}, 8)
    assert clamped.tolist() == pytest.approx([1, 1, 1, 1] + [math.log(n) / math.log(4)
                                                             for n in (5, 6, 7, 8)])
    free = query_scales({**options, "attn_log_scale": 4, "attn_log_clamp": False,
                         "attn_scale": 3.0}, 4)
    assert free.tolist() == pytest.approx([0.0, 1.5, 3 * math.log(3) / math.log(4), 3.0])
    with pytest.raises(ValueError, match="attn_log_scale must be 0"):
        tiny("mapwm", NAV, attn_log_scale=1)
    with pytest.raises(ValueError, match="attn_scale must be"):
        tiny("mapwm", NAV, attn_scale=0.0)


def test_clamped_log_scale_leaves_the_training_length_alone():
    batch = navigation.generate(NAV, 2, np.random.default_rng(4))  # 48 tokens
    base = tiny("mapwm", NAV).forward(batch.tokens).copy()
    same = tiny("mapwm", NAV, attn_log_scale=48).forward(batch.tokens)
    assert np.array_equal(base, same)  # every factor is 1: bit for bit
    longer = tiny("mapwm", NAV, attn_log_scale=24).forward(batch.tokens)
    assert np.array_equal(base[:, :24], longer[:, :24])
    assert np.abs(base[:, 24:] - longer[:, 24:]).max() > 1e-4


@pytest.mark.parametrize("model,options", [("mapwm", {}), ("mapem_s", {}),
                                           ("mapem_os", {}), ("mapem_os", {"mapem_mode": "sum"}),
                                           ("rope", {})])
def test_scaled_logits_are_the_factor_times_the_logits(model, options):
    batch = navigation.generate(NAV, 1, np.random.default_rng(5))
    base = tiny(model, NAV, **options)
    scaled = ood.with_options(base, attn_scale=1.5, attn_log_scale=16, attn_log_clamp=False)
    rows = np.array([3, 15, 30, 47])
    factors = 1.5 * np.log(rows + 1) / math.log(16)
    for net in (base, scaled):
        net.forward(batch.tokens)
    _, logits0 = A.attention_rows(base, rows)
    _, logits1 = A.attention_rows(scaled, rows)
    finite = np.isfinite(logits0)
    assert np.array_equal(finite, np.isfinite(logits1))
    np.testing.assert_allclose(logits1[finite], (logits0 * factors[:, None])[finite],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model,options", [("mapwm", {}), ("mapem_s", {}),
                                           ("mapem_os", {}), ("mapem_os", {"mapem_mode": "sum"})])
def test_query_scaling_gradients_match_finite_differences(model, options):
    scaling = dict(attn_scale=1.7, attn_log_scale=5, attn_log_clamp=False)
    net = tiny(model, NAV, seed=6, backend="numpy", **options, **scaling)
    batch = navigation.generate(NAV, 2, np.random.default_rng(7))
    tokens, targets, mask = batch.tokens[:, :20], batch.targets[:, :20], batch.mask[:, :20]
    mask[:, ::3] = True
    net.loss(tokens, targets, mask)
    net.backward()
    grad = net.params.grad.copy()
    names = [n for n in net.params.params if n.split(".")[-2] in ("q", "k", "delta_in")
             or n.endswith("start")]
    assert names
    eps = 1e-6
    for name in names:
        p = net.params.params[name]
        for i in (p.offset, p.offset + p.size // 2, p.offset + p.size - 1):
            old = net.params.data[i]
            net.params.data[i] = old + eps
            up = net.loss(tokens, targets, mask)
            net.params.data[i] = old - eps
            down = net.loss(tokens, targets, mask)
            net.params.data[i] = old
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - grad[i]) <= 1e-7 + 1e-4 * abs(numeric), (name, i)
    # the C model agrees with the float64 one
    c_net = tiny(model, NAV, seed=6, **options, **scaling)
    c_net.params.data[:] = net.params.data
    assert c_net.loss(tokens, targets, mask) == pytest.approx(net.loss(tokens, targets, mask),
                                                              rel=1e-5)
    c_net.backward()
    net.backward()
    scale = np.abs(net.params.grad).max()
    np.testing.assert_allclose(c_net.params.grad, net.params.grad, rtol=1e-3,
                               atol=1e-4 * scale)


def test_with_options_keeps_the_parameters():
    net = tiny("mapwm", NAV)
    other = ood.with_options(net, attn_scale=2.0)
    assert other.config.options["attn_scale"] == 2.0 and net.config.options["attn_scale"] == 1.0
    assert np.array_equal(other.params.data, net.params.data)
    with pytest.raises(ValueError, match="change the parameters"):
        ood.with_options(net, delta_rank=3)


def test_a_checkpoint_without_the_new_options_resumes(tmp_path):
    train_config = TrainConfig(dims=1, steps=8, grid_size=4, sequences=16, batch_size=8)
    task = train_config.task_config()
    model_config = ModelConfig.for_task("mapwm", task, d_model=32, n_heads=2)
    train(model_config, train_config, out_dir=tmp_path, progress=False, log=lambda *a: None,
          eval_tasks={"iid": task})
    path = tmp_path / "checkpoint.npz"
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    for name in ("attn_scale", "attn_log_scale", "attn_log_clamp"):
        del meta["model"]["options"][name]  # as a checkpoint written before they existed
    arrays["meta"] = json.dumps(meta)
    np.savez(path, **arrays)
    check_resume(path, model_config, train_config)  # no difference
    with pytest.raises(ValueError, match="options.attn_scale: checkpoint 1.0 != 2.0"):
        check_resume(path, ModelConfig.for_task("mapwm", task, d_model=32, n_heads=2,
                                                attn_scale=2.0), train_config)


# ---- the diagnosis spec (mapformer.reproduce.mapformer_ood) ------------------------------------
def test_diagnosis_spec_records_and_resumes(tmp_path, monkeypatch):
    """Two ranks of Table 2's 1D MapWM row at 128 sequences: the records hold every variant's
    diagnosis and metrics; a rerun runs nothing; a run whose record is lost reads its
    finished checkpoint back (no training); an interrupted run resumes from its checkpoint."""
    from mapformer import reproduce
    from mapformer.experiments import RecordStore, run_all
    from mapformer.reproduce import mapformer_ood
    monkeypatch.setenv("MAPFORMER_RUNS", str(tmp_path / "runs"))
    table = reproduce.table("mapformer", "ood", sequences=128, eval_sequences=8)
    runs = [mapformer_ood.make_run("table2_1d", row, 0, 128, 8, 4)
            for row in ("MapWM", "MapWM r=2")]
    store = RecordStore(tmp_path / "records")
    assert run_all(runs, store, progress=False) == {"held": 0, "ran": 2, "failed": []}
    record = store.get(runs[1].id)
    assert record["run"]["model"]["options"]["delta_rank"] == 2
    assert record["run"]["train"]["sequences"] == 128
    assert record["variants"] == {"T=1": {}, "T=1,log": {"attn_log_scale": 64},
                                  "T=2": {"attn_scale": 2.0},
                                  "T=2,log": {"attn_scale": 2.0, "attn_log_scale": 64}}
    sparse = record["diagnosis"]["variants"]["T=1"]["ood_sparse"]
    assert 0 <= sparse["accuracy"]["accuracy"] <= 1
    assert sum(row["n"] for row in sparse["accuracy"]["by_lag"]) == sparse["accuracy"]["n"]
    assert max(row["hi"] for row in sparse["attention"]["0"]["best"]["by_keys"]) > 128
    angles = record["diagnosis"]["angles"]["ood_sparse"]["0"]
    assert all(row["model_error_max"] < 1e-3 for row in angles["head 0"])
    assert record["metrics"]["ood_sparse"]["accuracy T=2"] == \
        record["diagnosis"]["variants"]["T=2"]["ood_sparse"]["accuracy"]["accuracy"]
    assert run_all(runs, store, progress=False)["ran"] == 0
    # the checkpoint of a run whose record is lost is read back, not trained again
    store.path(runs[0].id).unlink()
    assert run_all(runs, store, progress=False)["ran"] == 1
    assert store.get(runs[0].id)["wall_s"] is None  # read from its checkpoint
    first = store.get(runs[0].id)["metrics"]
    # an interrupted run (its checkpoint at step 1 of 2) is resumed, not started again
    store.path(runs[0].id).unlink()
    checkpoint = tmp_path / "runs" / runs[0].id / "checkpoint.npz"
    with np.load(checkpoint) as f:
        arrays = {k: f[k] for k in f.files}
    meta = json.loads(str(arrays["meta"]))
    assert (meta["step"], meta["train"]["checkpoint_every"]) == (2, 100)
    arrays["meta"] = json.dumps({**meta, "step": 1})
    np.savez(checkpoint, **arrays)
    assert run_all(runs, store, progress=False)["ran"] == 1
    resumed = store.get(runs[0].id)
    assert resumed["wall_s"] is not None and resumed["metrics"].keys() == first.keys()
    assert "MapWM r=2" in table.markdown(store, 1)


def test_diagnosis_legacy_records_keep_the_old_numbers():
    """The converted records of the old script (results/records/mapformer-legacy) render its
    figures: Table 1's MapWM OOD-sparse object recalls 0.330 at 38,400 sequences, 1.000 at
    200,000; MapEM-os trained with log-n scaling at 200,000: 0.998."""
    from mapformer import reproduce
    from mapformer.experiments import RecordStore
    store = RecordStore(Path(__file__).resolve().parents[1] / "results" / "records"
                        / "mapformer-legacy")
    line = next(x for x in reproduce.table("mapformer", "ood").markdown(store, 3).splitlines()
                if x.startswith("| MapWM |"))
    assert line.split(" | ")[3] == "0.330 ± 0.066 (n=3)§"
    text = reproduce.table("mapformer", "ood", sequences=200_000).markdown(store, 3)
    cells = {x.split(" | ")[0]: x.split(" | ") for x in text.splitlines() if x.startswith("|")}
    assert cells["| MapWM"][3] == "1.000 ± 0.000 (n=3)§"
    assert cells["| MapEM-os log-n"][3] == "0.998 ± 0.003 (n=3)§"
