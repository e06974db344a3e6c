"""The baseline positional schemes of the APE and GridPE tables: ``sinusoidal`` and
``learned_abs`` (additive: their code is added to the token embeddings, ``Scheme.embed``),
``rope`` with trainable frequencies (``rope_trainable``, "RoPE tuned") and ``rope_axial``.
Each forward against a direct NumPy computation, the trainable parts' gradients against
finite differences, the C backend against the float64 one, one training step through the
API and the command line on navigation and selective copy, and bad input."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import assert_param_gradients, subprocess_env
from mapformer.models import ModelConfig, Transformer
from mapformer.schemes import SCHEMES
from mapformer.tasks import navigation, rooms, selective_copy
from mapformer.tdb import TDB, TDBConfig
from mapformer.train import TrainConfig, load_checkpoint, train

TABLE, OMEGA = "blocks.0.mixer.scheme.table", "blocks.0.mixer.scheme.omega"
NAV = navigation.NavigationConfig(dims=2, steps=5, grid_size=4, n_objects=3)


def config(positional, d_model=32, **options):
    return ModelConfig(vocab_size=9, d_model=d_model, n_heads=2, n_layers=2,
                       positional=positional, options=options)


def tokens(batch=2, steps=11, seed=0):
    return np.random.default_rng(seed).integers(0, 9, (batch, steps))


def vaswani(positions, width, scale):
    """(..., width): per axis a of positions (..., n), its chunk of width / n components:
    (scale sin(p_a f_i), scale cos(p_a f_i)), f_i = 10000^(-2i / (width / n))."""
    n = positions.shape[-1]
    chunk = width // n
    f = 10000.0 ** (-np.arange(0, chunk, 2) / chunk)
    out = np.empty(positions.shape[:-1] + (width,))
    for a in range(n):
        angle = positions[..., a:a + 1] * f
        out[..., a * chunk:(a + 1) * chunk:2] = scale * np.sin(angle)
        out[..., a * chunk + 1:(a + 1) * chunk:2] = scale * np.cos(angle)
    return out


def test_additive_schemes_are_of_kind_none_and_every_mixer_takes_them():
    for name in ("sinusoidal", "learned_abs"):
        assert SCHEMES.get(name).kind == "none"
    assert SCHEMES.get("rope_axial").kind == "angles"
    t = tokens()
    for mixer in ("attention", "lstm", "mamba"):
        model = Transformer(ModelConfig(vocab_size=9, d_model=32, n_heads=2, mixer=mixer,
                                        positional="learned_abs",
                                        options={"abs_positions": 12}), seed=0)
        loss_of(model, t)()
        model.backward()
        grad = model.params.params[TABLE].grad
        assert np.abs(grad[:11]).min(axis=1).max() > 1e-4 and not grad[11:].any(), mixer


@pytest.mark.parametrize("backend,tol", [("numpy", 1e-12), ("c", 2e-6)])
def test_sinusoidal_1d_is_vaswanis_code_added_to_the_embeddings(backend, tol):
    model = Transformer(config("sinusoidal", d_model=48, sinusoidal_scale=0.5), seed=1,
                        backend=backend)
    scheme = model.blocks[0].mixer.scheme
    x = model.ops.asarray(np.random.default_rng(2).standard_normal((2 * 13, 48)))
    y = scheme.embed(x, 2, 13)
    code = vaswani(np.arange(13.0)[:, None], 48, 0.5)  # the token index, from 0
    assert scheme.sinusoids.shape == (1, 13, 48)
    np.testing.assert_allclose(scheme.sinusoids[0], code, rtol=0, atol=tol)
    np.testing.assert_allclose(y.reshape(2, 13, 48), x.reshape(2, 13, 48) + code, rtol=0,
                               atol=2 * tol)
    # the model adds it once, after the token embedding: the first block's input
    t = tokens(2, 13)
    model.forward(t)
    embedded = model.params.params["embed.weight"].value[t]
    np.testing.assert_allclose(model.blocks[0].ln1.x.reshape(2, 13, 48), embedded + code,
                               rtol=0, atol=2 * tol)


@pytest.mark.parametrize("backend,tol", [("numpy", 1e-12), ("c", 1e-5)])
def test_sinusoidal_nd_has_a_chunk_of_the_width_per_axis(backend, tol):
    batch = navigation.generate(NAV, 3, np.random.default_rng(0))
    coords = navigation.token_coordinates(batch)  # (3, 10, 2), ints in [0, 4)
    cfg = ModelConfig.for_task("rope", NAV, d_model=32, n_heads=2, positional="sinusoidal")
    assert cfg.options["coord_dims"] == 2
    model = Transformer(cfg, seed=0, backend=backend)
    model.forward(batch.tokens, coords)
    code = vaswani(coords.astype(float), 32, 0.02)
    np.testing.assert_allclose(model.blocks[0].mixer.scheme.sinusoids, code, rtol=0, atol=tol)
    # the first 16 components read x alone, the last 16 y alone
    moved = coords.copy()
    moved[..., 1] += 1
    model.forward(batch.tokens, moved)
    got = model.blocks[0].mixer.scheme.sinusoids
    np.testing.assert_allclose(got[..., :16], code[..., :16], rtol=0, atol=tol)
    assert np.abs(got[..., 16:] - code[..., 16:]).max() > 1e-3


@pytest.mark.parametrize("backend,tol", [("numpy", 0), ("c", 0)])
def test_learned_abs_adds_row_t_of_its_table_to_token_t(backend, tol):
    model = Transformer(config("learned_abs", abs_positions=20), seed=1, backend=backend)
    table = model.params.params[TABLE]
    assert table.shape == (20, 32) and [n for n in model.params.params if "scheme" in n] == [
        TABLE]  # one table, shared (the first layer's)
    assert 0.015 < float(np.std(table.value)) < 0.025  # N(0, 0.02^2) like the embeddings
    scheme = model.blocks[0].mixer.scheme
    x = model.ops.asarray(np.random.default_rng(2).standard_normal((2 * 7, 32)))
    y = scheme.embed(x, 2, 7)
    np.testing.assert_allclose(y.reshape(2, 7, 32), x.reshape(2, 7, 32) + table.value[:7],
                               rtol=1e-7, atol=tol)
    np.testing.assert_array_equal(scheme.positions, np.arange(7))


def loss_of(model, batch_tokens, coords=None):
    mask = np.ones(batch_tokens.shape, bool)
    targets = np.roll(batch_tokens, -1, axis=1)
    return lambda: model.loss(batch_tokens, targets, mask, coords)


def test_learned_abs_table_gradient_matches_finite_differences():
    model = Transformer(config("learned_abs", abs_positions=9), seed=0, backend="numpy")
    table = model.params.params[TABLE]
    assert_param_gradients(model, loss_of(model, tokens(2, 6)), [table], rtol=1e-6, atol=1e-10)
    grad = table.grad
    assert np.abs(grad[:6]).min(axis=1).max() > 1e-6 and not grad[6:].any()  # rows read


def test_rope_trainable_gradient_matches_finite_differences():
    """One omega for both layers (declared by the first): the sum of both layers' shares,
    through the rotary op and the path integration."""
    model = Transformer(config("rope", rope_trainable=True), seed=0, backend="numpy")
    assert [n for n in model.params.params if "scheme" in n] == [OMEGA]
    omega = model.params.params[OMEGA]
    omega.value[...] = np.random.default_rng(3).uniform(0.05, 1.5, omega.shape)
    # central differences at eps = 1e-6 of a loss ~2 carry ~2 * 2^-52 / 1e-6 = 4e-10 of
    # rounding: the small entries are compared to that
    assert_param_gradients(model, loss_of(model, tokens(2, 7)), [omega], atol=2e-9, least=1e-5)


@pytest.mark.parametrize("backend,tol", [("numpy", 1e-12), ("c", 1e-5)])
def test_rope_trainable_starts_as_frozen_rope(backend, tol):
    frozen = Transformer(config("rope"), seed=4, backend=backend)
    tuned = Transformer(config("rope", rope_trainable=True), seed=4, backend=backend)
    assert not [n for n in frozen.params.params if "scheme" in n]
    np.testing.assert_allclose(tuned.params.params[OMEGA].value,
                               frozen.blocks[0].mixer.scheme.frequencies, rtol=1e-7)
    t = tokens()
    np.testing.assert_allclose(tuned.forward(t), frozen.forward(t), rtol=tol, atol=tol)
    # both layers read the one parameter
    assert tuned.blocks[1].mixer.scheme.frequencies is tuned.params.params[OMEGA].value


@pytest.mark.parametrize("backend,tol", [("numpy", 1e-12), ("c", 1e-5)])
def test_rope_axial_angles_are_per_axis_rope(backend, tol):
    batch = navigation.generate(NAV, 2, np.random.default_rng(1))
    coords = navigation.token_coordinates(batch)
    cfg = ModelConfig.for_task("rope", NAV, d_model=32, n_heads=2, positional="rope_axial")
    model = Transformer(cfg, seed=0, backend=backend)
    model.forward(batch.tokens, coords)
    theta = model.blocks[0].mixer.scheme.theta  # (B, T, H, NB = 8): 4 pairs per axis
    f = 10000.0 ** (-np.arange(4) / 4)
    want = np.concatenate([coords[..., :1] * f, coords[..., 1:] * f], axis=-1)
    np.testing.assert_allclose(theta, np.broadcast_to(want[:, :, None], theta.shape), rtol=tol,
                               atol=tol)


def test_rope_axial_is_ape_grid_at_its_rope_initialisation():
    """ape_grid starts as axial RoPE: the same chunks and frequencies, W^x in place of the
    rotation by x f, so the logits agree (float64)."""
    batch = navigation.generate(NAV, 2, np.random.default_rng(2))
    coords = navigation.token_coordinates(batch)
    logits = {}
    for positional in ("rope_axial", "ape_grid"):
        cfg = ModelConfig.for_task("rope", NAV, d_model=32, n_heads=2, n_layers=2,
                                   positional=positional)
        model = Transformer(cfg, seed=5, backend="numpy")
        logits[positional] = model.forward(batch.tokens, coords)
    np.testing.assert_allclose(logits["rope_axial"], logits["ape_grid"], rtol=1e-10,
                               atol=1e-12)


def test_rope_axial_in_1d_is_rope():
    """n = 1 without coordinates: the token index at RoPE's frequencies (angles t omega in
    place of (t + 1) omega: the same scores)."""
    t = tokens()
    rope = Transformer(config("rope"), seed=2, backend="numpy").forward(t)
    axial = Transformer(config("rope_axial"), seed=2, backend="numpy").forward(t)
    np.testing.assert_allclose(axial, rope, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("positional,options", [
    ("sinusoidal", {}), ("learned_abs", {"abs_positions": 16}), ("rope", {"rope_trainable": True}),
    ("rope_axial", {})])
def test_c_backend_matches_numpy(positional, options):
    t = tokens(3, 9, seed=1)
    grads = {}
    for backend in ("numpy", "c"):
        model = Transformer(config(positional, **options), seed=6, backend=backend)
        loss = loss_of(model, t)()
        model.backward()
        grads[backend] = loss, model.logits, model.params.grad
    assert grads["c"][0] == pytest.approx(grads["numpy"][0], rel=1e-5)
    np.testing.assert_allclose(grads["c"][1], grads["numpy"][1], rtol=1e-4, atol=1e-5)
    scale = np.abs(grads["numpy"][2]).max()
    np.testing.assert_allclose(grads["c"][2], grads["numpy"][2], rtol=1e-3,
                               atol=1e-4 * scale)


def test_bad_input():
    model = Transformer(config("learned_abs", abs_positions=8), seed=0, backend="numpy")
    model.forward(tokens(1, 8))  # positions 0..7: the whole table
    with pytest.raises(ValueError, match=r"learned_abs': token position 8 is beyond its "
                       r"table of abs_positions = 8 positions"):
        model.forward(tokens(1, 9))
    with pytest.raises(ValueError, match="d_model must be a multiple of 2 n"):
        Transformer(ModelConfig(vocab_size=9, d_model=36, n_heads=2, positional="sinusoidal",
                                options={"coord_dims": 4}))
    with pytest.raises(ValueError, match="D / 2 = 8 rotation pairs over n = 3 axes"):
        Transformer(config("rope_axial", coord_dims=3))
    for positional in ("sinusoidal", "rope_axial"):
        with pytest.raises(ValueError, match=f"'{positional}' with coord_dims = 2 needs"):
            Transformer(config(positional, coord_dims=2)).forward(tokens())
    with pytest.raises(ValueError, match="abs_positions must be an integer >= 1"):
        config("learned_abs", abs_positions=0)


def test_abs_positions_default_covers_the_tasks_evaluation_sets():
    for train_config in (TrainConfig(dims=2, steps=6, grid_size=4),
                         TrainConfig(task="selective_copy", n_copy=4, n_blanks=6)):
        task = train_config.task_config()
        cfg = ModelConfig.for_task("rope", task, positional="learned_abs")
        longest = max(t.seq_len for t in train_config.eval_tasks().values())
        assert cfg.options["abs_positions"] == longest > task.seq_len


@pytest.mark.parametrize("positional,options,trained", [
    ("sinusoidal", {}, []), ("learned_abs", {}, [TABLE]),
    ("rope", {"rope_trainable": True}, [OMEGA]), ("rope_axial", {}, [])])
@pytest.mark.parametrize("task", ["navigation", "selective_copy"])
def test_one_step_through_the_api(positional, options, trained, task):
    shape = (dict(dims=2, steps=6, grid_size=4, n_objects=3) if task == "navigation"
             else dict(task="selective_copy", n_copy=3, n_blanks=5))
    train_config = TrainConfig(**shape, sequences=8, batch_size=8, eval_sequences=2, lr=1e-2)
    cfg = ModelConfig.for_task("rope", train_config.task_config(), d_model=48, n_heads=2,
                               positional=positional, **options)
    result = train(cfg, train_config, progress=False, log=lambda *a: None)
    assert result["steps"] == 1 and math.isfinite(result["loss"])
    assert all(math.isfinite(result["eval"][name]["loss"]) for name in result["eval"])
    params = result["model"].params.params
    for name in trained:
        start = Transformer(cfg, seed=train_config.seed).params.params[name].value
        assert np.abs(params[name].value - start).max() > 1e-4


@pytest.mark.parametrize("positional,flags,task", [
    ("sinusoidal", [], "navigation"), ("learned_abs", [], "selective_copy"),
    ("rope", ["--rope-trainable", "true"], "selective_copy"), ("rope_axial", [], "navigation")])
def test_one_step_through_the_cli(tmp_path, positional, flags, task):
    shape = (["--dims", "2", "--steps", "6", "--grid-size", "4", "--n-objects", "3"]
             if task == "navigation" else ["--task", task, "--n-copy", "3", "--n-blanks", "5"])
    args = [sys.executable, "-m", "mapformer", "train", "--positional", positional, *shape,
            "--sequences", "8", "--batch-size", "8", "--eval-sequences", "2", "--d-model",
            "48", "--n-heads", "2", "--out", str(tmp_path), "--no-progress", "--json", *flags]
    run = subprocess.run(args, env=subprocess_env(1), capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["steps"] == 1 and math.isfinite(result["loss"])
    model = load_checkpoint(tmp_path / "checkpoint.npz")[0]
    assert model.config.positional == positional
    if positional == "rope":
        assert model.config.options["rope_trainable"] is True and OMEGA in model.params.params
    if task == "navigation":
        assert model.config.options["coord_dims"] == 2
    if positional == "learned_abs":  # selective copy's longest sequence: ood_sparse's
        assert model.config.options["abs_positions"] == max(
            t.seq_len for t in selective_copy.ood_sets(
                selective_copy.SelectiveCopyConfig(n_copy=3, n_blanks=5)).values())


def test_tdb_adds_the_code_too():
    """TDB builds its own transformer body: the additive schemes reach it as well."""
    room = rooms.RoomsConfig(height=4, width=5, n_obs=3, patch=2, steps=12, seed=0)
    t = rooms.walks(room, rooms.make_room(room), 2, 0).tokens(room.n_obs)
    model = TDB(TDBConfig(n_obs=3, d_model=32, n_heads=2, n_layers=1, steps=2, codebooks=2,
                          codes=8, head_hidden=16, positional="learned_abs"), seed=0,
                backend="numpy")
    model.loss(t)
    model.backward()
    grad = model.params.params[TABLE].grad
    assert np.abs(grad[:t.shape[1]]).max() > 1e-6 and not grad[t.shape[1]:].any()


def test_rope_tuned_is_ape_seq_without_its_basis():
    """ape_seq at its RoPE initialisation (M = I) and RoPE tuned: the same logits, and the
    same gradient for the shared frequencies (ape_seq's ``angles``, RoPE's ``omega``)."""
    t = tokens(2, 9)
    grads = {}
    for positional, options, name in (("rope", {"rope_trainable": True}, OMEGA),
                                      ("ape_seq", {}, "blocks.0.mixer.scheme.angles")):
        model = Transformer(config(positional, **options), seed=7, backend="numpy")
        loss_of(model, t)()
        model.backward()
        grads[positional] = model.logits, model.params.params[name].grad
    np.testing.assert_allclose(grads["rope"][0], grads["ape_seq"][0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["rope"][1], grads["ape_seq"][1], rtol=1e-8, atol=1e-14)
    assert np.abs(grads["rope"][1]).max() > 1e-6
