"""The digits image-classification tasks (issue 12): scikit-learn's 8x8 digits, shipped in
mapformer/data/digits.npz, as 64 pixel tokens with 2D coordinates ('digits') or pasted at a
random offset on a 16x16 canvas ('digits16'); the model's mean pooling (pool='mean'); the task
from Python, TrainConfig and the command line; and a small non-causal model learning above
chance on a tiny budget."""
import json

import numpy as np
import pytest

from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import digits
from mapformer.train import TrainConfig, task_module, train


def test_data_is_sklearns_digits():
    """1797 images of grey levels 0..16, about 180 of each digit, the first a 0 whose first
    row is scikit-learn's (digits.csv.gz, row 1: 0,0,5,13,9,1,0,0)."""
    images, labels = digits.load()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert images.max() == 16 and images.min() == 0
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert labels[:10].tolist() == list(range(10))
    assert images[0, 0].tolist() == [0, 0, 5, 13, 9, 1, 0, 0]
    assert int(images.astype(np.int64).sum()) == 561718
    assert not images.flags.writeable


def test_splits_are_disjoint_and_cover_the_data():
    parts = {s: digits.split_indices(42, s) for s in ("train", "dev", "test")}
    assert [len(parts[s]) for s in ("train", "dev", "test")] == [1257, 180, 360]
    assert np.array_equal(np.sort(np.concatenate(list(parts.values()))), np.arange(1797))
    assert not np.array_equal(digits.split_indices(7, "test"), parts["test"])
    with pytest.raises(ValueError, match="split"):
        digits.split_indices(42, "val")


def test_batches_tokens_coordinates_and_offsets():
    config = digits.preset("iid", canvas=16)
    assert (config.vocab_size, config.seq_len, config.coord_dims, config.coord_extent) == \
        (27, 256, 2, 16)
    batch = digits.generate(config, 6, 3)
    images, labels = digits.load()
    assert batch.tokens.shape == (6, 256) and batch.tokens.dtype == np.int32
    assert batch.targets[:, 0].tolist() == (17 + batch.labels).tolist()
    assert batch.mask.shape == (6, 1) and batch.mask.all()
    for b in range(6):
        canvas = batch.tokens[b].reshape(16, 16)
        r, c = batch.offsets[b]
        assert 0 <= r <= 8 and 0 <= c <= 8
        picked = canvas[r:r + 8, c:c + 8]
        i = np.flatnonzero((images == picked).all(axis=(1, 2)) & (labels == batch.labels[b]))
        assert i.size >= 1 and np.isin(i, digits.split_indices(42, "train")).any()
        outside = canvas.copy()
        outside[r:r + 8, c:c + 8] = 0
        assert not outside.any()
    coords = digits.token_coordinates(batch)
    assert coords.shape == (6, 256, 2) and coords[0, 17].tolist() == [1.0, 1.0]
    assert coords[0, 255].tolist() == [15.0, 15.0]
    assert len({tuple(o) for o in digits.generate(config, 64, 0).offsets}) > 20
    again = digits.generate(config, 6, 3)
    assert np.array_equal(again.tokens, batch.tokens)
    small = digits.generate(digits.preset("iid"), 4, 0)
    assert small.tokens.shape == (4, 64) and not small.offsets.any()


def test_eval_sets_are_fixed_and_capped():
    config = digits.preset("iid", canvas=16, eval_split="dev")
    sets = digits.eval_set(config, 1000, seed=5, batch_size=64)
    assert sum(len(b.labels) for b in sets) == 180 and len(sets) == 3
    again = digits.eval_set(config, 1000, seed=9, batch_size=64)
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(sets, again))
    first = digits.eval_set(config, 10, batch_size=64)[0]
    assert np.array_equal(first.tokens, sets[0].tokens[:10])
    assert list(digits.ood_sets(config)) == ["dev"]
    with pytest.raises(ValueError, match="loss_positions"):
        digits.loss_mask(first, "all")
    with pytest.raises(ValueError, match="canvas"):
        digits.preset("iid", canvas=4)
    with pytest.raises(ValueError, match="preset"):
        digits.preset("ood_sparse")


def test_task_from_train_config_and_model_defaults():
    """'digits' and 'digits16' are tasks of TrainConfig; a model for them is non-causal
    (attn_mask 'none' from the task) and reads 2D coordinates."""
    for name, canvas in (("digits", 8), ("digits16", 16)):
        task = TrainConfig(task=name).task_config()
        assert task == digits.DigitsConfig(canvas=canvas) and task_module(task) is digits
    task = digits.preset("iid", canvas=16)
    config = ModelConfig.for_task("rope", task, positional="ape_grid", d_model=32, n_heads=2)
    assert config.options["attn_mask"] == "none" and config.options["coord_dims"] == 2
    assert config.options["ape_positions"] == 32
    assert ModelConfig.for_task("rope", task, attn_mask="causal").options["attn_mask"] == \
        "causal"


@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_mean_pooling_is_the_mean_of_the_token_logits(backend):
    """pool='mean' gives (B, 1, V) logits equal to the mean over the tokens of the unpooled
    ones (the head is linear); the C and NumPy backends agree on the loss and gradients."""
    task = digits.preset("iid")
    batch = digits.generate(task, 3, 1)
    config = ModelConfig.for_task("rope", task, d_model=32, n_heads=2, n_layers=2)
    model = Transformer(config, seed=1, backend=backend)
    tokens = model.forward(batch.tokens)
    pooled = model.forward(batch.tokens, pool="mean")
    assert pooled.shape == (3, 1, 27) and tokens.shape == (3, 64, 27)
    np.testing.assert_allclose(pooled[:, 0], tokens.mean(axis=1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="pool"):
        model.forward(batch.tokens, pool="max")
    other = Transformer(config, seed=1, backend="numpy" if backend == "c" else "c")
    losses = []
    for m in (model, other):
        losses.append(m.loss(batch.tokens, batch.targets, batch.mask,
                             digits.token_coordinates(batch), None, "mean"))
        m.backward()
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    np.testing.assert_allclose(model.params.grad, other.params.grad, rtol=2e-3,
                               atol=2e-4 * np.abs(other.params.grad).max())


def test_small_model_learns_above_chance():
    """A 1-layer, d_model 32 non-causal RoPE classifier, 200 steps of 32 images (about 3 s):
    test accuracy well above chance (0.1) and the majority-class floor (0.13-0.15)."""
    config = TrainConfig(task="digits", sequences=32 * 200, batch_size=32, lr=1e-2,
                         weight_decay=0.01, schedule="cosine", warmup_steps=10,
                         eval_sequences=360, eval_batch_size=120, log_every=50)
    model = ModelConfig.for_task("rope", config.task_config(), d_model=32, n_heads=2,
                                 n_layers=1)
    result = train(model, config, progress=False, log=lambda *a: None)
    test = result["eval"]["iid"]
    assert test["positions"] == 360
    assert test["accuracy"] > 0.22 and test["accuracy"] > test["floor"] + 0.07, test


def test_command_line(tmp_path, capsys):
    """python -m mapformer train --task digits16 runs, pools and evaluates."""
    from mapformer.__main__ import main
    main(["train", "--task", "digits16", "--model", "rope", "--positional", "ape_grid",
          "--sequences", "16", "--batch-size", "8", "--eval-sequences", "8",
          "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--no-progress", "--json",
          "--out", str(tmp_path)])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["eval"]["iid"]["positions"] == 8
    assert 0.0 <= result["eval"]["iid"]["accuracy"] <= 1.0
