"""Tests of the selective-copy task generator and its accuracy functions."""

import itertools

import numpy as np
import pytest

from mapformer.tasks import selective_copy as sc


CONFIGS = [
    sc.SelectiveCopyConfig(),
    sc.SelectiveCopyConfig(n_copy=5, n_blanks=7, n_symbols=3),
    sc.SelectiveCopyConfig(n_copy=1, n_blanks=0, n_symbols=1),
    sc.SelectiveCopyConfig(n_copy=3, n_blanks=20, n_symbols=40),
]


def test_vocab_and_lengths():
    cfg = sc.SelectiveCopyConfig(n_copy=5, n_blanks=7, n_symbols=3)
    assert (cfg.blank_id, cfg.separator_id, cfg.vocab_size) == (3, 4, 5)
    assert cfg.separator_index == 12
    assert cfg.seq_len == 17


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_layout(cfg):
    B, C, N, L = 11, cfg.n_copy, cfg.separator_index, cfg.seq_len
    batch = sc.generate(cfg, B, 0)
    assert batch.tokens.shape == batch.targets.shape == batch.mask.shape == (B, L)
    assert batch.positions.shape == (B, C)
    assert batch.tokens.dtype == batch.targets.dtype == np.int32
    assert batch.mask.dtype == np.bool_
    assert batch.positions.dtype == np.int64
    assert batch.tokens.min() >= 0 and batch.tokens.max() < cfg.vocab_size

    part = batch.tokens[:, :N]
    is_data = part < cfg.n_symbols
    assert np.all(is_data | (part == cfg.blank_id))
    assert np.all(is_data.sum(axis=1) == C)
    assert np.all((part == cfg.blank_id).sum(axis=1) == cfg.n_blanks)
    assert np.all(batch.tokens[:, N] == cfg.separator_id)
    assert np.all(batch.tokens[:, N + 1 :] < cfg.n_symbols)

    # The answer (targets on the mask) is the data tokens of the input part, in order.
    answer = batch.targets[:, N:]
    for b in range(B):
        np.testing.assert_array_equal(answer[b], part[b][is_data[b]])
    np.testing.assert_array_equal(batch.tokens[:, N + 1 :], answer[:, :-1])

    # positions: increasing columns of the data tokens, holding the answer.
    assert np.all(np.diff(batch.positions, axis=1) > 0)
    assert batch.positions.min() >= 0 and batch.positions.max() < N
    np.testing.assert_array_equal(np.take_along_axis(batch.tokens, batch.positions, axis=1), answer)
    cols = np.nonzero(is_data)[1]
    np.testing.assert_array_equal(cols.reshape(B, C), batch.positions)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_targets_are_next_token_and_mask_on_answer(cfg):
    batch = sc.generate(cfg, 7, 1)
    N = cfg.separator_index
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.tokens[:, 1:])
    # The last target is the answer's last token, i.e. the last data token.
    last_data = np.take_along_axis(batch.tokens, batch.positions[:, -1:], axis=1)[:, 0]
    np.testing.assert_array_equal(batch.targets[:, -1], last_data)
    assert np.all(batch.mask.sum(axis=1) == cfg.n_copy)
    assert np.all(batch.mask[:, N:]) and not np.any(batch.mask[:, :N])
    assert np.all(batch.targets[:, N - 1] == cfg.separator_id)  # predicted, but not scored
    assert np.all(batch.targets[batch.mask] < cfg.n_symbols)


def test_every_interleaving_equally_likely():
    # n_copy=2, n_blanks=3: C(5, 2) = 10 patterns, each with probability 1/10.
    cfg = sc.SelectiveCopyConfig(n_copy=2, n_blanks=3, n_symbols=4)
    n = 50_000
    batch = sc.generate(cfg, n, 2)
    patterns = {p: i for i, p in enumerate(itertools.combinations(range(5), 2))}
    codes = batch.positions[:, 0] * 5 + batch.positions[:, 1]
    counts = np.bincount(codes, minlength=25)[[a * 5 + b for a, b in patterns]]
    assert counts.sum() == n
    expected = n / len(patterns)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 33.7, (chi2, counts)  # chi-square, 9 dof: P(chi2 > 33.7) ~ 1e-4


def test_blank_positions_uniform_at_scale():
    # iid preset: every input column is a blank with probability 1/2, and the k-th data token
    # sits on average at column (k + 1) * (N + 1) / (C + 1) - 1 (order statistics).
    cfg = sc.preset("iid")
    n, C, N = 4096, cfg.n_copy, cfg.separator_index
    batch = sc.generate(cfg, n, 3)
    blank_rate = (batch.tokens[:, :N] == cfg.blank_id).mean(axis=0)
    sd = np.sqrt(0.25 / n)
    assert np.abs(blank_rate - 0.5).max() < 5 * sd
    mean_pos = batch.positions.mean(axis=0)
    expected = np.arange(1, C + 1) * (N + 1) / (C + 1) - 1
    assert np.abs(mean_pos - expected).max() < 0.65  # 5 sd: sd of a mean position <= ~0.13
    # Data symbols are uniform.
    freq = np.bincount(batch.targets[batch.mask], minlength=cfg.n_symbols) / (n * C)
    assert np.abs(freq - 1 / cfg.n_symbols).max() < 5 * np.sqrt((1 / 16) * (15 / 16) / (n * C))


def test_determinism():
    cfg = sc.SelectiveCopyConfig(n_copy=9, n_blanks=13)
    a, b, c = sc.generate(cfg, 6, 42), sc.generate(cfg, 6, 42), sc.generate(cfg, 6, 43)
    for field in ("tokens", "targets", "mask", "positions"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.tokens, c.tokens)

    rng = np.random.default_rng(5)
    first, second = sc.generate(cfg, 6, rng), sc.generate(cfg, 6, rng)
    assert not np.array_equal(first.tokens, second.tokens)  # the generator advances

    s1, s2 = sc.batches(cfg, 4, seed=7), sc.batches(cfg, 4, seed=7)
    for _ in range(3):
        np.testing.assert_array_equal(next(s1).tokens, next(s2).tokens)


def test_eval_set():
    cfg = sc.SelectiveCopyConfig(n_copy=4, n_blanks=4)
    ev = sc.eval_set(cfg, 10, seed=7, batch_size=4)
    assert [b.tokens.shape[0] for b in ev] == [4, 4, 2]
    again = sc.eval_set(cfg, 10, seed=7, batch_size=4)
    for x, y in zip(ev, again):
        np.testing.assert_array_equal(x.tokens, y.tokens)
    assert not np.array_equal(sc.eval_set(cfg, 10, seed=8, batch_size=4)[0].tokens, ev[0].tokens)
    # The training stream of the same seed gives other sequences.
    assert not np.array_equal(next(sc.batches(cfg, 4, seed=7)).tokens, ev[0].tokens)
    with pytest.raises(ValueError, match="n_sequences"):
        sc.eval_set(cfg, 0, seed=7)
    with pytest.raises(ValueError, match="batch_size"):
        sc.eval_set(cfg, 4, seed=7, batch_size=0)


def test_presets():
    expected = {"iid": (128, 128, 16), "ood_dense": (128, 64, 16), "ood_sparse": (128, 256, 16)}
    assert set(sc.PRESETS) == set(expected)
    for name, fields in expected.items():
        cfg = sc.preset(name)
        assert (cfg.n_copy, cfg.n_blanks, cfg.n_symbols) == fields
    assert sc.preset("iid") == sc.SelectiveCopyConfig()
    assert sc.preset("iid").seq_len == 384
    assert sc.preset("ood_sparse", n_symbols=8) == sc.SelectiveCopyConfig(128, 256, 8)
    with pytest.raises(ValueError, match="unknown preset"):
        sc.preset("iidd")


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_copy", 0),
        ("n_copy", -3),
        ("n_copy", 2.0),
        ("n_copy", True),
        ("n_blanks", -1),
        ("n_blanks", "4"),
        ("n_symbols", 0),
        ("n_symbols", None),
    ],
)
def test_bad_config_raises_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        sc.SelectiveCopyConfig(**{field: value})


def test_bad_batch_size_raises():
    with pytest.raises(ValueError, match="batch_size"):
        sc.generate(sc.SelectiveCopyConfig(), 0, 0)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        sc.SelectiveCopyConfig().n_copy = 3


def one_hot_logits(pred, vocab_size):
    return np.eye(vocab_size, dtype=np.float32)[pred]


def test_accuracy_exact_cases():
    cfg = sc.SelectiveCopyConfig(n_copy=6, n_blanks=5, n_symbols=4)
    batch = sc.generate(cfg, 8, 11)
    V = cfg.vocab_size

    perfect = batch.targets.copy()
    perfect[~batch.mask] = (perfect[~batch.mask] + 1) % V  # unscored columns do not count
    wrong = (batch.targets + 1) % V

    # Sequences 0..3 perfect, 4..7 wrong on their first 3 of 6 answer tokens.
    half_tokens = perfect.copy()
    N = cfg.separator_index
    half_tokens[4:, N : N + 3] = wrong[4:, N : N + 3]
    # Sequences 0..3 perfect, 4..7 all wrong.
    half_rows = perfect.copy()
    half_rows[4:] = wrong[4:]
    # Every sequence wrong on its last 3 answer tokens.
    half_each = perfect.copy()
    half_each[:, -3:] = wrong[:, -3:]

    cases = [
        (perfect, 1.0, 1.0),
        (wrong, 0.0, 0.0),
        (half_tokens, 0.75, 0.5),
        (half_rows, 0.5, 0.5),
        (half_each, 0.5, 0.0),
    ]
    for pred, tok, seq in cases:
        assert sc.token_accuracy(pred, batch) == tok
        assert sc.sequence_accuracy(pred, batch) == seq
        assert sc.token_accuracy(one_hot_logits(pred, V), batch) == tok
        assert sc.sequence_accuracy(one_hot_logits(pred, V), batch) == seq


def test_accuracy_rejects_wrong_shape():
    batch = sc.generate(sc.SelectiveCopyConfig(n_copy=3, n_blanks=2), 4, 0)
    with pytest.raises(ValueError, match="shape"):
        sc.token_accuracy(batch.targets[:, :-1], batch)
    with pytest.raises(ValueError, match="shape"):
        sc.sequence_accuracy(batch.targets[:2], batch)


def test_package_exports():
    import mapformer.tasks as tasks

    assert tasks.selective_copy.generate is sc.generate
    for name in ("SelectiveCopyConfig", "SelectiveCopyBatch", "token_accuracy", "sequence_accuracy"):
        assert getattr(tasks, name) is getattr(sc, name)
        assert name in tasks.__all__
    # The navigation exports are untouched.
    assert tasks.generate is tasks.navigation.generate
    assert tasks.PRESETS is tasks.navigation.PRESETS
