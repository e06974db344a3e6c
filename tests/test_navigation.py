"""Tests of the forced-navigation task generator against slow pure-Python references."""

import math

import numpy as np
import pytest

from mapformer.tasks import navigation as nav


def step_vector(action, dims):
    """The move of one action id as a list of dims ints (slow reference)."""
    move = [0] * dims
    move[action // 2] = 1 if action % 2 == 0 else -1
    return move


def mask_ref(batch, cfg):
    """The loss mask (B, 2T) from positions alone, one step at a time (slow reference)."""
    B, T = batch.positions.shape[:2]
    mask = np.zeros((B, 2 * T), dtype=bool)
    for b in range(B):
        seen = set()
        for t in range(T):
            cell = tuple(int(x) for x in batch.positions[b, t])
            mask[b, 2 * t] = cell in seen
            seen.add(cell)
    return mask


@pytest.mark.parametrize("dims", [1, 2, 3, 4, 5])
def test_layout_shapes_and_vocab(dims):
    cfg = nav.NavigationConfig(dims=dims, steps=37, grid_size=5, n_objects=7)
    batch = nav.generate(cfg, 9, 0)
    assert cfg.n_actions == 2 * dims
    assert cfg.blank_id == 2 * dims + 7
    assert cfg.vocab_size == 2 * dims + 8
    assert cfg.seq_len == 74
    assert cfg.action_ids() == range(0, 2 * dims)
    assert cfg.object_ids() == range(2 * dims, 2 * dims + 7)
    assert batch.tokens.shape == batch.targets.shape == batch.mask.shape == (9, 74)
    assert batch.positions.shape == (9, 37, dims)
    assert batch.tokens.dtype == batch.targets.dtype == np.int32
    assert batch.mask.dtype == np.bool_
    assert batch.positions.dtype == np.int64
    actions, obs = batch.tokens[:, 0::2], batch.tokens[:, 1::2]
    assert actions.min() >= 0 and actions.max() < 2 * dims
    assert obs.min() >= 2 * dims and obs.max() <= cfg.blank_id
    assert set(np.unique(actions)) == set(range(2 * dims))
    assert not batch.mask[:, 1::2].any()


@pytest.mark.parametrize("dims", [1, 2, 3, 5])
def test_positions_follow_actions_mod_grid(dims):
    cfg = nav.NavigationConfig(dims=dims, steps=50, grid_size=4)
    batch = nav.generate(cfg, 6, 1)
    pos = batch.positions
    assert pos.min() >= 0 and pos.max() < 4
    actions = batch.tokens[:, 0::2]
    for b in range(6):
        for t in range(1, 50):
            expected = (pos[b, t - 1] + step_vector(int(actions[b, t]), dims)) % 4
            np.testing.assert_array_equal(pos[b, t], expected)


@pytest.mark.parametrize("dims", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("fixed", [False, True])
def test_mask_matches_slow_reference(dims, fixed):
    cfg = nav.NavigationConfig(dims=dims, steps=40, grid_size=3, fixed_map=fixed)
    batch = nav.generate(cfg, 8, 2)
    ref = mask_ref(batch, cfg)
    np.testing.assert_array_equal(batch.mask, ref)
    assert 0 < ref.sum() < 8 * 40  # both revisits and first visits occur on this small grid


def test_start_cell_counts_only_once_observed():
    cfg = nav.NavigationConfig(dims=1, steps=3, grid_size=10)
    batch = nav.generate(cfg, 2000, 3)
    a = batch.tokens[:, 0::2]
    back = a[:, 0] != a[:, 1]  # a_2 undoes a_1: p_2 is the unobserved start cell
    assert back.sum() > 500
    assert not batch.mask[back, 2].any()
    # a_3 undoing a_2 returns to p_1, observed at t=1
    assert batch.mask[a[:, 1] != a[:, 2], 4].all()


def test_targets_are_next_tokens():
    cfg = nav.NavigationConfig(steps=64, grid_size=8)
    batch = nav.generate(cfg, 16, 4)
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.tokens[:, 1:])
    assert (batch.targets[:, -1] == cfg.blank_id).all()


@pytest.mark.parametrize("dims", [1, 2, 5])
def test_map_consistent_within_sequence(dims):
    cfg = nav.NavigationConfig(dims=dims, steps=200, grid_size=4, p_empty=0.3)
    batch = nav.generate(cfg, 10, 5)
    obs = batch.tokens[:, 1::2]
    n_revisits = 0
    for b in range(10):
        content = {}
        for t in range(200):
            cell = tuple(int(x) for x in batch.positions[b, t])
            if cell in content:
                assert obs[b, t] == content[cell]
                assert batch.targets[b, 2 * t] == content[cell]
                n_revisits += 1
            content[cell] = obs[b, t]
    assert n_revisits == batch.mask.sum() > 0


def lags_ref(batch):
    """Steps since each step's cell was last visited, 0 at a first visit (slow reference)."""
    B, T = batch.positions.shape[:2]
    lags = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        last = {}
        for t in range(T):
            cell = tuple(int(x) for x in batch.positions[b, t])
            lags[b, t] = t - last[cell] if cell in last else 0
            last[cell] = t
    return lags


@pytest.mark.parametrize("dims, grid, steps, walk", [(1, 4, 33, "uniform"),
                                                     (2, 7, 40, "no_backtrack"),
                                                     (3, 3, 25, "uniform"),
                                                     (5, 5, 16, "no_backtrack")])
def test_visit_lags_match_the_slow_reference(dims, grid, steps, walk):
    cfg = nav.NavigationConfig(dims=dims, steps=steps, grid_size=grid, walk=walk,
                               action_repeat=2)
    batch = nav.generate(cfg, 9, 3)
    lags = nav.visit_lags(batch)
    np.testing.assert_array_equal(lags, lags_ref(batch))
    np.testing.assert_array_equal(lags > 0, batch.mask[:, 0::2])
    recall = nav.recall_lags(batch)
    np.testing.assert_array_equal(recall[:, 0::2], lags)
    assert (recall[:, 1::2] == 0).all()
    if walk == "no_backtrack" and dims > 1:
        assert lags.max() > 2 and not (lags == 2).any()  # never straight back
    else:
        assert (lags == 2).any()


def test_per_sequence_maps_differ():
    cfg = nav.NavigationConfig(dims=1, steps=400, grid_size=8, p_empty=0.0)
    batch = nav.generate(cfg, 2, 6)
    maps = []
    for b in range(2):
        m = np.full(8, -1)
        m[batch.positions[b, :, 0]] = batch.tokens[b, 1::2]
        assert (m >= 0).all()  # 400 steps visit every cell of an 8-cycle
        maps.append(m)
    assert not np.array_equal(maps[0], maps[1])


def test_fixed_map_shared_across_sequences_and_batches():
    cfg = nav.NavigationConfig(dims=2, steps=100, grid_size=6, fixed_map=True, map_seed=7)
    world = nav.fixed_map(cfg)
    assert world.shape == (6, 6) and world.dtype == np.int32
    assert not world.flags.writeable
    for seed in (0, 1):
        batch = nav.generate(cfg, 12, seed)
        cells = tuple(batch.positions[..., j] for j in range(2))
        np.testing.assert_array_equal(batch.tokens[:, 1::2], world[cells])
    other = nav.fixed_map(nav.NavigationConfig(dims=2, grid_size=6, fixed_map=True, map_seed=8))
    assert not np.array_equal(world, other)
    with pytest.raises(ValueError, match="fixed_map"):
        nav.fixed_map(nav.NavigationConfig())


def test_fixed_map_blank_fraction():
    cfg = nav.NavigationConfig(dims=2, grid_size=200, p_empty=0.3, fixed_map=True)
    world = nav.fixed_map(cfg)
    assert abs(np.mean(world == cfg.blank_id) - 0.3) < 0.01
    objects = world[world != cfg.blank_id]
    counts = np.bincount(objects - cfg.n_actions, minlength=cfg.n_objects)
    assert counts.size == 16 and counts.min() > 0.8 * objects.size / 16


@pytest.mark.parametrize("p_empty", [0.2, 0.5, 0.8])
def test_blank_floor_is_p_empty(p_empty):
    # 512 x 128 steps on a 16 x 16 torus: the floor's std over seeds is about 0.005.
    cfg = nav.NavigationConfig(steps=128, grid_size=16, p_empty=p_empty)
    batch = nav.generate(cfg, 512, 8)
    assert abs(nav.blank_floor(batch, cfg.blank_id) - p_empty) < 0.025


def test_blank_floor_extremes_and_empty_mask():
    assert nav.blank_floor(nav.generate(nav.NavigationConfig(p_empty=0.0, grid_size=4), 4, 0), 20) == 0.0
    assert nav.blank_floor(nav.generate(nav.NavigationConfig(p_empty=1.0, grid_size=4), 4, 0), 20) == 1.0
    one_step = nav.generate(nav.NavigationConfig(steps=1), 4, 0)
    assert not one_step.mask.any()
    assert math.isnan(nav.blank_floor(one_step, 20))


def test_recall_accuracy():
    cfg = nav.NavigationConfig(steps=64, grid_size=8)
    batch = nav.generate(cfg, 32, 9)
    assert nav.recall_accuracy(batch.targets, batch) == 1.0
    logits = np.eye(cfg.vocab_size, dtype=np.float32)[batch.targets]  # (B, 2T, V)
    assert nav.recall_accuracy(logits, batch) == 1.0
    always_blank = np.full_like(batch.targets, cfg.blank_id)
    assert nav.recall_accuracy(always_blank, batch) == pytest.approx(nav.blank_floor(batch, cfg.blank_id))
    wrong = batch.targets.copy()
    rows, cols = np.nonzero(batch.mask)
    wrong[rows[::2], cols[::2]] = 0  # action id 0 is never a recall target
    assert nav.recall_accuracy(wrong, batch) == pytest.approx(1 - len(rows[::2]) / len(rows))
    with pytest.raises(ValueError, match="logits_or_predictions"):
        nav.recall_accuracy(batch.targets[:, :-1], batch)
    empty = nav.generate(nav.NavigationConfig(steps=1), 2, 0)
    assert math.isnan(nav.recall_accuracy(empty.targets, empty))


def test_determinism():
    cfg = nav.NavigationConfig(steps=50, grid_size=8, action_repeat=3)
    a, b, c = nav.generate(cfg, 4, 11), nav.generate(cfg, 4, 11), nav.generate(cfg, 4, 12)
    for field in ("tokens", "targets", "mask", "positions"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.tokens, c.tokens)
    from_gen = nav.generate(cfg, 4, np.random.default_rng(11))
    np.testing.assert_array_equal(a.tokens, from_gen.tokens)

    s1, s2 = nav.batches(cfg, 4, seed=3), nav.batches(cfg, 4, seed=3)
    first = [next(s1).tokens for _ in range(3)]
    second = [next(s2).tokens for _ in range(3)]
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first[0], first[1])

    e1, e2 = nav.eval_set(cfg, 10, seed=3, batch_size=4), nav.eval_set(cfg, 10, seed=3, batch_size=4)
    assert [len(x.tokens) for x in e1] == [4, 4, 2]
    for x, y in zip(e1, e2):
        np.testing.assert_array_equal(x.tokens, y.tokens)
    assert not np.array_equal(e1[0].tokens, first[0])  # eval and train streams differ for one seed


@pytest.mark.parametrize("repeat", [1, 2, 4, 9])
def test_action_repeat_run_statistics(repeat):
    # Runs have mean length (R+1)/2, so a run starts at a step with probability 2/(R+1) (away
    # from t = 0); a new run repeats the previous action with probability 1/(2n).
    dims = 2
    cfg = nav.NavigationConfig(dims=dims, steps=200, grid_size=16, action_repeat=repeat)
    a = nav.generate(cfg, 500, 13).tokens[:, 0::2]
    same = np.mean(a[:, 50:] == a[:, 49:-1])
    expected = 1 - 2 / (repeat + 1) * (1 - 1 / (2 * dims))
    assert abs(same - expected) < 0.01


def test_action_repeat_runs_longer_than_sequence():
    cfg = nav.NavigationConfig(dims=1, steps=10, grid_size=8, action_repeat=1000)
    a = nav.generate(cfg, 2000, 14).tokens[:, 0::2]
    # The first run covers all 10 steps with probability 991/1000.
    assert np.mean((a == a[:, :1]).all(axis=1)) > 0.98


def test_huge_grid_is_lazy_and_overflow_is_caught():
    cfg = nav.NavigationConfig(dims=5, steps=64, grid_size=1000)  # 1e15 cells
    batch = nav.generate(cfg, 8, 15)
    np.testing.assert_array_equal(batch.mask, mask_ref(batch, cfg))
    with pytest.raises(ValueError, match="2\\*\\*62"):
        nav.generate(nav.NavigationConfig(dims=5, grid_size=10**4), 1, 0)
    with pytest.raises(ValueError, match="2\\*\\*62"):
        nav.generate(nav.NavigationConfig(dims=3, grid_size=10**6), 5, 0)


@pytest.mark.parametrize(
    "field, value",
    [
        ("dims", 0), ("dims", 2.0), ("dims", True),
        ("steps", 0), ("steps", -3), ("steps", "8"),
        ("grid_size", 1), ("grid_size", 0),
        ("p_empty", -0.1), ("p_empty", 1.5), ("p_empty", float("nan")), ("p_empty", "0.5"),
        ("n_objects", 0),
        ("fixed_map", 1), ("fixed_map", None),
        ("action_repeat", 0), ("action_repeat", 1.5),
        ("map_seed", -1),
    ],
)
def test_bad_config_values_raise(field, value):
    with pytest.raises(ValueError, match=field):
        nav.NavigationConfig(**{field: value})


def test_other_bad_values_raise():
    with pytest.raises(ValueError, match="fixed_map"):
        nav.NavigationConfig(dims=3, grid_size=216, fixed_map=True)  # 10_077_696 cells
    nav.NavigationConfig(dims=3, grid_size=215, fixed_map=True)  # 9_938_375 cells is allowed
    with pytest.raises(ValueError, match="batch_size"):
        nav.generate(nav.NavigationConfig(), 0, 0)
    with pytest.raises(ValueError, match="n_sequences"):
        nav.eval_set(nav.NavigationConfig(), 0, 0)
    with pytest.raises(ValueError, match="iid.*ood_dense.*ood_sparse|ood_dense.*iid"):
        nav.preset("ood")


def test_presets():
    assert nav.PRESETS == {
        "iid": dict(steps=128, p_empty=0.5, grid_size=64),
        "ood_dense": dict(steps=64, p_empty=0.2, grid_size=32),
        "ood_sparse": dict(steps=512, p_empty=0.8, grid_size=128),
        "table3": dict(steps=16, p_empty=0.5, grid_size=64),
    }
    table3 = nav.table3_ood_sets(nav.preset("table3"))
    assert (table3["ood_dense"].steps, table3["ood_dense"].grid_size) == (8, 32)
    assert (table3["ood_sparse"].steps, table3["ood_sparse"].grid_size,
            table3["ood_sparse"].p_empty) == (32, 128, 0.8)
    expected = {
        # dims: (iid, ood_dense, ood_sparse) as (steps, grid_size, p_empty)
        1: ((128, 64, 0.5), (64, 32, 0.2), (512, 128, 0.8)),
        2: ((128, 64, 0.5), (64, 32, 0.2), (512, 128, 0.8)),
        3: ((256, 16, 0.5), (128, 8, 0.2), (1024, 32, 0.8)),
        5: ((16, 5, 0.5), (8, 3, 0.2), (64, 10, 0.8)),
    }
    for dims, rows in expected.items():
        for name, (steps, grid, p) in zip(("iid", "ood_dense", "ood_sparse"), rows):
            cfg = nav.preset(name, dims=dims)
            assert (cfg.dims, cfg.steps, cfg.grid_size, cfg.p_empty) == (dims, steps, grid, p)
            assert (cfg.n_objects, cfg.fixed_map, cfg.action_repeat) == (16, False, 1)
    cfg = nav.preset("ood_sparse", dims=3, steps=20, fixed_map=True)
    assert (cfg.steps, cfg.grid_size, cfg.fixed_map) == (20, 32, True)
    assert nav.preset("iid").vocab_size == 21


def test_no_backtrack_walks_never_undo_a_step():
    """walk "no_backtrack": no action is the inverse of the one before it (with action_repeat:
    no run's action undoes the previous run's), every other action still drawn; the walk
    reaches the train config through task_options and stays in the derived OOD sets; a
    uniform walk's description (and so a run's id) has no walk field, as before it existed."""
    from mapformer.experiments.runs import task_to_dict
    from mapformer.train import TrainConfig
    config = nav.NavigationConfig(dims=2, steps=64, grid_size=16, walk="no_backtrack")
    actions = nav.generate(config, 256, np.random.default_rng(3)).tokens[:, 0::2]
    assert not np.any(actions[:, 1:] == (actions[:, :-1] ^ 1))
    assert set(np.unique(actions)) == {0, 1, 2, 3}
    follows = np.bincount(4 * actions[:, :-1].ravel() + actions[:, 1:].ravel(), minlength=16)
    assert follows.reshape(4, 4)[[0, 1, 2, 3], [1, 0, 3, 2]].sum() == 0
    assert follows.min() == 0 and np.sort(follows)[4] > 0  # the 12 allowed pairs all occur
    runs = nav.NavigationConfig(dims=2, steps=64, grid_size=16, walk="no_backtrack",
                            action_repeat=3)
    a = nav.generate(runs, 64, np.random.default_rng(4)).tokens[:, 0::2]
    assert not np.any(a[:, 1:] == (a[:, :-1] ^ 1))
    train = TrainConfig(task="navigation", steps=16, grid_size=8,
                        task_options={"walk": "no_backtrack"})
    assert {t.walk for t in train.eval_tasks().values()} == {"no_backtrack"}
    assert "walk" not in task_to_dict(nav.NavigationConfig())
    assert task_to_dict(config)["walk"] == "no_backtrack"
    with pytest.raises(ValueError, match="walk must be one of"):
        nav.NavigationConfig(walk="spiral")
    with pytest.raises(ValueError, match="task 'navigation' has options"):
        TrainConfig(task="navigation", task_options={"walks": 3})


def test_wrapped_recalls_go_round_the_torus():
    """wrapped_recalls marks the recalls reached by going round the torus: none where the
    walk is too short to go round, only recalls of lag >= the grid's side in 1D, and on the
    OOD-dense set of Table 2 under runs of 6 actions about a third of the object recalls."""
    wide = nav.NavigationConfig(dims=2, steps=24, grid_size=64)
    batch = nav.generate(wide, 32, 0)
    assert batch.mask.any() and not nav.wrapped_recalls(batch, wide).any()
    ring = nav.NavigationConfig(dims=1, steps=16, grid_size=8, p_empty=0.2, action_repeat=6)
    shares = []
    for seed in range(4):
        batch = nav.generate(ring, 64, seed)
        wrapped = nav.wrapped_recalls(batch, ring)
        assert not (wrapped & ~batch.mask).any()
        assert (nav.recall_lags(batch)[wrapped] >= ring.grid_size).all()
        objects = batch.mask & (batch.targets != ring.blank_id)
        shares.append((wrapped & objects).sum() / objects.sum())
    assert 0.2 < np.mean(shares) < 0.45
