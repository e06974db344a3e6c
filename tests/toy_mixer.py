"""A toy token mixer in one module, written as docs/how-to/add-a-mixer.md says: each token
sees the one k places back, y_t = W x_(t-k) + b (zero input for t < k). Importing this module
registers it as ``toy_shift``; tests/test_extending.py trains it."""
from mapformer.mixers import Mixer, register_mixer
from mapformer.nn import Linear
from mapformer.registry import Option
from mapformer.schemes import get_scheme


@register_mixer
class TokenShift(Mixer):
    """Parameters: ``out`` (C -> C). Traces: ``shifted`` (B, T, C), the shifted inputs."""

    name = "toy_shift"
    accepts = ("none",)
    options = (Option("toy_shift_by", int, 1, "how many tokens back the toy mixer looks",
                      minimum=1),)
    traces = ("shifted",)

    def __init__(self, store, name, config, ops, out_std):
        self.config, self.ops = config, ops
        self.out = Linear(store, f"{name}.out", config.d_model, config.d_model, ops,
                          std=out_std)
        self.scheme = get_scheme(config.positional)(store, f"{name}.scheme", config, ops)

    def forward(self, x, batch, steps, state=None):
        """x (N, C) -> y (N, C); the positional state passes through."""
        kept = max(steps - self.config.options["toy_shift_by"], 0)
        x = x.reshape(batch, steps, -1)
        self.shifted = self.ops.zeros(x.shape)
        self.shifted[:, steps - kept:] = x[:, :kept]
        return self.out.forward(self.shifted.reshape(batch * steps, -1)), state

    def backward(self, dy, dstate=None):
        """dy (N, C) -> dx (N, C); the projection's gradients accumulated (+=)."""
        batch, steps, width = self.shifted.shape
        kept = max(steps - self.config.options["toy_shift_by"], 0)
        dshifted = self.out.backward(dy).reshape(batch, steps, width)
        dx = self.ops.zeros(dshifted.shape)
        dx[:, :kept] = dshifted[:, steps - kept:]
        return dx.reshape(batch * steps, width), dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """The output projection's product."""
        return 2 * batch * steps * config.d_model ** 2
