"""Tests of APE's sequence transduction tasks (copy, repeat, reverse): the generator's layout on
hand-made sources, padding, the splits, the metrics, and one training step through the API
and the command line."""
import json
import math

import numpy as np
import pytest

from mapformer.__main__ import main
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import transduction as tr
from mapformer.train import TrainConfig, evaluate, load_checkpoint, train

QUIET = dict(progress=False, log=lambda *a: None)
SMALL = dict(mean_length=6, n_symbols=5)  # separator 5, padding 6
SOURCES = np.array([[0, 1, 2, 6, 6], [3, 4, 0, 1, 2]])  # n = 3 and 5 (padded with 6)
LENGTHS = np.array([3, 5])
EXPECTED = {  # the full sequences source SEP target, padded with 6
    "copy": [[0, 1, 2, 5, 0, 1, 2, 6, 6, 6, 6],
             [3, 4, 0, 1, 2, 5, 3, 4, 0, 1, 2]],
    "repeat": [[0, 1, 2, 5, 0, 1, 2, 0, 1, 2, 6, 6, 6, 6, 6, 6],
               [3, 4, 0, 1, 2, 5, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]],
    "reverse": [[0, 1, 2, 5, 2, 1, 0, 6, 6, 6, 6],
                [3, 4, 0, 1, 2, 5, 2, 1, 0, 4, 3]],
}


@pytest.mark.parametrize("operation", tr.OPERATIONS)
def test_batch_of_hand_made_sources(operation):
    config = tr.TransductionConfig(operation=operation, **SMALL)
    assert (config.separator_id, config.pad_id, config.vocab_size) == (5, 6, 7)
    batch = tr.make_batch(config, SOURCES, LENGTHS)
    full = np.array(EXPECTED[operation])
    m = LENGTHS * (2 if operation == "repeat" else 1)
    real = np.arange(full.shape[1] - 1)[None, :] < (LENGTHS + m)[:, None]  # input columns
    np.testing.assert_array_equal(batch.tokens, np.where(real, full[:, :-1], 6))
    np.testing.assert_array_equal(batch.targets, full[:, 1:])
    expected_mask = np.zeros(batch.tokens.shape, dtype=bool)
    for b in range(2):  # the columns n .. n+m-1, whose targets are the target tokens
        expected_mask[b, LENGTHS[b]:LENGTHS[b] + m[b]] = True
    np.testing.assert_array_equal(batch.mask, expected_mask)
    assert (batch.tokens.dtype, batch.targets.dtype) == (np.int32, np.int32)
    np.testing.assert_array_equal(tr.loss_mask(batch, "revisits"), expected_mask)
    np.testing.assert_array_equal(tr.loss_mask(batch, "all"), real)
    assert np.all(batch.tokens[~real] == config.pad_id)
    assert np.all(batch.targets[~batch.mask & ~real] == config.pad_id)


@pytest.mark.parametrize("operation", tr.OPERATIONS)
def test_generated_batches_relate_source_and_target(operation):
    config = tr.TransductionConfig(operation=operation, mean_length=9, n_symbols=7,
                                   train_size=300)
    batch = tr.generate(config, 40, 1)
    assert config.min_length <= batch.lengths.min() and batch.lengths.max() <= config.max_length
    assert batch.tokens.shape[1] == (batch.lengths * (1 + config.target_factor)).max()
    for b, n in enumerate(batch.lengths):
        w = batch.tokens[b, :n]
        assert np.all(w < config.n_symbols) and batch.tokens[b, n] == config.separator_id
        y = {"copy": w, "repeat": np.concatenate([w, w]), "reverse": w[::-1]}[operation]
        np.testing.assert_array_equal(batch.targets[b][batch.mask[b]], y)
        assert np.flatnonzero(batch.mask[b]).tolist() == list(range(n, n + len(y)))


def test_lengths_and_defaults():
    config = tr.TransductionConfig()  # cpu scale: mean 32, spread 3.2 (the paper's ratio)
    assert (config.length_std, config.min_length, config.max_length) == (3.2, 20, 44)
    assert config.seq_len == 88 and tr.preset("iid", operation="repeat").seq_len == 132
    paper = tr.TransductionConfig(mean_length=100)
    assert (paper.length_std, paper.min_length, paper.max_length) == (10.0, 60, 140)
    _, lengths = tr.split_sources(config, "train", 2000)
    # int() of Normal(32, 3.2) truncates toward zero: mean about 31.5
    assert 31.2 < lengths.mean() < 31.8 and 2.8 < lengths.std() < 3.6
    with pytest.raises(ValueError, match="fewer than 50 distinct train sources"):
        tr.split_sources(tr.TransductionConfig(mean_length=2, n_symbols=2), "train", 50)
    for bad in (dict(operation="sort"), dict(mean_length=0), dict(eval_split="train"),
                dict(length_std=float("nan")), dict(train_size=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            tr.TransductionConfig(**bad)


def test_splits_are_disjoint_fixed_and_prefix_consistent():
    config = tr.TransductionConfig(mean_length=3, length_std=1.0, n_symbols=3)
    rows = {s: tr.split_sources(config, s, 25) for s in tr.SPLITS}
    keys = {s: {tuple(r) for r in rows[s][0]} for s in tr.SPLITS}
    assert all(len(k) == 25 for k in keys.values())  # de-duplicated
    assert not (keys["train"] & keys["dev"] or keys["train"] & keys["test"]
                or keys["dev"] & keys["test"])
    for s in tr.SPLITS:  # every source in its split's hash buckets
        assert set(tr.split_of(*rows[s]).tolist()) <= set(tr.BUCKETS[s])
    # a function of the config only: the same after the cache is cleared; prefixes agree;
    # the three operations share the sources
    tr._split_sources.cache_clear()
    again = tr.split_sources(tr.TransductionConfig(operation="copy", mean_length=3,
                                                   length_std=1.0, n_symbols=3), "dev", 40)
    np.testing.assert_array_equal(again[0][:25], rows["dev"][0])
    other = tr.split_sources(tr.TransductionConfig(mean_length=3, length_std=1.0, n_symbols=3,
                                                   data_seed=7), "dev", 25)
    assert not np.array_equal(other[0], rows["dev"][0])
    # the OOD-length set reads the test buckets, so it shares no source with training
    long = tr.ood_sets(config)["ood_long"]
    assert (long.mean_length, long.length_std, long.eval_split) == (6, 2.0, "test")
    sources, lengths = tr.split_sources(long, "test", 50)
    assert set(tr.split_of(sources, lengths).tolist()) <= set(tr.BUCKETS["test"])
    # evaluation sets ignore the seed; training batches are drawn from the training split
    a, b = tr.eval_set(config, 10, seed=0, batch_size=4), tr.eval_set(config, 10, 5, 4)
    assert [len(x.tokens) for x in a] == [4, 4, 2]
    assert all(np.array_equal(x.tokens, y.tokens) for x, y in zip(a, b))
    batch = tr.generate(replace_size(config, 25), 30, 3)
    train_keys = {tuple(r[:n]) for r, n in zip(*tr.split_sources(config, "train", 25))}
    assert {tuple(t[:n]) for t, n in zip(batch.tokens, batch.lengths)} <= train_keys
    np.testing.assert_array_equal(tr.generate(replace_size(config, 25), 30, 3).tokens,
                                  batch.tokens)


def replace_size(config, n):
    from dataclasses import replace
    return replace(config, train_size=n)


def test_padding_changes_no_logit():
    """A row's logits on its real columns are the same alone and padded in a batch (every
    mixer is causal and padding comes last)."""
    config = tr.TransductionConfig(operation="reverse", **SMALL)
    model = Transformer(ModelConfig.for_task("rope", config, positional="ape_seq", d_model=32,
                                             n_heads=2, n_layers=2))
    batch = tr.make_batch(config, SOURCES, LENGTHS)
    both = model.ops.to_numpy(model.forward(batch.tokens)).copy()
    alone = tr.make_batch(config, SOURCES[:1, :3], LENGTHS[:1])
    one = model.ops.to_numpy(model.forward(alone.tokens))
    np.testing.assert_allclose(both[0, :6], one[0], rtol=1e-5, atol=1e-5)


def test_metrics_on_hand_made_logits():
    config = tr.TransductionConfig(operation="copy", **SMALL)
    batch = tr.make_batch(config, SOURCES, LENGTHS)  # 3 + 5 target tokens
    V = config.vocab_size
    uniform = np.zeros(batch.tokens.shape + (V,))
    assert tr.perplexity(uniform, batch) == pytest.approx(V)
    logits = np.zeros(batch.tokens.shape + (V,))
    np.put_along_axis(logits, batch.targets[..., None], 2.0, axis=-1)  # every target best
    p = math.exp(2.0) / (math.exp(2.0) + V - 1)
    assert tr.perplexity(logits, batch) == pytest.approx(1 / p)
    assert tr.token_accuracy(logits, batch) == 1.0 and tr.sequence_accuracy(logits, batch) == 1.0
    pred = batch.targets.copy()
    pred[1, 6] = 0 if pred[1, 6] else 1  # one wrong target token in row 1
    pred[0, 9] = 0  # a padding column: not scored
    assert tr.token_accuracy(pred, batch) == pytest.approx(7 / 8)
    assert tr.sequence_accuracy(pred, batch) == 0.5
    assert tr.eval_metrics(math.log(2.5), 3, 4) == {"perplexity": pytest.approx(2.5),
                                                     "sequence_accuracy": 0.75}
    with pytest.raises(ValueError, match="logits_or_predictions"):
        tr.sequence_accuracy(pred[:, :-1], batch)


def test_evaluate_reports_perplexity_and_exact_match():
    config = tr.TransductionConfig(operation="reverse", **SMALL)
    model = Transformer(ModelConfig.for_task("rope", config, d_model=32, n_heads=2), seed=3)
    r = evaluate(model, {"iid": config}, sequences=10, batch_size=4)["iid"]
    assert r["perplexity"] == pytest.approx(math.exp(r["loss"]))
    logits = [model.ops.to_numpy(model.forward(b.tokens)).copy()
              for b in tr.eval_set(config, 10, batch_size=4)]
    batches = tr.eval_set(config, 10, batch_size=4)
    exact = sum(tr.sequence_accuracy(z, b) * len(b.tokens) for z, b in zip(logits, batches))
    assert r["sequence_accuracy"] == pytest.approx(exact / 10)
    scored = sum(int(b.mask.sum()) for b in batches)
    ce = sum(math.log(tr.perplexity(z, b)) * b.mask.sum() for z, b in zip(logits, batches))
    assert r["positions"] == scored and r["loss"] == pytest.approx(ce / scored, rel=1e-4)


def test_one_training_step_through_the_api():
    train_config = TrainConfig(task="repeat", mean_length=5, sequences=8, batch_size=8,
                               eval_sequences=6)
    task = train_config.task_config()
    assert (task.operation, task.mean_length, task.n_symbols) == ("repeat", 5, 20)
    model_config = ModelConfig.for_task("rope", task, positional="ape_seq", d_model=32,
                                        n_heads=2)
    result = train(model_config, train_config, **QUIET)
    assert result["steps"] == 1 and math.isfinite(result["loss"])
    assert set(result["eval"]) == {"iid", "dev", "ood_long"}
    for r in result["eval"].values():
        assert r["perplexity"] == pytest.approx(math.exp(r["loss"]))
        assert 0.0 <= r["sequence_accuracy"] <= 1.0 and r["sequences"] == 6
    with pytest.raises(ValueError, match="no ood_dense set"):
        TrainConfig(task="copy", ood_dense="mean_length=4")
    assert TrainConfig(task="copy").eval_tasks()["ood_long"].mean_length == 64  # twice 32
    with pytest.raises(ValueError, match="presets"):
        TrainConfig(task="copy", preset="ood_dense")


def test_one_training_step_through_the_cli(tmp_path, capsys):
    main(["train", "--task", "reverse", "--mean-length", "8", "--n-symbols", "6",
          "--sequences", "8", "--batch-size", "8", "--eval-sequences", "4", "--d-model", "32",
          "--n-heads", "2", "--positional", "rope", "--no-progress", "--json",
          "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "perplexity" in out and "exact match" in out and "ood_long" in out
    result = json.loads(out.strip().splitlines()[-1])
    model, _, train_config, step = load_checkpoint(tmp_path / "checkpoint.npz")
    assert step == 1 and model.config.vocab_size == 8
    assert train_config.task_config() == tr.TransductionConfig(operation="reverse",
                                                               mean_length=8, n_symbols=6)
    main(["eval", str(tmp_path / "checkpoint.npz"), "--json"])
    again = json.loads(capsys.readouterr().out)
    for name in ("iid", "dev", "ood_long"):
        assert again[name]["perplexity"] == pytest.approx(result["eval"][name]["perplexity"])
        assert again[name]["sequence_accuracy"] == result["eval"][name]["sequence_accuracy"]
