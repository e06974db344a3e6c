"""What every positional scheme is, and the interfaces its ``kind`` promises a mixer.

A scheme is a class registered with :func:`mapformer.schemes.register_scheme`:

- ``name``: its key in SCHEMES and the value of ``ModelConfig.positional``;
- ``kind``: the interface it offers a token mixer (a mixer lists the kinds it ``accepts``):
  - ``"none"``: no positional information (:class:`Scheme` itself);
  - ``"angles"``: rotation angles for queries and keys (:class:`AngleScheme`);
  - ``"positions"``: positional queries and keys Q_P, K_P (B, T, H, D) of their own, for a
    mixer that scores them beside the content ones: ``positions(x, batch, steps) -> (qp, kp)``
    and ``positions_backward(dqp, dkp, dx)`` (dx accumulated); see schemes/mapem.py;
  - ``"attention"``: it runs the causal attention itself on the mixer's q, k, v
    (:class:`AttentionScheme`);
  an additive scheme (:class:`AdditiveScheme`: sinusoidal, learned absolute) is of kind
  ``"none"``: it offers the mixer nothing, its code is added to the token embeddings
  (``embed``), so every mixer takes it;
- ``options``: a tuple of :class:`mapformer.registry.Option`, validated (defaults filled)
  into ``config.options`` before the scheme is built;
- ``traces``: names of the attributes a forward leaves on the scheme for analyses to read
  (documented in each class);
- ``__init__(store, name, config, ops)``: declares its parameters on the
  :class:`mapformer.nn.ParameterStore` under ``name`` (in a fixed order: the rng draws of
  the initial values follow it);
- ``initial_state(batch, steps)``: the positional state entering the first layer (None but
  for schemes that carry one across layers, TAPE);
- ``basis()`` / ``basis_backward(dbasis)``: an optional per-head orthogonal change of basis
  (H, D, D) the mixer folds into its query and key projections (None by default; ape_seq);
- ``embed(x, batch, steps)`` / ``embed_backward(dx)``: what the model does to the token
  embeddings x (N, C) before the first block, called on the first layer's scheme only (the
  identity by default; :class:`AdditiveScheme` adds its positional code);
- ``flops(config, batch, steps)``: matmul flops of one forward of its own products;
- ``coordinates``: set by the model before every forward: the tokens' coordinates (B, T, n)
  as the task supplies them (navigation: the agent's cell after each step; see
  ``Transformer.forward``), in the backend's float dtype, or None (the task gives none: the
  token index is the position). Schemes that do not read it ignore it.
- ``mask``, ``masks`` (kind ``"attention"``): ``mask`` is set by the attention mixer before
  every ``attend``: the attention ops' mask keywords of its ``attn_mask`` option ({} when
  causal; ``mapformer.mixers.attention.mask_arguments``); a scheme that passes them on to its
  attention lists the mask names it supports in ``masks`` (default: causal only, and the
  mixer refuses any other).

Tensor arithmetic goes through ``ops`` (the backend), never NumPy directly: a scheme runs
unchanged on every backend. Shapes: B batch, T tokens, H heads, D head dim, NB = D / 2
rotation blocks, N = B * T rows, C = d_model.
"""
import weakref
from abc import ABC, abstractmethod

# ParameterStore -> {key: value}: what every layer's scheme of one model shares
_SHARED = weakref.WeakKeyDictionary()


def shared_once(store, key, build):
    """``build()`` the first time a scheme asks for ``key`` on this
    :class:`mapformer.nn.ParameterStore` (in the first layer's scheme, the first built: e.g.
    declaring a parameter every layer shares, under that layer's name), the same value every
    later time."""
    values = _SHARED.setdefault(store, {})
    if key not in values:
        values[key] = build()
    return values[key]


class Scheme:
    """No positional information: the mixer sees content alone (kind ``none``)."""

    name = None
    kind = "none"
    options = ()
    traces = ()
    coordinates = None

    def __init__(self, store, name, config, ops):
        self.config, self.ops = config, ops

    def initial_state(self, batch, steps):
        return None

    def basis(self):
        """An orthogonal change of basis (H, D, D) that a mixer with query and key projections
        folds into them (q -> M_h q, k -> M_h k per head, before anything else the scheme
        does), or None (the default: none). Called once per layer and forward."""
        return None

    def basis_backward(self, dbasis):
        """dbasis (H, D, D): the gradient of this layer's :meth:`basis` (only called when it
        returned one)."""
        raise NotImplementedError(f"{self.name} has no basis")

    def embed(self, x, batch, steps):
        """x (N, C): the token embeddings -> the first block's input (N, C). The model calls
        it on its first layer's scheme, after ``coordinates`` are set. By default x itself."""
        return x

    def embed_backward(self, dx):
        """dx (N, C): the gradient of :meth:`embed`'s output -> gradients into this scheme's
        parameters (+=); dx itself passes on to the token embeddings unchanged (embed adds a
        code that does not depend on x). By default nothing."""

    @classmethod
    def flops(cls, config, batch, steps):
        return 0


class AngleScheme(Scheme, ABC):
    """A scheme that only generates rotation angles (kind ``angles``); the mixer rotates each
    pair (q[2i], q[2i+1]) and (k[2i], k[2i+1]) of every head by theta_i (the rotary op)."""

    kind = "angles"

    @abstractmethod
    def angles(self, x, batch, steps):
        """x (N, C) -> theta (TB, T, H, NB), TB = B for input-dependent angles, 1 for angles
        shared by every sequence."""

    @abstractmethod
    def angles_backward(self, dtheta, dx):
        """dtheta (TB, T, H, NB) -> gradients into this scheme's parameters (+=) and, for
        angles that depend on x, into dx (N, C) (+=)."""


class AttentionScheme(Scheme, ABC):
    """A scheme that runs the causal attention itself (kind ``attention``), on the mixer's
    queries, keys and values; ``state`` is the positional state carried from layer to layer
    (None but for schemes with an :meth:`initial_state`)."""

    kind = "attention"
    masks = ("causal",)
    mask = {}  # the mixer's mask keywords for the attention ops, set before attend

    @abstractmethod
    def attend(self, x, q, k, v, batch, steps, state):
        """x (N, C) (the mixer's input), q, k, v (B, T, H, D) -> (out (B, T, H, D), state
        for the next layer)."""

    @abstractmethod
    def attend_backward(self, dout, dstate):
        """dout (B, T, H, D), dstate (the next layer's state gradient) -> (dq, dk, dv, the
        incoming state's gradient)."""

    def input_backward(self, dx):
        """Gradient of this scheme's own dependence on x into dx (N, C) (+=), called after the
        mixer's projections wrote dx. By default a scheme reads x only through the mixer's
        q, k, v: nothing to add."""


class AdditiveScheme(Scheme, ABC):
    """An absolute positional code added to the token embeddings before the first block
    (Vaswani's sinusoids, a learned table): x -> x + code, the code (TB, T, C) a function of
    the tokens' positions only (TB = B for codes of the task's coordinates, 1 for one shared
    by every sequence), broadcast over the batch. Kind ``none``: the mixers see content
    only (what the code put into it)."""

    @abstractmethod
    def code(self, batch, steps):
        """-> (TB, T, C) the code of each token's position."""

    def code_backward(self, dcode):
        """dcode (B, T, C): the code's gradient -> its parameters' (+=). By default none."""

    def embed(self, x, batch, steps):
        code = self.code(batch, steps)
        self.shape = code.shape[1:]
        if code.shape[0] != batch:
            code = self.ops.broadcast_rows(code[0], (batch,) + code.shape[1:])
        return self.ops.residual_forward(x, code.reshape(x.shape))

    def embed_backward(self, dx):
        self.code_backward(dx.reshape((-1,) + self.shape))
