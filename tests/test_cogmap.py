"""Cognitive-map extraction, planning and the TDB metrics on codes whose answer is known."""
import networkx as nx
import numpy as np

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
    g = cogmap.graph_from_counts(counts)
    assert set(g.edges) == {(0, 1), (1, 2)}
    assert g.edges[0, 1]["action"] == 2 and g.edges[1, 2]["action"] == 3


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
