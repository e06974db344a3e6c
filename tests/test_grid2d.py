"""Tests of the 2D grid transduction tasks (copy, transpose, rotate90, flip): the target is the
operated source grid for many samples, the page coordinates, the splits, argument checks, and
tiny training runs through the trainer and the command line with 2D schemes."""
import json
import math

import numpy as np
import pytest

from mapformer.__main__ import main
from mapformer.models import ModelConfig
from mapformer.tasks import grid2d
from mapformer.train import TASKS, TrainConfig, train

QUIET = dict(progress=False, log=lambda *a: None)
NUMPY_OP = {"copy": lambda g: g, "transpose": lambda g: g.T, "rotate90": lambda g: np.rot90(g, -1),
            "flip": np.flipud}


def read_grids(tokens, config):
    """Split one full token sequence (no padding) at newlines into (source, target) grids."""
    sep = list(tokens).index(config.separator_id)
    out = []
    for part in (tokens[:sep], tokens[sep + 1:]):
        rows, row = [], []
        for t in part:
            if t == config.newline_id:
                rows.append(row)
                row = []
            else:
                row.append(t)
        assert row == []  # every row ends with a newline
        out.append(np.array(rows))
    return out


@pytest.mark.parametrize("operation", grid2d.OPERATIONS)
def test_the_target_is_the_operated_source_for_many_grids(operation):
    config = grid2d.GridConfig(operation=operation, n_symbols=7)
    batch = grid2d.generate(config, 300, rng=3)
    hw = set()
    for b in range(300):
        real = batch.lengths[b] + batch.mask[b].sum()  # input columns n + m
        full = np.concatenate([batch.tokens[b, :1], batch.targets[b, :real]])
        assert (batch.tokens[b, 1:real] == batch.targets[b, :real - 1]).all()
        assert (batch.tokens[b, real:] == config.pad_id).all()
        source, target = read_grids(full, config)
        assert source.shape == tuple(batch.shapes[b])
        np.testing.assert_array_equal(target, NUMPY_OP[operation](source))
        hw.add(source.shape)
        assert batch.lengths[b] == source.shape[0] * (source.shape[1] + 1)
        assert (np.flatnonzero(batch.mask[b]) == np.arange(batch.lengths[b], real)).all()
    assert hw == {(h, w) for h in range(4, 7) for w in range(4, 7)}  # every shape 4..6 drawn


def test_page_coordinates_of_a_hand_checked_transpose():
    config = grid2d.GridConfig(operation="transpose", mean_side=3, spread=1, n_symbols=5)
    grids = np.full((1, 4, 4), -1)
    grids[0, :2, :3] = [[0, 1, 2], [3, 4, 0]]
    batch = grid2d.make_batch(config, grids, np.array([[2, 3]]))
    nl, sep = config.newline_id, config.separator_id
    full = [0, 1, 2, nl, 3, 4, 0, nl, sep, 0, 3, nl, 1, 4, nl, 2, 0, nl]
    assert batch.tokens[0].tolist() == full[:-1] and batch.targets[0].tolist() == full[1:]
    rows = [0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 3, 4, 4, 4, 5, 5]  # source, separator, target
    cols = [0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 1, 2, 0, 1, 2, 0, 1]
    coords = grid2d.token_coordinates(batch)
    assert coords.dtype == np.int64 and coords.shape == (1, 17, 2)
    assert coords[0, :, 0].tolist() == rows and coords[0, :, 1].tolist() == cols
    assert batch.mask[0].tolist() == [False] * 8 + [True] * 9
    assert grid2d.attention_prefix(batch).tolist() == [9]  # source and separator
    assert grid2d.loss_mask(batch, "all").sum() == 17


def test_coordinates_follow_the_cells_for_random_grids():
    for operation in grid2d.OPERATIONS:
        config = grid2d.GridConfig(operation=operation, mean_side=4, n_symbols=4)
        grids, shapes = grid2d.split_grids(config, "dev", 50)
        batch = grid2d.make_batch(config, grids, shapes)
        for b in range(50):
            h, w = shapes[b]
            th, tw = grid2d.target_shape(operation, h, w)
            n, m = batch.lengths[b], th * (tw + 1)
            xy = batch.coordinates[b]
            src = [(r, c) for r in range(h) for c in range(w + 1)]
            # the target's cells and newlines but the last newline (never an input)
            tgt = [(h + 1 + i, j) for i in range(th) for j in range(tw + 1)][:-1]
            assert [tuple(p) for p in xy[:n + m]] == src + [(h, 0)] + tgt
            assert (xy[n + m:] == 0).all()
            assert xy[:, 0].max() == h + th and xy[:, 1].max() == max(w, tw)
    assert grid2d.GridConfig().coord_extent == 19  # ood_large sides up to 9: rows up to 18


def test_splits_disjoint_deterministic_and_prefix_consistent():
    config = grid2d.GridConfig(mean_side=3, spread=1, n_symbols=3)
    keys = {}
    for split in ("train", "dev", "test"):
        grids, shapes = grid2d.split_grids(config, split, 300)
        k = grid2d.grid_keys(grids, shapes)
        assert len(np.unique(k, axis=0)) == 300  # distinct
        keys[split] = {tuple(row) for row in k}
    assert not (keys["train"] & keys["dev"] or keys["train"] & keys["test"]
                or keys["dev"] & keys["test"])
    grid2d._split.cache_clear()
    again = grid2d.split_grids(grid2d.GridConfig(operation="rotate90", mean_side=3, spread=1,
                                                 n_symbols=3, train_size=7), "train", 100)
    first = grid2d.split_grids(config, "train", 300)
    np.testing.assert_array_equal(again[0], first[0][:100])  # any operation, any prefix
    np.testing.assert_array_equal(again[1], first[1][:100])
    other = grid2d.split_grids(grid2d.GridConfig(mean_side=3, spread=1, n_symbols=3,
                                                 data_seed=1), "train", 100)
    assert not np.array_equal(other[0], first[0][:100])
    a = grid2d.generate(config, 16, rng=5)
    b = grid2d.generate(config, 16, rng=5)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    sets = grid2d.ood_sets(config)
    assert (sets["ood_large"].min_side, sets["ood_large"].max_side) == (5, 7)
    assert sets["dev"].eval_split == "dev"
    with pytest.raises(ValueError, match="fewer than 100 distinct"):
        grid2d.split_grids(grid2d.GridConfig(mean_side=2, spread=0, n_symbols=2), "test", 100)


def test_bad_arguments_name_the_argument():
    for bad, name in ((dict(operation="rotate"), "operation"), (dict(mean_side=1), "mean_side"),
                      (dict(spread=-1), "spread"), (dict(mean_side=3, spread=2), "spread"),
                      (dict(n_symbols=1), "n_symbols"), (dict(train_size=0), "train_size"),
                      (dict(eval_split="train"), "eval_split"), (dict(mean_side=4.5),
                                                                 "mean_side")):
        with pytest.raises(ValueError, match=name):
            grid2d.GridConfig(**bad)
    config = grid2d.GridConfig()
    with pytest.raises(ValueError, match="batch_size"):
        grid2d.generate(config, 0)
    with pytest.raises(ValueError, match="n_sequences"):
        grid2d.eval_set(config, 0)
    with pytest.raises(ValueError, match="split"):
        grid2d.split_grids(config, "val", 3)
    with pytest.raises(ValueError, match="loss_positions"):
        grid2d.loss_mask(grid2d.generate(config, 2, rng=0), "observations")
    with pytest.raises(ValueError, match="preset"):
        grid2d.preset("ood_dense")
    with pytest.raises(ValueError, match="loss_positions"):
        TrainConfig(task="grid_flip", loss_positions="observations")
    with pytest.raises(ValueError, match="spread"):  # a grid side of 1 through --grid-side 2
        TrainConfig(task="grid_flip", grid_side=2)


def test_train_config_and_model_defaults_from_the_task():
    assert {f"grid_{op}" for op in grid2d.OPERATIONS} <= set(TASKS)
    train_config = TrainConfig(task="grid_rotate90", grid_side=4, n_symbols=9)
    task = train_config.task_config()
    assert task == grid2d.GridConfig(operation="rotate90", mean_side=4, n_symbols=9)
    assert set(train_config.eval_tasks()) == {"iid", "dev", "ood_large"}
    axial = ModelConfig.for_task("rope", task, positional="rope_axial")
    assert (axial.vocab_size, axial.options["coord_dims"], axial.options["coord_source"]) == (
        12, 2, "task")
    ape = ModelConfig.for_task("rope", task, positional="ape_grid")
    assert ape.options["ape_positions"] == 2 * task.coord_extent == 34  # ood rows up to 16


@pytest.mark.parametrize("positional", ["ape_grid", "rope_axial"])
def test_tiny_training_through_the_trainer(positional):
    train_config = TrainConfig(task="grid_transpose", grid_side=3, sequences=4 * 16,
                               batch_size=16, lr=3e-3, eval_sequences=16, eval_batch_size=16)
    task = train_config.task_config()
    model_config = ModelConfig.for_task("rope", task, positional=positional, d_model=32,
                                        n_heads=2, n_layers=1, attn_mask="prefix")
    result = train(model_config, train_config, **QUIET)
    assert result["steps"] == 4 and math.isfinite(result["loss"])
    for name in ("iid", "dev", "ood_large"):
        r = result["eval"][name]
        # chance: 20 symbols and the newline, perplexity near 21 after 4 steps
        assert 10 < r["perplexity"] < 30 and r["perplexity"] == pytest.approx(math.exp(r["loss"]))
        assert 0.0 <= r["sequence_accuracy"] <= 1.0
    model = result["model"]
    batch = grid2d.generate(task, 3, rng=0)
    logits = model.forward(batch.tokens, coordinates=grid2d.token_coordinates(batch),
                           prefix=grid2d.attention_prefix(batch))
    assert model.ops.to_numpy(logits).reshape(batch.tokens.shape + (-1,)).shape == (
        3, batch.tokens.shape[1], task.vocab_size)


def test_cli_trains_a_grid_task(capsys):
    main(["train", "--task", "grid_flip", "--grid-side", "3", "--sequences", "8",
          "--batch-size", "8", "--eval-sequences", "4", "--d-model", "32", "--n-heads", "2",
          "--positional", "gridpe", "--no-progress", "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result["eval"]) == {"iid", "dev", "ood_large"}
    assert math.isfinite(result["eval"]["ood_large"]["perplexity"])
