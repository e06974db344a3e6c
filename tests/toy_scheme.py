"""A toy positional scheme in one module, written as docs/how-to/add-a-scheme.md says:
learned rotation rates, theta[t, h, i] = rate[h, i] * (t + 1) (RoPE whose frequencies are
learned, one per head and rotation block). Importing this module registers it as
``toy``; tests/test_extending.py trains it."""
from mapformer.nn import constant_init
from mapformer.registry import Option
from mapformer.schemes import AngleScheme, register_scheme


@register_scheme
class LearnedRate(AngleScheme):
    """Parameter ``rate`` (H, NB). Traces: ``theta`` (1, T, H, NB), the last angles."""

    name = "toy"
    options = (Option("toy_rate", float, 0.5, "the toy scheme's initial angle per token",
                      above=0),)
    traces = ("theta",)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        self.rate = store.declare(f"{name}.rate", (config.n_heads, config.head_dim // 2),
                                  constant_init(config.options["toy_rate"]), decay=False)

    def angles(self, x, batch, steps):
        """The same angles for every sequence (TB = 1): path integration of Delta = 1."""
        self.ones = self.ops.ones((1, steps) + self.rate.shape)
        self.theta = self.ops.path_integration_forward(self.ones, self.rate.value)
        return self.theta

    def angles_backward(self, dtheta, dx):
        """Into the rates only: the angles do not depend on x."""
        self.ops.path_integration_backward(dtheta, self.ones, self.rate.value, self.rate.grad)
