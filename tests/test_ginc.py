"""GINC's mixture of HMMs (mapformer.tasks.ginc): the generator's structure, documents that
follow their HMM, forward filtering against the sum over every hidden path, and prompts whose
labels are the brute-force answer."""
import itertools

import numpy as np
import pytest

from mapformer.tasks import ginc

SMALL = ginc.GincConfig(n_symbols=5, n_values=2, n_slots=3, n_hmms=4, seed=7)


def test_mixture_is_the_generators_structure():
    m = ginc.make_mixture(ginc.GincConfig())
    c = m.config
    assert m.emission.shape == (10, 10) and (m.emission[:, 0] == ginc.DELIMITER).all()
    assert ((m.emission[:, 1:] >= 1) & (m.emission[:, 1:] < 50)).all()
    assert m.transitions.shape == (10, 100, 100) and m.concepts.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(m.transitions.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(m.start.sum(-1), 1.0, rtol=1e-12)
    for h in range(c.n_hmms):  # value transitions shared, slot transitions the HMM's own
        np.testing.assert_array_equal(m.transitions[h],
                                      np.kron(m.value_transitions, m.slot_transitions[h]))
    assert np.diag(m.value_transitions).min() >= c.value_identity
    assert not np.allclose(m.slot_transitions[0], m.slot_transitions[1])
    # a mixture of permutations: doubly stochastic
    np.testing.assert_allclose(m.slot_transitions.sum(1), 1.0, rtol=1e-12)
    again = ginc.make_mixture(ginc.GincConfig())
    np.testing.assert_array_equal(again.transitions, m.transitions)
    other = ginc.make_mixture(ginc.GincConfig(seed=2))
    assert not np.array_equal(other.emission, m.emission)


def test_documents_follow_their_hmm():
    m = ginc.make_mixture(SMALL)
    symbols, hmm, hidden = ginc.documents(m, 64, 400, np.random.default_rng(0))
    assert symbols.shape == (64, 400) and symbols.dtype == np.int32
    assert set(hmm.tolist()) <= {0, 1}  # in-distribution concepts only
    np.testing.assert_array_equal(symbols, m.symbols[hidden])
    steps = m.transitions[hmm[:, None], hidden[:, :-1], hidden[:, 1:]]
    assert (steps > 0).all()
    # the empirical transitions of concept 0 are its matrix
    counts = np.zeros((SMALL.n_states, SMALL.n_states))
    rows = hidden[hmm == 0]
    np.add.at(counts, (rows[:, :-1].ravel(), rows[:, 1:].ravel()), 1)
    seen = counts.sum(1) > 500
    np.testing.assert_allclose(counts[seen] / counts[seen].sum(1, keepdims=True),
                               m.transitions[0][seen], atol=0.05)


def brute_force_next(m, hmm, start, symbols):
    """p(next symbol | symbols) by summing over every hidden path."""
    S, T, out = SMALL.n_states, m.transitions[hmm], m.symbols
    joint = np.zeros(SMALL.n_symbols)
    for path in itertools.product(range(S), repeat=len(symbols) + 1):
        if any(out[h] != x for h, x in zip(path, symbols)):
            continue
        p = start[path[0]] * np.prod([T[a, b] for a, b in zip(path, path[1:])])
        joint[out[path[-1]]] += p
    return joint / joint.sum()


def test_forward_filtering_is_the_sum_over_hidden_paths():
    m = ginc.make_mixture(SMALL)
    rng = np.random.default_rng(1)
    for hmm in range(SMALL.n_hmms):
        symbols = m.symbols[ginc.hidden_walks(m, np.array([hmm]), np.array([1]), 3, rng)[0]]
        got = ginc.next_symbol_probabilities(m, hmm, m.start[hmm], symbols)
        np.testing.assert_allclose(got, brute_force_next(m, hmm, m.start[hmm], symbols),
                                   rtol=1e-10, atol=1e-14)
    start = np.zeros(SMALL.n_states)
    start[0] = 1.0  # the delimiter state of value 0, which cannot emit a word first
    with pytest.raises(ValueError, match="probability 0"):
        ginc.next_symbol_probabilities(m, 0, start, np.array([m.emission[0, 1], 0]))


@pytest.mark.parametrize("k, n", [(3, 0), (3, 2), (5, 4)])
def test_prompts_hold_n_examples_and_the_brute_force_label(k, n):
    m = ginc.make_mixture(SMALL)
    p = ginc.prompts(m, k, n, 40, np.random.default_rng(3))
    assert p.tokens.shape == (40, n * (k + 1) + k - 1)
    delimiters = np.arange(k, n * (k + 1), k + 1)
    assert (p.tokens[:, delimiters] == ginc.DELIMITER).all()
    starts = np.arange(0, n * (k + 1) + 1, k + 1)  # each example's first symbol
    for i in range(40):
        column = m.emission[:, p.start_slot[i]]
        assert np.isin(p.tokens[i, starts], column).all()
        start = np.zeros(SMALL.n_states)
        start[np.arange(SMALL.n_values) * SMALL.n_slots + p.start_slot[i]] = 0.5
        want = brute_force_next(m, p.hmm[i], start, p.tokens[i, -(k - 1):])
        assert p.labels[i] == want.argmax()
    assert set(p.hmm.tolist()) <= {0, 1} and (p.start_slot >= 1).all()


def test_bad_settings():
    with pytest.raises(ValueError, match="n_slots"):
        ginc.GincConfig(n_slots=1)
    with pytest.raises(ValueError, match="transition_temp"):
        ginc.GincConfig(transition_temp=0.0)
    with pytest.raises(ValueError, match="value_identity"):
        ginc.GincConfig(value_identity=1.5)
    m = ginc.make_mixture(SMALL)
    with pytest.raises(ValueError, match="k"):
        ginc.prompts(m, 1, 2, 3, 0)
    with pytest.raises(ValueError, match="n"):
        ginc.prompts(m, 3, -1, 3, 0)


def test_training_task_windows_and_prompt_sets():
    """Task "ginc": windows of the corpus with the dummy action after each symbol, the loss
    on every next symbol; a prompt set scores its label at the last position only; the
    evaluation sets are the paper's k and n whose prompts fit the window."""
    from mapformer.train import TrainConfig
    config = TrainConfig(task="ginc", loss_positions="observations",
                         task_options=dict(documents=6, length=200, window=40, seed=5))
    task = config.task_config()
    assert task.mixture.seed == 5 and task.vocab_size == 51 and task.seq_len == 80
    batch = ginc.generate(task, 4, 0)
    assert batch.tokens.shape == (4, 80) and (batch.tokens[:, 1::2] == 50).all()
    docs = ginc.corpus(task)
    for row in batch.tokens[:, 0::2]:  # a window of one document
        assert any(np.array_equal(row, d[s:s + 40]) for d in docs for s in range(161))
    assert (batch.targets[:, 1:-1:2] == batch.tokens[:, 2::2]).all()
    assert batch.mask.sum() == 4 * 39
    sets = config.eval_tasks()
    assert "k3_n8" in sets and "k10_n4" not in sets  # 4 x 11 + 9 = 53 > 40 symbols
    prompt_set = sets["k5_n2"]
    [b] = ginc.eval_set(prompt_set, 7, batch_size=8)
    drawn = ginc.prompts(ginc.mixture_of(task.mixture), 5, 2, 7, [5, 3, 5, 2])
    np.testing.assert_array_equal(b.tokens[:, 0::2], drawn.tokens)
    assert b.mask.sum() == 7 and b.mask[:, -1].all()
    np.testing.assert_array_equal(b.targets[:, -1], drawn.labels)
    with pytest.raises(ValueError, match="window"):
        TrainConfig(task="ginc", loss_positions="observations",
                    task_options=dict(length=100, window=200))


@pytest.mark.parametrize("kind", ["transformer", "tdb"])
def test_models_train_on_ginc_and_score_the_prompts(kind):
    """A transformer and a TDB (one dummy action) train a few steps on task "ginc" through
    mapformer.train; every prompt set's accuracy is its share of right last tokens."""
    from mapformer.models import ModelConfig
    from mapformer.tdb import TDBConfig
    from mapformer.train import TrainConfig, train
    config = TrainConfig(task="ginc", loss_positions="observations", sequences=8, batch_size=4,
                         task_options=dict(documents=4, length=64, window=24),
                         eval_sequences=6, schedule="constant", weight_decay=0.0)
    model = (ModelConfig(vocab_size=51, d_model=32, positional="rope") if kind == "transformer"
             else TDBConfig(n_obs=50, n_actions=1, d_model=32, n_heads=2, n_layers=1,
                            codes=16, head_hidden=16, steps=2))
    result = train(model, config, progress=False, log=lambda *a: None)
    assert result["steps"] == 2 and np.isfinite(result["loss"])
    prompts_k3 = result["eval"]["k3_n2"]
    assert prompts_k3["positions"] == 6
    assert prompts_k3["accuracy"] * 6 == pytest.approx(round(prompts_k3["accuracy"] * 6))
