"""Cognitive maps from a discrete bottleneck's codes, planning on them, and TDB's metrics
(Dedieu et al. 2024, section 3.6 and appendices C, D, H), with networkx.

Extraction (appendix C), from the code tuples s_n (M indices, one per codebook) of the
training walks and their actions:
1. with M > 1, tuples within Hamming distance ``d_hamming`` (the fraction of differing
   slots, 0.25) are clustered: greedily by frequency, the most frequent unassigned tuple
   absorbing every unassigned tuple within the distance (the paper does not say whether its
   merging is transitive; this one is not);
2. counts C[i, a, k] of (cluster i, action a, next cluster k) over consecutive steps (kept
   sparse, :class:`Transitions`: a poorly trained bottleneck gives tens of thousands); edge
   i -> k labelled with argmax_a C[i, a, k], kept iff that count >= ``threshold`` (0.1) x the
   largest count;
3. nodes with fewer than 2 distinct in- or out-neighbours (self excluded) are dropped (one
   pass), then nodes with the same in- and out-neighbours are merged, until none are;
4. every cluster left out is attached to the kept node whose transition distributions
   p(k | i, a) (from the counts of step 2, unthresholded) are nearest in L1.
Planning: networkx.shortest_path between the nodes of two tuples (a tuple never seen is
replaced by the nearest seen one in Hamming distance); the plan is the edges' actions.

A second extractor, beyond the paper: from a MapWM / MapEM model's path-integrated angles
theta at the observation positions (:func:`extract_angle_map`): the angle vectors' points
on the unit circles are clustered by k-means into a number of places (as many as TDB has
codes, by default), and the places go through steps 2-4 above as 1-tuples.

Metrics: ImpFallback (% of problems with a valid plan, one that reaches the goal cell when run
in the true room, shorter than the fallback path), RatioSP (mean plan length / shortest
length over those problems) and NormGED (graph edit distance between the map and the true
graph over the sum of their distances to the empty graph; learned nodes carry the true cell
most often seen while they are active, appendix H, and are matched to it).
"""
from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from .analysis import wrap
from .tasks import rooms


def cluster_tuples(tuples, counts, d_hamming=0.25):
    """tuples int (U, M) unique code tuples, counts (U,) their frequencies -> cluster id
    (U,) int: greedy by frequency (see the module). M = 1: every tuple its own cluster."""
    tuples = np.asarray(tuples)
    U, M = tuples.shape
    cluster = np.full(U, -1, np.int64)
    if M == 1:
        return np.arange(U)
    n = 0
    for i in np.argsort(-np.asarray(counts), kind="stable"):
        if cluster[i] >= 0:
            continue
        near = (tuples != tuples[i]).mean(-1) <= d_hamming + 1e-12
        cluster[near & (cluster < 0)] = n
        n += 1
    return cluster


@dataclass(frozen=True)
class Transitions:
    """Sparse transition counts: the E distinct (source, action, target) triples seen, sorted
    lexicographically, each int64 (E,), with their counts (E,); dense form C[i, a, k] by
    :meth:`dense` (n_states x n_actions x n_states: small maps only)."""

    source: np.ndarray
    action: np.ndarray
    target: np.ndarray
    count: np.ndarray
    n_states: int
    n_actions: int

    def dense(self):
        c = np.zeros((self.n_states, self.n_actions, self.n_states), np.int64)
        c[self.source, self.action, self.target] = self.count
        return c

    def probabilities(self):
        """(E,) p(target | source, action) of each triple: its count over its (source,
        action) row's total."""
        row = self.source * self.n_actions + self.action
        if not len(row):
            return np.zeros(0)
        first = np.r_[0, np.flatnonzero(np.diff(row)) + 1]  # rows are contiguous (sorted)
        totals = np.add.reduceat(self.count, first)
        return self.count / np.repeat(totals, np.diff(np.r_[first, len(row)]))


def transition_counts(states, actions, n_states, n_actions=rooms.N_ACTIONS):
    """states int (W, N) (-1: none), actions int (W, N) -> :class:`Transitions`: counts of
    (s_n, a_n, s_{n+1}) over consecutive steps of every walk, stored sparse (the map of a
    badly clustered run has tens of thousands of states)."""
    s, a, t = states[:, :-1].ravel(), actions[:, :-1].ravel(), states[:, 1:].ravel()
    ok = (s >= 0) & (t >= 0)
    key = (s[ok].astype(np.int64) * n_actions + a[ok]) * n_states + t[ok]
    key, count = np.unique(key, return_counts=True)
    row, target = np.divmod(key, n_states)
    source, action = np.divmod(row, n_actions)
    return Transitions(source, action, target, count.astype(np.int64), int(n_states),
                       int(n_actions))


def graph_from_counts(transitions, threshold=0.1):
    """DiGraph over the states with an edge i -> k (attribute action = argmax_a C[i, a, k],
    the lowest action on ties, and its count) where that count >= threshold x the largest
    count. transitions: :class:`Transitions`."""
    tr = transitions
    graph = nx.DiGraph()
    graph.add_nodes_from(range(tr.n_states))
    cmax = tr.count.max() if tr.count.size else 0
    if cmax == 0:
        return graph
    order = np.lexsort((tr.action, -tr.count, tr.target, tr.source))  # best action first
    s, t = tr.source[order], tr.target[order]
    first = np.r_[True, (s[1:] != s[:-1]) | (t[1:] != t[:-1])]
    best = order[first]
    for e in best[tr.count[best] >= threshold * cmax]:
        graph.add_edge(int(tr.source[e]), int(tr.target[e]), action=int(tr.action[e]),
                       count=int(tr.count[e]))
    return graph


def nearest_kept(transitions, states, kept):
    """For each of ``states`` (Q,), the node of ``kept`` (sorted, K) whose transition
    distributions p(k | i, a) (0 for an unseen (i, a)) are nearest in L1 summed over a and k,
    the first on ties -> (nodes (Q,), distances (Q,)). Sparse: L1(i, j) = |p_i| + |p_j| -
    2 sum min(p_i, p_j) over the (a, k) both have, |p_i| the number of actions seen from i."""
    tr = transitions
    kept = np.asarray(kept, np.int64)
    p = tr.probabilities()
    rows = np.unique(tr.source * tr.n_actions + tr.action)
    mass = np.bincount(rows // tr.n_actions, minlength=tr.n_states).astype(np.float64)
    slot = np.full(tr.n_states, -1, np.int64)
    slot[kept] = np.arange(len(kept))
    mine = slot[tr.source] >= 0  # the kept nodes' entries, sorted by (action, target)
    key = tr.action * tr.n_states + tr.target
    by_key = np.flatnonzero(mine)[np.argsort(key[mine], kind="stable")]
    kept_key, kept_slot, kept_p = key[by_key], slot[tr.source[by_key]], p[by_key]
    starts = np.searchsorted(tr.source, states, "left")
    ends = np.searchsorted(tr.source, states, "right")
    nodes = np.empty(len(states), np.int64)
    distances = np.empty(len(states))
    for q, (i, lo, hi) in enumerate(zip(states, starts, ends)):
        dist = mass[kept] + mass[i]
        for e in range(lo, hi):
            a, b = np.searchsorted(kept_key, key[e], "left"), np.searchsorted(kept_key, key[e],
                                                                             "right")
            dist[kept_slot[a:b]] -= 2 * np.minimum(kept_p[a:b], p[e])  # one entry a node
        best = int(dist.argmin())
        nodes[q], distances[q] = kept[best], dist[best]
    return nodes, distances


def prune_degree(graph, minimum=2):
    """The subgraph of nodes with at least ``minimum`` distinct in- and out-neighbours (self
    excluded), one pass."""
    keep = [n for n in graph
            if len(set(graph.successors(n)) - {n}) >= minimum
            and len(set(graph.predecessors(n)) - {n}) >= minimum]
    return graph.subgraph(keep).copy()


def merge_same_neighbours(graph):
    """Merge nodes with the same in- and out-neighbours until none are -> (graph, alias:
    {merged node: the node it became})."""
    alias = {}
    while True:
        groups = {}
        for n in graph:
            key = (frozenset(graph.successors(n)), frozenset(graph.predecessors(n)))
            groups.setdefault(key, []).append(n)
        merges = [sorted(g) for g in groups.values() if len(g) > 1]
        if not merges:
            return graph, alias
        for group in merges:
            keep = group[0]
            for other in group[1:]:
                graph = nx.contracted_nodes(graph, keep, other, self_loops=True, copy=True)
                alias[other] = keep
        for k, v in list(alias.items()):
            while v in alias:
                v = alias[v]
            alias[k] = v


@dataclass
class CogMap:
    """graph: DiGraph of map nodes (edge attribute action); tuples int (U, M): the code tuples
    seen; node_of: (U,) the map node of each tuple (after attachment); retained: bool (U,),
    whether the tuple's cluster survived the thresholds as a node of its own (or merged into
    one) rather than being attached to its nearest node (step 4)."""

    graph: nx.DiGraph
    tuples: np.ndarray
    node_of: np.ndarray
    lookup: dict = field(default_factory=dict)
    retained: np.ndarray = None

    def node(self, code_tuple):
        """The map node of a code tuple (M,): its own, or the nearest seen tuple's."""
        key = tuple(int(x) for x in code_tuple)
        if key in self.lookup:
            return self.lookup[key]
        dist = (self.tuples != np.asarray(code_tuple)).sum(-1)
        return int(self.node_of[int(dist.argmin())])

    def plan(self, start_tuple, goal_tuple):
        """Actions of a shortest path from the node of start_tuple to that of goal_tuple, or
        None when the map has no path."""
        u, v = self.node(start_tuple), self.node(goal_tuple)
        try:
            path = nx.shortest_path(self.graph, u, v)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            return None
        return [self.graph.edges[a, b]["action"] for a, b in zip(path, path[1:])]


def extract_map(indices, actions, d_hamming=0.25, threshold=0.1, n_actions=rooms.N_ACTIONS):
    """indices int (W, N, M): the code tuples of W walks, actions int (W, N) -> CogMap."""
    indices = np.asarray(indices)
    W, N, M = indices.shape
    tuples, inverse, counts = np.unique(indices.reshape(-1, M), axis=0, return_inverse=True,
                                        return_counts=True)
    cluster = cluster_tuples(tuples, counts, d_hamming)
    states = cluster[inverse.reshape(W, N)]
    n_clusters = int(cluster.max()) + 1
    c = transition_counts(states, np.asarray(actions), n_clusters, n_actions)
    graph, alias = merge_same_neighbours(prune_degree(graph_from_counts(c, threshold)))
    kept = sorted(graph)
    node_of_cluster = np.array([alias.get(i, i) if alias.get(i, i) in graph else -1
                                for i in range(n_clusters)])
    orphans = np.flatnonzero(node_of_cluster < 0)
    retained = (node_of_cluster >= 0)[cluster]
    if kept and len(orphans):
        node_of_cluster[orphans] = nearest_kept(c, orphans, kept)[0]
    node_of = node_of_cluster[cluster]
    lookup = {tuple(int(x) for x in t): int(n) for t, n in zip(tuples, node_of)}
    return CogMap(graph, tuples, node_of, lookup, retained)


def execute(room, start, plan):
    """The cell (r, c) reached by running ``plan`` (actions) from ``start`` in ``room`` (a
    :class:`mapformer.tasks.rooms.Room`, the cube included, or the shape (H, W) of a flat
    room)."""
    if not isinstance(room, rooms.Room):
        room = rooms.Room(np.empty(tuple(room), np.int8), None)
    pos = np.asarray(start)
    for a in plan:
        pos = rooms.move(room, pos, np.asarray(a))
    return tuple(int(x) for x in pos)


def planning_metrics(plans, starts, goals, room, fallback_length):
    """plans: a list of action lists (None: no plan), starts, goals (P, 2) cells ->
    {"ImpFallback": % of problems whose plan reaches the goal in ``room`` and is shorter than
    fallback_length, "RatioSP": mean len(plan) / shortest length over those (nan if none),
    "problems": P}. Problems whose start is their goal are left out (shortest length 0)."""
    graph = nx.DiGraph(rooms.ground_truth_graph(room))
    w = room.obs.shape[1]
    good, ratios, counted = 0, [], 0
    for plan, s, g in zip(plans, starts, goals):
        s, g = tuple(int(x) for x in s), tuple(int(x) for x in g)
        if s == g:
            continue
        counted += 1
        if plan is None or len(plan) >= fallback_length:
            continue
        if execute(room, s, plan) != g:
            continue
        good += 1
        ratios.append(len(plan) / nx.shortest_path_length(graph, s[0] * w + s[1],
                                                         g[0] * w + g[1]))
    return {"ImpFallback": 100.0 * good / max(counted, 1),
            "RatioSP": float(np.mean(ratios)) if ratios else float("nan"),
            "problems": counted}


def node_positions(cogmap, indices, positions):
    """{map node: the true cell (r, c) seen most often while it is active}: indices (W, N, M),
    positions (W, N, 2) of the same walks."""
    seen = {}
    flat_i = np.asarray(indices).reshape(-1, np.asarray(indices).shape[-1])
    flat_p = np.asarray(positions).reshape(-1, 2)
    for t, p in zip(flat_i, flat_p):
        n = cogmap.node(t)
        key = (int(p[0]), int(p[1]))
        counts = seen.setdefault(n, {})
        counts[key] = counts.get(key, 0) + 1
    return {n: max(c.items(), key=lambda kv: (kv[1], kv[0]))[0] for n, c in seen.items()}


def norm_ged(learned, truth):
    """GED(learned, truth) / (GED(learned, empty) + GED(truth, empty)) in [0, 1], unit costs,
    with nodes matched by their ``pos`` attributes (appendix H's rule: a learned node is the
    true cell seen most often while it is active): each true cell takes the learned node of
    its position with the most edges (ties: the lowest id), every other node is deleted or
    inserted, and an edge counts as kept when its image under that matching is an edge of
    the other graph (multi-edges collapsed). Exact when the learned nodes' positions are
    distinct; otherwise an upper bound of the GED over all matchings, as the paper's
    timeout-limited search (networkx.optimize_graph_edit_distance, which needs SciPy) also
    returns."""
    g1, g2 = nx.DiGraph(learned), nx.DiGraph(truth)
    cell = {g2.nodes[m].get("pos"): m for m in g2}
    match = {}
    for n in sorted(g1, key=lambda n: (-g1.degree(n), n)):
        m = cell.get(g1.nodes[n].get("pos"))
        if m is not None and m not in match.values():
            match[n] = m
    kept = sum(1 for u, v in g1.edges if u in match and v in match
               and g2.has_edge(match[u], match[v]))
    cost = (g1.number_of_nodes() + g2.number_of_nodes() - 2 * len(match)
            + g1.number_of_edges() + g2.number_of_edges() - 2 * kept)
    empty = (g1.number_of_nodes() + g1.number_of_edges() + g2.number_of_nodes()
             + g2.number_of_edges())
    return cost / empty if empty else 0.0


META_MINIMUMS = {"seed": 0, "train_walks": 1, "test_walks": 1, "context": 0, "angle_places": 1}
OPTIONAL_META = ("context", "angle_places")


def room_config(meta):
    """The RoomsConfig of a map checkpoint's ``meta`` (as the reproduction script writes it),
    its fields checked: room (RoomsConfig's fields), seed, train_walks, test_walks and, where
    present, context and angle_places (integers, at least META_MINIMUMS') and noise (a share
    in [0, 1)). ValueError naming the field."""
    if not isinstance(meta.get("room"), dict):
        raise ValueError(f"meta field 'room' must be a JSON object of RoomsConfig fields, got "
                         f"{meta.get('room')!r:.80}")
    try:
        config = rooms.RoomsConfig(**meta["room"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"meta field 'room' is not a room: {exc}") from None
    for name, low in META_MINIMUMS.items():
        value = meta.get(name)
        if value is None and name in OPTIONAL_META:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"meta field {name!r} must be an integer >= {low}, got "
                             f"{value!r:.80}")
    noise = meta.get("noise", 0.0)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise < 1:
        raise ValueError(f"meta field 'noise' must be a share in [0, 1), got {noise!r:.80}")
    return config


def walks_of(meta):
    """(room config, room, training walks, test walks) of a TDB checkpoint's ``meta``
    (checked: :func:`room_config`); the training walks carry the meta's noise, as the pool
    the model trained on (:func:`mapformer.tasks.rooms.training_walks`)."""
    config = room_config(meta)
    room = rooms.make_room(config)
    seed = meta["seed"]
    pool = rooms.RoomsTask(replace(config, seed=seed), meta["train_walks"],
                           noise=meta.get("noise", 0.0))
    return (config, room, rooms.training_walks(pool, room),
            rooms.walks(config, room, meta["test_walks"], [seed, 2]))


def encode_all(model, tokens, batch=32):
    """The code tuples (W, N, M) of a TDB over walks' tokens (W, 2N), ``batch`` at a time."""
    model.train(False)
    return np.concatenate([np.asarray(model.encode(tokens[i:i + batch])[1])
                           for i in range(0, len(tokens), batch)])


def code_statistics(states, positions):
    """How the training walks' codes sit on the room: states int (W, N, M) (code tuples, or
    place ids with M = 1), positions int (W, N, 2) (the cells) -> {"tuples": the distinct
    tuples, "tuples_per_cell": the mean over visited cells of the distinct tuples seen there
    (1 for a code per cell; a clone structure has more), "cells_per_tuple": the mean over
    tuples of the distinct cells they were seen at (1 for codes that alias nothing), "purity":
    the fraction of positions whose tuple's most frequent cell is their own
    (:func:`place_purity`; rare tuples weigh little here, as in the map)}."""
    states = np.asarray(states)
    flat = states.reshape(-1, states.shape[-1])
    cells = np.asarray(positions).reshape(-1, 2)
    _, tuple_id = np.unique(flat, axis=0, return_inverse=True)
    _, cell_id = np.unique(cells, axis=0, return_inverse=True)
    pairs = np.unique(np.stack([tuple_id.ravel(), cell_id.ravel()], 1), axis=0)
    return {"tuples": int(tuple_id.max()) + 1,
            "tuples_per_cell": float(np.bincount(pairs[:, 1]).mean()),
            "cells_per_tuple": float(np.bincount(pairs[:, 0]).mean()),
            "purity": float(place_purity(tuple_id.reshape(states.shape[:2]), positions))}


def timestep_metrics(cm, states):
    """What the TDB paper's Figs. 10 and 11 show, on walks' code tuples ``states`` int
    (W, N, M) (the test walks'): "teleport_by_timestep" {"positions", "hits"}: per
    observation index n + 1 (1-based, lists indexed by it) the walks and how many of them
    "teleport" there, their map node at x_{n+1} neither the node at x_n nor its successor
    in the map (a shortest path longer than one step); "codes" {"count", "mean_timestep",
    "retained"}: per distinct tuple of the walks, how often it occurs, the mean observation
    index (1-based) it occurs at, and whether it survived the map's thresholds
    (:attr:`CogMap.retained`; False for a tuple the training walks never showed)."""
    states = np.asarray(states)
    W, N, M = states.shape
    tuples, inverse, counts = np.unique(states.reshape(-1, M), axis=0, return_inverse=True,
                                        return_counts=True)
    node = np.array([cm.node(t) for t in tuples])[inverse.reshape(W, N)]
    seen = {tuple(int(x) for x in t): bool(r) for t, r in zip(cm.tuples, cm.retained)}
    step = np.broadcast_to(np.arange(1, N + 1), (W, N))
    pairs, which = np.unique(np.stack([node[:, :-1], node[:, 1:]], -1).reshape(-1, 2),
                             axis=0, return_inverse=True)  # each distinct step judged once
    near = np.array([a == b or cm.graph.has_edge(a, b) for a, b in pairs], bool)
    jumps = ~near[which.ravel()].reshape(W, N - 1)
    positions = np.zeros(N + 1, np.int64)
    positions[2:] = W
    hits = np.zeros(N + 1, np.int64)
    hits[2:] = jumps.sum(0)
    mean_step = np.bincount(inverse.ravel(), weights=step.ravel()) / counts
    return {"teleport_by_timestep": {"positions": positions.tolist(), "hits": hits.tolist()},
            "codes": {"count": counts.tolist(), "mean_timestep": mean_step.tolist(),
                      "retained": [seen.get(tuple(int(x) for x in t), False)
                                   for t in tuples]}}


def map_metrics(cm, train_states, train, test_states, test, room, context):
    """Planning metrics and NormGED of a map ``cm`` built from the training walks' states
    (W, N, M) (code tuples, or cluster ids with M = 1): node positions from ``train``'s cells,
    plans from position ``context`` to N - context of every test walk (its states
    ``test_states``), and the codes' :func:`code_statistics` on the training walks. Sets the
    map's node attribute pos."""
    nx.set_node_attributes(cm.graph, node_positions(cm, train_states, train.pos), "pos")
    N = test_states.shape[1]
    plans = [cm.plan(test_states[i, context], test_states[i, N - context])
             for i in range(len(test_states))]
    metrics = planning_metrics(plans, test.pos[:, context], test.pos[:, N - context], room,
                               N - 2 * context)
    metrics["NormGED"] = norm_ged(cm.graph, rooms.ground_truth_graph(room))
    metrics["nodes"] = cm.graph.number_of_nodes()
    metrics["edges"] = cm.graph.number_of_edges()
    metrics.update(code_statistics(train_states, train.pos))
    return metrics


def evaluate_map(model, meta, context, by_timestep=False, d_hamming=0.25, threshold=0.1):
    """(map, room, metrics) of a trained TDB on its room: the map from the training walks'
    codes (:func:`extract_map` with ``d_hamming`` and ``threshold``, the paper's 0.25 and 0.1
    by default), plans from position ``context`` to N - context of every test walk; with
    ``by_timestep`` the metrics add "by_timestep", :func:`timestep_metrics` on the test
    walks."""
    config, room, train, test = walks_of(meta)
    codes = encode_all(model, train.tokens(config.n_obs))
    cm = extract_map(codes, train.actions, d_hamming, threshold)
    test_codes = encode_all(model, test.tokens(config.n_obs))
    metrics = map_metrics(cm, codes, train, test_codes, test, room, context)
    if by_timestep:
        metrics["by_timestep"] = timestep_metrics(cm, test_codes)
    return cm, room, metrics


# Beyond the paper: a map from a MapFormer's path-integrated positions instead of codes.

def observation_angles(model, tokens, batch=32):
    """theta (W, N, H NB) of a MapWM / MapEM :class:`mapformer.models.Transformer` (its first
    block's scheme, the path integrator: ``blocks[0].mixer.scheme.theta``) at the observation
    positions of walks' tokens (W, 2N), ``batch`` walks at a time."""
    model.train(False)
    out = []
    for i in range(0, len(tokens), batch):
        t = np.asarray(tokens[i:i + batch])
        model.forward(t)
        theta = model.ops.to_numpy(model.blocks[0].mixer.scheme.theta)
        out.append(theta.reshape(t.shape[0], t.shape[1], -1)[:, 0::2])
    return np.concatenate(out)


def _circle(angles):
    """angles (..., A) -> their points on the unit circles (..., 2A) over sqrt(A): the RMS
    chord distance between two angle vectors is the Euclidean distance of their images."""
    a = np.asarray(angles, np.float64)
    return np.concatenate([np.cos(a), np.sin(a)], -1) / np.sqrt(a.shape[-1])


@dataclass
class AngleClusters:
    """centres float32 (K, 2A): the places' centres on the unit circles (:func:`_circle`)."""

    centres: np.ndarray

    def assign(self, angles, rows=32768):
        """angles (..., A) -> (...) the nearest centre's id (lowest id on ties), ``rows``
        points at a time (a (rows, K) distance block)."""
        e = _circle(angles).astype(np.float32)  # as cluster_angles computed its ids
        flat = e.reshape(-1, e.shape[-1])
        return _nearest(flat, self.centres, rows).reshape(e.shape[:-1])


def _nearest(points, centres, rows=32768):
    """points (P, D), centres (K, D) -> (P,) the nearest centre's index (squared Euclidean
    distance, one product per block of ``rows`` points)."""
    c2 = (centres ** 2).sum(1)
    out = np.empty(len(points), np.int64)
    for i in range(0, len(points), rows):
        p = points[i:i + rows]
        out[i:i + rows] = (c2[None] - 2 * p @ centres.T).argmin(1)
    return out


def _kmeans_pp(points, places, rng):
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; greedy as scikit-learn's):
    points (P, D) -> centres (<= places, D). Each next centre is the best, by the summed
    squared distance to the nearest centre it leaves, of 2 + ln(places) candidates drawn
    with probability proportional to that distance (squared distances under 1e-6, the
    product's float32 rounding, count as 0); stops early when every point sits on a
    centre."""
    candidates = 2 + int(np.log(places))
    norms = (points ** 2).sum(1)
    chosen = [int(rng.integers(len(points)))]
    d2 = ((points - points[chosen[0]]) ** 2).sum(1)
    while len(chosen) < places and d2.sum() > 0:
        pick = rng.choice(len(points), candidates, p=d2 / d2.sum())
        to_pick = norms[:, None] - 2 * points @ points[pick].T + norms[pick]
        to_pick[to_pick < 1e-6] = 0
        after = np.minimum(d2[:, None], to_pick)
        best = int(after.sum(0).argmin())
        chosen.append(int(pick[best]))
        d2 = after[:, best]
    return points[chosen].copy()


def cluster_angles(angles, places=500, iterations=30, seed=0, init_sample=50000):
    """angles (P, A) -> (ids (P,), AngleClusters): k-means of the angle vectors' points on
    the unit circles (:func:`_circle`, where Euclidean distance is the RMS chord distance)
    into at most ``places`` places: greedy k-means++ seeding on ``init_sample`` points drawn
    with ``seed``, then Lloyd's iterations (at most ``iterations``, until no point changes
    place); a place left empty is dropped, and ids are numbered by first appearance. A step
    is O(P K A): one product per block of points."""
    if places < 1:
        raise ValueError(f"places must be at least 1, got {places}")
    e = _circle(np.asarray(angles).reshape(-1, np.shape(angles)[-1])).astype(np.float32)
    rng = np.random.default_rng(seed)
    sample = e if len(e) <= init_sample else e[rng.choice(len(e), init_sample, replace=False)]
    centres = _kmeans_pp(sample, places, rng)
    ids = _nearest(e, centres)
    for _ in range(iterations):
        counts = np.bincount(ids, minlength=len(centres))
        sums = np.zeros_like(centres)
        np.add.at(sums, ids, e)
        filled = counts > 0
        centres[filled] = sums[filled] / counts[filled, None]
        new = _nearest(e, centres)
        if np.array_equal(new, ids):
            break
        ids = new
    used, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(len(used), np.int64)
    rank[np.argsort(first)] = np.arange(len(used))
    return rank[inverse], AngleClusters(centres[used[np.argsort(first)]])


def extract_angle_map(angles, actions, places=500, threshold=0.1):
    """angles (W, N, A) at the observations of W walks, actions (W, N) -> (CogMap over the
    places' ids as 1-tuples, AngleClusters, the walks' place ids (W, N, 1)): the angles'
    k-means places (:func:`cluster_angles`), then appendix C's steps 2-4 as for codes
    (:func:`extract_map`, M = 1)."""
    angles = np.asarray(angles)
    ids, clusters = cluster_angles(angles.reshape(-1, angles.shape[-1]), places)
    W, N = angles.shape[:2]
    ids = ids.reshape(W, N, 1)
    return extract_map(ids, actions, threshold=threshold), clusters, ids


def place_purity(states, positions):
    """states int (W, N) place ids, positions (W, N, 2) true cells -> the fraction of
    positions whose place's most frequent cell is their own cell (1: every place lies in
    one cell; for places that ignore the cell, see ``purity_chance`` of
    :func:`evaluate_angle_map`)."""
    s = np.asarray(states).ravel()
    p = np.asarray(positions).reshape(-1, 2)
    cell = np.unique(p, axis=0, return_inverse=True)[1].ravel()
    cells = int(cell.max()) + 1
    pair, count = np.unique(s * cells + cell, return_counts=True)
    best = np.zeros(s.max() + 1, np.int64)
    np.maximum.at(best, pair // cells, count)
    return float(best.sum() / len(s))


def revisit_distances(angles, positions, pairs=20000, seed=0):
    """angles (W, N, A), positions (W, N, 2) of the same walks -> {"revisit_distance": the
    median RMS chord distance (:func:`_circle`) between the angles at two observations of one
    walk in the same cell, "other_distance": the same over two different cells}, over
    ``pairs`` position pairs drawn within walks with ``seed`` (nan where no pair was drawn).
    A path integrator's revisits are near 0; angles that ignore the cell give both alike."""
    angles, positions = np.asarray(angles), np.asarray(positions)
    W, N = angles.shape[:2]
    rng = np.random.default_rng(seed)
    w, i, j = rng.integers(0, W, pairs), rng.integers(0, N, pairs), rng.integers(0, N, pairs)
    keep = i != j
    w, i, j = w[keep], i[keep], j[keep]
    d = np.sqrt(((_circle(angles[w, i]) - _circle(angles[w, j])) ** 2).sum(-1))
    same = (positions[w, i] == positions[w, j]).all(-1)
    return {"revisit_distance": float(np.median(d[same])) if same.any() else float("nan"),
            "other_distance": float(np.median(d[~same])) if (~same).any() else float("nan")}


def step_closure(model, tokens, n_obs, walks=32):
    """How far a step there and back (x a x a') turns a MapWM / MapEM model's first-block
    angles: the median over its (head, block) angles and the two pairs of opposite actions
    (up / down, left / right) of |wrap(omega (Delta_a + Delta_a' + 2 Delta_x))|, radians in
    [0, pi], each Delta the mean over the token's occurrences in the first ``walks`` walks of
    ``tokens`` (W, 2N) (Delta_x: over the n_obs observation tokens). 0 for a path integrator
    (away from walls); about pi / 2 for steps unrelated to the moves; nan when a token is
    missing from those walks."""
    model.train(False)
    t = np.asarray(tokens[:walks])
    model.forward(t)
    scheme = model.blocks[0].mixer.scheme
    delta = np.asarray(model.ops.to_numpy(scheme.delta), np.float64).reshape(t.shape + (-1,))
    omega = np.asarray(model.ops.to_numpy(scheme.frequencies), np.float64).reshape(-1)
    if not all((t == k).any() for k in range(n_obs + rooms.N_ACTIONS)):
        return float("nan")
    mean = [delta[t == k].mean(0) for k in range(n_obs + rooms.N_ACTIONS)]
    obs = np.mean(mean[:n_obs], 0)
    turns = [omega * (mean[n_obs + a] + mean[n_obs + a + 1] + 2 * obs) for a in (0, 2)]
    return float(np.median(np.abs(wrap(np.array(turns)))))


def evaluate_angle_map(model, config, room, train, test, context, places=500):
    """(map, metrics) of a trained MapWM / MapEM transformer (trained on the rooms' tokens) on
    walks of ``room`` (rooms config ``config``): the map from the training walks' angles
    (``places`` k-means places), plans between the places nearest the test walks' angles at
    ``context`` and N - context; metrics as :func:`map_metrics` plus ``clusters`` (places
    found), ``purity`` (:func:`place_purity` over the training walks), ``purity_chance``
    (the same with the place ids shuffled over the positions, seed 0: places of the same
    sizes that ignore the cell), :func:`revisit_distances` of the training walks and
    :func:`step_closure`."""
    angles = observation_angles(model, train.tokens(config.n_obs))
    cm, clusters, states = extract_angle_map(angles, train.actions, places)
    test_states = clusters.assign(observation_angles(model, test.tokens(config.n_obs)))
    metrics = map_metrics(cm, states, train, test_states[..., None], test, room, context)
    metrics["clusters"] = len(clusters.centres)
    metrics["purity"] = place_purity(states[..., 0], train.pos)
    metrics["purity_chance"] = place_purity(
        np.random.default_rng(0).permutation(states.ravel()), train.pos)
    metrics.update(revisit_distances(angles, train.pos))
    metrics["step_closure"] = step_closure(model, train.tokens(config.n_obs), config.n_obs)
    return cm, metrics


def write_graphml(graph, path):
    """The map as GraphML (a node's pos as the string 'r,c')."""
    g = nx.DiGraph()
    for n, attrs in graph.nodes(data=True):
        pos = attrs.get("pos")
        g.add_node(n, pos="" if pos is None else f"{pos[0]},{pos[1]}")
    for u, v, attrs in graph.edges(data=True):
        g.add_edge(u, v, action=attrs.get("action", -1))
    nx.write_graphml(g, path)


def plot_maps(learned, room, path):
    """PNG: the learned map beside the room's true graph, nodes coloured by their cell's
    observation: in a flat room (or a torus) each node drawn at the true cell it is most often
    active in (jittered so that nodes of one cell do not hide each other); on the cube, whose
    faces' cells have no plane layout, both graphs by the Kamada-Kawai algorithm (as the
    paper's Fig. 3)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    truth = nx.DiGraph(rooms.ground_truth_graph(room))
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, graph, title, jitter in ((axes[0], learned, "learned map", 0.25),
                                     (axes[1], truth, "true room", 0.0)):
        placed = [n for n in graph if graph.nodes[n].get("pos") is not None]
        if room.topology == "cube":
            layout = nx.kamada_kawai_layout(graph.subgraph(placed).to_undirected())
        else:
            layout = {n: (graph.nodes[n]["pos"][1] + jitter * rng.uniform(-1, 1),
                          -graph.nodes[n]["pos"][0] + jitter * rng.uniform(-1, 1))
                      for n in placed}
        sub = graph.subgraph(layout)
        colours = [room.obs[graph.nodes[n]["pos"]] for n in sub]
        nx.draw_networkx(sub, layout, ax=ax, node_size=60, node_color=colours,
                         cmap="tab10", with_labels=False, arrows=False, width=0.5)
        ax.set_title(f"{title}: {graph.number_of_nodes()} nodes, "
                     f"{graph.number_of_edges()} edges")
        ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
