"""What every token mixer is: the layer of a Block that moves information between tokens.

A mixer is a class registered with :func:`mapformer.mixers.register_mixer`:

- ``name``: its key in MIXERS and the value of ``ModelConfig.mixer``;
- ``accepts``: the kinds of positional scheme it can use (see :mod:`mapformer.schemes.base`);
  a ModelConfig pairing it with another kind is refused. A mixer with no use for positions
  (a selective scan, an LSTM) accepts ``("none",)``;
- ``options``, ``traces``: as for schemes; its scheme is ``self.scheme``, built by the mixer
  after its own parameters under ``f"{name}.scheme"``;
- ``__init__(store, name, config, ops, out_std)``: declares its parameters; ``out_std`` is the
  init std of its output projection into the residual stream;
- ``forward(x, batch, steps, state) -> (y, state)`` and ``backward(dy, dstate) -> (dx,
  dstate)``: x, y, dx, dy (N, C); ``state`` is the positional state carried from layer to layer
  (None but for schemes with an initial state), passed through when the mixer has no use
  for it; backward accumulates (+=) into its parameters' gradients;
- ``initial_state(batch, steps)``: its scheme's;
- ``flops(config, batch, steps)``: matmul flops of one forward of its own products (its
  scheme counts its own).

Tensor arithmetic goes through ``ops`` (the backend), never NumPy directly. Shapes: B batch,
T tokens, H heads, D head dim, N = B * T rows, C = d_model.
"""
from ..nn import Linear


class Mixer:
    """Defaults every mixer shares: no options, no traces, its scheme's initial state."""

    name = None
    accepts = ()
    options = ()
    traces = ()

    def initial_state(self, batch, steps):
        return self.scheme.initial_state(batch, steps)


class QKVMixer(Mixer):
    """Query, key, value and output projections (C -> C, heads split), shared by the attention
    mixers. ``content_qk=False``: values only, for attention driven by positions alone."""

    def __init__(self, store, name, config, ops, out_std, content_qk=True):
        c = config.d_model
        self.config, self.ops = config, ops
        self.q = Linear(store, f"{name}.q", c, c, ops) if content_qk else None
        self.k = Linear(store, f"{name}.k", c, c, ops) if content_qk else None
        self.v = Linear(store, f"{name}.v", c, c, ops)
        self.out = Linear(store, f"{name}.out", c, c, ops, std=out_std)

    def project(self, x, batch, steps):
        """x (N, C) -> q, k, v (B, T, H, D); q, k are None without content projections. When
        the scheme has a change of basis (``self.scheme.basis()`` (H, D, D), ape_seq), each
        head's q and k are mapped by it, folded into the projections' weights."""
        shape = (batch, steps, self.config.n_heads, self.config.head_dim)
        v = self.v.forward(x).reshape(shape)
        if self.q is None:
            return None, None, v
        self.basis = self.scheme.basis()
        return (self.q.forward(x, self.basis).reshape(shape),
                self.k.forward(x, self.basis).reshape(shape), v)

    def project_backward(self, dq, dk, dv):
        """dq, dk (None without content projections), dv (B, T, H, D) -> dx (N, C); the
        basis's gradient, if any, goes to ``self.scheme.basis_backward``."""
        n = dv.shape[0] * dv.shape[1]
        dx = self.v.backward(dv.reshape(n, -1))
        if self.q is not None:
            dbasis = None if self.basis is None else self.ops.zeros_like(self.basis)
            self.q.backward(dq.reshape(n, -1), dx, dbasis)
            self.k.backward(dk.reshape(n, -1), dx, dbasis)
            if dbasis is not None:
                self.scheme.basis_backward(dbasis)
        return dx

    def output(self, attn):
        """attn (B, T, H, D) -> y (N, C)."""
        self.attn = attn
        return self.out.forward(attn.reshape(attn.shape[0] * attn.shape[1], -1))

    def output_backward(self, dy):
        return self.out.backward(dy).reshape(self.attn.shape)

    @staticmethod
    def projection_flops(config, batch, steps, projections):
        """``projections`` C x C products over N rows."""
        return 2 * batch * steps * config.d_model ** 2 * projections

    @staticmethod
    def attention_flops(config, batch, steps, products):
        """``products`` (B, H, T, T)-sized matmuls over the causal half (scores, or the
        weighted sum of values): B H T^2 D each."""
        return batch * config.d_model * steps * steps * products
