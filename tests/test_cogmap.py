"""Cognitive-map extraction, planning and the TDB metrics on codes whose answer is known."""
import networkx as nx
import numpy as np
import pytest

from mapformer import cogmap
from mapformer.tasks import rooms

CONFIG = rooms.RoomsConfig(height=3, width=4, n_obs=3, patch=0, steps=60, seed=1)


def perfect_codes(n_walks=40, seed=0):
    """Walks whose code is the agent's cell: the map must be the room itself."""
    room = rooms.make_room(CONFIG)
    w = rooms.walks(CONFIG, room, n_walks, seed)
    return room, w, rooms.node_of(w.pos, CONFIG.width)[..., None]


def test_cluster_tuples_greedy_by_frequency():
    tuples = np.array([[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 1], [5, 5, 5, 5]])
    counts = np.array([1, 10, 3, 2])
    # [0,0,0,1] (most frequent) absorbs the tuples one slot away; [0,0,1,1] is one slot from
    # it too; [5,5,5,5] is alone
    assert list(cogmap.cluster_tuples(tuples, counts)) == [0, 0, 0, 1]
    assert list(cogmap.cluster_tuples(tuples[:, :1], counts)) == [0, 1, 2, 3]


def test_graph_from_counts_thresholds_and_labels():
    counts = np.zeros((3, 4, 3), np.int64)
    counts[0, 2, 1] = 100
    counts[0, 1, 1] = 5
    counts[1, 3, 2] = 10   # exactly 0.1 x max: kept
    counts[2, 0, 0] = 9    # below: dropped
    s, a, t = np.nonzero(counts)
    g = cogmap.graph_from_counts(cogmap.Transitions(s, a, t, counts[s, a, t], 3, 4))
    assert set(g.edges) == {(0, 1), (1, 2)}
    assert g.edges[0, 1]["action"] == 2 and g.edges[1, 2]["action"] == 3
    assert g.edges[0, 1]["count"] == 100


def random_walk_states(n_states=40, walks=30, steps=25, seed=0):
    rng = np.random.default_rng(seed)
    states = rng.integers(-1, n_states, (walks, steps))
    return states, rng.integers(0, 4, (walks, steps))


def test_sparse_transition_counts_match_the_dense_count():
    states, actions = random_walk_states()
    dense = np.zeros((40, 4, 40), np.int64)
    for w in range(states.shape[0]):
        for n in range(states.shape[1] - 1):
            if states[w, n] >= 0 and states[w, n + 1] >= 0:
                dense[states[w, n], actions[w, n], states[w, n + 1]] += 1
    tr = cogmap.transition_counts(states, actions, 40)
    assert (tr.dense() == dense).all() and tr.count.sum() == dense.sum()
    rows = dense.sum(-1, keepdims=True)
    p = dense / np.maximum(rows, 1)
    assert np.allclose(tr.probabilities(), p[tr.source, tr.action, tr.target], atol=1e-15)
    # the edge labels: argmax over actions, the lowest on ties, as the dense argmax
    g = cogmap.graph_from_counts(tr, threshold=0.0)
    best = dense.max(1)
    assert set(g.edges) == set(zip(*map(list, np.nonzero(best > 0))))
    for i, k in g.edges:
        assert g.edges[i, k]["action"] == dense[i, :, k].argmax()


def test_nearest_kept_is_the_dense_l1_argmin():
    states, actions = random_walk_states(seed=3)
    tr = cogmap.transition_counts(states, actions, 40)
    dense = tr.dense()
    p = dense / np.maximum(dense.sum(-1, keepdims=True), 1)
    kept = np.arange(0, 40, 3)
    orphans = np.setdiff1d(np.arange(40), kept)
    nodes, dist = cogmap.nearest_kept(tr, orphans, kept)
    for i, node, d in zip(orphans, nodes, dist):
        full = np.abs(p[kept] - p[i]).sum((1, 2))
        assert abs(d - full.min()) < 1e-12 and abs(full[kept == node][0] - full.min()) < 1e-12
    # a state with no transitions out is nearest the kept node with fewest actions seen
    empty = cogmap.Transitions(*(np.zeros(0, np.int64),) * 4, 3, 4)
    assert list(cogmap.nearest_kept(empty, np.array([2]), [0, 1])[0]) == [0]


def test_extract_map_with_many_noise_codes_stays_sparse():
    """Perfect codes with a third of the steps replaced by codes seen once (about 16,000
    clusters: a dense (clusters, actions, clusters) table would need 8 GB): the room is still
    the map, the cells keep their nodes, and every noise code is attached to a kept node."""
    room, w, codes = perfect_codes(n_walks=800)
    rng = np.random.default_rng(0)
    noise = rng.random(codes.shape) < 1 / 3
    codes = np.where(noise, 100 + np.cumsum(noise).reshape(codes.shape), codes)
    cm = cogmap.extract_map(codes, w.actions)
    assert len(cm.tuples) == 12 + noise.sum() > 15_000
    assert sorted(cm.graph) == list(range(12))
    assert set(cm.graph.edges) == set(nx.DiGraph(rooms.ground_truth_graph(room)).edges)
    assert list(cm.node_of[:12]) == list(range(12)) and (cm.node_of[12:] >= 0).all()


def test_merge_same_neighbours():
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    g = nx.DiGraph(edges + [(v, u) for u, v in edges])  # 1 and 2: the same neighbours
    merged, alias = cogmap.merge_same_neighbours(g)
    assert alias == {2: 1}
    assert sorted(merged) == [0, 1, 3, 4]
    assert set(merged.successors(1)) == {0, 3} and set(merged.predecessors(3)) == {1, 4}


def test_perfect_codes_rebuild_the_room():
    room, w, codes = perfect_codes()
    cm = cogmap.extract_map(codes, w.actions)
    truth = nx.DiGraph(rooms.ground_truth_graph(room))
    assert cm.graph.number_of_nodes() == 12
    assert set(cm.graph.edges) == set(truth.edges)
    for u, v in truth.edges:  # every edge's action moves as the room does
        pos_u = np.array(truth.nodes[u]["pos"])
        assert cogmap.execute((3, 4), pos_u, [cm.graph.edges[u, v]["action"]]) == \
            truth.nodes[v]["pos"]
    pos = cogmap.node_positions(cm, codes, w.pos)
    nx.set_node_attributes(cm.graph, pos, "pos")
    assert cogmap.norm_ged(cm.graph, truth) == 0.0
    # a map missing one node: 1 node and its edges off
    broken = cm.graph.copy()
    broken.remove_node(5)
    removed = cm.graph.number_of_edges() - broken.number_of_edges()
    expected = (1 + removed) / (2 * (12 + truth.number_of_edges()) - 1 - removed)
    assert abs(cogmap.norm_ged(broken, truth) - expected) < 1e-12


def test_planning_on_a_perfect_map_is_optimal():
    room, w, codes = perfect_codes()
    cm = cogmap.extract_map(codes, w.actions)
    test = rooms.walks(CONFIG, room, 30, 99)
    C = 10
    starts, goals = test.pos[:, C], test.pos[:, CONFIG.steps - C]
    cells = rooms.node_of(test.pos, CONFIG.width)
    plans = [cm.plan([cells[i, C]], [cells[i, CONFIG.steps - C]]) for i in range(30)]
    m = cogmap.planning_metrics(plans, starts, goals, room, CONFIG.steps - 2 * C)
    assert m["ImpFallback"] == 100.0 and m["RatioSP"] == 1.0
    assert m["problems"] == int((cells[:, C] != cells[:, CONFIG.steps - C]).sum())
    # a wrong plan is not valid; no plan is not valid
    bad = [None] + [[0]] * 29
    assert cogmap.planning_metrics(bad, starts, goals, room, 40)["ImpFallback"] < 100.0


def test_unseen_tuples_take_the_nearest_seen_tuple():
    room, w, codes = perfect_codes()
    codes2 = np.concatenate([codes, codes], -1)  # M = 2, both slots the cell
    cm = cogmap.extract_map(codes2, w.actions)
    assert cm.graph.number_of_nodes() == 12
    assert cm.node([3, 999]) == cm.node([3, 3])


def exact_angles(pos):
    """Angles that encode the cell exactly: (r, c) times frequencies 1 and 0.5, (..., 4)."""
    r, c = pos[..., 0].astype(float), pos[..., 1].astype(float)
    return np.stack([r, c, 0.5 * r, 0.5 * c], -1)


def test_angle_clusters_and_assignment():
    angles = np.array([[0.0, 0.0], [0.05, 0.0], [3.0, 3.0], [0.0, 2 * np.pi]])
    ids, clusters = cogmap.cluster_angles(angles, places=2)
    assert list(ids) == [0, 0, 1, 0]  # 2 pi wraps onto 0; ids by first appearance
    assert clusters.centres.shape == (2, 4)
    assert list(clusters.assign(np.array([[2.9, 3.1], [-0.02, 0.01]]))) == [1, 0]
    assert list(clusters.assign(np.array([[2.9, 3.1], [-0.02, 0.01]]), rows=1)) == [1, 0]


def test_angle_clusters_stop_at_the_distinct_points_and_refuse_no_places():
    ids, clusters = cogmap.cluster_angles(np.array([[1.0], [2.0], [1.0], [2.0]]), places=10)
    assert list(ids) == [0, 1, 0, 1] and clusters.centres.shape == (2, 2)
    with pytest.raises(ValueError, match="places"):
        cogmap.cluster_angles(np.zeros((3, 1)), places=0)


def test_kmeans_places_of_noisy_angles_are_the_cells():
    room, w, _ = perfect_codes()
    noisy = exact_angles(w.pos) + np.random.default_rng(0).normal(0, 0.05, w.pos.shape[:2] + (4,))
    ids, clusters = cogmap.cluster_angles(noisy.reshape(-1, 4), places=12)
    assert len(clusters.centres) == 12
    assert cogmap.place_purity(ids.reshape(w.pos.shape[:2]), w.pos) == 1.0


def test_revisit_distances():
    pos = np.array([[[0, 0], [0, 1], [0, 0]]])
    angles = np.array([[[0.0, 0.0], [np.pi, 0.0], [2 * np.pi, 0.0]]])  # cell (0, 0) twice
    d = cogmap.revisit_distances(angles, pos, pairs=200)
    assert abs(d["revisit_distance"]) < 1e-12
    assert abs(d["other_distance"] - np.sqrt(2.0)) < 1e-12  # chord 2 on one of two circles
    assert np.isnan(cogmap.revisit_distances(angles[:, :2], pos[:, :2], 50)["revisit_distance"])


def test_place_purity():
    pos = np.array([[[0, 0], [0, 1], [0, 0], [1, 1]]])
    assert cogmap.place_purity(np.array([[0, 1, 0, 2]]), pos) == 1.0
    assert cogmap.place_purity(np.array([[0, 0, 0, 0]]), pos) == 0.5  # cell (0, 0): 2 of 4
    assert cogmap.place_purity(np.array([[0, 0, 1, 1]]), pos) == 0.5


def test_angle_map_of_exact_positions_is_the_room():
    room, w, _ = perfect_codes()
    cm, clusters, ids = cogmap.extract_angle_map(exact_angles(w.pos), w.actions)
    assert len(clusters.centres) == 12 and cm.graph.number_of_nodes() == 12
    test = rooms.walks(CONFIG, room, 10, 7)
    test_ids = clusters.assign(exact_angles(test.pos))[..., None]
    m = cogmap.map_metrics(cm, ids, w, test_ids, test, room, 10)
    assert m["NormGED"] == 0.0 and m["nodes"] == 12 and m["edges"] == 34 + 10  # moves, wall loops
    assert m["ImpFallback"] == 100.0 and m["RatioSP"] == 1.0
    assert cogmap.place_purity(ids[..., 0], w.pos) == 1.0


def test_evaluate_angle_map_on_angles_that_are_the_cells(monkeypatch):
    """evaluate_angle_map with the model's angles replaced by exact ones (40 training walks,
    10 test walks): the room, purity 1, and shuffled places far from pure."""
    room, w, _ = perfect_codes()
    test = rooms.walks(CONFIG, room, 10, 7)
    monkeypatch.setattr(cogmap, "observation_angles", lambda model, tokens: exact_angles(
        w.pos if len(tokens) == len(w.pos) else test.pos))
    monkeypatch.setattr(cogmap, "step_closure", lambda model, tokens, n_obs: 0.0)
    cm, m = cogmap.evaluate_angle_map(None, CONFIG, room, w, test, 10, places=50)
    assert m["clusters"] == 12 and m["purity"] == 1.0 and m["purity_chance"] < 0.5
    assert m["revisit_distance"] == 0.0 and m["other_distance"] > 0.3
    assert m["NormGED"] == 0.0 and m["ImpFallback"] == 100.0


def test_angle_map_of_a_trained_mapwm_end_to_end():
    from mapformer.models import ModelConfig, Transformer
    from mapformer.tasks.rooms import next_observation_targets
    from mapformer.train import AdamW, TrainConfig
    room, w, _ = perfect_codes(n_walks=16)
    model = Transformer(ModelConfig.preset("mapwm", CONFIG.vocab_size, d_model=32, n_heads=2,
                                           n_layers=1))
    opt = AdamW(model, TrainConfig(lr=3e-3, weight_decay=0.0, clip=1.0))
    tokens = w.tokens(CONFIG.n_obs)
    targets, mask = next_observation_targets(tokens)
    for _ in range(10):
        model.loss(tokens, targets, mask)
        model.backward()
        opt.step(3e-3)
    test = rooms.walks(CONFIG, room, 4, 9)
    cm, m = cogmap.evaluate_angle_map(model, CONFIG, room, w, test, 10)
    assert m["clusters"] >= 1 and 0 <= m["nodes"] <= m["clusters"]
    assert 0.0 <= m["NormGED"] <= 1.0 and 0.0 <= m["ImpFallback"] <= 100.0
    assert m["problems"] <= 4
    assert 0.0 <= m["step_closure"] <= np.pi
    model.blocks[0].mixer.scheme.omega.value[...] = 0.0  # no turn: every step closes
    assert cogmap.step_closure(model, w.tokens(CONFIG.n_obs), CONFIG.n_obs) == 0.0
    assert np.isnan(cogmap.step_closure(model, w.tokens(CONFIG.n_obs)[:1, :2], CONFIG.n_obs))


def test_code_statistics_count_tuples_per_cell_and_cells_per_tuple():
    """Perfect codes (one tuple per cell): 1 and 1; two clones of every cell (the tuple's
    second slot the walk's parity): 2 tuples a cell; a code per observation colour: every tuple
    covers the cells of its colour."""
    room, w, codes = perfect_codes()
    stats = cogmap.code_statistics(codes, w.pos)
    visited = len(np.unique(w.pos.reshape(-1, 2), axis=0))
    assert stats == {"tuples": visited, "tuples_per_cell": 1.0, "cells_per_tuple": 1.0,
                     "purity": 1.0}
    parity = (np.arange(len(codes)) % 2)[:, None, None] + np.zeros_like(codes)
    clones = cogmap.code_statistics(np.concatenate([codes, parity], -1), w.pos)
    assert clones == {"tuples": 2 * visited, "tuples_per_cell": 2.0, "cells_per_tuple": 1.0,
                      "purity": 1.0}
    colours = cogmap.code_statistics(w.obs[..., None], w.pos)
    cells_of = {o: len(np.unique(w.pos[w.obs == o], axis=0)) for o in np.unique(w.obs)}
    assert colours["tuples"] == len(cells_of)
    assert colours["cells_per_tuple"] == np.mean(list(cells_of.values()))
    assert colours["tuples_per_cell"] == 1.0
    cells = rooms.node_of(w.pos, CONFIG.width).ravel()
    commonest = sum(np.bincount(cells[w.obs.ravel() == o]).max() for o in cells_of)
    assert colours["purity"] == pytest.approx(commonest / cells.size)


def test_timestep_metrics_count_teleports_and_code_timing():
    """On the perfect map, walks whose codes are their cells never teleport; a walk whose code
    jumps to a cell two steps away teleports there and back; an unseen tuple counts as not
    retained, and each tuple's count and mean (1-based) observation index are its own."""
    room, w, codes = perfect_codes()
    cm = cogmap.extract_map(codes, w.actions)
    assert cm.retained.all()
    test = rooms.walks(CONFIG, room, 5, 7)
    states = rooms.node_of(test.pos, CONFIG.width)[..., None].copy()
    clean = cogmap.timestep_metrics(cm, states)["teleport_by_timestep"]
    N = CONFIG.steps
    assert clean["positions"] == [0, 0] + [5] * (N - 1) and sum(clean["hits"]) == 0
    n = 10
    r, c = np.divmod(np.arange(12), 4)
    away = np.minimum(*[np.abs(r - test.pos[0, k, 0]) + np.abs(c - test.pos[0, k, 1])
                        for k in (n - 1, n + 1)])
    assert away.max() >= 2
    states[0, n] = int(away.argmax())  # two steps or more from x_n's and x_{n+2}'s cells
    out = cogmap.timestep_metrics(cm, states)
    hits = out["teleport_by_timestep"]["hits"]
    assert hits[n + 1] == 1 and hits[n + 2] == 1 and sum(hits) == 2
    states[1, 3] = 99  # never seen in training: attached to its nearest seen tuple
    codes_out = cogmap.timestep_metrics(cm, states)["codes"]
    tuples, counts = np.unique(states.reshape(-1), return_counts=True)
    assert codes_out["count"] == counts.tolist()
    assert codes_out["retained"] == [bool(t != 99) for t in tuples]
    assert codes_out["mean_timestep"][tuples.tolist().index(99)] == 4.0
    steps = np.broadcast_to(np.arange(1, N + 1), states.shape[:2])
    first = tuples[0]
    assert codes_out["mean_timestep"][0] == pytest.approx(steps[states[..., 0] == first].mean())
