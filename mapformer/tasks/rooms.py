"""2D aliased rooms (TDB, Dedieu et al. 2024, section 4.2 and appendix D).

A room is an H x W grid of cells, each showing one of O observation symbols, drawn iid
uniformly; one p x p patch is copied onto a second, non-overlapping place (global aliasing),
and a room missing a symbol is drawn again. An agent takes uniformly random actions
(0 up, 1 down, 2 left, 3 right); a move into the wall leaves it in place. A walk of N steps
is x_1, a_1, ..., x_N, a_N (observation first, a_n taken after seeing x_n), tokenised as
observation ids 0..O-1 and action ids O..O+3 (vocabulary O + 4). The start cell is uniform
(the paper does not say). Everything is vectorised over walks; a room and its walks are fixed
by their seeds.

The ground truth for the cognitive-map metrics is a networkx MultiDiGraph: one node per cell
(id r W + c, with its observation and position), one edge per action from every cell (key
and attribute ``action``), walls as self-loops.
"""
from dataclasses import dataclass

import networkx as nx
import numpy as np

N_ACTIONS = 4
MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)])  # up, down, left, right


@dataclass(frozen=True)
class RoomsConfig:
    """height, width: the room's cells; n_obs: observation symbols (O); patch: the side of
    the aliased patch (p; 0: none); steps: observations per walk (N); seed: the room's."""

    height: int = 15
    width: int = 20
    n_obs: int = 4
    patch: int = 4
    steps: int = 400
    seed: int = 0

    def __post_init__(self):
        for name in ("height", "width", "n_obs", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.patch, int) or self.patch < 0:
            raise ValueError(f"patch must be an integer >= 0, got {self.patch!r}")
        if self.patch and not _two_windows_fit(self.height, self.width, self.patch):
            raise ValueError(f"two {self.patch} x {self.patch} patches do not fit apart in a "
                             f"{self.height} x {self.width} room")
        if self.n_obs > self.height * self.width:
            raise ValueError(f"n_obs ({self.n_obs}) must be at most the room's cells")

    @property
    def vocab_size(self):
        return self.n_obs + N_ACTIONS


def _two_windows_fit(h, w, p):
    return p <= min(h, w) and (2 * p <= h or 2 * p <= w)


def _overlap(a, b, p):
    return abs(a[0] - b[0]) < p and abs(a[1] - b[1]) < p


@dataclass(frozen=True)
class Room:
    """obs int (H, W): each cell's symbol; patches ((r, c), (r, c)): the top-left corners of
    the source patch and its copy (None without aliasing)."""

    obs: np.ndarray
    patches: tuple


def make_room(config):
    """The room of ``config`` (fixed by config.seed)."""
    rng = np.random.default_rng([config.seed, 0x600D])
    h, w, p = config.height, config.width, config.patch
    while True:
        obs = rng.integers(0, config.n_obs, (h, w))
        patches = None
        if p:
            while True:
                a = (int(rng.integers(0, h - p + 1)), int(rng.integers(0, w - p + 1)))
                b = (int(rng.integers(0, h - p + 1)), int(rng.integers(0, w - p + 1)))
                if not _overlap(a, b, p):
                    break
            obs[b[0]:b[0] + p, b[1]:b[1] + p] = obs[a[0]:a[0] + p, a[1]:a[1] + p]
            patches = (a, b)
        if len(np.unique(obs)) == config.n_obs:
            return Room(obs, patches)


def step(pos, actions, height, width):
    """pos int (..., 2) rows and columns, actions int (...) -> the next positions: the move,
    or the same cell where it would leave the room."""
    nxt = pos + MOVES[actions]
    inside = ((nxt[..., 0] >= 0) & (nxt[..., 0] < height) & (nxt[..., 1] >= 0)
              & (nxt[..., 1] < width))
    return np.where(inside[..., None], nxt, pos)


@dataclass
class Walks:
    """obs, actions int (n, N); pos int (n, N, 2): the cell at each observation."""

    obs: np.ndarray
    actions: np.ndarray
    pos: np.ndarray

    def tokens(self, n_obs):
        """(n, 2N) int32: x_1, a_1, ..., x_N, a_N with action ids offset by n_obs."""
        n, steps = self.obs.shape
        out = np.empty((n, 2 * steps), np.int32)
        out[:, 0::2] = self.obs
        out[:, 1::2] = self.actions + n_obs
        return out


def walks(config, room, n_walks, rng):
    """n_walks random walks of config.steps observations in ``room``; rng a NumPy Generator
    or a seed."""
    rng = np.random.default_rng(rng)
    h, w, steps = config.height, config.width, config.steps
    actions = rng.integers(0, N_ACTIONS, (n_walks, steps))
    pos = np.empty((n_walks, steps, 2), np.int64)
    pos[:, 0] = np.stack([rng.integers(0, h, n_walks), rng.integers(0, w, n_walks)], -1)
    for t in range(1, steps):
        pos[:, t] = step(pos[:, t - 1], actions[:, t - 1], h, w)
    return Walks(room.obs[pos[..., 0], pos[..., 1]], actions, pos)


def node_of(pos, width):
    """Cell ids r W + c of positions (..., 2)."""
    return pos[..., 0] * width + pos[..., 1]


def ground_truth_graph(room):
    """networkx MultiDiGraph of the room: node r W + c (attributes obs, pos), one edge per
    action from every node (key = attribute action), walls as self-loops."""
    h, w = room.obs.shape
    graph = nx.MultiDiGraph()
    cells = np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij"), -1).reshape(-1, 2)
    for r, c in cells:
        graph.add_node(int(r * w + c), obs=int(room.obs[r, c]), pos=(int(r), int(c)))
    for a in range(N_ACTIONS):
        nxt = step(cells, np.full(len(cells), a), h, w)
        for u, v in zip(node_of(cells, w), node_of(nxt, w)):
            graph.add_edge(int(u), int(v), key=a, action=a)
    return graph
