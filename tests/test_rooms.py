"""The 2D aliased rooms of TDB: the room's aliasing, walls, walks that follow the ground-truth
graph, and fixed seeds; the aliased cube (its adjacency against the cube's geometry) and the
in-context rooms (palettes, colours, base targets)."""
from dataclasses import replace

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
                                 dict(steps=1.5), dict(topology="sphere"),
                                 dict(topology="cube", patch=0), dict(colours=3),
                                 dict(colours=2.5)])
def test_bad_configs(bad):
    match = "cube" if bad.get("topology") == "cube" else \
        next(iter(bad)) if "patch" not in bad else "patch"
    with pytest.raises(ValueError, match=match):
        rooms.RoomsConfig(**{**dict(height=6, width=8), **bad})


def test_torus_joins_the_edges_and_keeps_the_patch():
    config = rooms.RoomsConfig(height=6, width=8, n_obs=4, patch=2, steps=50, topology="torus")
    room = rooms.make_room(config)
    assert np.array_equal(room.obs, rooms.make_room(replace(config, topology="room")).obs)
    pos = np.array([[0, 0], [5, 7], [2, 3], [0, 7]])
    assert rooms.move(room, pos, np.array([0, 1, 2, 3])).tolist() == [[5, 0], [0, 7], [2, 2],
                                                                       [0, 0]]
    graph = rooms.ground_truth_graph(room)
    assert nx.number_of_selfloops(graph) == 0 and graph.number_of_edges() == 4 * 48
    assert nx.shortest_path_length(graph, 0, 47) == 2  # (0, 0) -> (5, 7): up, left
    w = rooms.walks(config, room, 20, 3)
    assert (w.pos[:, 1:] != w.pos[:, :-1]).any(-1).all()  # no walls: every action moves


# ---- the aliased cube ---------------------------------------------------------------------
CUBE = rooms.RoomsConfig(height=4, width=4, n_obs=12, patch=0, steps=300, seed=1,
                         topology="cube")


def test_cube_has_six_faces_of_cells_and_every_symbol():
    room = rooms.make_room(CUBE)
    assert room.obs.shape == (8, 12) and CUBE.cells == 96 == room.transitions.shape[0]
    assert sorted(np.unique(room.obs)) == list(range(12)) and room.patches is None
    assert rooms.RoomsConfig(height=6, width=6, patch=0, n_obs=12, topology="cube").cells == 216


def test_cube_adjacency_is_the_surface_geometry():
    """Brute force from the 3D centres: two face cells are neighbours iff their centres are 1
    apart on one face or sqrt(1/2) apart across an edge; every cell has 4 distinct
    neighbours (a closed surface: no walls), the relation is symmetric, each action from a
    cell reaches a different one, and corner cells (24: three per corner) have two
    neighbours on other faces."""
    e = 4
    room = rooms.make_room(CUBE)
    centres = rooms.cube_centres(e)
    face, rest = np.divmod(np.arange(6 * e * e), e * e)
    i, j = np.divmod(rest, e)
    layout = ((face // 3) * e + i) * (3 * e) + (face % 3) * e + j  # cell id of centre n
    dist = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    same_face = face[:, None] == face[None]
    want = (same_face & np.isclose(dist, 1)) | (~same_face & np.isclose(dist, np.sqrt(0.5)))
    got = np.zeros_like(want)
    position = np.empty(6 * e * e, np.int64)
    position[layout] = np.arange(6 * e * e)
    for a in range(rooms.N_ACTIONS):
        got[np.arange(6 * e * e), position[room.transitions[layout, a]]] = True
    assert np.array_equal(got, want) and (want.sum(1) == 4).all()
    assert all(len(set(row)) == 4 for row in room.transitions)
    off_face = (want & ~same_face).sum(1)
    assert (off_face == 2).sum() == 24 and (off_face == 1).sum() == 6 * 4 * (e - 2)


def test_cube_walks_follow_its_graph_and_execute():
    from mapformer import cogmap
    room = rooms.make_room(CUBE)
    w = rooms.walks(CUBE, room, 5, 0)
    graph = rooms.ground_truth_graph(room)
    assert graph.number_of_nodes() == 96 and graph.number_of_edges() == 96 * 4
    assert not any(u == v for u, v in graph.edges())  # no walls
    width = room.obs.shape[1]
    for n in range(5):
        for t in range(CUBE.steps - 1):
            u, v = (int(x) for x in rooms.node_of(w.pos[n, t:t + 2], width))
            assert graph.edges[u, v, int(w.actions[n, t])]["action"] == w.actions[n, t]
        assert np.array_equal(w.obs[n], room.obs[w.pos[n, :, 0], w.pos[n, :, 1]])
        assert cogmap.execute(room, w.pos[n, 0], w.actions[n, :-1]) == tuple(w.pos[n, -1])
    # 300 steps on 96 cells: the walks cover most of the surface, across faces
    assert len(np.unique(rooms.node_of(w.pos, width))) > 80


# ---- in-context rooms -----------------------------------------------------------------------
ICL = rooms.RoomsConfig(height=6, width=8, n_obs=4, patch=3, steps=50, seed=3, colours=30)


def test_palettes_recolour_the_base_layout():
    room = rooms.make_room(ICL)
    assert np.array_equal(room.obs, rooms.make_room(SMALL).obs)  # the same base layout
    pal = rooms.palettes(ICL, 200, 5)
    assert pal.shape == (200, 4) and pal.min() >= 0 and pal.max() < 30
    assert all(len(set(p)) == 4 for p in pal) and len({tuple(p) for p in pal}) > 190
    assert np.array_equal(pal, rooms.palettes(ICL, 200, 5))
    w = rooms.walks(ICL, room, 40, 1, palettes=pal)
    assert np.array_equal(w.colours, pal[w.palette[:, None], w.obs])
    assert len(set(w.palette.tolist())) > 30 and ICL.vocab_size == 34
    tokens = w.tokens(ICL.n_symbols)
    assert np.array_equal(tokens[:, 0::2], w.colours)
    assert np.array_equal(tokens[:, 1::2], w.actions + 30)
    # without palettes the walk is the base room's, positions and actions the same draws
    base = rooms.walks(ICL, room, 40, 1)
    assert np.array_equal(base.pos, w.pos) and base.colours is None
    with pytest.raises(ValueError, match="colours"):
        rooms.palettes(SMALL, 3, 0)


def test_base_targets_rank_the_colours_seen_so_far():
    colours = np.random.default_rng(0).integers(0, 30, (7, 40))
    got = rooms.base_targets(colours)
    for n in range(7):
        for t in range(40):
            seen = sorted(set(colours[n, :t + 1].tolist()))
            assert got[n, t] == seen.index(colours[n, t])
    # a walk of one room: ranks within its O colours, the first observation ranked 0
    room = rooms.make_room(ICL)
    w = rooms.walks(ICL, room, 10, 2, palettes=rooms.palettes(ICL, 10, 3))
    ranks = rooms.base_targets(w.colours)
    assert ranks.max() < 4 and (ranks[:, 0] == 0).all()


def test_evaluation_counts_accuracy_by_timestep():
    """evaluate's accuracy_by_timestep on the rooms task: every test walk scores each
    observation x_2 .. x_N once, and the hits summed over timesteps are the accuracy's."""
    from mapformer.models import ModelConfig, Transformer
    from mapformer.train import TrainConfig, evaluate
    train_config = TrainConfig(task="rooms", steps=10, task_options=dict(
        height=4, width=5, n_obs=3, patch=2, walks=8), loss_positions="observations")
    task = train_config.task_config()
    model = Transformer(ModelConfig(vocab_size=task.vocab_size, d_model=32, positional="rope"),
                        seed=0)
    out = evaluate(model, {"iid": task}, sequences=6, batch_size=4)["iid"]
    by_step = out["accuracy_by_timestep"]
    assert by_step["positions"] == [0, 0] + [6] * 9
    assert sum(by_step["hits"]) / sum(by_step["positions"]) == out["accuracy"]
    assert all(0 <= h <= n for h, n in zip(by_step["hits"], by_step["positions"]))
    assert out["accuracy"] <= out["accuracy_top5"] <= 1.0


def test_noise_replaces_the_training_pools_observations_only():
    """noise p: about p (1 - 1/O) of the pool's observations change (a uniform draw may give
    the same symbol back), cells and actions stay; the test walks are clean; the map's
    training walks (cogmap.walks_of) are the noisy pool the batches come from."""
    from mapformer import cogmap
    clean = rooms.task_preset("iid", seed=3, steps=50, walks=400)
    noisy = rooms.task_preset("iid", seed=3, steps=50, walks=400, noise=0.3)
    a, b = rooms.training_walks(clean), rooms.training_walks(noisy)
    assert np.array_equal(a.pos, b.pos) and np.array_equal(a.actions, b.actions)
    changed = (a.obs != b.obs).mean()
    O = clean.room.n_obs
    assert abs(changed - 0.3 * (1 - 1 / O)) < 0.01
    assert np.array_equal(rooms.evaluation_walks(clean, 8).obs,
                          rooms.evaluation_walks(noisy, 8).obs)
    walks = cogmap.walks_of(noisy.map_meta(8))[2]
    assert np.array_equal(walks.obs, b.obs)
    batch = rooms.generate(noisy, 4, 0)
    assert np.isin(batch.tokens[:, 0::2], np.arange(O)).all()
    with pytest.raises(ValueError, match="noise"):
        rooms.task_preset("iid", noise=1.0)
    with pytest.raises(ValueError, match="noise"):
        cogmap.room_config({**noisy.map_meta(8), "noise": -0.1})
