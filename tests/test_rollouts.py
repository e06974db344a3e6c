"""The map-free baselines' rollout planner (mapformer/rollouts.py) with an oracle whose
predictions are the room's, and with a tiny transformer end to end."""
import numpy as np
import pytest

from mapformer import rollouts
from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import rooms

CONFIG = rooms.RoomsConfig(height=3, width=4, n_obs=3, patch=0, steps=24, seed=2)


class Oracle:
    """rollouts.room_oracle (the actions replayed from the walk's first cell in the true
    room), recording the batch size of every call."""

    def __init__(self, room, start):
        self.predict, self.batches = rollouts.room_oracle(room, start, CONFIG.n_obs), []

    def __call__(self, tokens):
        self.batches.append(len(tokens))
        return self.predict(tokens)


def problem(n=8, seed=0):
    room = rooms.make_room(CONFIG)
    return room, rooms.walks(CONFIG, room, n, seed)


def test_oracle_planner_finds_valid_short_paths():
    room, w = problem()
    C = 4
    found = 0
    for i in range(len(w.obs)):
        plans = rollouts.rollout_plans(Oracle(room, w.pos[i, 0]), w.tokens(CONFIG.n_obs)[i],
                                       C, CONFIG.n_obs, rollouts=100, seed=i)
        assert all(1 <= len(p) < CONFIG.steps - 2 * C for p in plans)
        assert [len(p) for p in plans] == sorted(len(p) for p in plans)
        best = rollouts.shortest_valid(plans, room.obs.shape, w.pos[i, C],
                                       w.pos[i, CONFIG.steps - C])
        if tuple(w.pos[i, C]) != tuple(w.pos[i, CONFIG.steps - C]):
            found += best is not None
    # a 3 x 4 room and 100 rollouts of up to 15 steps: every problem with start != goal is
    # solved
    assert found == sum(tuple(w.pos[i, C]) != tuple(w.pos[i, CONFIG.steps - C])
                        for i in range(len(w.obs))) >= 5


def test_evaluate_rollouts_with_the_oracle():
    room, w = problem(n=1, seed=3)
    m = rollouts.evaluate_rollouts(Oracle(room, w.pos[0, 0]), w, room, CONFIG.n_obs, 4)
    assert m["problems"] == 1 and m["rollouts"] == 100
    assert m["ImpFallback"] == 100.0 and m["RatioSP"] >= 1.0
    assert 1 <= m["returned_valid"] <= m["returned"]


def test_room_oracle_predicts_the_walks_next_observations():
    """After each action of a real walk, the oracle's prediction is the walk's next
    observation; "oracle" in evaluate_rollouts is each walk's room_oracle."""
    room, w = problem(n=6, seed=4)
    tokens = w.tokens(CONFIG.n_obs)
    for i in range(len(tokens)):
        predicted = rollouts.room_oracle(room, w.pos[i, 0], CONFIG.n_obs)(tokens[i:i + 1])[0]
        assert predicted[1:-1:2].tolist() == w.obs[i, 1:].tolist()
        assert predicted[0::2].tolist() == w.obs[i].tolist()
    by_name = rollouts.evaluate_rollouts("oracle", w, room, CONFIG.n_obs, 4, rollouts=20)
    plans = [rollouts.rollout_plans(Oracle(room, w.pos[i, 0]), tokens[i], 4, CONFIG.n_obs,
                                    rollouts=20, seed=[0, i]) for i in range(len(tokens))]
    assert by_name["returned"] == sum(len(p) for p in plans) > 0


def test_rollout_count_and_seed():
    room, w = problem(n=1)
    tokens = w.tokens(CONFIG.n_obs)[0]
    oracle = Oracle(room, w.pos[0, 0])
    a = rollouts.rollout_plans(oracle, tokens, 4, CONFIG.n_obs, rollouts=7, seed=5)
    L = CONFIG.steps - 8
    # L - 1 generation calls of 7 rollouts each, then one tail call per candidate length
    assert oracle.batches[:L - 1] == [7] * (L - 1)
    assert all(b <= 7 for b in oracle.batches[L - 1:])
    assert a == rollouts.rollout_plans(Oracle(room, w.pos[0, 0]), tokens, 4, CONFIG.n_obs,
                                       rollouts=7, seed=5)
    many = [rollouts.rollout_plans(Oracle(room, w.pos[0, 0]), tokens, 4, CONFIG.n_obs,
                                   rollouts=7, seed=s) for s in range(4)]
    assert len({str(p) for p in many}) > 1


def test_tail_evaluation_rejects_a_wrong_model():
    """A model that always predicts one symbol: its candidates fail the tail unless the tail
    is that symbol throughout."""
    room, w = problem(n=1)
    tokens = w.tokens(CONFIG.n_obs)[0]
    goal = int(tokens[2 * (CONFIG.steps - 4)])
    plans = rollouts.rollout_plans(lambda t: np.full(np.shape(t), goal), tokens, 4,
                                   CONFIG.n_obs, rollouts=5, seed=0)
    tail_obs = tokens[2 * (CONFIG.steps - 4) + 2:2 * CONFIG.steps:2]
    assert (plans == []) == bool((tail_obs != goal).any())


def test_transformer_end_to_end():
    room, w = problem(n=2)
    model = Transformer(ModelConfig(vocab_size=CONFIG.vocab_size, d_model=32, n_heads=2,
                                    n_layers=1, mlp_ratio=2))
    m = rollouts.evaluate_rollouts(rollouts.greedy_predictor(model, CONFIG.n_obs), w, room,
                                   CONFIG.n_obs, 4, rollouts=10)
    assert 0.0 <= m["ImpFallback"] <= 100.0 and m["problems"] <= 2
    assert m["returned_valid"] <= m["returned"]


def test_each_plan_once():
    """Rollouts sharing a prefix give the same candidate: it is returned once."""
    room, w = problem(n=1)
    plans = rollouts.rollout_plans(Oracle(room, w.pos[0, 0]), w.tokens(CONFIG.n_obs)[0], 4,
                                   CONFIG.n_obs, rollouts=200, seed=1)
    assert len(plans) == len({tuple(p) for p in plans}) > 0


def test_decoded_rollouts_give_the_recomputed_plans_with_the_oracle():
    room, w = problem(n=4)
    tokens = w.tokens(CONFIG.n_obs)
    for i in range(len(tokens)):
        want = rollouts.rollout_plans(Oracle(room, w.pos[i, 0]), tokens[i], 4, CONFIG.n_obs,
                                      rollouts=60, seed=i)
        got = rollouts.rollout_plans(rollouts.RoomOracleDecoder(room, w.pos[i, 0],
                                                                 CONFIG.n_obs), tokens[i], 4,
                                     CONFIG.n_obs, rollouts=60, seed=i)
        assert got == want and (want or w.pos[i, 4].tolist() == w.pos[i, 20].tolist())


@pytest.mark.parametrize("mixer,positional", [("attention", "rope"), ("lstm", "none")])
def test_decoded_rollouts_are_the_recomputed(mixer, positional):
    """Random small models (weights x 4: predictions that depend on the context): the
    rollouts' greedy predictions and the accepted plans with the cache are the recomputed
    ones (tests/test_decode.py: their logits agree within 1e-5 (1 + max |logit|))."""
    room, w = problem(n=4)
    tokens = w.tokens(CONFIG.n_obs)
    model = Transformer(ModelConfig(vocab_size=CONFIG.vocab_size, d_model=32, n_heads=2,
                                    n_layers=2, mlp_ratio=2, mixer=mixer,
                                    positional=positional), seed=3)
    model.params.data *= 4
    predict = rollouts.greedy_predictor(model, CONFIG.n_obs)
    decoder = rollouts.greedy_decoder(model, CONFIG.n_obs)
    found, symbols = 0, set()
    for i in range(len(tokens)):
        actions = np.random.default_rng(i).integers(0, rooms.N_ACTIONS, (30, 16))
        want = rollouts._Recomputed(predict, tokens[i, :9], actions, CONFIG.n_obs)
        got = rollouts._Decoded(decoder, tokens[i, :9], actions, CONFIG.n_obs)
        assert np.array_equal(got.predicted[:, :-1], want.predicted[:, :-1])
        symbols |= set(want.predicted[:, :-1].ravel().tolist())
        plans = rollouts.rollout_plans(predict, tokens[i], 4, CONFIG.n_obs, 60, seed=i)
        assert rollouts.rollout_plans(decoder, tokens[i], 4, CONFIG.n_obs, 60, seed=i) == plans
        found += len(plans)
    assert len(symbols) > 1 and (mixer == "lstm" or found > 0)
