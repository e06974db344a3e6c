"""``rope``: fixed rotary angles theta[t, h, i] = omega_i * (t + 1), omega_i = base^(-2i / D)
(RoPE: the angles of path integration with every Delta = 1)."""
import numpy as np

from ..registry import Option
from . import AngleScheme, register_scheme

ROPE_BASE = Option("rope_base", float, 10000.0,
                   "RoPE's frequency base: omega_i = base^(-2i / D) (also TAPE's initial state)",
                   above=0)


def rope_frequencies(base, n_heads, n_blocks):
    """(H, NB) RoPE frequencies base^(-2i / D), D = 2 NB."""
    return np.tile(base ** (-np.arange(n_blocks) / n_blocks), (n_heads, 1))


@register_scheme
class RoPE(AngleScheme):
    """Traces: ``theta`` (1, T, H, NB) the last forward's angles (wrapped to [-pi, pi));
    ``frequencies`` (H, NB) omega."""

    name = "rope"
    options = (ROPE_BASE,)
    traces = ("theta", "frequencies")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        self.frequencies = ops.asarray(rope_frequencies(
            config.options["rope_base"], config.n_heads, config.head_dim // 2))
        self.theta_by_steps = {}

    def angles(self, x, batch, steps):
        """The same angles for every sequence, computed once per length."""
        if steps not in self.theta_by_steps:
            ones = self.ops.ones((1, steps) + self.frequencies.shape)
            self.theta_by_steps[steps] = self.ops.path_integration_forward(ones, self.frequencies)
        self.theta = self.theta_by_steps[steps]
        return self.theta

    def angles_backward(self, dtheta, dx):
        """Fixed angles: no parameters, no dependence on x."""
