"""TDB: the head inputs, the C model against the NumPy reference model, the heads' gradients
against finite differences, and a short training run on an aliased room."""
import json

import numpy as np
import pytest

from conftest import numerical_grad
from mapformer import cogmap
from mapformer.tasks import rooms
from mapformer.tasks.rooms import next_observation_targets
from mapformer.tdb import TDB, TDBConfig, head_inputs
from mapformer.train import AdamW, TrainConfig

ROOM = rooms.RoomsConfig(height=4, width=5, n_obs=3, patch=2, steps=12, seed=0)


def tokens(n, seed=0):
    return rooms.walks(ROOM, rooms.make_room(ROOM), n, seed).tokens(ROOM.n_obs)


def small(**values):
    base = dict(n_obs=3, d_model=32, n_heads=2, n_layers=1, steps=2, codebooks=2, codes=8,
                head_hidden=16)
    base.update(values)
    return TDBConfig(**base)


def test_head_inputs_and_next_observation_targets():
    # x1 a1 x2 a2 x3 a3 with O = 3 (actions are ids 3..6)
    t = np.array([[0, 3, 1, 5, 2, 6]])
    ids, targets, masks = head_inputs(t, 3, 2)
    assert ids.tolist() == [[3, 5, 6], [5, 6, 0]]
    assert targets.tolist() == [[1, 2, 0], [2, 0, 0]]
    assert masks.tolist() == [[1, 1, 0], [1, 0, 0]]
    ids, targets, masks = head_inputs(t, 3, 5)  # heads past the walk's end: nothing
    assert masks[2:].sum() == 0 and ids[3:].sum() == 0 and masks[1].tolist() == [1, 0, 0]
    tg, mask = next_observation_targets(t)
    assert tg.tolist() == [[0, 1, 0, 2, 0, 0]]
    assert mask.tolist() == [[False, True, False, True, False, False]]


@pytest.mark.parametrize("values", [dict(), dict(codebook_width="full", enc=True)])
def test_c_model_matches_numpy_reference(values):
    c_model = TDB(small(**values), seed=2)
    ref_model = TDB(small(**values), seed=2, backend="numpy")
    if ref_model.teacher is not None:
        ref_model.teacher.params.data[:] = c_model.teacher.params.data
    ref_model.params.data[:] = c_model.params.data
    t = tokens(3)
    c_loss, ref_loss = c_model.loss(t), ref_model.loss(t)
    assert c_loss == pytest.approx(ref_loss, rel=2e-5)
    assert np.array_equal(np.asarray(c_model.vq.indices), ref_model.vq.indices)
    c_model.backward()
    ref_model.backward()
    for name, p in ref_model.params.params.items():
        got, want = c_model.params.params[name].grad, p.grad
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale + 1e-7,
                                   err_msg=f"gradient of {name}")


def test_head_gradients_by_finite_differences():
    """The heads sit after the bottleneck, where the loss is smooth in their parameters."""
    model = TDB(small(head_hidden=4), seed=1, backend="numpy")
    t = tokens(2)
    model.loss(t)
    model.backward()
    for name in ("heads.1.code.weight", "heads.1.action1.weight", "heads.0.out.bias"):
        p = model.params.params[name]
        want = p.grad.copy()
        got = numerical_grad(lambda: model.loss(t), p.value)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9, err_msg=name)


def test_training_learns_the_room():
    config = small(steps=1, codebooks=1, codes=32, n_layers=1)
    model = TDB(config, seed=0)
    opt = AdamW(model, TrainConfig(lr=3e-3, weight_decay=0.0))
    t = tokens(64, seed=1)
    rng = np.random.default_rng(0)
    first = model.loss(t[:16])
    for _ in range(60):
        model.loss(t[rng.integers(0, 64, 16)])
        model.backward()
        opt.step(3e-3)
    assert model.loss(t[:16]) < 0.8 * first
    usage = model.vq.usage()
    assert usage["used"][0] >= 2
    # a map comes out of the codes
    codes = np.asarray(model.encode(t)[1])
    walks = rooms.walks(ROOM, rooms.make_room(ROOM), 64, 1)
    cm = cogmap.extract_map(codes, walks.actions)
    assert cm.node_of.shape == (len(cm.tuples),)


def test_token_scores_hold_the_heads_logits_at_the_action_positions():
    """token_scores (B, 2N, O): the s = 0 head's logits at each action's position (its
    prediction of the next observation), 0 at the observations' positions; their argmax is
    the training loop's and evaluate's prediction."""
    model = TDB(small(), seed=0)
    t = tokens(4)
    model.loss(t)
    scores = model.token_scores()
    B, T = t.shape
    assert scores.shape == (B, T, 3)
    head = np.asarray(model.ops.to_numpy(model.logits[0])).reshape(B, T // 2, 3)
    assert np.array_equal(scores[:, 1::2], head) and not scores[:, 0::2].any()


def test_full_width_codebooks_read_the_whole_output():
    """codebook_width 'full' (the paper's Sec. 3.5): each of the M codebooks snaps the whole
    final output to its nearest code, the heads read the M codes concatenated, and the
    gradient reaching the output is the sum over the codebooks of the straight-through
    gradient plus each one's commitment term; 'split' is left out of the run description, so
    the records made before the option keep their ids."""
    cfg = small(codebook_width="full", codebooks=3, d_model=32)
    model = TDB(cfg, seed=4, backend="numpy")
    t = tokens(2)
    model.loss(t)
    vq, C = model.vq, cfg.d_model
    x = vq.z[:, 0]  # (N, C): every codebook's input is the whole row
    assert vq.z.shape == (x.shape[0], 3, C) and np.array_equal(vq.z[:, 2], x)
    book = vq.codebook.value  # (M, K, C)
    nearest = ((x[:, None, None, :] - book[None]) ** 2).sum(-1).argmin(-1)  # (N, M)
    assert np.array_equal(vq.indices, nearest)
    want = np.concatenate([book[m][nearest[:, m]] for m in range(3)], axis=1)
    assert model.encode(t)[0].shape == (x.shape[0], 3 * C)
    np.testing.assert_array_equal(model.encode(t)[0], want)
    assert model.params.params["heads.0.code.weight"].value.shape == (16, 3 * C)
    dy = np.random.default_rng(0).standard_normal((x.shape[0], 3 * C))
    model.vq.forward(x)
    dx = model.vq.backward(dy)
    w = vq.loss_weight(x.shape[0])
    commitment = sum(2 * 0.25 * w * (x - book[m][nearest[:, m]]) for m in range(3))
    np.testing.assert_allclose(dx, dy.reshape(-1, 3, C).sum(1) + commitment, rtol=1e-12)
    assert "codebook_width" not in small().to_dict()
    assert small().to_dict() == TDBConfig.from_dict(small().to_dict()).to_dict()
    assert TDBConfig.from_dict(cfg.to_dict()) == cfg


def test_bad_config():
    with pytest.raises(ValueError, match="steps"):
        TDBConfig(n_obs=3, steps=0)
    with pytest.raises(ValueError, match="codebook_width"):
        small(codebook_width="half")
    with pytest.raises(ValueError, match="d_model"):
        TDBConfig(n_obs=3, d_model=30, n_heads=4)


def rooms_checkpoint(tmp_path, config, name, steps=2):
    """The library checkpoint of ``config`` (a TDBConfig or ModelConfig) trained ``steps``
    steps by mapformer.train on the rooms task in ROOM (16 training walks, 4 test walks,
    context 2): (path, train config)."""
    from mapformer.train import train
    train_config = TrainConfig(
        task="rooms", steps=ROOM.steps, task_options=dict(
            height=ROOM.height, width=ROOM.width, n_obs=ROOM.n_obs, patch=ROOM.patch,
            walks=16, context=2), sequences=4 * steps, batch_size=4,
        loss_positions="observations", schedule="constant", weight_decay=0.0, seed=ROOM.seed,
        eval_sequences=4, eval_batch_size=4)
    train(config, train_config, out_dir=tmp_path / name, progress=False, log=lambda *a: None)
    return tmp_path / name / "checkpoint.npz", train_config


def test_checkpoint_and_map_command(tmp_path, capsys):
    """A TDB trained by mapformer.train: its library checkpoint loads as a TDB, and map draws
    its map in the room of the checkpoint's rooms task."""
    from dataclasses import asdict

    from mapformer.__main__ import main
    from mapformer.train import load_checkpoint
    path, train_config = rooms_checkpoint(tmp_path, small(codebooks=1, steps=1), "tdb")
    loaded, _, saved, step = load_checkpoint(path)
    assert isinstance(loaded, TDB) and saved == train_config and step == 2
    assert train_config.task_config().map_meta(4) == {
        "room": asdict(ROOM), "seed": 0, "train_walks": 16, "test_walks": 4, "context": 2}
    assert main(["map", str(path), "--out", str(tmp_path / "map")]) == 0
    metrics = json.loads(capsys.readouterr().out.splitlines()[0])
    assert metrics["problems"] <= 4 and 0.0 <= metrics["NormGED"] <= 1.0
    assert (tmp_path / "map" / "cogmap.graphml").stat().st_size > 0
    assert (tmp_path / "map" / "cogmap.png").stat().st_size > 0
    # the extraction's thresholds: every transition an edge at 0, the same map as the
    # default at the paper's values; out of [0, 1] one line on stderr
    assert main(["map", str(path), "--out", str(tmp_path / "map0"), "--threshold", "0",
                 "--d-hamming", "0.25"]) == 0
    everything = json.loads(capsys.readouterr().out.splitlines()[0])
    assert everything["edges"] >= metrics["edges"]
    with pytest.raises(SystemExit):
        main(["map", str(path), "--d-hamming", "1.5"])
    assert "--d-hamming must be in [0, 1], got 1.5" in capsys.readouterr().err
    (tmp_path / "bad.npz").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit):
        main(["map", str(tmp_path / "bad.npz")])


def test_enc_variant():
    """The teacher starts as the student's prefix and follows it by EMA; the enc loss is the
    normalised regression onto the teacher's next code; C matches NumPy; the enc head's
    gradients match finite differences."""
    cfg = small(steps=1, codebooks=1, enc=True, ema=0.9, head_hidden=4)
    c_model, ref_model = TDB(cfg, seed=2), TDB(cfg, seed=2, backend="numpy")
    ref_model.params.data[:] = c_model.params.data
    ref_model.teacher.params.data[:] = c_model.teacher.params.data
    n = c_model.teacher.params.size
    assert np.array_equal(c_model.teacher.params.data, c_model.params.data[:n])
    assert "enc.out.weight" in c_model.params.params
    t = tokens(3)
    assert c_model.loss(t) == pytest.approx(ref_model.loss(t), rel=2e-5)
    c_model.backward()
    ref_model.backward()
    for name, p in ref_model.params.params.items():
        got, want = c_model.params.params[name].grad, p.grad
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max() + 1e-7,
                                   err_msg=f"gradient of {name}")
    for name in ("enc.code.weight", "enc.out.bias"):
        p = ref_model.params.params[name]
        got = numerical_grad(lambda: ref_model.loss(t), p.value)
        np.testing.assert_allclose(got, p.grad, rtol=1e-5, atol=1e-9, err_msg=name)
    # the enc term: a mean over positions of squared distances of unit vectors, in (0, 4]
    assert 0.0 < ref_model.enc_loss(t, ref_model.encode(t)[0]) <= 4.0
    before_t = ref_model.teacher.params.data.copy()
    ref_model.params.data[:] += 1.0
    ref_model.update_teacher()
    np.testing.assert_allclose(ref_model.teacher.params.data,
                               0.9 * before_t + 0.1 * ref_model.params.data[:n], rtol=1e-12)
    with pytest.raises(ValueError, match="ema"):
        small(enc=True, ema=1.0)


def test_map_command_on_a_mapwm_checkpoint(tmp_path, capsys):
    """A MapWM transformer's checkpoint: the map comes from its angles; a RoPE one has none."""
    from mapformer.__main__ import main
    from mapformer.models import ModelConfig, Transformer
    from mapformer.train import load_checkpoint
    config = ModelConfig.preset("mapwm", 7, d_model=32, n_heads=2, n_layers=1)
    path, _ = rooms_checkpoint(tmp_path, config, "mapwm")
    loaded = load_checkpoint(path)[0]
    assert isinstance(loaded, Transformer) and loaded.config == config
    assert main(["map", str(path), "--out", str(tmp_path / "map"), "--angle-places", "8"]) == 0
    metrics = json.loads(capsys.readouterr().out.splitlines()[0])
    assert 1 <= metrics["clusters"] <= 8 and 0.0 <= metrics["NormGED"] <= 1.0
    assert (tmp_path / "map" / "cogmap.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        main(["map", str(path), "--angle-places", "0"])
    assert "argument --angle-places: must be an integer >= 1, got 0" in capsys.readouterr().err
    rope, _ = rooms_checkpoint(tmp_path, ModelConfig.preset("rope", 7, d_model=32, n_heads=2,
                                                            n_layers=1), "rope")
    with pytest.raises(SystemExit):
        main(["map", str(rope)])


def test_checkpoint_is_saved_at_exactly_the_path_given(tmp_path):
    """save_checkpoint(path "x", ...) of a TDB writes x (no suffix added), which
    load_checkpoint("x") reads back with its kind, parameters and VQ state."""
    from mapformer.train import load_checkpoint, save_checkpoint
    model = TDB(small(codebooks=1, steps=1), seed=4)
    model.vq.counts[0, 3] = 5
    config = TrainConfig(task="rooms", steps=12, task_options=dict(
        height=4, width=5, n_obs=3, patch=2, walks=16), loss_positions="observations",
        sequences=8, batch_size=4)
    save_checkpoint(tmp_path / "x", model, AdamW(model, config), config, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]
    loaded, _, saved, step = load_checkpoint(tmp_path / "x")
    assert loaded.config == model.config and saved == config and step == 0
    assert np.array_equal(loaded.params.data, model.params.data)
    assert loaded.vq.counts[0, 3] == 5


def bad_map_checkpoints(tmp_path):
    """{case: (path, the message refusing it)}: files the map command must refuse (the
    library checkpoint of a TDB on the rooms task, edited)."""
    good, _ = rooms_checkpoint(tmp_path, small(codebooks=1, steps=1), "good")
    with np.load(good) as f:
        arrays = dict(f)
    meta, size = json.loads(str(arrays["meta"])), arrays["params"].shape[0]
    config = meta["model"]

    def edit(name, **changes):
        np.savez(tmp_path / name, **{**arrays, **changes})
        return tmp_path / name

    def edit_meta(name, **changes):
        return edit(name, meta=json.dumps({**meta, **changes}))

    empty, truncated, npy = tmp_path / "empty.npz", tmp_path / "truncated.npz", tmp_path / "a.npy"
    empty.write_bytes(b"")
    truncated.write_bytes(good.read_bytes()[:good.stat().st_size // 2])
    np.save(npy, arrays["params"])
    nan = arrays["params"].copy()
    nan[3] = np.nan
    huge = {**config, "d_model": 65536, "n_heads": 512, "head_hidden": 65536}  # > 128 GiB
    navigation = {k: v for k, v in meta["train"].items() if k != "task_options"}
    return {
        "empty": (empty, f"{empty} is not a readable checkpoint (corrupt or truncated: "
                         "EOFError: No data left in file)"),
        "truncated": (truncated, f"{truncated} is not a readable checkpoint (corrupt or "
                                 "truncated: BadZipFile: File is not a zip file)"),
        "meta list": (edit("list.npz", meta=json.dumps([1, 2])),
                      "meta must be a JSON object, got list"),
        "unknown kind": (edit_meta("kind.npz", kind="lstm"),
                         "meta field 'kind' must be one of transformer, tdb, got 'lstm'"),
        "unknown field": (edit_meta("field.npz", model={**config, "colour": 1}),
                          "the saved configuration is invalid: TDBConfig has no field "
                          "'colour'"),
        "0-d params": (edit("scalar.npz", params=np.float32(1.0)),
                       "params must be a float32 vector (P,), got float32 of shape ()"),
        "bare npy": (npy, f"{npy} is not a checkpoint: a bare array, not an .npz"),
        "huge model": (edit_meta("huge.npz", model=huge),
                       f"the saved configuration does not describe the {size} parameters that "
                       f"params holds: the parameters reach {7 * 65536} at 'embed.weight' (7, "
                       f"65536), past {size}"),
        "nan params": (edit("nan.npz", params=nan),
                       "params holds non-finite values (in 'embed.weight')"),
        "int64 params": (edit("int.npz", params=arrays["params"].astype(np.int64)),
                         f"params must be a float32 vector (P,), got int64 of shape ({size},)"),
        "vq counts": (edit("counts.npz", vq_counts=arrays["vq_counts"].astype(np.int32)),
                      "the tdb state: vq_counts must be int64 counts >= 0 of shape (1, 8), "
                      "got int32 of shape (1, 8)"),
        "no room": (edit_meta("room.npz", train={**navigation, "task": "navigation"}),
                    "a checkpoint of task 'navigation' has no room: map reads one of the "
                    "rooms task"),
    }


def test_map_command_refuses_bad_checkpoints_in_one_line(tmp_path, capsys):
    """Each was a traceback (EOFError, BadZipFile, TypeError, IndexError, KeyError,
    MemoryError) or a map drawn from NaN or int64 parameters. The Python API raises the same
    message (load_checkpoint a CheckpointError) but for a checkpoint that loads and holds no
    room, which only map refuses."""
    from mapformer.__main__ import main
    from mapformer.train import CheckpointError, load_checkpoint
    for case, (path, message) in bad_map_checkpoints(tmp_path).items():
        line = message if message.startswith(str(path)) else f"{path}: {message}"
        if case != "no room":
            with pytest.raises(CheckpointError) as info:
                load_checkpoint(path)
            assert str(info.value) == line, case
        with pytest.raises(SystemExit) as info:
            main(["map", str(path), "--out", str(tmp_path / "map")])
        assert info.value.code == 2, case
        assert capsys.readouterr().err.splitlines() == [f"python -m mapformer: error: {line}"]
    assert not (tmp_path / "map").exists()


@pytest.mark.parametrize("values", [dict(), dict(steps=1, codebooks=1, enc=True),
                                    dict(codebook_width="full", enc=True)])
def test_flop_count_is_the_products_a_forward_runs(values):
    """tdb.forward_flops (+ the enc teacher's encode_flops) against the products one loss()
    multiplies, counted from the shapes the C backend's ops are called with: linear 2 n Cin
    Cout, the fused MLP two of them, the VQ's distances 2 n M K (C / M), attention's causal
    half of its two products (2 B H T^2 D in all)."""
    from mapformer import tdb as tdb_module

    model = TDB(small(**values), seed=0)
    counted = []

    def counting(name, fn, flops):
        def wrapped(*args, **kwargs):
            counted.append(flops(*args))
            return fn(*args, **kwargs)
        return name, wrapped

    ops = model.ops
    rules = {
        "linear_forward": lambda x, w, *rest: 2 * x.shape[0] * w.shape[0] * w.shape[1],
        "mlp_forward": lambda x, w1, *rest: 4 * x.shape[0] * w1.shape[0] * w1.shape[1],
        "vq_forward": lambda z, codebooks, *rest: 2 * z.shape[0] * int(np.prod(codebooks.shape)),
        "attention_forward": lambda q, *rest: 2 * q.shape[0] * q.shape[2] * q.shape[1] ** 2
        * q.shape[3]}
    originals = {name: getattr(ops, name) for name in rules}
    try:
        for name, rule in rules.items():
            setattr(ops, *counting(name, originals[name], rule))
        t = tokens(3)
        model.loss(t)
    finally:
        for name, fn in originals.items():
            setattr(ops, name, fn)
    cfg, (batch, length) = model.config, t.shape
    expected = tdb_module.forward_flops(cfg, batch, length) + (
        tdb_module.encode_flops(cfg, batch, length) if cfg.enc else 0)
    assert sum(counted) == expected
    assert tdb_module.step_flops(cfg, batch, length) == 2 * tdb_module.forward_flops(
        cfg, batch, length) + expected
