"""What a bottleneck implements. A Block computes h = x + drop(mixer(ln1 x)), then
h = bottleneck(h), then h + drop(mlp(ln2 h)).

A bottleneck is a class registered with :func:`mapformer.bottlenecks.register_bottleneck`,
with ``name`` (the value of ``ModelConfig.bottleneck``), ``options`` and ``traces`` as for
schemes, and:

- ``__init__(store, name, config, ops)``: declares its own parameters on the store (a VQ
  bottleneck: its codebooks, without weight decay);
- ``forward(x) -> y``: x, y (N, C); keeps what backward needs (a VQ: the code indices);
- ``backward(dy) -> dx`` (N, C): the gradient through the bottleneck (a VQ: straight through
  to x) plus that of its auxiliary loss, with the loss's own weighting; parameter gradients
  accumulated (+=). It may return ``dy`` itself: the Block accumulates the residual
  branch's gradient into what it returns;
- ``aux_loss() -> float``: the auxiliary loss of the last forward (a VQ: codebook and
  commitment terms), added to the model's loss;
- ``flops(config, batch, steps)``: matmul flops of one forward (a VQ: its distance products).

Tensor arithmetic goes through ``ops`` (the backend), never NumPy directly.
"""
from abc import ABC, abstractmethod


class Bottleneck(ABC):
    """A slot between a block's mixer and its MLP. ``training`` follows the model's
    ``train(mode)``: a bottleneck with state beyond its parameters (VQ's usage counts and
    dead-code restarts) changes it in training forwards only."""

    name = None
    options = ()
    traces = ()
    training = True

    def __init__(self, store, name, config, ops):
        self.config, self.ops = config, ops

    @abstractmethod
    def forward(self, x):
        """x (N, C) -> y (N, C)."""

    @abstractmethod
    def backward(self, dy):
        """dy (N, C) -> dx (N, C)."""

    @abstractmethod
    def aux_loss(self):
        """The auxiliary loss of the last forward (float)."""

    @classmethod
    def flops(cls, config, batch, steps):
        return 0
