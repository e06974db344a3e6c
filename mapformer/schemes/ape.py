"""``ape_seq``, ``ape_grid`` and ``ape_tree``: algebraic positional encodings (Kogkalidis et
al., "Algebraic Positional Encodings", NeurIPS 2024): positions as orthogonal operators on
queries and keys.

``ape_seq`` (class :class:`APESequence` below): one orthogonal W per head
(appendix 8.1: W = expm(A - A^T)); the token at position p (its index) has q -> W^p q,
k -> W^p k, so the score q_m^T W^(n - m) k_n depends on the relative position only. It is kept
in APE's canonical form W = M^T R(omega) M (section 3.2), so that W^p is never formed: M is
folded into the q and k projections and R(p omega) is the rotary op, at RoPE's cost. It has
the paper's multiplicative distance decay of the logits as an option (``ape_decay``).

``ape_grid`` and ``ape_tree`` (kind ``attention``: the scheme applies the operators, then runs
the causal attention): ``ape_grid`` has one generator per axis and head, each on its own
chunk of the head (E = D / n); the token at coordinates (x_1..x_n) (the task's,
``Scheme.coordinates``) has the direct sum W_1^x_1 + ... + W_n^x_n. Coordinates are integers
in [0, ape_positions). Their generators A are the parameters, shared by every layer (as in the
paper): the first layer's scheme declares them, computes the maps W^0..W^(P-1) once per
forward (expm, then powers by doubling: ceil(log2 P) batched products) and, in its backward
(the last to run), takes the gradient that every layer summed into the maps back into the
generators (the doubling undone, then the Frechet derivative of expm by the block-triangular
identity). That generator-side arithmetic is on parameters only (G H small matrices and their
P powers) and runs in float64 NumPy on every backend (``ops.ape_powers_*``); applying the
maps to the activations is the C op ``ape_apply`` (a dense E x E product per token and head).

Initialisation (option ``ape_no_init`` False): RoPE in closed form, A[2i+1, 2i] = omega_i =
rope_base^(-i / NB) on each chunk (so expm(A - A^T) is the block-diagonal rotation RoPE
applies: ape_grid starts as axial RoPE; ape_seq, with M = I and omega = RoPE's, as exactly
the ``rope`` scheme); with ``ape_no_init``: A ~ N(0, 0.01^2), W near the identity.
``ape_tree`` (below): binary-tree positions, one generator per branch.

Distance decay (``ape_decay`` gamma < 1, every APE scheme): the logit between query i and key
j multiplied by gamma^d(i, j) (the paper's public code: gamma = 0.98), d the distance between
their positions: |i - j| (ape_seq), floor of the Euclidean distance of the coordinates
(ape_grid), edges on the tree path between the heap numbers (ape_tree). ape_grid's and
ape_tree's factors do not split into f(i) g(j), so they go into the attention op itself as a
per-pair factor: the first layer numbers the distinct positions of the batch (pos_ids
(B, T)) and tabulates gamma^d between them (pair_factor (N, N), N <= 4096 distinct
positions), once per forward for every layer; the kernels gather each tile's factors from
the table (no T x T matrix). It applies to the logits before the mask, so it composes with
every attn_mask. ape_seq keeps its cheaper separable form in causal attention and takes the
table (gamma^|i - j| on the token index) under the other masks.
"""
import weakref

import numpy as np

from .. import geometry
from ..nn import constant_init, normal_init
from ..registry import Option
from . import AttentionScheme, register_scheme
from .coordinates import (COORD_DIMS, COORD_SOURCE, coordinates_or_index, task_coordinates,
                          task_extent)
from .rope import ROPE_BASE, rope_frequencies

APE_NO_INIT = Option("ape_no_init", bool, False, "APE generators start near the identity "
                     "(N(0, 0.01^2)) instead of RoPE's rotations")


def table_extent(task):
    """Positions per axis ape_grid tabulates for a task: twice its extent (navigation's
    ood_sparse evaluation set walks a grid twice the training one)."""
    return 2 * task_extent(task)


APE_DECAY = Option("ape_decay", float, 1.0, "APE's logits multiplied by gamma^distance "
                   "(ape_seq |i - j|, ape_grid floor(Euclidean), ape_tree tree distance; the "
                   "paper's public code: 0.98; 1: no decay)", above=0)

APE_POSITIONS = Option("ape_positions", int, 128, "positions per axis ape_grid tabulates "
                       "(coordinates in [0, P); for a task: twice its grid side or sequence "
                       "length)", minimum=1, from_task=table_extent)

# ParameterStore -> {scheme name: its _Shared}: one generator per model, found by every layer
_SHARED = weakref.WeakKeyDictionary()


class _Shared:
    """A generator parameter and its maps, shared by every layer's scheme: ``maps``
    (G, P, H, E, E) from the last forward, ``dmaps`` their gradient summed by the layers;
    ``factor``: the distance decay's attention arguments of the last forward (pos_ids,
    pair_factor; empty without a decay)."""

    def __init__(self, param):
        self.param, self.maps, self.dmaps, self.factor = param, None, None, {}


# the attention op's table limit (MF_ATTN_MAX_POSITIONS: distinct positions a batch may hold)
MAX_DECAY_POSITIONS = 4096


def decay_factor(index, batch, distance, gamma):
    """The distance decay's per-pair factor of positions ``index`` (TB, T, A) ints (TB = 1:
    the same for every sequence) as numbered ids: (pos_ids (B, T) int32, the number of each
    token's position among the distinct positions of the batch, pair_factor (N, N) float32
    gamma^distance(u, w) between the distinct positions u, w), with ``distance``: (N, 1, A),
    (1, N, A) -> (N, N) int distances. ValueError naming ``ape_decay`` when the batch holds
    more than MAX_DECAY_POSITIONS distinct positions or gamma^distance overflows float32."""
    index = np.broadcast_to(np.asarray(index), (batch,) + np.shape(index)[1:])
    unique, ids = np.unique(index.reshape(-1, index.shape[2]), axis=0, return_inverse=True)
    if len(unique) > MAX_DECAY_POSITIONS:
        raise ValueError(f"ape_decay: the batch holds {len(unique)} distinct positions; the "
                         f"decay's table takes at most {MAX_DECAY_POSITIONS} (use ape_decay 1, "
                         "or smaller batches / shorter sequences / shallower trees)")
    d = distance(unique[:, None, :], unique[None, :, :])
    if np.log(gamma) * d.max() >= np.log(np.finfo(np.float32).max):
        raise ValueError(f"ape_decay {gamma}: gamma^distance overflows float32 at this "
                         f"batch's largest distance {d.max()} (a decay is gamma < 1)")
    table = geometry.decay_table(d, gamma)
    return ids.reshape(index.shape[:2]).astype(np.int32), table


def sequence_decay_factor(batch, steps, gamma):
    """ape_seq's decay as a per-pair factor: (pos_ids (B, T) int32, the token index,
    pair_factor (T, T) float32 gamma^|i - j|); ValueError naming ``ape_decay`` for T beyond the
    op's table (MAX_DECAY_POSITIONS)."""
    if steps > MAX_DECAY_POSITIONS:
        raise ValueError(f"ape_decay: {steps} tokens under a non-causal attn_mask; the decay's "
                         f"table takes at most {MAX_DECAY_POSITIONS} positions")
    index = np.arange(steps)
    pos_ids = np.ascontiguousarray(np.broadcast_to(index.astype(np.int32), (batch, steps)))
    return pos_ids, geometry.decay_table(np.abs(index[:, None] - index[None, :]), gamma)


class APE(AttentionScheme):
    """Shared machinery of the APE schemes. A subclass defines ``positions(steps) ->
    (index (TB, T, A) int32, P)`` (each token's position per axis, and the positions the table
    holds) and ``distance(a, b)`` (integer distances between positions (..., A): ape_decay's
    d), and may change ``axes(config)`` (A), ``generators(config)`` (G),
    ``rope_init`` and ``table_forward`` / ``table_backward`` (generators -> maps, default:
    powers). Parameter ``generator`` (G, H, E, E), declared by the first layer only. Traces:
    ``q_att``, ``k_att`` (B, T, H, D) the mapped queries and keys; ``maps`` (A, P, H, E, E)
    the operator of every position (per axis)."""

    kind = "attention"
    traces = ("q_att", "k_att", "maps")
    masks = ("causal", "none", "prefix")  # the mixer's attn_mask values it runs (self.mask)

    @classmethod
    def axes(cls, config):
        """A: the chunks the head is cut into (one generator each, unless ``generators``
        says otherwise)."""
        return 1

    @classmethod
    def generators(cls, config):
        return cls.axes(config)

    def rope_init(self, rng, shape):
        """RoPE's rotation on every generator (closed form)."""
        g, h, e, _ = shape
        return geometry.rope_generator(rope_frequencies(self.config.options["rope_base"], h,
                                                         e // 2), g)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        a, h, d = self.axes(config), config.n_heads, config.head_dim
        if d % a or (d // a) % 2:
            raise ValueError(f"{self.name} splits the head dim {d} into {a} chunks of an even "
                             "size: D must be a multiple of 2 n")
        e = d // a
        shared = _SHARED.setdefault(store, {})
        self.owner = self.name not in shared
        if self.owner:
            init = normal_init(0.01) if config.options["ape_no_init"] else self.rope_init
            shared[self.name] = _Shared(store.declare(
                f"{name}.generator", (self.generators(config), h, e, e), init, decay=False))
        self.shared = shared[self.name]

    @property
    def maps(self):
        return self.shared.maps

    def attend(self, x, q, k, v, batch, steps, state):
        self.index, positions = self.positions(steps)
        shared, ops = self.shared, self.ops
        if self.owner:
            shared.maps = self.table_forward(shared.param.value, positions)
            shared.dmaps = ops.zeros_like(shared.maps)
            gamma = self.config.options["ape_decay"]
            shared.factor = {}
            if gamma != 1.0:
                pos_ids, table = decay_factor(ops.to_numpy(self.index), batch, self.distance,
                                              gamma)
                shared.factor = dict(pos_ids=ops.as_indices(pos_ids, "pos_ids"),
                                     pair_factor=ops.asarray(table))
        self.factor = shared.factor
        self.q, self.k, self.v = q, k, v
        self.q_att = ops.ape_apply_forward(q, shared.maps, self.index)
        self.k_att = ops.ape_apply_forward(k, shared.maps, self.index)
        self.out, self.lse = ops.attention_forward(self.q_att, self.k_att, v, **self.mask,
                                                   **self.factor)
        return self.out, state

    def attend_backward(self, dout, dstate):
        shared, ops = self.shared, self.ops
        dq_att, dk_att, dv = ops.attention_backward(dout, self.q_att, self.k_att, self.v,
                                                    self.out, self.lse, **self.mask,
                                                    **self.factor)
        dq = ops.ape_apply_backward(dq_att, self.q, shared.maps, self.index, shared.dmaps)
        dk = ops.ape_apply_backward(dk_att, self.k, shared.maps, self.index, shared.dmaps)
        if self.owner:  # the first layer's backward runs last: every layer's dmaps are in
            self.table_backward(shared.dmaps, shared.param.value, shared.param.grad)
        return dq, dk, dv, dstate

    def table_forward(self, generator, positions):
        """The maps (A, P, H, E, E) of ``positions`` positions per axis: powers W^p."""
        return self.ops.ape_powers_forward(generator, positions)

    def table_backward(self, dmaps, generator, dgenerator):
        self.ops.ape_powers_backward(dmaps, generator, dgenerator)

    @classmethod
    def flops(cls, config, batch, steps):
        """The maps on q and k (2 x 2 N H D E), plus this layer's share of the powers computed
        once per forward for every layer (G H P 2 E^3 with P = T, split over the layers)."""
        a, h, d = cls.axes(config), config.n_heads, config.head_dim
        e = d // a
        return 4 * batch * steps * h * d * e + (2 * a * h * steps * e ** 3) // config.n_layers


class _SharedCanonical:
    """ape_seq's parameters and their per-forward values, shared by every layer's scheme:
    ``basis`` (M, H x D x D), ``eig`` (its generator's skew eigendecomposition, for the
    backward) and ``theta`` (1, T, H, NB) from the last forward, ``dbasis`` and ``dtheta``
    their gradients summed by the layers."""

    def __init__(self, generator, angles):
        self.generator, self.angles = generator, angles
        self.basis = self.dbasis = self.eig = self.theta = self.dtheta = None
        self.ones = {}  # steps -> Delta = 1 (1, T, H, NB)


@register_scheme
class APESequence(AttentionScheme):
    """``ape_seq``: position = token index t, operator W^t with W = M^T R(omega) M per head,
    in APE's canonical form (section 3.2: every W in SO(D) is P R P^T, P orthogonal, R
    block-diagonal 2x2 rotations; here P = M^T): M = expm(B - B^T) and the angles omega (H, NB)
    are the parameters, shared by every layer. Since W^t = M^T R(t omega) M, the score
    (W^m q_m)^T (W^n k_n) = (R(m omega) M q_m)^T (R(n omega) M k_n): the leading M^T cancels, so
    the mixer folds M into its q and k projections (``basis``: parameter-side products, no
    per-token matrix) and the scheme (kind ``attention``) rotates by t omega with the rotary
    op (the angles: path integration of Delta = 1, as RoPE's, with trainable omega), then runs
    the causal attention. The same operators W as APE's W = expm(A - A^T) (every W in SO(D)
    has this form, and every M, omega gives one), reached through (B, omega) in place of A:
    gradients flow into omega through the rotary op and into B through the fold and expm's
    Frechet derivative (ops.ape_basis_*), not through powers of a dense W. The
    parametrisation differs from the paper's, so training dynamics may too; and
    since M sits next to free W_q, W_k, the model family equals RoPE with trainable angles
    shared by the layers (APE's footnote 4); M keeps APE's operator explicit (traces).
    Initialisation: M = I (B = 0) and omega = RoPE's frequencies (exactly the ``rope``
    model); ``ape_no_init``: B and omega ~ N(0, 0.01^2), W near the identity. Parameters
    ``basis_generator`` B (H, D, D) and ``angles`` omega (H, NB), declared by the first layer
    only.

    ``ape_decay`` gamma < 1: the paper's multiplicative distance decay, the logit between
    query i and key j multiplied by gamma^(i - j) (its public code: 0.98, and no decay for the
    RoPE baselines; the paper's text writes p^c, which would grow). In causal attention
    (j <= i, the only mask here) gamma^(i - j) = gamma^(i - c) gamma^(c - j), so it is the C op
    ``ape_decay`` scaling the rotated q_i by gamma^(i - c) and k_j by gamma^(c - j)
    (c = (T - 1) / 2), exact and without touching the attention kernels; it bounds T to
    |ln gamma| (T - 1) / 2 <= 40 (gamma = 0.98: T <= 3960). A mask with keys after the query
    (``none``, ``prefix``) needs gamma^|i - j|, which does not split: there the attention op
    takes it as a per-pair factor (pos_ids = the token index, pair_factor gamma^|i - j|
    (T, T), T <= 4096: ``decay_factor``), as ape_grid's and ape_tree's decays do.

    Traces: ``basis_map`` (H, D, D) M, ``theta`` (1, T, H, NB) the angles (t + 1) omega
    (wrapped to [-pi, pi)), ``q_att``, ``k_att`` (B, T, H, D) the rotated (and decayed)
    queries and keys."""

    name = "ape_seq"
    options = (ROPE_BASE, APE_NO_INIT, APE_DECAY)
    traces = ("basis_map", "theta", "q_att", "k_att")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        h, d = config.n_heads, config.head_dim
        self.decay = config.options["ape_decay"]
        self.masks = ("causal", "none", "prefix")
        shared = _SHARED.setdefault(store, {})
        self.owner = self.name not in shared
        if self.owner:
            base, no_init = config.options["rope_base"], config.options["ape_no_init"]
            generator = store.declare(f"{name}.basis_generator", (h, d, d),
                                      normal_init(0.01) if no_init else constant_init(0.0),
                                      decay=False)
            angles = store.declare(
                f"{name}.angles", (h, d // 2), normal_init(0.01) if no_init else
                (lambda rng, shape: rope_frequencies(base, h, d // 2)), decay=False)
            shared[self.name] = _SharedCanonical(generator, angles)
        self.shared = shared[self.name]

    def basis(self):
        """M (H, D, D), computed by the first layer (the first to run) for all."""
        shared = self.shared
        if self.owner:
            shared.basis, shared.eig = self.ops.ape_basis_forward(shared.generator.value)
            shared.dbasis = self.ops.zeros_like(shared.basis)
        self.basis_map = shared.basis
        return shared.basis

    def basis_backward(self, dbasis):
        """Summed over the layers; the first layer's backward (the last) takes the sum into
        the generator."""
        shared = self.shared
        self.ops.add_(shared.dbasis, dbasis)
        if self.owner:
            self.ops.ape_basis_backward(shared.dbasis, shared.eig, shared.generator.grad)

    def attend(self, x, q, k, v, batch, steps, state):
        """theta (1, T, H, NB) = (t + 1) omega (computed by the first layer for all); q, k
        (already mapped by M in the projections) rotated by it, then the attention, decayed
        (ape_decay < 1) by scaling q and k (causal) or by the per-pair factor (other masks)."""
        shared, ops = self.shared, self.ops
        if self.owner:
            if steps not in shared.ones:
                shared.ones[steps] = ops.ones((1, steps) + shared.angles.shape)
            shared.theta = ops.path_integration_forward(shared.ones[steps], shared.angles.value)
            shared.dtheta = ops.zeros_like(shared.theta)
        self.theta, self.q, self.k, self.v = shared.theta, q, k, v
        self.q_att, self.k_att = ops.rotary_forward(q, k, self.theta)
        # gamma^(i - j) splits into q and k scales for keys j <= i (causal: no mask keyword)
        self.separable, self.factor = self.decay != 1.0 and not self.mask, {}
        if self.separable:
            self.q_att, self.k_att = ops.ape_decay_forward(self.q_att, self.k_att, self.decay)
        elif self.decay != 1.0:
            pos_ids, table = sequence_decay_factor(batch, steps, self.decay)
            self.factor = dict(pos_ids=ops.as_indices(pos_ids, "pos_ids"),
                               pair_factor=ops.asarray(table))
        self.out, self.lse = ops.attention_forward(self.q_att, self.k_att, v, **self.mask,
                                                   **self.factor)
        return self.out, state

    def attend_backward(self, dout, dstate):
        shared, ops = self.shared, self.ops
        dq_att, dk_att, dv = ops.attention_backward(dout, self.q_att, self.k_att, self.v,
                                                    self.out, self.lse, **self.mask,
                                                    **self.factor)
        if self.separable:
            dq_att, dk_att = ops.ape_decay_backward(dq_att, dk_att, self.decay)
        dq, dk, dtheta = ops.rotary_backward(dq_att, dk_att, self.q, self.k, self.theta)
        ops.add_(shared.dtheta, dtheta)
        if self.owner:  # the first layer's backward runs last: every layer's dtheta is in
            ops.path_integration_backward(shared.dtheta, shared.ones[dtheta.shape[1]],
                                          shared.angles.value, shared.angles.grad)
        return dq, dk, dv, dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """M folded into the q and k weights and biases (2 x 2 H D^2 (C + 1))."""
        h, d = config.n_heads, config.head_dim
        return 4 * h * d * d * (config.d_model + 1)


@register_scheme
class APEGrid(APE):
    """``ape_grid``: position = the task's coordinates (B, T, n) (the token index when it
    gives none and n = 1), maps W_a^x_a per axis a on chunk a of the head."""

    name = "ape_grid"
    options = (ROPE_BASE, APE_NO_INIT, COORD_DIMS, COORD_SOURCE, APE_POSITIONS, APE_DECAY)

    @classmethod
    def axes(cls, config):
        return config.options["coord_dims"]

    def positions(self, steps):
        coordinates = coordinates_or_index(self, steps)
        extent = self.config.options["ape_positions"]
        return self.ops.as_indices(coordinates), (max(extent, steps)
                                                  if task_coordinates(self) is None else extent)

    def distance(self, a, b):
        """ape_decay's d: floor of the Euclidean distance (the token index: |i - j|)."""
        return geometry.grid_distance(a, b)


def tree_levels(task):
    """Levels ape_tree tabulates for a task: its ``tree_levels`` (the tree tasks' deepest
    node), else 6."""
    return getattr(task, "tree_levels", 6)


APE_TREE_DEPTH = Option("ape_tree_depth", int, 6, "levels below the root ape_tree tabulates "
                        "(heap numbers 1 .. 2^(depth+1) - 1; for a task: its deepest node)",
                        minimum=1, from_task=tree_levels)


def tree_rope_generator(base, n_heads, dim):
    """(2, H, D, D): branch 0 at RoPE's frequencies base^(-i / NB), branch 1 half a step
    lower, base^(-(i + 1/2) / NB), NB = D / 2."""
    nb = dim // 2
    return np.concatenate([geometry.rope_generator(np.tile(base ** (-(np.arange(nb) + shift)
                                                                   / nb), (n_heads, 1)))
                           for shift in (0.0, 0.5)])


def node_distance(a, b):
    """ape_tree's decay distance: edges on the tree path between heap numbers a, b (..., 1)
    (geometry.tree_distance); 0 when either is 0 (no node: no decay, as its operator is the
    identity)."""
    a, b = np.broadcast_arrays(np.asarray(a)[..., 0], np.asarray(b)[..., 0])
    both = (a > 0) & (b > 0)
    return np.where(both, geometry.tree_distance(np.maximum(a, 1), np.maximum(b, 1)), 0)


@register_scheme
class APETree(APE):
    """``ape_tree``: position = the token's node in a binary tree by heap number h (root 1,
    children 2h and 2h + 1; 0: no node, the identity, for separators and padding), given as
    the coordinates (B, T, 1) (there is no token-index fallback). Two generators per head,
    W_0 (left) and W_1 (right); node h's operator is the ordered product along its path,
    M_h = M_(h // 2) W_(h % 2), so the score between two nodes depends only on the path
    between them (up to their common ancestor, then down), and paths with the same branch
    counts in another order differ (not expressible as MapWM's cumulative sum). The heap
    numbers index the table directly: the paper's public code looked 1-indexed heap numbers
    up in a 0-indexed enumeration (its root got a child's path); this is the numbering the
    algebra says. RoPE initialisation: W_0 at RoPE's frequencies base^(-i / NB), W_1 at
    base^(-(i + 1/2) / NB) (both rotations: commutative until training moves them).
    ``ape_decay``: gamma^(tree distance) on the logits (module docstring)."""

    name = "ape_tree"
    options = (ROPE_BASE, APE_NO_INIT, APE_TREE_DEPTH, APE_DECAY)

    @classmethod
    def generators(cls, config):
        return 2

    def rope_init(self, rng, shape):
        return tree_rope_generator(self.config.options["rope_base"], shape[1], shape[2])

    def positions(self, steps):
        if self.coordinates is None or self.coordinates.shape[2] != 1:
            raise ValueError("positional scheme 'ape_tree' needs the tokens' heap numbers as "
                             "coordinates (B, T, 1): pass coordinates= to "
                             "Transformer.forward / loss")
        return (self.ops.as_indices(self.coordinates),
                2 ** (self.config.options["ape_tree_depth"] + 1))

    def table_forward(self, generator, positions):
        return self.ops.ape_tree_forward(generator, positions.bit_length() - 2)

    def distance(self, a, b):
        return node_distance(a, b)

    def table_backward(self, dmaps, generator, dgenerator):
        self.ops.ape_tree_backward(dmaps, generator, dgenerator)
