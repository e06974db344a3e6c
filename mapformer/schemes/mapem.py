"""``mapem``: MapFormer episodic memory's positions (paper section 3.5.1), for the conjunctive
mixer (kind ``positions``).

Positional queries and keys rotate start vectors by the path-integrated angles of
schemes/mapwm.py: Q_P[t] = R(theta_t) q*, K_P[t] = R(theta_t) k*, one shared p* = q* = k* per
head unless ``mapem_separate_start`` (the paper's appendix form; the reproduction found
separate vectors anti-align and stall).
"""
from ..registry import Option
from . import register_scheme
from .mapwm import PATH_OPTIONS, PathIntegrator

SEPARATE_START = Option("mapem_separate_start", bool, False,
                        "separate MapEM start vectors q*, k* instead of one shared p* per head")


def start_vector_init(rng, shape):
    """(H, D) start vectors p*, standard normal: |p*|^2 ~ D, so the positional logits
    scale * s_P(i, j) = p*^T R(theta_j - theta_i) p* / sqrt(D) span about +-sqrt(D) and a
    positional match can dominate a softmax from the start (with unit vectors they span
    +-1/sqrt(D) and MapEM-s attention stays nearly uniform: measured 0.55 vs 0.49 floor after
    600 steps). Every block gets mass: a block with p*_b = 0 would get no gradient (the
    derivative of s_P in p*_b is (R(d) + R(-d)) p*_b)."""
    return rng.standard_normal(shape)


@register_scheme
class MapEMPositions(PathIntegrator):
    """Path integration (the parameters and traces of :class:`PathIntegrator`), then the start
    vectors ``start`` (H, D) (and ``start_k`` when separate) rotated by theta."""

    name = "mapem"
    kind = "positions"
    options = PATH_OPTIONS + (SEPARATE_START,)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        shape = (config.n_heads, config.head_dim)
        self.start_q = store.declare(f"{name}.start", shape, start_vector_init, decay=False)
        self.start_k = (store.declare(f"{name}.start_k", shape, start_vector_init, decay=False)
                        if config.options["mapem_separate_start"] else self.start_q)
        self.tiles = [None, None]  # the start vectors over (B, T), buffers kept across steps

    def positions(self, x, batch, steps):
        """x (N, C) -> Q_P, K_P (B, T, H, D)."""
        theta = self.angles(x, batch, steps)
        shape = (batch, steps) + self.start_q.shape
        # reused buffers: a fresh array each step cost MapEM-os 1.05x on one thread (page faults)
        self.pq = self.tiles[0] = self.ops.broadcast_rows(self.start_q.value, shape,
                                                          self.tiles[0])
        if self.start_k is self.start_q:
            self.pk = self.pq
        else:
            self.pk = self.tiles[1] = self.ops.broadcast_rows(self.start_k.value, shape,
                                                              self.tiles[1])
        return self.ops.rotary_forward(self.pq, self.pk, theta)

    def positions_backward(self, dqp, dkp, dx):
        """dqp, dkp (B, T, H, D) -> gradients into the start vectors and path integration's
        parameters, and into dx (N, C) (+=)."""
        dpq, dpk, dtheta = self.ops.rotary_backward(dqp, dkp, self.pq, self.pk, self.theta)
        self.ops.add_(self.start_q.grad, self.ops.sum_leading(dpq, 2))
        self.ops.add_(self.start_k.grad, self.ops.sum_leading(dpk, 2))
        self.angles_backward(dtheta, dx)
