"""The 2D aliased rooms of TDB: the room's aliasing, walls, walks that follow the ground-truth
graph, and fixed seeds."""
import networkx as nx
import numpy as np
import pytest

from mapformer.tasks import rooms

SMALL = rooms.RoomsConfig(height=6, width=8, n_obs=4, patch=3, steps=100, seed=3)


def test_room_has_every_symbol_and_one_copied_patch():
    for seed in range(5):
        config = rooms.RoomsConfig(height=6, width=8, n_obs=4, patch=3, steps=10, seed=seed)
        room = rooms.make_room(config)
        assert room.obs.shape == (6, 8)
        assert set(np.unique(room.obs)) == {0, 1, 2, 3}
        (r0, c0), (r1, c1) = room.patches
        assert abs(r0 - r1) >= 3 or abs(c0 - c1) >= 3  # apart
        assert np.array_equal(room.obs[r0:r0 + 3, c0:c0 + 3], room.obs[r1:r1 + 3, c1:c1 + 3])


def test_room_is_fixed_by_its_seed():
    a, b = rooms.make_room(SMALL), rooms.make_room(SMALL)
    assert np.array_equal(a.obs, b.obs) and a.patches == b.patches
    other = rooms.make_room(rooms.RoomsConfig(height=6, width=8, n_obs=4, patch=3, seed=4))
    assert not np.array_equal(a.obs, other.obs)


def test_walls_keep_the_agent_in_place():
    pos = np.array([[0, 0], [0, 0], [5, 7], [5, 7], [2, 3]])
    actions = np.array([0, 2, 1, 3, 0])  # up, left at the top-left; down, right at the corner
    assert np.array_equal(rooms.step(pos, actions, 6, 8),
                          [[0, 0], [0, 0], [5, 7], [5, 7], [1, 3]])


def test_walks_follow_the_ground_truth_graph():
    room = rooms.make_room(SMALL)
    w = rooms.walks(SMALL, room, 7, np.random.default_rng(0))
    assert w.obs.shape == w.actions.shape == (7, 100) and w.pos.shape == (7, 100, 2)
    assert np.array_equal(w.obs, room.obs[w.pos[..., 0], w.pos[..., 1]])
    graph = rooms.ground_truth_graph(room)
    nodes = rooms.node_of(w.pos, 8)
    for n in range(7):
        for t in range(99):
            u, v, a = int(nodes[n, t]), int(nodes[n, t + 1]), int(w.actions[n, t])
            assert graph.has_edge(u, v, key=a)
    # moves by one cell at most; actions uniform over 4
    assert np.abs(np.diff(w.pos, axis=1)).sum(-1).max() <= 1
    counts = np.bincount(w.actions.ravel(), minlength=4)
    assert counts.min() > 0.2 * w.actions.size


def test_walks_are_fixed_by_their_seed():
    room = rooms.make_room(SMALL)
    a, b = rooms.walks(SMALL, room, 3, 11), rooms.walks(SMALL, room, 3, 11)
    assert np.array_equal(a.pos, b.pos) and np.array_equal(a.actions, b.actions)


def test_tokens_interleave_observations_and_actions():
    room = rooms.make_room(SMALL)
    w = rooms.walks(SMALL, room, 2, 0)
    tok = w.tokens(SMALL.n_obs)
    assert tok.shape == (2, 200) and tok.dtype == np.int32
    assert np.array_equal(tok[:, 0::2], w.obs)
    assert np.array_equal(tok[:, 1::2], w.actions + 4)
    assert tok.max() < SMALL.vocab_size == 8


def test_ground_truth_graph():
    room = rooms.make_room(SMALL)
    graph = rooms.ground_truth_graph(room)
    assert graph.number_of_nodes() == 48 and graph.number_of_edges() == 4 * 48
    assert nx.number_of_selfloops(graph) == 2 * 6 + 2 * 8  # the walls
    assert all(graph.out_degree(n) == 4 for n in graph)
    assert graph.nodes[8 * 2 + 5]["obs"] == room.obs[2, 5]
    # opposite corners are (6 - 1) + (8 - 1) moves apart
    assert nx.shortest_path_length(graph, 0, 47) == 12


@pytest.mark.parametrize("bad", [dict(height=0), dict(patch=5), dict(n_obs=100),
                                 dict(steps=1.5)])
def test_bad_configs(bad):
    with pytest.raises(ValueError, match=next(iter(bad)) if "patch" not in bad else "patch"):
        rooms.RoomsConfig(**{**dict(height=6, width=8), **bad})
