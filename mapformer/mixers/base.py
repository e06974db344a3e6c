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
- ``prefix``: set by the model before every forward: the task's prefix length of each
  sequence (B,) or None, read by the attention mixers' ``attn_mask='prefix'``
  (:data:`MASK_OPTIONS`);
- ``flops(config, batch, steps)``: matmul flops of one forward of its own products (its
  scheme counts its own).

Tensor arithmetic goes through ``ops`` (the backend), never NumPy directly. Shapes: B batch,
T tokens, H heads, D head dim, N = B * T rows, C = d_model.
"""
import math

import numpy as np

from ..nn import Linear
from ..registry import Option

QUERY_SCALE_OPTIONS = (
    Option("attn_scale", float, 1.0, "multiply every attention logit by this (a softmax "
           "temperature of 1 / attn_scale: > 1 sharpens; e.g. at test time on a trained "
           "model)", above=0),
    Option("attn_log_scale", int, 0, "0: off; L >= 2: multiply the logits of query i (0-based) "
           "by max(1, log(i + 1) / log L), L the training sequence length in tokens, so that "
           "a softmax over more keys than in training stays as sharp", minimum=0),
    Option("attn_log_clamp", bool, True, "with attn_log_scale: clamp its factor at 1 (positions "
           "within the training length unchanged, training included); false: log(i + 1) / log "
           "L at every position (the literature's log-n scaling, which changes training)"),
)

# every attention mixer's mask options (attention, conjunctive)
MASKS = ("causal", "none", "prefix")
MASK_OPTIONS = (
    Option("attn_mask", str, "causal", "which keys a query sees: causal (j <= i), none "
           "(every key: an encoder), prefix (full attention within the first P tokens, causal "
           "after: a prefix LM; P from the task per sequence, else attn_prefix); for a task: "
           "its attention_mask (none for the image classifiers), else causal",
           choices=MASKS, from_task=lambda task: getattr(task, "attention_mask", "causal")),
    Option("attn_prefix", int, 0, "with attn_mask prefix: the prefix length P when the task "
           "gives none per sequence (a fixed source length; clipped to the sequence)",
           minimum=0),
)


def mask_arguments(options, prefix, batch, steps):
    """The attention ops' mask keywords for ``options`` (attn_mask, attn_prefix): {} for causal
    (the ops' default), {"mask": "none"}, or {"mask": "prefix", "prefix": int32 (B,)} with
    ``prefix`` (the task's per-sequence lengths, (B,) ints, or None: attn_prefix for every
    sequence), clipped to [0, steps]."""
    mask = options["attn_mask"]
    if mask == "causal":
        return {}
    if mask == "none":
        return {"mask": "none"}
    lengths = np.full(batch, options["attn_prefix"]) if prefix is None else np.asarray(prefix)
    if lengths.shape != (batch,):
        raise ValueError(f"prefix must have shape ({batch},) (one length per sequence), got "
                         f"{lengths.shape}")
    return {"mask": "prefix",
            "prefix": np.ascontiguousarray(np.clip(lengths, 0, steps), dtype=np.int32)}


def query_scales(options, steps):
    """Per-position logit factors (T,) float64 of the options QUERY_SCALE_OPTIONS for T =
    ``steps`` tokens: attn_scale * s_i, s_i = max(1, log(i + 1) / log L) (or without the max
    when attn_log_clamp is false) with L = attn_log_scale, s_i = 1 when it is 0; None when
    every factor is 1 (the defaults: nothing to multiply). A function of sizes and options
    only, never of activations."""
    scale, length = options["attn_scale"], options["attn_log_scale"]
    if length == 0:
        return None if scale == 1.0 else np.full(steps, scale)
    factors = np.log(np.arange(1, steps + 1)) / math.log(length)
    if options["attn_log_clamp"]:
        factors = np.maximum(factors, 1.0)
    return scale * factors


class Mixer:
    """Defaults every mixer shares: no options, no traces, its scheme's initial state."""

    name = None
    accepts = ()
    options = ()
    traces = ()
    prefix = None  # set by the model before every forward: the task's prefix lengths (B,)

    def initial_state(self, batch, steps):
        return self.scheme.initial_state(batch, steps)


class QKVMixer(Mixer):
    """Query, key, value and output projections (C -> C, heads split), shared by the attention
    mixers. ``content_qk=False``: values only, for attention driven by positions alone.

    The options QUERY_SCALE_OPTIONS (every attention mixer's) multiply query i by a factor
    (:func:`query_scales`) before the attention, which multiplies each logit of row i by it
    (a rotation or a product with keys is linear in the query): :meth:`scale_queries` and
    :meth:`scale_queries_backward` (dq times the same factors)."""

    def __init__(self, store, name, config, ops, out_std, content_qk=True):
        c = config.d_model
        if config.options.get("attn_log_scale") == 1:
            raise ValueError("attn_log_scale must be 0 (off) or a training length >= 2, got 1 "
                             "(log 1 = 0)")
        self.config, self.ops = config, ops
        self.factors = {}  # steps -> the query factors (T, 1, 1) in the backend's arrays
        self.q = Linear(store, f"{name}.q", c, c, ops) if content_qk else None
        self.k = Linear(store, f"{name}.k", c, c, ops) if content_qk else None
        self.v = Linear(store, f"{name}.v", c, c, ops)
        self.out = Linear(store, f"{name}.out", c, c, ops, std=out_std)

    scale_content = True  # project() scales the content queries (see scale_queries)

    def project(self, x, batch, steps):
        """x (N, C) -> q, k, v (B, T, H, D); q, k are None without content projections; q
        times the query factors when ``scale_content``. When the scheme has a change of basis
        (``self.scheme.basis()`` (H, D, D), ape_seq), each head's q and k are mapped by it,
        folded into the projections' weights."""
        shape = (batch, steps, self.config.n_heads, self.config.head_dim)
        v = self.v.forward(x).reshape(shape)
        if self.q is None:
            return None, None, v
        self.basis = self.scheme.basis()
        q = self.q.forward(x, self.basis).reshape(shape)
        return (self.scale_queries(q) if self.scale_content else q,
                self.k.forward(x, self.basis).reshape(shape), v)

    def scale_queries(self, q):
        """q (B, T, H, D) -> q times the query factors of position t (q itself when they are
        all 1). Keeps the factors for :meth:`scale_queries_backward`."""
        steps = q.shape[1]
        if steps not in self.factors:
            factors = query_scales(self.config.options, steps)
            self.factors[steps] = None if factors is None else self.ops.asarray(
                factors.reshape(steps, 1, 1))
        self.scales = self.factors[steps]
        return q if self.scales is None else self.ops.mul(q, self.scales)

    def scale_queries_backward(self, dq):
        """The gradient of :meth:`scale_queries`' input from that of its output, (B, T, H,
        D)."""
        return dq if self.scales is None or dq is None else self.ops.mul(dq, self.scales)

    def project_backward(self, dq, dk, dv):
        """dq, dk (None without content projections), dv (B, T, H, D) -> dx (N, C); dq is
        the gradient of project()'s q (scaled when ``scale_content``); the basis's gradient,
        if any, goes to ``self.scheme.basis_backward``."""
        n = dv.shape[0] * dv.shape[1]
        dx = self.v.backward(dv.reshape(n, -1))
        if self.q is not None:
            if self.scale_content:
                dq = self.scale_queries_backward(dq)
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
