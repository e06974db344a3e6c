"""``gridpe``: GridPE (Li et al., "GridPE: Unifying positional encoding in transformers with a
grid cell-inspired framework"), in its fixed-frequency form, applied as rotary planes to q and k
of the tokens' true n-dimensional coordinates (``Scheme.coordinates``; the token index when the
task gives none, n = 1).

Each head's NB = D/2 rotation planes are grid-cell modules: n + 1 wave directions u_j (unit
vectors of a regular simplex in R^n: 3 at 120 degrees in 2D, +-1 in 1D) at S geometric scales
omega_s = omega_max * r^(-s), r = e^(1/n) (the ratio the paper derives as minimising the number
of neurons for a given resolution: N(r) ~ r^n / ln r is least at r = e^(1/n)). Block
i = s (n + 1) + j turns by theta_i = omega_s u_j . x; blocks beyond S (n + 1) stay unrotated.
In 2D head h's simplex is turned by h 120 / H degrees, so heads sample different directions.
Frequencies are fixed (no parameters, no gradient): the score between tokens at x_m and x_n is
sum_i Re(q_i conj(k_i) e^{i omega_s u_j . (x_m - x_n)}), a function of the displacement only.
It is MapWM with known displacements and frozen frequencies; in 1D the two directions are
+-1: RoPE whose frequencies fall by e from one pair of planes to the next.

Variants, as the paper names them (only ``rotate`` is implemented; the others are written down
for whoever adds them):
- ``rotate`` (this module): the code multiplies q and k pairwise, e^{i theta} per plane.
- ``complex``: q' = [q cos theta, q sin theta] per channel (one angle per real channel, width
  2D), so q' . k' = sum_d q_d k_d cos(theta_d(x_m) - theta_d(x_n)): a cosine kernel per channel
  (the paper's complex code with its conjugate; its 2024 code omits the conjugate).
- ``merge``: the real code [cos theta, sin theta] of the position added to the token embedding
  (absolute, additive, before the first layer), no rotation in attention.
- ``deep``: the code [cos theta, sin theta] passed through a learned MLP (trained with the
  model: the authors' 2024 code builds a new untrained MLP in every forward, a bug) whose output
  multiplies q and k elementwise.
The 2024 code also redraws random frequencies every forward pass and lays ViT patches on one
row; neither is copied here.
"""
import math

import numpy as np

from ..registry import Option
from . import AngleScheme, register_scheme
from .coordinates import COORD_DIMS, coordinates_or_index

GRIDPE_OPTIONS = (
    COORD_DIMS,
    Option("gridpe_scales", int, 0, "GridPE's number of scales S (0: as many as the head's "
           "planes allow, floor(D / 2 / (n + 1)))", minimum=0),
    Option("gridpe_ratio", float, 0.0, "GridPE's scale ratio r (0: e^(1/n), the paper's "
           "optimum)", minimum=0),
    Option("gridpe_omega_max", float, math.pi, "GridPE's fastest frequency (radians per unit "
           "of coordinate)", above=0),
)


def simplex_directions(n):
    """(n + 1, n) unit vectors of a regular simplex centred at 0 in R^n (pairwise dot -1/n)."""
    corners = np.eye(n + 1) - 1.0 / (n + 1)
    # Helmert's orthonormal basis of the sum-zero hyperplane: row k-1 is
    # (1, ..., 1, -k, 0, ...) / sqrt(k (k + 1)) (1D: +-1; 2D: u_0 at 30 degrees, 120 apart)
    basis = np.zeros((n, n + 1))
    for k in range(1, n + 1):
        basis[k - 1, :k], basis[k - 1, k] = 1.0, -k
        basis[k - 1] /= math.sqrt(k * (k + 1))
    directions = corners @ basis.T
    return directions / np.linalg.norm(directions, axis=1, keepdims=True)


def gridpe_frequencies(n_heads, n_blocks, n, scales=0, ratio=0.0, omega_max=math.pi):
    """(H, NB, n) frequency vectors: block s (n + 1) + j of head h is omega_max r^(-s) u_j
    (u_j turned by h 120 / H degrees in 2D), the blocks past S (n + 1) zero."""
    scales = scales or n_blocks // (n + 1)
    if scales < 1 or scales * (n + 1) > n_blocks:
        raise ValueError(f"gridpe needs 1 <= S (n + 1) <= D / 2 = {n_blocks} planes, got "
                         f"S = {scales}, n = {n}")
    ratio = ratio or math.exp(1.0 / n)
    freq = np.zeros((n_heads, n_blocks, n))
    base = simplex_directions(n)
    for h in range(n_heads):
        u = base
        if n == 2:
            a = 2 * math.pi / 3 * h / n_heads
            u = base @ np.array([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
        for s in range(scales):
            freq[h, s * (n + 1):(s + 1) * (n + 1)] = omega_max * ratio ** (-s) * u
    return freq


@register_scheme
class GridPE(AngleScheme):
    """theta[tb, t, h, i] = f[h, i] . x[tb, t] for the coordinates x (TB, T, n); fixed.
    Traces: ``theta`` (TB, T, H, NB) the last forward's angles; ``frequencies`` (H, NB, n)
    the frequency vectors."""

    name = "gridpe"
    options = GRIDPE_OPTIONS
    traces = ("theta", "frequencies")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        self.frequencies = self.frequency_vectors(config)
        self.weight = ops.asarray(self.frequencies.reshape(-1, config.options["coord_dims"]))

    @classmethod
    def frequency_vectors(cls, config):
        """(H, NB, n) the frequency vectors f[h, i] (a subclass may choose others)."""
        o = config.options
        return gridpe_frequencies(config.n_heads, config.head_dim // 2, o["coord_dims"],
                                  o["gridpe_scales"], o["gridpe_ratio"], o["gridpe_omega_max"])

    def angles(self, x, batch, steps):
        coordinates = coordinates_or_index(self, steps)
        tb, n = coordinates.shape[0], coordinates.shape[2]
        theta = self.ops.linear_forward(coordinates.reshape(tb * steps, n), self.weight)
        self.theta = theta.reshape((tb, steps) + self.frequencies.shape[:2])
        return self.theta

    def angles_backward(self, dtheta, dx):
        """Fixed frequencies, and coordinates that do not depend on x: nothing to do."""

    @classmethod
    def flops(cls, config, batch, steps):
        """theta = x f^T: 2 N n H NB."""
        return 2 * batch * steps * config.options["coord_dims"] * config.d_model // 2
