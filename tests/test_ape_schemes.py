"""The APE and GridPE positional schemes in a model: the oracles (ape_seq initialised to RoPE
is the ``rope`` model; ape_seq's folded basis and rotations are APE's dense W^t; scores
depend on relative positions only, in 1D and on the task's 2D coordinates), the generators'
gradients through expm (and the powers, the folds) against finite differences (generators
shared by the layers), the C backend against float64, task coordinates reaching the schemes, and a
few training steps through the Python API and the command line."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import assert_param_gradients, subprocess_env
from mapformer import reference as ref
from mapformer.models import ModelConfig, Transformer
from mapformer.schemes.ape import MAX_DECAY_POSITIONS, decay_factor, node_distance
from mapformer.schemes.gridpe import gridpe_frequencies, simplex_directions
from mapformer.tasks import navigation
from mapformer.train import TrainConfig, load_checkpoint, train

GENERATOR = "blocks.0.mixer.scheme.generator"


def config(positional, **options):
    return ModelConfig(vocab_size=9, d_model=32, n_heads=2, n_layers=2, positional=positional,
                       options=options)


BASIS, ANGLES = "blocks.0.mixer.scheme.basis_generator", "blocks.0.mixer.scheme.angles"


@pytest.mark.parametrize("backend,tol", [("numpy", 1e-10), ("c", 2e-4)])
def test_ape_seq_initialised_to_rope_is_the_rope_model(backend, tol):
    """Same seed, same draws (the RoPE-like initialisation draws nothing): the logits agree,
    since M = I and the angles are RoPE's (t + 1) omega_i."""
    tokens = np.random.default_rng(0).integers(0, 9, (2, 11))
    rope = Transformer(config("rope"), seed=3, backend=backend).forward(tokens)
    ape = Transformer(config("ape_seq"), seed=3, backend=backend)
    np.testing.assert_allclose(ape.forward(tokens), rope, rtol=tol, atol=tol)
    # one basis and one set of angles for both layers (APE shares its W)
    assert [n for n in ape.params.params if "scheme" in n] == [BASIS, ANGLES]
    first, second = ape.blocks[0].mixer.scheme, ape.blocks[1].mixer.scheme
    assert second.basis_map is first.basis_map and second.theta is first.theta
    np.testing.assert_array_equal(first.basis_map, np.broadcast_to(np.eye(16), (2, 16, 16)))


def randomise_ape_seq(model, seed=0):
    rng = np.random.default_rng(seed)
    for name in (BASIS, ANGLES):
        value = model.params.params[name].value
        value[...] = rng.standard_normal(value.shape) * 0.5


def test_ape_seq_scores_are_apes_dense_operator():
    """With a random basis and random angles, the scores the attention compares are APE's
    q_m^T W^(n - m) k_n (W^t applied densely, float64) with W = M^T R(omega) M, M =
    expm(B - B^T), on the mixer's unmapped q = x W_q^T + b_q."""
    model = Transformer(config("ape_seq"), seed=1, backend="numpy")
    randomise_ape_seq(model)
    tokens = np.random.default_rng(2).integers(0, 9, (2, 7))
    model.forward(tokens)
    mixer = model.blocks[1].mixer
    b = model.params.params[BASIS].value
    omega = model.params.params[ANGLES].value
    m = ref.expm(b - np.swapaxes(b, -1, -2))
    rope = ref.rope_generator(omega)[0]
    w = np.swapaxes(m, -1, -2) @ ref.expm(rope - np.swapaxes(rope, -1, -2)) @ m
    maps = np.stack([[np.linalg.matrix_power(w[h], t) for h in range(2)] for t in range(7)])
    shape = (2, 7, 2, 16)

    def mapped(linear):
        y = (mixer.q.x @ linear.weight.value.T + linear.bias.value).reshape(shape)
        return np.einsum("thij,bthj->bthi", maps, y)

    expected = np.einsum("bthd,bshd->bhts", mapped(mixer.q), mapped(mixer.k))
    np.testing.assert_allclose(scores_of(mixer), expected, rtol=1e-10, atol=1e-12)


def test_ape_seq_decay_multiplies_the_logits():
    """ape_decay = 0.9: every score the attention compares is the undecayed one times
    0.9^(query - key) (the keys at or before the query), and the C backend agrees."""
    tokens = np.random.default_rng(2).integers(0, 9, (2, 7))
    i, j = np.arange(7)[:, None], np.arange(7)[None, :]
    got = {}
    for backend, decay in (("numpy", 1.0), ("numpy", 0.9), ("c", 0.9)):
        model = Transformer(config("ape_seq", ape_decay=decay), seed=1, backend=backend)
        randomise_ape_seq(model)
        got[backend, decay] = model.forward(tokens), scores_of(model.blocks[0].mixer)
    plain, decayed = got["numpy", 1.0][1], got["numpy", 0.9][1]
    np.testing.assert_allclose(decayed, plain * 0.9 ** (i - j), rtol=1e-10, atol=1e-12)
    assert np.abs(got["numpy", 0.9][0] - got["numpy", 1.0][0]).max() > 1e-5
    np.testing.assert_allclose(got["c", 0.9][0], got["numpy", 0.9][0], rtol=2e-4, atol=2e-4)


def assert_decay_reaches_attention(make_config, tokens, coords, factors):
    """Models of ``make_config(decay)`` at decay 1 and 0.8 (NumPy) and 0.8 (C): at 0.8 the
    second layer's attention gets ``factors`` (B, T, T) through its table, its output is the
    reference attention with them, the loss changes with the decay, and the C backend's loss
    and gradients match float64. Returns the NumPy model at 0.8."""
    results = {}
    for backend, decay in (("numpy", 1.0), ("numpy", 0.8), ("c", 0.8)):
        model = Transformer(make_config(decay), seed=3, backend=backend)
        loss = model.loss(tokens, tokens, np.ones(tokens.shape), coords)
        model.backward()
        results[backend, decay] = loss, {n: np.array(p.grad, np.float64)
                                         for n, p in model.params.params.items()}
        if backend == "numpy" and decay == 0.8:
            decayed, scheme = model, model.blocks[1].mixer.scheme
            ids, table = scheme.factor["pos_ids"], scheme.factor["pair_factor"]
            np.testing.assert_allclose(table[ids[:, :, None], ids[:, None, :]], factors,
                                       rtol=1e-6)
            want = ref.attention_forward(scheme.q_att, scheme.k_att, scheme.v, **scheme.mask,
                                         pos_ids=ids, pair_factor=table)[0]
            np.testing.assert_allclose(scheme.out, want, rtol=1e-12, atol=1e-12)
    assert abs(results["numpy", 0.8][0] - results["numpy", 1.0][0]) > 1e-6
    (lc, gc), (ln, gn) = results["c", 0.8], results["numpy", 0.8]
    assert abs(lc - ln) < 1e-4 * abs(ln)
    for name, g in gn.items():
        np.testing.assert_allclose(gc[name], g, rtol=0, atol=2e-3 * np.abs(g).max() + 1e-7,
                                   err_msg=name)
    return decayed


@pytest.mark.parametrize("mask", ["none", "prefix"])
def test_ape_seq_decay_under_non_causal_masks(mask):
    """Keys after the query: ape_decay 0.8 reaches the attention as the per-pair factor
    0.8^|i - j| on the token index; the output is the reference attention with it, the
    gradients match finite differences, and the C backend matches float64."""
    tokens = np.random.default_rng(5).integers(0, 9, (2, 7))
    i, j = np.arange(7)[:, None], np.arange(7)[None, :]
    model = assert_decay_reaches_attention(
        lambda decay: config("ape_seq", ape_decay=decay, ape_no_init=True, attn_mask=mask,
                             attn_prefix=3),
        tokens, None, np.broadcast_to(0.8 ** np.abs(i - j), (2, 7, 7)))
    assert_param_gradients(model, lambda: model.loss(tokens, tokens, np.ones(tokens.shape)),
                           [model.params.params[BASIS], model.params.params[ANGLES]])


def test_ape_seq_c_backend_matches_numpy():
    """The fold (float32 products) and the rotary op on the C backend against float64."""
    tokens = np.random.default_rng(0).integers(0, 9, (2, 11))
    losses, grads = [], []
    for backend in ("numpy", "c"):
        model = Transformer(config("ape_seq"), seed=3, backend=backend)
        randomise_ape_seq(model)
        losses.append(model.loss(tokens, tokens, np.ones(tokens.shape)))
        model.backward()
        grads.append({n: np.array(model.params.params[n].grad, np.float64)
                      for n in (BASIS, ANGLES, "blocks.0.mixer.q.weight")})
    assert abs(losses[0] - losses[1]) < 1e-4 * abs(losses[0])
    for name, g in grads[0].items():
        np.testing.assert_allclose(grads[1][name], g, rtol=0, atol=1e-3 * np.abs(g).max())
        assert np.abs(g).max() > 1e-6


def scores_of(mixer):
    return np.einsum("bthd,bshd->bhts", mixer.scheme.q_att, mixer.scheme.k_att)


def scores(model):
    s = model.blocks[0].mixer.scheme
    mixer = model.blocks[0].mixer
    q, k = (s.q_att, s.k_att) if hasattr(s, "q_att") else (mixer.q_att, mixer.k_att)
    return np.einsum("bthd,bshd->bhts", q, k)


@pytest.mark.parametrize("positional", ["ape_seq", "gridpe"])
def test_scores_depend_on_relative_position_only(positional):
    """Every token equal: q and k are the same at every position, so a score is a function
    of the positions alone, and it must be one of their difference (Toeplitz)."""
    model = Transformer(config(positional, **({"ape_no_init": True}
                                              if positional == "ape_seq" else {})),
                        seed=1, backend="numpy")
    model.forward(np.full((1, 9), 4))
    s = scores(model)[0, 0]
    for offset in range(-8, 9):
        diagonal = np.diagonal(s, offset)
        np.testing.assert_allclose(diagonal, diagonal[0], rtol=1e-10, atol=1e-12)
    assert np.ptp(np.diagonal(s, 0)) < 1e-10 and np.ptp(s) > 1e-3  # positions do matter


@pytest.mark.parametrize("positional", ["ape_grid", "gridpe"])
def test_2d_scores_depend_on_the_displacement_only(positional):
    cfg = ModelConfig(vocab_size=9, d_model=48, n_heads=2, positional=positional,
                      options={"coord_dims": 2, **({"ape_no_init": True, "ape_positions": 8}
                                                 if positional == "ape_grid" else {})})
    model = Transformer(cfg, seed=2, backend="numpy")
    coords = np.array([[0, 0], [1, 0], [3, 2], [4, 2], [2, 5], [3, 5], [0, 0], [6, 7]])
    model.forward(np.full((1, 8), 4), coordinates=coords[None])
    s = scores(model)[0]
    # token pairs (0, 1), (2, 3), (4, 5) have displacement (1, 0); 0 and 6 share a cell
    for h in range(2):
        np.testing.assert_allclose([s[h, 2, 3], s[h, 4, 5]], [s[h, 0, 1]] * 2, rtol=1e-10)
        np.testing.assert_allclose([s[h, 1, 0], s[h, 3, 2]], [s[h, 5, 4]] * 2, rtol=1e-10)
        np.testing.assert_allclose(s[h, 6], s[h, 0], rtol=1e-10)
    assert abs(s[0, 0, 1] - s[0, 0, 7]) > 1e-3


@pytest.mark.parametrize("random", [True, False])
def test_tree_scores_depend_on_the_path_only(random):
    """Every token equal: a score is a function of the two nodes, and it must be one of the
    path between them: every (parent, left child) pair scores alike, every (parent, right
    child) pair too; left-then-right and right-then-left differ once the generators do not
    commute (random ones), and coincide at RoPE's initialisation (commuting rotations)."""
    cfg = ModelConfig(vocab_size=9, d_model=32, n_heads=2, positional="ape_tree",
                      options={"ape_tree_depth": 3})
    model = Transformer(cfg, seed=4, backend="numpy")
    if random:
        gen = model.params.params[GENERATOR].value
        gen[...] = np.random.default_rng(0).standard_normal(gen.shape) * 0.3
    heap = np.array([1, 2, 3, 4, 5, 6, 7, 10, 13, 0])
    model.forward(np.full((1, heap.size), 4), coordinates=heap[None, :, None])
    s = scores(model)[0]
    at = {int(h): i for i, h in enumerate(heap)}
    for h in range(2):
        left = [s[h, at[p], at[2 * p]] for p in (1, 2, 3, 5)]
        right = [s[h, at[p], at[2 * p + 1]] for p in (1, 2, 3, 6)]
        np.testing.assert_allclose(left, left[0], rtol=1e-10)
        np.testing.assert_allclose(right, right[0], rtol=1e-10)
        assert abs(left[0] - right[0]) > 1e-4
        # up one level then down the other side: the same path from 4 to 5 as from 6 to 7
        np.testing.assert_allclose(s[h, at[4], at[5]], s[h, at[6], at[7]], rtol=1e-10)
        # 5 is left-then-right, 6 right-then-left; node 0 (no node) is at the root
        np.testing.assert_allclose(s[h, at[0], at[3]], s[h, at[1], at[3]], rtol=1e-10)
        differ = abs(s[h, at[1], at[5]] - s[h, at[1], at[6]])
        assert differ > 1e-4 if random else differ < 1e-10


def test_coordinates_are_required_and_checked():
    cfg = ModelConfig(vocab_size=9, d_model=48, n_heads=2, positional="gridpe",
                      options={"coord_dims": 2})
    model = Transformer(cfg, seed=0)
    with pytest.raises(ValueError, match="'gridpe' with coord_dims = 2 needs"):
        model.forward(np.zeros((1, 4), np.int32))
    with pytest.raises(ValueError, match=r"coordinates must have shape \(B, T, n\)"):
        model.forward(np.zeros((1, 4), np.int32), coordinates=np.zeros((1, 5, 2)))
    with pytest.raises(ValueError, match="coord_dims = 2 but the coordinates"):
        model.forward(np.zeros((1, 4), np.int32), coordinates=np.zeros((1, 4, 3)))
    with pytest.raises(ValueError, match="finite"):
        model.forward(np.zeros((1, 4), np.int32), coordinates=np.full((1, 4, 2), np.nan))
    tree = Transformer(ModelConfig(vocab_size=9, d_model=32, n_heads=2, positional="ape_tree",
                                   options={"ape_tree_depth": 2}))
    with pytest.raises(ValueError, match="'ape_tree' needs the tokens' heap numbers"):
        tree.forward(np.zeros((1, 4), np.int32))
    with pytest.raises(ValueError, match="index.* = 8 is out of range"):
        tree.forward(np.zeros((1, 2), np.int32), coordinates=[[[1], [8]]])
    grid = Transformer(ModelConfig(vocab_size=9, d_model=48, n_heads=2, positional="ape_grid",
                                   options={"coord_dims": 2, "ape_positions": 4}))
    with pytest.raises(ValueError, match="index.* = 4 is out of range"):
        grid.forward(np.zeros((1, 2), np.int32), coordinates=[[[0, 1], [4, 0]]])
    odd_chunks = ModelConfig(vocab_size=9, d_model=36, n_heads=2, positional="ape_grid",
                             options={"coord_dims": 2})  # chunks of 9
    with pytest.raises(ValueError, match="multiple of 2 n"):
        Transformer(odd_chunks)


def test_gridpe_frequencies():
    u = simplex_directions(2)
    np.testing.assert_allclose(u @ u.T, np.where(np.eye(3), 1.0, -0.5), atol=1e-12)
    np.testing.assert_allclose(simplex_directions(1), [[1.0], [-1.0]], atol=1e-12)
    f = gridpe_frequencies(2, 16, 2)  # S = 5 scales of 3 directions, one plane left at zero
    norms = np.linalg.norm(f, axis=-1)
    np.testing.assert_allclose(norms[0, :15], np.pi * np.exp(-np.arange(5) / 2).repeat(3))
    assert np.all(f[:, 15] == 0)
    # head 1 of 2 is turned by 120 / 2 degrees
    np.testing.assert_allclose((f[1, :3] * f[0, :3]).sum(-1) / np.pi ** 2, 0.5, atol=1e-12)
    # r = e^(1/n) minimises the neuron count N(r) = r^n / ln r of the paper
    for n in (1, 2, 3):
        r = np.linspace(1.05, 4, 20000)
        assert abs(r[np.argmin(r ** n / np.log(r))] - math.exp(1 / n)) < 1e-3


@pytest.mark.parametrize("positional,dims,decay", [("ape_seq", 1, 1.0), ("ape_seq", 1, 0.8),
                                                   ("ape_grid", 2, 1.0), ("ape_grid", 2, 0.8),
                                                   ("ape_tree", 1, 1.0), ("ape_tree", 1, 0.8)])
def test_generator_gradient_matches_finite_differences(positional, dims, decay):
    """Through both layers' maps, the doubling (the tree's levels) and expm's Frechet
    derivative (float64); ape_seq: its basis through both layers' folds and expm, its angles
    through the rotary op (and the decay); ape_grid, ape_tree: through the attention's
    per-pair decay factors too."""
    task = navigation.NavigationConfig(dims=dims, steps=5, grid_size=3, n_objects=3)
    batch = navigation.generate(task, 2, np.random.default_rng(0))
    coords = navigation.token_coordinates(batch)
    options = {"ape_decay": decay}
    if positional == "ape_tree":  # heap numbers 0 (no node) .. 7 of a depth-2 table
        coords = np.random.default_rng(1).integers(0, 8, batch.tokens.shape + (1,))
        options["ape_tree_depth"] = 2
    cfg = ModelConfig.for_task("rope", task, d_model=32, n_heads=2, n_layers=2,
                               positional=positional, ape_no_init=True, **options)
    model = Transformer(cfg, seed=0, backend="numpy")
    if positional == "ape_seq":
        params = [model.params.params[BASIS], model.params.params[ANGLES]]
        assert [p.shape for p in params] == [(2, 16, 16), (2, 8)]
    else:
        params = [model.params.params[GENERATOR]]
        generators = 2 if positional == "ape_tree" else dims
        assert params[0].shape == (generators, 2, 16 // dims, 16 // dims)

    def loss():
        return model.loss(batch.tokens, batch.targets, np.ones_like(batch.mask), coords)

    assert_param_gradients(model, loss, params)


@pytest.mark.parametrize("positional", ["ape_grid", "ape_tree"])
@pytest.mark.parametrize("mask", ["causal", "none"])
def test_grid_and_tree_decay_multiply_the_logits(positional, mask):
    """ape_decay = 0.8 on ape_grid (floor of the Euclidean distance) and ape_tree (the tree
    path; node 0 no decay): the attention gets the factors 0.8^d of every pair of tokens (the
    table by position ids), the output is the reference attention with those factors, it
    changes with the decay, and the C backend matches float64 (loss and gradients)."""
    if positional == "ape_grid":
        coords = np.array([[[0, 0], [1, 0], [3, 2], [4, 2], [2, 5], [0, 0], [6, 7]]] * 2)
        coords[1] = coords[1, ::-1]
        options = {"coord_dims": 2, "ape_positions": 8}
        d = ref.grid_distance(coords[:, :, None], coords[:, None, :])
    else:
        coords = np.array([[1, 2, 3, 4, 5, 10, 0], [7, 6, 0, 13, 1, 2, 3]])[..., None]
        options = {"ape_tree_depth": 3}
        a, b = coords[:, :, None, 0], coords[:, None, :, 0]
        d = np.where((a > 0) & (b > 0), ref.tree_distance(np.maximum(a, 1), np.maximum(b, 1)), 0)
        np.testing.assert_array_equal(node_distance(coords[:, :, None], coords[:, None, :]), d)
    tokens = np.random.default_rng(0).integers(0, 9, coords.shape[:2])
    assert_decay_reaches_attention(
        lambda decay: ModelConfig(vocab_size=9, d_model=32, n_heads=2, n_layers=2,
                                  positional=positional,
                                  options={**options, "ape_no_init": True, "ape_decay": decay,
                                           "attn_mask": mask}),
        tokens, coords, 0.8 ** d)


def test_decay_tables_refused_and_rebuilt_per_batch():
    """decay_factor raises naming ape_decay for more distinct positions than the op's table
    takes and for gamma^distance past float32; a model's second batch with other coordinates
    gets its own table (the loss a fresh model gives on it)."""
    l1 = lambda a, b: np.abs(a - b).sum(-1)  # noqa: E731
    with pytest.raises(ValueError, match="ape_decay"):
        decay_factor(np.arange(MAX_DECAY_POSITIONS + 1)[None, :, None], 1, l1, 0.98)
    with pytest.raises(ValueError, match="ape_decay"):
        decay_factor(np.array([[[0], [200]]]), 1, l1, 2.0)
    ids, table = decay_factor(np.array([[[5], [1], [5]]]), 2, l1, 0.5)
    np.testing.assert_array_equal(ids, [[1, 0, 1], [1, 0, 1]])
    np.testing.assert_array_equal(table, [[1.0, 0.5 ** 4], [0.5 ** 4, 1.0]])
    cfg = ModelConfig(vocab_size=9, d_model=32, n_heads=2, n_layers=2, positional="ape_grid",
                      options={"coord_dims": 2, "ape_positions": 8, "ape_decay": 0.7})
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 9, (2, 7))
    first, second = (rng.integers(0, 8, (2, 7, 2)) for _ in range(2))
    model = Transformer(cfg, seed=2, backend="numpy")
    model.loss(tokens, tokens, np.ones(tokens.shape), first)
    again = model.loss(tokens, tokens, np.ones(tokens.shape), second)
    fresh = Transformer(cfg, seed=2, backend="numpy").loss(tokens, tokens, np.ones(tokens.shape),
                                                           second)
    assert again == fresh


TASK = dict(dims=2, steps=6, grid_size=4, n_objects=3)


@pytest.mark.parametrize("positional", ["gridpe", "ape_seq", "ape_grid"])
def test_schemes_train_through_the_api(positional):
    train_config = TrainConfig(**TASK, sequences=24, batch_size=8, eval_sequences=2, lr=1e-2)
    task = train_config.task_config()
    cfg = ModelConfig.for_task("rope", task, d_model=48, n_heads=2, positional=positional)
    if positional != "ape_seq":
        assert cfg.options["coord_dims"] == 2
    result = train(cfg, train_config, progress=False, log=lambda *a: None)
    assert result["steps"] == 3 and math.isfinite(result["loss"])
    params = result["model"].params.params
    # the generator learned (no weight decay on it)
    for name in {"gridpe": [], "ape_seq": [BASIS, ANGLES]}.get(positional, [GENERATOR]):
        start = Transformer(cfg, seed=train_config.seed).params.params[name].value
        assert np.abs(params[name].value - start).max() > 1e-4


@pytest.mark.parametrize("positional,flags", [
    ("gridpe", []), ("ape_seq", ["--ape-no-init", "true"]), ("ape_grid", [])])
def test_schemes_train_through_the_cli(tmp_path, positional, flags):
    args = [sys.executable, "-m", "mapformer", "train", "--positional", positional,
            "--dims", "2", "--steps", "6", "--grid-size", "4", "--n-objects", "3",
            "--sequences", "8", "--batch-size", "8", "--eval-sequences", "2", "--d-model",
            "48", "--n-heads", "2", "--out", str(tmp_path), "--no-progress", "--json", *flags]
    run = subprocess.run(args, env=subprocess_env(1), capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["steps"] == 1 and math.isfinite(result["loss"])
    model = load_checkpoint(tmp_path / "checkpoint.npz")[0]
    assert model.config.positional == positional
    if positional != "ape_seq":
        assert model.config.options["coord_dims"] == 2
    if positional == "ape_grid":
        assert model.config.options["ape_positions"] == 8


def test_reproduce_scripts_have_decay_rows(monkeypatch):
    """APE's ape_seq_decay / ape_tree_decay (mapformer.reproduce.ape) and GridPE's
    ape_grid_decay (mapformer.reproduce.gridpe) rows configure ape_decay 0.98 (the paper's
    public code), the tree row as a prefix LM."""
    from mapformer import reproduce
    run = reproduce.table("ape", "a").make_run("reverse", "ape_seq_decay", 0)
    assert run.model["positional"] == "ape_seq" and run.model["options"]["ape_decay"] == 0.98
    run = reproduce.table("ape", "b").make_run("tree_copy breadth", "ape_tree_decay", 0)
    assert run.model["positional"] == "ape_tree" and run.model["options"]["ape_decay"] == 0.98
    assert run.model["options"]["attn_mask"] == "prefix"
    run = reproduce.table("gridpe", "navigation").make_run("", "ape_grid_decay", 0)
    assert run.model["positional"] == "ape_grid" and run.model["options"]["ape_decay"] == 0.98
