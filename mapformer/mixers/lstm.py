"""``lstm``: a one-layer LSTM as the token mixer (the LSTM baseline of TDB's Table 1).

h_t = LSTM(x_t, h_{t-1}, c_t) over the tokens of each sequence (the C op ``lstm``: the
input products of every step in one product, the recurrence step by step), then an output
projection into the residual stream. Hidden width = d_model; gates (i, f, g, o) initialised
U(-1/sqrt(C), 1/sqrt(C)) as in PyTorch, with the forget gate's bias at 1 (Jozefowicz et al.
2015). It has no use for positions (scheme ``none``)."""
import math

import numpy as np

from ..nn import Linear
from ..schemes import get_scheme
from . import Mixer, register_mixer
from .base import extend


def _uniform(bound):
    return lambda rng, shape: rng.uniform(-bound, bound, shape)


def _gate_bias(hidden):
    """Zeros but the forget gate's quarter, 1."""
    def init(rng, shape):
        b = np.zeros(shape)
        b[hidden:2 * hidden] = 1.0
        return b
    return init


@register_mixer
class LSTMMixer(Mixer):
    """Parameters: ``w_ih`` (4C, C), ``w_hh`` (4C, C), ``b`` (4C,) (no weight decay on b),
    ``out`` (C -> C). Traces: ``h`` (B, T, C) the hidden states, ``c`` (B, T, C) the cells."""

    name = "lstm"
    accepts = ("none",)
    traces = ("h", "c")

    def __init__(self, store, name, config, ops, out_std):
        c = config.d_model
        self.config, self.ops = config, ops
        bound = 1.0 / math.sqrt(c)
        self.w_ih = store.declare(f"{name}.w_ih", (4 * c, c), _uniform(bound), decay=True)
        self.w_hh = store.declare(f"{name}.w_hh", (4 * c, c), _uniform(bound), decay=True)
        self.b = store.declare(f"{name}.b", (4 * c,), _gate_bias(c), decay=False)
        self.out = Linear(store, f"{name}.out", c, c, ops, std=out_std)
        self.scheme = get_scheme(config.positional)(store, f"{name}.scheme", config, ops)

    def initial_state(self, batch, steps):
        return None

    def forward(self, x, batch, steps, state=None):
        self.x = x.reshape(batch, steps, -1)
        self.h, self.c, self.gates = self.ops.lstm_forward(self.x, self.w_ih.value,
                                                           self.w_hh.value, self.b.value)
        return self.out.forward(self.h.reshape(batch * steps, -1)), state

    def decode(self, x, batch, steps, cache, start):
        """x (N, C) of ``steps`` new tokens per sequence after ``start`` positions of
        ``cache`` ((h, c) (B, capacity, C) the hidden states and cells so far, or None) ->
        (y (N, C), (h, c) holding start + steps positions): the recurrence goes on from the
        state at position start - 1. No traces, no gradient."""
        hs, cs = (None, None) if cache is None else cache
        h0 = c0 = None
        if cache is not None:
            h0, c0 = self.ops.asarray(hs[:, start - 1]), self.ops.asarray(cs[:, start - 1])
        h, c, _ = self.ops.lstm_forward(x.reshape(batch, steps, -1), self.w_ih.value,
                                        self.w_hh.value, self.b.value, h0, c0)
        y = self.out.forward(h.reshape(batch * steps, -1))
        return y, (extend(self.ops, hs, h, start), extend(self.ops, cs, c, start))

    def backward(self, dy, dstate=None):
        dh = self.out.backward(dy).reshape(self.h.shape)
        dx, _, _ = self.ops.lstm_backward(dh, self.x, self.w_ih.value, self.w_hh.value,
                                          self.h, self.c, self.gates, self.w_ih.grad,
                                          self.w_hh.grad, self.b.grad)
        return dx.reshape(-1, dx.shape[-1]), dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """Input and recurrent products (2 N C 4C each) and the output projection."""
        n, c = batch * steps, config.d_model
        return 2 * n * c * 4 * c * 2 + 2 * n * c * c
