"""``tree_sq``: Shiv and Quirk's tree positional encoding (NeurIPS 2019, "Novel positional
encodings to enable tree-based transformers"), the "Tree-SQ" baseline of the APE paper's
table (b): an absolute code of a node's path from the root, added to the token embeddings
(:class:`AdditiveScheme`, kind ``none``).

A node's path is its branch choices from the root (heap number h: root 1, children 2h and
2h + 1; the bits of h after its leading one). Read most recent first, step s of the path
(s = 0 the last branch taken) is a one-hot of its branch b in a stack of ``tree_sq_depth``
steps of kappa = 2 (older steps are dropped, as the stack's push truncates them); each of
the stack's L = 2 tree_sq_depth entries is spread over m = d_model // L components, component
j weighted by the geometric factor w_j^s sqrt((1 - w_j^2) d_model / 2), w_j = tanh(p_j) with
p_j learned (m parameters, from U(0.7, 0.999) as the APE code draws them). The
normalisation is the paper's, which sizes the code for unit-size embeddings; the embeddings
here start at 0.02 (the token embeddings' std), so the code is scaled by ``tree_sq_scale``
(default 0.02, as ``sinusoidal_scale`` scales Vaswani's code). Components past L m are 0.
Heap number 0 (the separator, padding) has no path: code 0.

The code is a product: onehot (B T, L) times E (L, d_model), E[l, l m + j] = the weight of
entry l's step in copy j, through the backend's linear op; the gradient of p comes from that
op's weight gradient (a (d_model, L) sum over the tokens) by the chain rule on the host.
"""
import numpy as np

from ..registry import Option
from . import AdditiveScheme, register_scheme, shared_once
from .ape import tree_levels

TREE_SQ_DEPTH = Option("tree_sq_depth", int, 6, "steps of a node's path tree_sq keeps, most "
                       "recent first (for a task: its deepest node's)", minimum=1,
                       from_task=tree_levels)
TREE_SQ_SCALE = Option("tree_sq_scale", float, 0.02, "amplitude of the tree_sq code (0.02: "
                       "the token embeddings' initial std)", above=0)
BRANCHES = 2  # kappa: the tree tasks' binary trees


def path_onehot(heaps, depth):
    """float64 (N, 2 depth): the one-hot stack of each heap number's path (N,) int, most
    recent step first: entry 2 s + b is 1 when step s (0: the last branch taken) went to
    branch b; steps past ``depth`` are dropped; heap 0 (no node) gives 0."""
    heaps = np.asarray(heaps, np.int64).reshape(-1)
    levels = np.where(heaps > 0, np.floor(np.log2(np.maximum(heaps, 1))), -1).astype(np.int64)
    out = np.zeros((heaps.size, BRANCHES * depth))
    for s in range(depth):
        taken = levels > s  # the node is deeper than s steps: its step s exists
        bit = (heaps >> s) & 1
        rows = np.nonzero(taken)[0]
        out[rows, BRANCHES * s + bit[rows]] = 1.0
    return out


def entry_weights(p, depth, width, scale):
    """(float64 (L, m), w (m,)): entry 2 s + b's weight in copy j, w_j^s sqrt((1 - w_j^2)
    width / 2) scale, w = tanh(p), L = 2 depth (on the host: m numbers)."""
    w = np.tanh(np.asarray(p, np.float64))
    steps = np.repeat(np.arange(depth), BRANCHES)[:, None]
    norm = scale * np.sqrt((1.0 - w ** 2) * width / 2.0)
    return w[None, :] ** steps * norm[None, :], w


def embedding_matrix(weights, width):
    """(width, L) float64: the linear op's weight, E^T with E[l, l m + j] = weights[l, j]."""
    L, m = weights.shape
    e = np.zeros((width, L))
    for l in range(L):
        e[l * m:(l + 1) * m, l] = weights[l]
    return e


def p_gradient(dweight, p, depth, width, scale):
    """(m,) float64: the gradient of p from the linear op's weight gradient dweight
    (width, L), through E's entries (d/dw of w^s sqrt(1 - w^2) = w^s sqrt(1 - w^2) (s / w -
    w / (1 - w^2))) and tanh."""
    weights, w = entry_weights(p, depth, width, scale)
    L, m = weights.shape
    dense = np.asarray(dweight, np.float64)
    dentries = np.stack([dense[l * m:(l + 1) * m, l] for l in range(L)])
    steps = np.repeat(np.arange(depth), BRANCHES)[:, None]
    dlog = steps / w[None, :] - (w / (1.0 - w ** 2))[None, :]
    return (dentries * weights * dlog).sum(0) * (1.0 - w ** 2)


@register_scheme
class TreeSQ(AdditiveScheme):
    """Parameter ``p`` (m,), m = d_model // (2 tree_sq_depth), declared by the first
    layer's scheme (the code is added once, before the first block, as ``learned_abs``'s).
    Traces: ``onehot`` (B T, L) the last forward's path stacks, ``weight`` (C, L) its
    linear op's weight (from p)."""

    name = "tree_sq"
    options = (TREE_SQ_DEPTH, TREE_SQ_SCALE)
    traces = ("onehot", "weight")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        self.depth = config.options["tree_sq_depth"]
        L, self.C = BRANCHES * self.depth, config.d_model
        if self.C // L < 1:
            raise ValueError(f"tree_sq spreads its {L} stack entries (2 tree_sq_depth) "
                             f"over d_model = {self.C}: d_model must be at least 2 "
                             "tree_sq_depth")
        self.p = shared_once(store, self.name, lambda: store.declare(
            f"{name}.p", (self.C // L,), lambda rng, shape: rng.uniform(0.7, 0.999, shape),
            decay=False))

    def _weight(self):
        """The linear op's (C, L) weight from p, on the backend."""
        weights, _ = entry_weights(self.ops.to_numpy(self.p.value), self.depth, self.C,
                                   self.config.options["tree_sq_scale"])
        return self.ops.asarray(embedding_matrix(weights, self.C))

    def code(self, batch, steps):
        if self.coordinates is None or self.coordinates.shape[2] != 1:
            raise ValueError("positional scheme 'tree_sq' needs the tokens' heap numbers as "
                             "coordinates (B, T, 1): pass coordinates= to "
                             "Transformer.forward / loss")
        self.onehot = self.ops.asarray(path_onehot(self.ops.to_numpy(self.coordinates),
                                                   self.depth))
        self.weight = self._weight()
        return self.ops.linear_forward(self.onehot, self.weight).reshape(batch, steps, self.C)

    def code_backward(self, dcode):
        """p's gradient (+=) from the linear op's weight gradient (p_gradient)."""
        dweight = self.ops.zeros((self.C, BRANCHES * self.depth))
        self.ops.linear_backward(dcode.reshape(-1, self.C), self.onehot, self.weight, dweight)
        dp = p_gradient(self.ops.to_numpy(dweight), self.ops.to_numpy(self.p.value),
                        self.depth, self.C, self.config.options["tree_sq_scale"])
        self.ops.add_(self.p.grad, self.ops.asarray(dp))

    @classmethod
    def flops(cls, config, batch, steps):
        """onehot E: 2 N L C, L = 2 tree_sq_depth."""
        return 2 * batch * steps * BRANCHES * config.options["tree_sq_depth"] * config.d_model
