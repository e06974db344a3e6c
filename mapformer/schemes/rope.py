"""``rope``: rotary angles theta[t, h, i] = omega_i * (t + 1), omega_i = base^(-2i / D)
(RoPE: the angles of path integration with every Delta = 1), frozen by default; with
``rope_trainable`` the frequencies omega are a parameter (APE's "RoPE tuned" baseline), shared
by every layer as APE's public code shares its rotary module, the gradient reaching them
through the rotary op and the path integration (as MapWM's omega)."""
import numpy as np

from ..registry import Option
from . import AngleScheme, register_scheme, shared_once

ROPE_BASE = Option("rope_base", float, 10000.0,
                   "RoPE's frequency base: omega_i = base^(-2i / D) (also TAPE's initial state)",
                   above=0)

ROPE_TRAINABLE = Option("rope_trainable", bool, False, "rope's frequencies omega trainable "
                        "(from RoPE's, shared by the layers: 'RoPE tuned'); false: frozen")


def rope_frequencies(base, n_heads, n_blocks):
    """(H, NB) RoPE frequencies base^(-2i / D), D = 2 NB."""
    return np.tile(base ** (-np.arange(n_blocks) / n_blocks), (n_heads, 1))


@register_scheme
class RoPE(AngleScheme):
    """Parameter (``rope_trainable`` only, declared by the first layer): ``omega`` (H, NB).
    Traces: ``theta`` (1, T, H, NB) the last forward's angles (wrapped to [-pi, pi));
    ``frequencies`` (H, NB) omega."""

    name = "rope"
    options = (ROPE_BASE, ROPE_TRAINABLE)
    traces = ("theta", "frequencies")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        initial = rope_frequencies(config.options["rope_base"], config.n_heads,
                                   config.head_dim // 2)
        self.omega = None
        if config.options["rope_trainable"]:
            self.omega = shared_once(store, self.name, lambda: store.declare(
                f"{name}.omega", initial.shape, lambda rng, shape: initial, decay=False))
        else:
            self.fixed = ops.asarray(initial)
        self.ones, self.theta_by_steps = {}, {}

    @property
    def frequencies(self):
        return self.fixed if self.omega is None else self.omega.value

    def angles(self, x, batch, steps):
        """The same angles for every sequence; frozen, computed once per length."""
        if self.omega is None:
            if steps not in self.theta_by_steps:
                ones = self.ops.ones((1, steps) + self.fixed.shape)
                self.theta_by_steps[steps] = self.ops.path_integration_forward(ones, self.fixed)
            self.theta = self.theta_by_steps[steps]
            return self.theta
        if steps not in self.ones:
            self.ones[steps] = self.ops.ones((1, steps) + self.omega.shape)
        self.theta = self.ops.path_integration_forward(self.ones[steps], self.omega.value)
        return self.theta

    def angles_at(self, x, batch, steps, start):
        """The angles of positions start .. start + steps - 1 (incremental decoding), (1,
        steps, H, NB): path integration of Delta = (start + 1, 1, 1, ...), whose running sums
        are the positions + 1, exact as :meth:`angles`' (the same bits as its rows)."""
        delta = self.ops.ones((1, steps) + self.frequencies.shape)
        delta[:, 0] = start + 1
        return self.ops.path_integration_forward(delta, self.frequencies)

    def angles_backward(self, dtheta, dx):
        """No dependence on x; trainable frequencies get this layer's share (+=)."""
        if self.omega is not None:
            self.ops.path_integration_backward(dtheta, self.ones[dtheta.shape[1]],
                                               self.omega.value, self.omega.grad)
