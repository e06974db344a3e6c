"""``mapwm``: MapFormer working memory (paper sections 3.5.2 and 4): path-integrated,
input-dependent rotary angles.

Every token yields a signed integration time Delta_t = W_out W_in x_t (rank r, no bias, no abs
or softplus, so an action and its inverse can cancel); theta = omega * cumsum_t(Delta) with
learnable frequencies omega (H, NB). Delta = 1 gives RoPE. MapEM (schemes/mapem.py) builds
its positions on the same path integrator.
"""
import math

import numpy as np

from ..nn import Linear
from ..registry import Option
from . import AngleScheme, register_scheme


def walk_extent(task):
    """The longest distance a path covers in a task (appendix 10.2): the task's own
    ``walk_extent`` (navigation: the grid side), else its sequence length (selective copy)."""
    return float(getattr(task, "walk_extent", task.seq_len))


PATH_OPTIONS = (
    Option("delta_rank", int, 2, "rank r of Delta = W_out W_in x (the world's dimension in "
           "the paper)", minimum=1),
    Option("omega_max", float, math.pi, "the fastest initial frequency omega", above=0),
    Option("omega_grid", float, 64.0, "omega starts geometrically spaced from omega_max down "
           "to omega_max / omega_grid (for a task: its grid side, or its sequence length for "
           "selective copy)", above=0, from_task=walk_extent),
)


def omega_init(omega_max, grid, n_heads, n_blocks):
    """(H, NB) frequencies omega_max * grid^(-i / (NB - 1)), i = 0..NB-1, for every head:
    MapFormer appendix 10.2 with the exponent's sign read so that omega decreases from
    omega_max to omega_max / grid."""
    exponents = np.arange(n_blocks) / max(n_blocks - 1, 1)
    return np.tile(omega_max * grid ** (-exponents), (n_heads, 1))


@register_scheme
class PathIntegrator(AngleScheme):
    """theta = omega * cumsum_t(Delta), Delta = W_out W_in x: x (N, C) -> theta (B, T, H, NB).

    Parameters: ``delta_in`` W_in (r, C), ``delta_out`` W_out (H * NB, r), ``omega`` (H, NB).
    Traces: ``delta`` (B, T, H, NB) the integration times Delta; ``delta_r`` (N, r) W_in x,
    Delta before W_out (the paper's Delta^in); ``theta`` (B, T, H, NB) the angles, wrapped to
    [-pi, pi); ``frequencies`` (H, NB) omega."""

    name = "mapwm"
    options = PATH_OPTIONS
    traces = ("delta", "delta_r", "theta", "frequencies")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        options = config.options
        c, h, r = config.d_model, config.n_heads, options["delta_rank"]
        self.shape = (h, config.head_dim // 2)
        self.delta_in = Linear(store, f"{name}.delta_in", c, r, ops, bias=False,
                               std=1.0 / math.sqrt(c))
        self.delta_out = Linear(store, f"{name}.delta_out", r, h * self.shape[1], ops,
                                bias=False, std=0.5 / math.sqrt(r))
        self.omega = store.declare(
            f"{name}.omega", self.shape,
            lambda rng, shape: omega_init(options["omega_max"], options["omega_grid"], *shape),
            decay=False)

    @property
    def frequencies(self):
        return self.omega.value

    def angles(self, x, batch, steps):
        self.delta_r = self.delta_in.forward(x)
        self.delta = self.delta_out.forward(self.delta_r).reshape((batch, steps) + self.shape)
        self.theta = self.ops.path_integration_forward(self.delta, self.omega.value)
        return self.theta

    def angles_backward(self, dtheta, dx):
        ddelta = self.ops.path_integration_backward(dtheta, self.delta, self.omega.value,
                                                    self.omega.grad)
        self.delta_in.backward(self.delta_out.backward(ddelta.reshape(dx.shape[0], -1)), dx)

    @classmethod
    def flops(cls, config, batch, steps):
        """Delta = W_out (W_in x): 2 N r (C + H NB)."""
        h, nb = config.n_heads, config.head_dim // 2
        return 2 * batch * steps * config.options["delta_rank"] * (config.d_model + h * nb)
