"""Planning without a map: the random rollouts with tail evaluation of TDB's map-free
baselines (Dedieu et al. 2024, appendix D), for any sequence model over the rooms' tokens.

For a test walk x_0, a_0, ..., x_{N-1}, a_{N-1} (indices from 0, as
:func:`mapformer.cogmap.evaluate_map` counts them, so that every row of the table plans the
same problems) and a context C (0 < 2C < N), the problem is a path from the cell of x_C to
that of x_{N-C}; a_C .. a_{N-C-1} is the fallback (length N - 2C).
1. ``rollouts`` random action sequences a^(i) of length N - 2C (a NumPy Generator of ``seed``);
2. each is rolled out greedily from the true context (x_0, a_0, ..., x_C): x^_{n+1} = the
   argmax observation after a_n^(i), appended, for n = C .. N - C - 1;
3. candidates: (i, n), n > C, with x^_n = x_{N-C} (n = C, the empty path, is left out: a
   problem whose start is its goal is not counted), and only those shorter than the
   fallback (n < N - C): the others cannot improve on it;
4. tail evaluation: the candidate's history is followed by the true tail a_{N-C}, x_{N-C+1},
   ..., a_{N-2}, x_{N-1} (teacher-forced); the candidate is accepted iff the greedy
   prediction after each tail action is the true next observation, for all C - 1 of them
   (the paper, counting from 1, has C: the walk has no observation after x_{N-1} here);
5. the accepted action prefixes a_C^(i) .. a_{n-1}^(i) are returned (duplicates once); the
   evaluation (:func:`shortest_valid`) keeps the shortest that reaches the goal in the true
   room, as the paper does.

Two ways to run the model, with the same plans (the test compares them):
- incremental decoding (a :class:`Decoder`, :func:`greedy_decoder`: the model's ``decode``
  with a KV cache, or the LSTM's state): the context x_0 .. x_C once, its cache copied to the
  ``rollouts`` sequences (with room for the whole rollout: new positions are written in
  place); each step of 2. is one call on two new tokens per rollout (the last prediction and
  the next action; the first step on the action alone) attending the cache; step 4 starts
  from each candidate's cached history (rows and a prefix of the last step's cache, copied)
  and runs the goal and the tail, 2C - 1 tokens, on it. Cost: about 2 (N - 2C) x rollouts
  tokens' forward work per problem, plus the attention of each new token on the cached ones
  (linear in their number), plus (2C - 1) tokens per candidate for the tails;
- recomputation (a ``predict`` function, :func:`greedy_predictor`), batched: step 2 is one
  forward of the ``rollouts`` sequences (prefix + rollout so far) per generated observation
  (N - 2C forwards whose length grows from 2C to 2(N - C)), step 4 one forward per candidate
  length over every candidate of that length. Cost: about (N - 2C)^2 / 2 x rollouts tokens'
  forward work per problem (plus the context's in every forward).

A model enters as a ``predict`` function: tokens int (B, T) -> (B, T) the argmax observation
after each position (:func:`greedy_predictor` wraps a :class:`mapformer.models.Transformer`
trained with :func:`mapformer.tasks.rooms.next_observation_targets`), or as a :class:`Decoder`
(:func:`greedy_decoder`, the same model through its ``decode``: transformers whose scheme
decodes at an offset, rope or none, and the LSTM).
"""
import numpy as np

from .tasks import rooms


def greedy_predictor(model, n_obs):
    """predict(tokens (B, T)) -> (B, T) argmax over the observation ids of ``model``'s logits
    (evaluation mode: no dropout)."""
    model.train(False)

    def predict(tokens):
        logits = model.ops.to_numpy(model.forward(np.asarray(tokens, np.int32)))
        return logits[..., :n_obs].argmax(-1)
    return predict


class Decoder:
    """Greedy predictions by incremental decoding: ``decoder(tokens (B, T), cache=None) ->
    (argmax observation after each new position (B, T), cache)`` with the model's
    :meth:`mapformer.models.Transformer.decode` (evaluation mode: no dropout)."""

    def __init__(self, model, n_obs):
        model.train(False)
        self.model, self.n_obs = model, n_obs

    def __call__(self, tokens, cache=None):
        logits, cache = self.model.decode(np.asarray(tokens, np.int32), cache)
        return self.model.ops.to_numpy(logits)[..., :self.n_obs].argmax(-1), cache


def greedy_decoder(model, n_obs):
    """A :class:`Decoder` of ``model``: the rollouts with a KV cache."""
    return Decoder(model, n_obs)


class _Recomputed:
    """Step 2 and step 4's predictions by whole forwards of the sequences so far."""

    def __init__(self, predict, context, actions, n_obs):
        self.predict = predict
        rollouts, length = actions.shape
        seq = np.tile(context, (rollouts, 1))           # x_0, a_0, ..., x_C
        self.predicted = np.empty((rollouts, length), np.int64)  # x^_{C+1} .. x^_{N-C-1}
        for k in range(length - 1):  # x^_{N-C} (k = L - 1): a path as long as the fallback
            seq = np.concatenate([seq, (actions[:, k] + n_obs)[:, None]], 1)
            self.predicted[:, k] = predict(seq)[:, -1]
            seq = np.concatenate([seq, self.predicted[:, k, None]], 1)
        self.seq = seq

    def tail_predictions(self, rows, k, tail):
        """The predictions (len(rows), len(tail)) at the tail's positions after the
        candidates (rollouts ``rows``, step k) and their goal."""
        history = self.seq[rows, :self.seq.shape[1] - 2 * (self.predicted.shape[1] - 2 - k)]
        return self.predict(np.concatenate([history, np.tile(tail, (len(rows), 1))],
                                           1))[:, history.shape[1]:]


class _Decoded:
    """Step 2 and step 4's predictions by incremental decoding (a :class:`Decoder`)."""

    def __init__(self, decoder, context, actions, n_obs):
        self.decoder = decoder
        rollouts, length = actions.shape
        _, cache = decoder(context[None])
        cache = cache.select(np.zeros(rollouts, np.intp), room=2 * length)
        self.predicted = np.empty((rollouts, length), np.int64)
        new = (actions[:, 0] + n_obs)[:, None]          # a_C; then x^_{C+k}, a_{C+k}
        for k in range(length - 1):
            pred, cache = decoder(new, cache)
            self.predicted[:, k] = pred[:, -1]
            if k + 1 < length - 1:
                new = np.stack([self.predicted[:, k], actions[:, k + 1] + n_obs], 1)
        self.cache = cache  # every position but the last prediction

    def tail_predictions(self, rows, k, tail):
        """As :meth:`_Recomputed.tail_predictions`: the goal x^ and the tail on the cache of
        each candidate's history up to its last action."""
        cache = self.cache.select(np.asarray(rows), self.cache.length
                                  - 2 * (self.predicted.shape[1] - 2 - k), room=1 + len(tail))
        block = np.concatenate([self.predicted[rows, k, None], np.tile(tail, (len(rows), 1))],
                               1)
        return self.decoder(block, cache)[0][:, 1:]


def rollout_plans(predict, tokens, context, n_obs, rollouts=100, seed=0,
                  n_actions=rooms.N_ACTIONS):
    """The accepted plans (see the module) of one walk's tokens (2N,): a list of action lists,
    shortest first (ties: by rollout), each at most once. ``predict``: a function (the
    rollouts recomputed) or a :class:`Decoder` (decoded with a cache); the same plans."""
    tokens = np.asarray(tokens)
    N, C = len(tokens) // 2, context
    L = N - 2 * C
    if C < 1 or L < 1:
        raise ValueError(f"context must satisfy 0 < 2 context < N = {N}, got {context}")
    actions = np.random.default_rng(seed).integers(0, n_actions, (rollouts, L))
    run = (_Decoded if isinstance(predict, Decoder) else _Recomputed)(
        predict, tokens[:2 * C + 1], actions, n_obs)
    goal = tokens[2 * (N - C)]
    tail = tokens[2 * (N - C) + 1:2 * N - 1]           # a_{N-C}, x_{N-C+1}, ..., x_{N-1}
    plans, seen = [], set()
    for k in range(L - 1):  # candidates x^_{C+k+1}: paths of k + 1 actions
        rows = []
        for i in np.nonzero(run.predicted[:, k] == goal)[0]:
            if tuple(actions[i, :k + 1]) not in seen:
                seen.add(tuple(actions[i, :k + 1]))
                rows.append(i)
        if not rows:
            continue
        pred = run.tail_predictions(rows, k, tail)
        ok = (pred[:, 0:2 * (C - 1):2] == tail[1::2]).all(1)  # after each tail action
        plans += [[int(a) for a in actions[i, :k + 1]] for i, good in zip(rows, ok) if good]
    return plans


def shortest_valid(plans, room, start, goal):
    """The shortest of ``plans`` that leads from cell ``start`` to ``goal`` in ``room`` (a
    Room, or the shape of a flat one), or None."""
    from .cogmap import execute
    goal = tuple(int(x) for x in goal)
    valid = [p for p in plans if execute(room, start, p) == goal]
    return min(valid, key=len) if valid else None


class RoomOracleDecoder(Decoder):
    """Greedy predictions that know the room, for walks starting at cell ``start``: after an
    action the observation of the cell it leads to (after an observation, that observation).
    Its cache holds the agent's cell after every token so far ((B, T, 2); rows and prefixes
    taken as a DecodeCache's are), so each call costs its new tokens only: a problem's
    rollouts cost their length, where recomputing with :func:`room_oracle` replays every
    rollout from the start at each of its steps (their length squared)."""

    class Cache:
        def __init__(self, pos):
            self.pos, self.length = pos, pos.shape[1]

        def select(self, rows, length=None, room=0):
            return RoomOracleDecoder.Cache(self.pos[rows, :length])

    def __init__(self, room, start, n_obs):
        self.room, self.start, self.n_obs = room, np.asarray(start), n_obs

    def __call__(self, tokens, cache=None):
        tokens = np.asarray(tokens)
        B, T = tokens.shape
        seen = 0 if cache is None else cache.length
        pos = np.tile(self.start, (B, 1)) if cache is None else cache.pos[:, -1]
        cells = np.empty((B, T, 2), np.int64)
        for t in range(T):
            if (seen + t) % 2:
                pos = rooms.move(self.room, pos, tokens[:, t] - self.n_obs)
            cells[:, t] = pos
        out = self.room.obs[cells[..., 0], cells[..., 1]].astype(np.int64)
        history = cells if cache is None else np.concatenate([cache.pos, cells], 1)
        return out, RoomOracleDecoder.Cache(history)


def room_oracle(room, start, n_obs):
    """A ``predict`` function that knows the room: tokens int (B, T) of walks that start at
    cell ``start`` (x_0's; actions offset by n_obs) -> (B, T) the true observation after each
    position (after an observation: that observation), by a fresh
    :class:`RoomOracleDecoder`. The rollout planner with it is the best any map-free model can
    do by random rollouts, its predictions never wrong."""
    return lambda tokens: RoomOracleDecoder(room, start, n_obs)(tokens)[0]


def evaluate_rollouts(predict, walks, room, n_obs, context, rollouts=100, seed=0):
    """ImpFallback and RatioSP (:func:`mapformer.cogmap.planning_metrics`) of the rollout
    planner over every walk of ``walks`` (problem w uses the Generator seed [seed, w]), plus
    ``returned`` (plans accepted by tail evaluation, summed) and ``returned_valid`` (those
    that reach the goal). ``predict``: a function or a :class:`Decoder` for every walk, or
    "oracle": each walk's :class:`RoomOracleDecoder` (the plans of :func:`room_oracle`)."""
    from .cogmap import planning_metrics
    tokens = walks.tokens(n_obs)
    N, C = tokens.shape[1] // 2, context
    starts, goals = walks.pos[:, C], walks.pos[:, N - C]
    best, returned, returned_valid = [], 0, 0
    for w in range(len(tokens)):
        walk_predict = (RoomOracleDecoder(room, walks.pos[w, 0], n_obs)
                        if isinstance(predict, str) and predict == "oracle" else predict)
        plans = rollout_plans(walk_predict, tokens[w], C, n_obs, rollouts, [seed, w])
        returned += len(plans)
        returned_valid += sum(shortest_valid([p], room, starts[w], goals[w])
                              is not None for p in plans)
        best.append(shortest_valid(plans, room, starts[w], goals[w]))
    metrics = planning_metrics(best, starts, goals, room, N - 2 * C)
    metrics.update(returned=returned, returned_valid=returned_valid, rollouts=rollouts)
    return metrics
