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

Three options of the same generator (TDB appendix I.1 and section 4.5 / appendix L, and one
beyond the paper):
- ``topology="cube"``, the aliased cube: the cells are the faces' cells of an E x E x E cube's
  surface (E = height = width; 6 E^2 cells, 216 for the paper's E = 6; the paper gives no
  more than "edge size 6", the face-cell reading is the research note's recommendation), each
  face with its own frame, actions in face-local directions (0 up, 1 down, 2 left, 3 right in
  the face's (i, j)); a step over an edge lands on the adjacent face (the cell whose centre is
  half a cell past the edge and half a cell down), where the face's own frame takes over: the
  dynamics are those of a closed surface, no walls, three faces at each corner (non-Euclidean).
  Colours iid from O (no patch: the aliasing is the colours'). Positions are (r, c) in a 2 E x
  3 E grid of the faces side by side (face f at block (f // 3, f % 3); not a net: adjacency
  comes from ``Room.transitions``), so cell ids, walks and graphs work as for a room.
- ``topology="torus"``: the flat room with its edges joined (a move off one side enters at the
  opposite one: no walls, the MapFormer paper's grids), aliased patch and all; for asking
  whether a model that integrates its path needs walls out of the way to form a map.
- ``colours=K > 0``, the in-context rooms: one base layout (the room of the config: H x W,
  O symbols, the aliased patch), recoloured per room by an injective map phi from the O
  symbols to K colours (:func:`palettes`: same partition of cells, new colours; K = 30 in the
  paper). A walk of :func:`walks` with ``palettes`` takes one of them at random and observes
  ``colours`` = phi(symbol); :meth:`Walks.tokens` then tokenises colours (vocabulary K + 4),
  and :func:`base_targets` gives the paper's "training in base" targets: the rank of x_n
  among the distinct colours seen in x_1 .. x_n (0 = lowest).

The walks of one room are also a training task of :func:`mapformer.train.train` (task
"rooms", :class:`RoomsTask`): a fixed pool of training walks per room, each step's batch drawn
from it, the room's test walks as the evaluation set, the loss on every next observation.
"""
import functools
from dataclasses import asdict, dataclass, replace

import networkx as nx
import numpy as np

from .stream import check_task_options

N_ACTIONS = 4
MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)])  # up, down, left, right


TOPOLOGIES = ("room", "cube", "torus")


@dataclass(frozen=True)
class RoomsConfig:
    """height, width: the room's cells (the cube: both its edge E); n_obs: observation symbols
    (O); patch: the side of the aliased patch (p; 0: none; the cube has none); steps:
    observations per walk (N); seed: the room's; topology: 'room' (a flat grid with walls),
    'cube' (the surface of a cube) or 'torus' (the flat grid with its edges joined);
    colours: 0, or K > n_obs colours of the in-context rooms' palettes (see the module)."""

    height: int = 15
    width: int = 20
    n_obs: int = 4
    patch: int = 4
    steps: int = 400
    seed: int = 0
    topology: str = "room"
    colours: int = 0

    def __post_init__(self):
        for name in ("height", "width", "n_obs", "steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.patch, int) or self.patch < 0:
            raise ValueError(f"patch must be an integer >= 0, got {self.patch!r}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {self.topology!r}")
        if self.topology == "cube" and (self.height != self.width or self.patch):
            raise ValueError(f"a cube has one edge (height = width) and no patch, got "
                             f"{self.height} x {self.width}, patch {self.patch}")
        if self.patch and not _two_windows_fit(self.height, self.width, self.patch):
            raise ValueError(f"two {self.patch} x {self.patch} patches do not fit apart in a "
                             f"{self.height} x {self.width} room")
        if self.n_obs > self.cells:
            raise ValueError(f"n_obs ({self.n_obs}) must be at most the room's cells")
        if not isinstance(self.colours, int) or not (self.colours == 0
                                                     or self.colours >= self.n_obs):
            raise ValueError(f"colours must be 0 (off) or an integer >= n_obs ({self.n_obs}), "
                             f"got {self.colours!r}")

    @property
    def cells(self):
        """Cells of the room (a cube: 6 E^2)."""
        return self.height * self.width * (6 if self.topology == "cube" else 1)

    @property
    def n_symbols(self):
        """Observation ids in the tokens: the colours of in-context rooms, else O."""
        return self.colours or self.n_obs

    @property
    def vocab_size(self):
        return self.n_symbols + N_ACTIONS


def _two_windows_fit(h, w, p):
    return p <= min(h, w) and (2 * p <= h or 2 * p <= w)


def _overlap(a, b, p):
    return abs(a[0] - b[0]) < p and abs(a[1] - b[1]) < p


@dataclass(frozen=True)
class Room:
    """obs int (H, W): each cell's symbol (a cube: (2 E, 3 E), its faces side by side);
    patches ((r, c), (r, c)): the top-left corners of the source patch and its copy (None
    without aliasing); transitions int (H W, 4): the cell id r W + c after each action from
    each cell (None: a flat room, :func:`step`); topology: the config's ("room", "cube",
    "torus")."""

    obs: np.ndarray
    patches: tuple
    transitions: np.ndarray = None
    topology: str = "room"


def make_room(config):
    """The room of ``config`` (fixed by config.seed)."""
    rng = np.random.default_rng([config.seed, 0x600D])
    if config.topology == "cube":
        e = config.height
        while True:
            obs = rng.integers(0, config.n_obs, (2 * e, 3 * e))
            if len(np.unique(obs)) == config.n_obs:
                return Room(obs, None, cube_transitions(e), "cube")
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
            return Room(obs, patches, torus_transitions(h, w) if config.topology == "torus"
                        else None, config.topology)


def step(pos, actions, height, width):
    """pos int (..., 2) rows and columns, actions int (...) -> the next positions: the move,
    or the same cell where it would leave the room."""
    nxt = pos + MOVES[actions]
    inside = ((nxt[..., 0] >= 0) & (nxt[..., 0] < height) & (nxt[..., 1] >= 0)
              & (nxt[..., 1] < width))
    return np.where(inside[..., None], nxt, pos)


def torus_transitions(height, width):
    """int (H W, 4): the cell id after each action from each cell of an H x W grid whose
    edges are joined (rows and columns modulo H and W)."""
    r, c = np.divmod(np.arange(height * width), width)
    return ((r[:, None] + MOVES[:, 0]) % height) * width + (c[:, None] + MOVES[:, 1]) % width


# ---- the aliased cube -----------------------------------------------------------------------
def _cube_faces(e):
    """The 6 faces (k, side) of the cube [0, E]^3: normal axis k, at coordinate side (0 or
    E); face f = 2 k + (side == E). Its cell (i, j) is centred at coordinate k = side,
    coordinate (k + 1) % 3 = i + 1/2, coordinate (k + 2) % 3 = j + 1/2."""
    return [(k, side) for k in range(3) for side in (0, e)]


def cube_centres(e):
    """(6 E^2, 3) the 3D centres of the cube's face cells, in cell id order (face f, then
    (i, j) row-major within it)."""
    centres = []
    for k, side in _cube_faces(e):
        for i in range(e):
            for j in range(e):
                point = np.empty(3)
                point[k], point[(k + 1) % 3], point[(k + 2) % 3] = side, i + 0.5, j + 0.5
                centres.append(point)
    return np.array(centres)


def cube_transitions(e):
    """int (6 E^2, 4) in the room's cell ids (r W + c of the (2 E, 3 E) layout): the cell after
    each action (MOVES in the face's (i, j)) from each face cell. A step that leaves the face
    goes over the edge: from centre p with outward normal n, in direction d, the new centre is
    p + d / 2 - n / 2, on the face whose outward normal is d."""
    faces = _cube_faces(e)
    centres = cube_centres(e)
    lookup = {tuple(p): n for n, p in enumerate(centres)}
    out = np.empty((len(centres), N_ACTIONS), np.int64)
    for n, p in enumerate(centres):
        k, side = faces[n // (e * e)]
        normal = np.zeros(3)
        normal[k] = 1.0 if side == e else -1.0
        for a, (di, dj) in enumerate(MOVES):
            d = np.zeros(3)
            d[(k + 1) % 3], d[(k + 2) % 3] = di, dj
            q = p + d
            if not ((0 < q) & (q < e) | (np.arange(3) == k)).all():  # over an edge
                q = p + d / 2 - normal / 2
            out[n, a] = lookup[tuple(q)]
    # face f, cell (i, j) -> row (f // 3) E + i, column (f % 3) E + j of the layout
    face, rest = np.divmod(np.arange(len(centres)), e * e)
    i, j = np.divmod(rest, e)
    layout = ((face // 3) * e + i) * (3 * e) + (face % 3) * e + j
    relabelled = np.empty_like(out)
    relabelled[layout] = layout[out]
    return relabelled


def move(room, pos, actions):
    """pos int (..., 2), actions int (...) -> the positions after the actions in ``room``:
    :func:`step` in a flat room, its ``transitions`` otherwise (a cube, a torus)."""
    h, w = room.obs.shape
    if room.transitions is None:
        return step(pos, actions, h, w)
    nxt = room.transitions[node_of(pos, w), actions]
    return np.stack(np.divmod(nxt, w), -1)


# ---- walks ------------------------------------------------------------------------------------
@dataclass
class Walks:
    """obs, actions int (n, N); pos int (n, N, 2): the cell at each observation; colours int
    (n, N) or None: in-context rooms, what the agent sees (its room's palette of obs);
    palette int (n,) or None: which palette each walk's room has."""

    obs: np.ndarray
    actions: np.ndarray
    pos: np.ndarray
    colours: np.ndarray = None
    palette: np.ndarray = None

    def tokens(self, n_obs):
        """(n, 2N) int32: x_1, a_1, ..., x_N, a_N with action ids offset by n_obs (the
        config's n_symbols); x the colours where the walks have them, else obs."""
        n, steps = self.obs.shape
        out = np.empty((n, 2 * steps), np.int32)
        out[:, 0::2] = self.obs if self.colours is None else self.colours
        out[:, 1::2] = self.actions + n_obs
        return out


def walks(config, room, n_walks, rng, palettes=None):
    """n_walks random walks of config.steps observations in ``room``; rng a NumPy Generator
    or a seed. ``palettes`` (R, O) (:func:`palettes`): in-context rooms, each walk in a room
    drawn uniformly from them (its colours and palette index in the Walks)."""
    rng = np.random.default_rng(rng)
    (h, w), steps = room.obs.shape, config.steps
    actions = rng.integers(0, N_ACTIONS, (n_walks, steps))
    pos = np.empty((n_walks, steps, 2), np.int64)
    pos[:, 0] = np.stack([rng.integers(0, h, n_walks), rng.integers(0, w, n_walks)], -1)
    for t in range(1, steps):
        pos[:, t] = move(room, pos[:, t - 1], actions[:, t - 1])
    obs = room.obs[pos[..., 0], pos[..., 1]]
    if palettes is None:
        return Walks(obs, actions, pos)
    palettes = np.asarray(palettes)
    which = rng.integers(0, len(palettes), n_walks)
    return Walks(obs, actions, pos, palettes[which[:, None], obs], which)


# ---- in-context rooms ---------------------------------------------------------------------
def palettes(config, n_rooms, rng):
    """(n_rooms, O) int: each row an injective map phi from the O symbols to config.colours
    colours (O of them, drawn without replacement): one recoloured room each."""
    if not config.colours:
        raise ValueError("palettes need config.colours > 0 (in-context rooms)")
    rng = np.random.default_rng(rng)
    return np.array([rng.choice(config.colours, config.n_obs, replace=False)
                     for _ in range(n_rooms)])


def base_targets(colours):
    """colours int (n, N) -> int (n, N): x~_n, the rank (0 = lowest) of colour x_n among the
    distinct colours of x_1 .. x_n (TDB section 4.5, "training in base"; the same x~ may
    name different colours over a walk)."""
    colours = np.asarray(colours)
    seen = np.zeros(colours.shape + (int(colours.max()) + 1,), bool)
    np.put_along_axis(seen, colours[..., None], True, -1)
    seen = np.logical_or.accumulate(seen, axis=1)          # colours seen up to n
    below = np.cumsum(seen, -1) - seen                     # seen colours below each colour
    return np.take_along_axis(below, colours[..., None], -1)[..., 0]


def node_of(pos, width):
    """Cell ids r W + c of positions (..., 2)."""
    return pos[..., 0] * width + pos[..., 1]


def ground_truth_graph(room):
    """networkx MultiDiGraph of the room: node r W + c (attributes obs, pos), one edge per
    action from every node (key = attribute action), walls as self-loops (a cube and a torus
    have none)."""
    h, w = room.obs.shape
    graph = nx.MultiDiGraph()
    cells = np.stack(np.meshgrid(np.arange(h), np.arange(w), indexing="ij"), -1).reshape(-1, 2)
    for r, c in cells:
        graph.add_node(int(r * w + c), obs=int(room.obs[r, c]), pos=(int(r), int(c)))
    for a in range(N_ACTIONS):
        nxt = move(room, cells, np.full(len(cells), a))
        for u, v in zip(node_of(cells, w), node_of(nxt, w)):
            graph.add_edge(int(u), int(v), key=a, action=a)
    return graph


# ---- the room's walks as a training task (mapformer.train's task "rooms") --------------------
PRESETS = {"iid": dict(height=15, width=20, n_obs=4, patch=4, steps=400)}
"""The rooms task's presets: "iid", the room of TDB's Table 1 (15 x 20, O = 4, one 4 x 4 patch
twice, walks of 400)."""
TASK_OPTIONS = {"height": int, "width": int, "n_obs": int, "patch": int, "topology": str,
                "walks": int, "context": int, "noise": float}
"""The rooms task's options (TrainConfig.task_options) and their types: the room's fields,
``walks`` (the training pool), ``context`` (the planning problems' C) and ``noise`` (the
share of the training pool's observations replaced at random)."""
POOL_OPTIONS = ("walks", "context", "noise")  # the RoomsTask's own fields, not the room's
LOSS_POSITIONS = ("observations",)
"""The choices of :func:`loss_mask`: every position whose target is the next observation."""


@dataclass(frozen=True)
class RoomsTask:
    """The walks of one room as a training task (TDB's Table 1): ``room`` the RoomsConfig (its
    seed the run's: a room per seed); ``walks`` the size of the fixed pool of training walks
    (drawn from ``[room.seed, 1]``, cached), from which each step's batch draws
    its walks uniformly with replacement; ``context`` C: a test walk's planning problem goes
    from its position C to N - C (TDB appendix D; None: N // 8, the paper's 50 of 400). The
    evaluation set is the room's test walks (:func:`evaluation_walks`, ``[room.seed, 2]``),
    which :func:`mapformer.cogmap.walks_of` draws again from :meth:`map_meta`. No blank
    token: every next observation is a target. ``noise`` p (TDB's Table 3): each observation
    of the training pool is replaced, with probability p, by one drawn uniformly from the O
    symbols (possibly itself; :func:`add_noise`, from ``[room.seed, 3]``), fixed with the
    pool; the test walks stay clean, and the map is built from the noisy pool the model
    trained on."""

    room: RoomsConfig
    walks: int = 2048
    context: int = None
    noise: float = 0.0
    blank_id = None  # not a field: the task has no blank token

    def __post_init__(self):
        if self.room.colours:
            raise ValueError("task 'rooms': the in-context rooms (colours > 0) are no training "
                             "task yet")
        if not isinstance(self.walks, int) or isinstance(self.walks, bool) or self.walks < 1:
            raise ValueError(f"task 'rooms': walks must be an integer >= 1, got {self.walks!r}")
        if not (isinstance(self.noise, (int, float)) and not isinstance(self.noise, bool)
                and 0.0 <= self.noise < 1.0):
            raise ValueError(f"task 'rooms': noise must be a share in [0, 1), got "
                             f"{self.noise!r}")
        c, n = self.planning_context, self.room.steps
        if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c < n - c:
            raise ValueError(f"task 'rooms': context must be an integer C with 0 <= C < N - C "
                             f"(N = {n} steps), got {self.context!r}")

    @property
    def vocab_size(self):
        return self.room.vocab_size

    @property
    def seq_len(self):
        return 2 * self.room.steps

    @property
    def planning_context(self):
        """C: ``context``, or N // 8 when it is None."""
        return self.room.steps // 8 if self.context is None else self.context

    def map_meta(self, test_walks):
        """The room, seed, walks and context as :func:`mapformer.cogmap.walks_of` reads them
        (its "meta"), with ``test_walks`` test walks (and "noise" where the pool has it)."""
        meta = {"room": asdict(self.room), "seed": self.room.seed, "train_walks": self.walks,
                "test_walks": test_walks, "context": self.planning_context}
        return {**meta, "noise": self.noise} if self.noise else meta


def task_preset(name="iid", seed=0, steps=None, **options):
    """The RoomsTask of preset ``name`` (:data:`PRESETS`) for the run seed ``seed`` (the
    room's), its walks ``steps`` long (None: the preset's), with ``options``
    (:data:`TASK_OPTIONS`, each of its type). ValueError naming the option for an unknown one
    or a bad value."""
    if name not in PRESETS:
        raise ValueError(f"task 'rooms' has presets {sorted(PRESETS)}, not {name!r}")
    options = check_task_options("rooms", options, TASK_OPTIONS, nullable=("context",))
    room = {**PRESETS[name], **{k: v for k, v in options.items() if k not in POOL_OPTIONS}}
    if steps is not None:
        room["steps"] = steps
    pool = {k: options[k] for k in POOL_OPTIONS if k in options}
    return RoomsTask(RoomsConfig(**room, seed=seed), **pool)


@dataclass
class RoomsBatch:
    """A batch of walks: tokens int32 (B, 2N) (:meth:`Walks.tokens`), targets int32 (B, 2N)
    and mask bool (B, 2N) (:func:`next_observation_targets`), positions int64 (B, N, 2): the
    cell of each observation."""

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    positions: np.ndarray


def next_observation_targets(tokens):
    """tokens int (B, 2N) -> (targets, mask) (B, 2N): at the action a_n's position the target
    is x_{n+1}; every other position (and a_N's) is masked out."""
    tokens = np.asarray(tokens)
    targets = np.zeros_like(tokens)
    mask = np.zeros(tokens.shape, bool)
    targets[:, 1:-1:2] = tokens[:, 2::2]
    mask[:, 1:-1:2] = True
    return targets, mask


def add_noise(drawn, n_obs, p, rng):
    """Walks ``drawn`` with each observation replaced, with probability ``p``, by one drawn
    uniformly from the ``n_obs`` symbols (rng a Generator or a seed); the cells and actions
    are the walks' own."""
    rng = np.random.default_rng(rng)
    flip = rng.random(drawn.obs.shape) < p
    obs = drawn.obs.copy()
    obs[flip] = rng.integers(0, n_obs, int(flip.sum()))
    return replace(drawn, obs=obs)


def training_walks(task, room=None):
    """The task's pool of training walks: ``task.walks`` walks from [room.seed, 1], with the
    task's noise (:func:`add_noise` from [room.seed, 3]) where it has some."""
    config = task.room
    drawn = walks(config, room or make_room(config), task.walks, [config.seed, 1])
    return add_noise(drawn, config.n_obs, task.noise, [config.seed, 3]) if task.noise else drawn


@functools.lru_cache(maxsize=4)
def _room_walks(task, stream, n_walks):
    """(walks, their tokens, read-only) of ``task``'s room, drawn from [room.seed, stream]
    (stream 1: the training pool, :func:`training_walks`)."""
    config = task.room
    drawn = (training_walks(task) if stream == 1 else
             walks(config, make_room(config), n_walks, [config.seed, stream]))
    tokens = drawn.tokens(config.n_symbols)
    for a in (drawn.obs, drawn.actions, drawn.pos, tokens):
        a.flags.writeable = False
    return drawn, tokens


def evaluation_walks(task, n_walks):
    """The room's ``n_walks`` test walks (cached; read-only; :func:`walks` from [room.seed,
    2], so another count draws other walks)."""
    return _room_walks(task, 2, n_walks)[0]


def _batch(drawn, tokens):
    targets, mask = next_observation_targets(tokens)
    return RoomsBatch(np.ascontiguousarray(tokens), targets, mask, np.asarray(drawn.pos))


def generate(task, batch_size, rng=None):
    """``batch_size`` walks of the task's training pool, drawn uniformly with replacement by
    ``rng`` (a Generator or a seed)."""
    pool, tokens = _room_walks(task, 1, task.walks)
    idx = np.random.default_rng(rng).integers(0, task.walks, batch_size)
    return _batch(Walks(pool.obs[idx], pool.actions[idx], pool.pos[idx]), tokens[idx])


def eval_set(task, n_sequences, seed=None, batch_size=32):
    """The room's ``n_sequences`` test walks (:func:`evaluation_walks`) in batches of
    ``batch_size`` (the last one holds the rest). ``seed`` is not read: the test walks are
    the room's ([room.seed, 2]), the ones its map is planned on."""
    pool, tokens = _room_walks(task, 2, n_sequences)
    return [_batch(Walks(pool.obs[i:i + batch_size], pool.actions[i:i + batch_size],
                         pool.pos[i:i + batch_size]), tokens[i:i + batch_size])
            for i in range(0, n_sequences, batch_size)]


def loss_mask(batch, positions):
    """bool (B, 2N): "observations", every position whose target is the next observation
    (``batch.mask``)."""
    if positions not in LOSS_POSITIONS:
        raise ValueError(f"loss_positions must be one of {LOSS_POSITIONS} for task 'rooms', "
                         f"got {positions!r}")
    return batch.mask


def timesteps(batch):
    """The index of the observation each position predicts: int64 (B, 2N), n + 1 at a_n's
    position (n counted from 1, as the paper does: a_n's target is x_{n+1}, so 2 .. N); 0 where
    nothing is predicted (the observations' positions, and a_N's). What "accuracy by
    timestep" (the TDB paper's Fig. 9) is counted over."""
    B, T = batch.mask.shape
    out = np.zeros((B, T), np.int64)
    out[:, 1::2] = np.arange(2, T // 2 + 2)
    return np.where(batch.mask, out, 0)


def token_coordinates(batch):
    """None: the model is not told where the agent is (TDB's setting)."""
    return None


def ood_sets(task):
    """None beyond the test walks: {}."""
    return {}


def describe(task):
    """'10 x 15 room, O 4, patch 3, walks of 200 from a pool of 2048, room seed 0, C 25'."""
    r = task.room
    return (f"{r.height} x {r.width} {r.topology}, O {r.n_obs}, patch {r.patch}, walks of "
            f"{r.steps} from a pool of {task.walks}, room seed {r.seed}, C "
            f"{task.planning_context}")
