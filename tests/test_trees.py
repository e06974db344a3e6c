"""Tests of APE's tree transduction tasks (copy, rotation, C3 reduction, tree operations):
the operations and serialisations on hand-built trees, the random trees, the splits, a
tiny training run that learns tree copy with ape_tree and the command line (table (b)'s
spec: tests/test_reproduce_ape.py)."""
import json
import math

import numpy as np
import pytest

from mapformer.__main__ import main
from mapformer.models import ModelConfig
from mapformer.tasks import trees
from mapformer.train import TrainConfig, load_checkpoint, train

QUIET = dict(progress=False, log=lambda *a: None)
W = 16


def heap(nodes, width=W):
    """One tree as a heap array (1, width) from {heap number: label}."""
    out = np.full((1, width), -1, dtype=np.int16)
    for h, label in nodes.items():
        out[0, h] = label
    return out


def nodes(tree):
    """{heap number: label} of a heap array (1, W)."""
    return {int(h): int(tree[0, h]) for h in np.flatnonzero(tree[0] >= 0)}


# B(10, B(11, L0, L1), L2)
TREE = {1: 10, 2: 11, 3: 2, 4: 0, 5: 1}


def test_serialisations_of_a_hand_built_tree():
    tokens, heaps, counts = trees.serialise(heap(TREE), "breadth")
    assert counts.tolist() == [5]
    assert tokens[0, :5].tolist() == [10, 11, 2, 0, 1] and heaps[0, :5].tolist() == [1, 2, 3, 4, 5]
    assert (tokens[0, 5:] == -1).all() and (heaps[0, 5:] == 0).all()
    tokens, heaps, _ = trees.serialise(heap(TREE), "depth")  # pre-order
    assert tokens[0, :5].tolist() == [10, 11, 0, 1, 2] and heaps[0, :5].tolist() == [1, 2, 4, 5, 3]
    deep = heap({1: 10, 2: 11, 3: 12, 4: 0, 5: 13, 10: 1, 11: 2, 6: 3, 7: 4})
    assert trees.serialise(deep, "depth")[1][0, :9].tolist() == [1, 2, 4, 5, 10, 11, 3, 6, 7]
    assert trees.serialise(deep, "breadth")[1][0, :9].tolist() == [1, 2, 3, 4, 5, 6, 7, 10, 11]


def test_rotation_by_the_public_codes_rule():
    # rot(B(10, B(11, L0, L1), L2)) = B(11, rot(L0), B(10, rot(L1), rot(L2)))
    out, overflow = trees.rotate(heap(TREE), W)
    assert nodes(out) == {1: 11, 2: 0, 3: 10, 6: 1, 7: 2} and not overflow[0]
    # a node whose left child is a leaf stays, its right subtree not visited
    right = {1: 10, 2: 0, 3: 11, 6: 12, 7: 3, 12: 1, 13: 2}
    assert nodes(trees.rotate(heap(right), W)[0]) == right
    # nested: B(10, B(11, B(12, L0, L1), L2), L3) -> B(11, B(12, L0, L1), B(10, L2, L3))
    nested = heap({1: 10, 2: 11, 3: 3, 4: 12, 5: 2, 8: 0, 9: 1})
    assert nodes(trees.rotate(nested, W)[0]) == {1: 11, 2: 12, 4: 0, 5: 1, 3: 10, 6: 2, 7: 3}
    assert trees.rotate(heap(TREE), 4)[1][0]  # nodes 6 and 7 do not fit in a width of 4
    assert not trees.rotate(heap(TREE), 8)[1][0]


def test_c3_reduction_reduces_every_depth_one_subtree():
    # B(3, B(3, L1, L2), B(3, L2, L2)) -> B(3, L0, L1): (1 + 2) % 3 = 0, (2 + 2) % 3 = 1
    tree = heap({1: 3, 2: 3, 3: 3, 4: 1, 5: 2, 6: 2, 7: 2})
    assert nodes(trees.reduce_c3(tree)) == {1: 3, 2: 0, 3: 1}
    # B(3, B(3, L1, L2), L2) -> B(3, L0, L2); the root's left child is not a leaf
    assert nodes(trees.reduce_c3(heap({1: 3, 2: 3, 3: 2, 4: 1, 5: 2}))) == {1: 3, 2: 0, 3: 2}
    assert nodes(trees.reduce_c3(heap({1: 2}))) == {1: 2}  # a leaf stays


def test_tree_operations_on_a_hand_built_base():
    base = np.repeat(heap({1: 70, 2: 5, 3: 71, 6: 6, 7: 7}), 5, axis=0)  # B(70, L5, B(71, L6, L7))
    node = np.array([3, 3, 3, 3, 2])
    op = np.array([0, 1, 2, 3, 1])
    x, y = trees.tree_ops(base, node, op, W)
    for i in range(4):  # x = B(124 + op, L71, base)
        assert nodes(x[i:i + 1]) == {1: 124 + i, 2: 71, 3: 70, 6: 5, 7: 71, 14: 6, 15: 7}
    assert nodes(y[0:1]) == {1: 71, 2: 6, 3: 7}  # extract
    assert nodes(y[1:2]) == {1: 71, 2: 7, 3: 6}  # flip-extract
    assert nodes(y[2:3]) == {1: 70, 2: 5, 3: 71}  # truncate
    assert nodes(y[3:4]) == {1: 70, 2: 5, 3: 71, 6: 6, 7: 7}  # no-op
    assert nodes(y[4:5]) == {1: 5} and nodes(x[4:5])[2] == 5  # flip-extract of a leaf


def test_batch_layout_and_heap_numbers():
    config = trees.TreeConfig(operation="copy")  # 20 labels: separator 20, padding 21
    src = trees.serialise(np.concatenate([heap(TREE), heap({1: 3})]), "breadth")
    tgt = trees.serialise(np.concatenate([heap(TREE), heap({1: 3})]), "depth")
    batch = trees.make_batch(config, *src, *tgt)
    assert batch.tokens.tolist() == [[10, 11, 2, 0, 1, 20, 10, 11, 0, 1],
                                     [3, 20, 21, 21, 21, 21, 21, 21, 21, 21]]
    assert batch.targets.tolist() == [[11, 2, 0, 1, 20, 10, 11, 0, 1, 2],
                                      [20, 3, 21, 21, 21, 21, 21, 21, 21, 21]]
    assert batch.coordinates[..., 0].tolist() == [[1, 2, 3, 4, 5, 0, 1, 2, 4, 5],
                                                  [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.mask.sum(axis=1).tolist() == [5, 1] and batch.mask[0, 5:].all()
    assert trees.attention_prefix(batch).tolist() == [6, 2]
    assert trees.loss_mask(batch, "all").sum(axis=1).tolist() == [10, 2]


@pytest.mark.parametrize("operation", trees.OPERATIONS)
def test_random_trees_and_examples(operation):
    config = trees.TreeConfig(operation=operation, mean_depth=4)
    x, y, bad = trees.examples(config, 300, np.random.default_rng(1))
    leaves, operators = trees.LABELS[operation]
    h = np.arange(config.width)
    for tree in (x, y):
        present = tree >= 0
        assert (present[:, 2:] <= present[:, h[2:] // 2]).all()  # every node's parent exists
        assert (present[:, 2::2] == present[:, 3::2]).all()  # 0 or 2 children
        assert present[:, 1].all() and (tree[present] < config.n_labels).all()
    if operation != "ops":
        inner = (x >= 0) & has_children(x)
        assert (x[inner] >= leaves).all() and (x[(x >= 0) & ~inner] < leaves).all()
        depth = (trees.levels(config.width)[None, :] * (x >= 0)).max(axis=1)
        assert depth.min() >= config.min_depth and depth.max() <= config.max_depth
    if operation == "copy":
        assert (x == y).all()
    if operation == "ops":
        base_labels = np.sort(np.where(x >= 0, x, 999)[:, 3:], axis=1)
        live = base_labels < 999
        dup = (base_labels[:, 1:] == base_labels[:, :-1]) & live[:, 1:]
        assert not dup[~bad].any()  # unique labels in the base (its slots 3..; ptr at 2)
        assert ((x[:, 1] >= 124) & (x[:, 1] <= 127)).all()


def has_children(tree):
    out = np.zeros(tree.shape, dtype=bool)
    out[:, 1:tree.shape[1] // 2] = tree[:, 2::2] >= 0
    return out


def test_splits_disjoint_deterministic_and_prefix_consistent():
    config = trees.TreeConfig(operation="rotate", mean_depth=3, train_size=300)
    rows = {}
    for split, count in (("train", 300), ("dev", 100), ("test", 100)):
        tokens, heaps, counts = trees.split_examples(config, split, count)[:3]
        rows[split] = {tuple(zip(t[:c], h[:c])) for t, h, c in zip(tokens, heaps, counts)}
        assert len(rows[split]) == count  # no duplicate
    assert not rows["train"] & rows["dev"] and not rows["train"] & rows["test"]
    assert not rows["dev"] & rows["test"]
    first = trees.split_examples(config, "test", 50)
    again = trees.split_examples(trees.TreeConfig(operation="rotate", mean_depth=3,
                                                  order="depth"), "test", 100)
    assert (first[0] == again[0][:50]).all()  # the same sources, whatever the order / count
    other = trees.split_examples(trees.TreeConfig(operation="rotate", mean_depth=3,
                                                  data_seed=7), "test", 50)
    assert (first[0] != other[0]).any()
    a = trees.generate(config, 8, 5)
    b = trees.generate(config, 8, 5)
    assert (a.tokens == b.tokens).all() and (a.coordinates == b.coordinates).all()


def test_config_checks_and_task_options():
    config = trees.TreeConfig(operation="ops")
    assert (config.n_labels, config.vocab_size, config.min_depth, config.max_depth) == (
        128, 130, 3, 7)
    assert (config.max_level, config.width, config.tree_levels) == (7, 256, 7)
    assert trees.TreeConfig(operation="rotate").max_level == 8  # rotations grow one deeper
    with pytest.raises(ValueError, match="operation"):
        trees.TreeConfig(operation="flip")
    with pytest.raises(ValueError, match="order"):
        trees.TreeConfig(order="inorder")
    with pytest.raises(ValueError, match="max_level"):
        trees.TreeConfig(max_level=3)
    task = TrainConfig(task="tree_ops", tree_depth=4, tree_order="depth").task_config()
    assert (task.operation, task.mean_depth, task.order) == ("ops", 4, "depth")
    model = ModelConfig.for_task("rope", task, positional="ape_tree")
    assert model.options["ape_tree_depth"] == task.tree_levels == 6
    grid = ModelConfig.for_task("rope", task, positional="ape_grid")
    assert grid.options["coord_source"] == "index"  # heap numbers are for ape_tree only


def test_tiny_training_learns_tree_copy_with_ape_tree():
    train_config = TrainConfig(task="tree_copy", tree_depth=3, sequences=32 * 150,
                               batch_size=32, lr=3e-3, weight_decay=0.01, schedule="cosine",
                               warmup_steps=10, eval_sequences=64, eval_batch_size=64)
    task = train_config.task_config()
    model_config = ModelConfig.for_task("rope", task, positional="ape_tree", d_model=32,
                                        n_heads=2, n_layers=2, attn_mask="prefix")
    result = train(model_config, train_config, **QUIET)
    iid = result["eval"]["iid"]
    # chance: perplexity 20 (20 labels), accuracy 1/20 (the floor 0.07); measured 5.7, 0.60
    assert iid["perplexity"] < 8.0 and iid["accuracy"] > 0.4
    assert iid["perplexity"] == pytest.approx(math.exp(iid["loss"]))


def test_cli_trains_and_evaluates_a_tree_task(tmp_path, capsys):
    main(["train", "--task", "tree_rotate", "--tree-depth", "3", "--tree-order", "depth",
          "--sequences", "8", "--batch-size", "8", "--eval-sequences", "4", "--d-model", "32",
          "--n-heads", "2", "--positional", "ape_tree", "--attn-mask", "prefix",
          "--no-progress", "--json", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "perplexity" in out and "exact match" in out
    result = json.loads(out.strip().splitlines()[-1])
    model, _, train_config, step = load_checkpoint(tmp_path / "checkpoint.npz")
    assert step == 1 and model.config.vocab_size == 22
    assert model.config.options["ape_tree_depth"] == 6  # depths 2..5, rotations one deeper
    assert train_config.task_config() == trees.TreeConfig(operation="rotate", mean_depth=3,
                                                          order="depth")
    main(["eval", str(tmp_path / "checkpoint.npz"), "--json"])
    again = json.loads(capsys.readouterr().out)
    assert again["iid"]["perplexity"] == pytest.approx(result["eval"]["iid"]["perplexity"])
    main(["train", "--task", "tree_c3", "--tree-depth", "3", "--sequences", "4",
          "--batch-size", "4", "--eval-sequences", "2", "--d-model", "32", "--n-heads", "2",
          "--positional", "rope", "--no-progress", "--json"])
    assert math.isfinite(json.loads(capsys.readouterr().out.strip().splitlines()[-1])[
        "eval"]["iid"]["perplexity"])
