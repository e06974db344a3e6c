"""``attention``: softmax attention over heads (causal by default), with a positional scheme.

How positions enter depends on the scheme's kind:
- ``none``: softmax(q k^T / sqrt(D)) v on the content queries and keys (MapEM-o, NoPE);
- ``angles``: queries and keys rotated pairwise by the scheme's angles first (the rotary op):
  RoPE, MapWM;
- ``attention``: the scheme runs the attention itself on q, k, v (CoPE; TAPE, which also
  carries its state from layer to layer).

Options (every attention mixer's, :data:`mapformer.mixers.base.QUERY_SCALE_OPTIONS`):
``attn_scale``, ``attn_log_scale``, ``attn_log_clamp`` multiply query i, hence row i of the
logits, by a factor (a temperature, constant or growing with log i beyond the training
length). With an ``attention`` scheme the scaled query is what the scheme receives (CoPE's
gates read it too, so there it is more than a temperature).

``attn_mask`` (:data:`mapformer.mixers.base.MASK_OPTIONS`): which keys a query sees. ``causal`` (the default: keys
j <= i, a decoder); ``none`` (every key: an encoder, e.g. an image classifier that pools over
the tokens); ``prefix`` (a prefix LM: full attention within the first P tokens, the source,
causal after them), P given per sequence by the task (``Transformer.forward(prefix=...)``,
e.g. the transduction tasks' source and separator) or, when the task gives none, the fixed
``attn_prefix``. The kernels are the same tiled ones for every mask (no T x T matrix). With
an ``attention`` scheme the scheme must list the mask in its ``masks`` (the APE schemes and
``relative`` do; CoPE and TAPE are causal only).

Incremental decoding (:meth:`CausalAttention.decode`): the new tokens' queries attend the
cached keys and values (the ``attention_decode`` op), for schemes of kind ``none`` (their
positions, if any, are in the embeddings: ``scheme.embed_at``) and angle schemes that give
the angles of positions at an offset (``scheme.angles_at``: rope), with the causal mask only;
the cache holds the keys as the softmax compares them (rotated) and the values.
"""
from ..schemes import get_scheme
from . import QKVMixer, register_mixer
from .base import MASK_OPTIONS, QUERY_SCALE_OPTIONS, extend, mask_arguments


@register_mixer
class CausalAttention(QKVMixer):
    """Parameters: ``q``, ``k``, ``v``, ``out`` (C -> C), then the scheme's. Traces: ``vh``
    (B, T, H, D) values; ``attn`` (B, T, H, D) the attention's output before ``out``;
    ``lse`` (B, H, T) its row log-sum-exps; ``q_att``, ``k_att`` (B, T, H, D) the queries and
    keys the softmax compared (rotated for angle schemes, queries times the factors of the
    query-scaling options; an ``attention`` scheme keeps its own)."""

    name = "attention"
    accepts = ("none", "angles", "attention")
    options = QUERY_SCALE_OPTIONS + MASK_OPTIONS
    traces = ("vh", "attn", "lse", "q_att", "k_att")
    def __init__(self, store, name, config, ops, out_std):
        super().__init__(store, name, config, ops, out_std)
        self.scheme = get_scheme(config.positional)(store, f"{name}.scheme", config, ops)
        mask = config.options["attn_mask"]
        if self.scheme.kind == "attention" and mask not in getattr(self.scheme, "masks",
                                                                   ("causal",)):
            raise ValueError(f"attn_mask {mask!r} is not supported by positional scheme "
                             f"{config.positional!r}, which runs its own attention (its masks: "
                             f"{getattr(self.scheme, 'masks', ('causal',))})")
        self.attend, self.attend_backward = {
            "none": (self.attend_content, self.attend_content_backward),
            "angles": (self.attend_rotated, self.attend_rotated_backward),
            "attention": (self.attend_by_scheme, self.attend_by_scheme_backward),
        }[self.scheme.kind]

    def forward(self, x, batch, steps, state=None):
        self.mask = mask_arguments(self.config.options, self.prefix, batch, steps)
        self.qh, self.kh, self.vh = self.project(x, batch, steps)
        attn, state = self.attend(x, batch, steps, state)
        return self.output(attn), state

    def backward(self, dy, dstate=None):
        return self.attend_backward(self.output_backward(dy), dstate)

    def decode(self, x, batch, steps, cache, start):
        """x (N, C) of ``steps`` new tokens per sequence after ``start`` positions of
        ``cache`` ((keys, values) (B, capacity, H, D), or None) -> (y (N, C), (keys, values)
        holding start + steps positions); no traces, no gradient."""
        kind = self.scheme.kind
        if kind == "attention" or (kind == "angles"
                                   and not hasattr(self.scheme, "angles_at")):
            raise NotImplementedError(f"positional scheme {self.scheme.name!r} has no "
                                      "incremental decoding")
        if self.config.options["attn_mask"] != "causal":
            raise NotImplementedError(f"attn_mask {self.config.options['attn_mask']!r} has no "
                                      "incremental decoding (causal only)")
        q, k, v = self.project(x, batch, steps, start)
        if kind == "angles":
            q, k = self.ops.rotary_forward(q, k, self.scheme.angles_at(x, batch, steps, start))
        keys, values = (None, None) if cache is None else cache
        keys = extend(self.ops, keys, k, start)
        values = extend(self.ops, values, v, start)
        attn, _ = self.ops.attention_decode_forward(q, keys, values, None, start + steps)
        return self.out.forward(attn.reshape(batch * steps, -1)), (keys, values)

    def attend_content(self, x, batch, steps, state):
        self.q_att, self.k_att = self.qh, self.kh
        attn, self.lse = self.ops.attention_forward(self.q_att, self.k_att, self.vh,
                                                    **self.mask)
        return attn, state

    def attend_content_backward(self, dattn, dstate):
        dq, dk, dv = self.ops.attention_backward(dattn, self.q_att, self.k_att, self.vh,
                                                 self.attn, self.lse, **self.mask)
        return self.project_backward(dq, dk, dv), dstate

    def attend_rotated(self, x, batch, steps, state):
        self.theta = self.scheme.angles(x, batch, steps)
        self.q_att, self.k_att = self.ops.rotary_forward(self.qh, self.kh, self.theta)
        attn, self.lse = self.ops.attention_forward(self.q_att, self.k_att, self.vh,
                                                    **self.mask)
        return attn, state

    def attend_rotated_backward(self, dattn, dstate):
        dq_att, dk_att, dv = self.ops.attention_backward(dattn, self.q_att, self.k_att, self.vh,
                                                         self.attn, self.lse, **self.mask)
        dq, dk, dtheta = self.ops.rotary_backward(dq_att, dk_att, self.qh, self.kh, self.theta)
        dx = self.project_backward(dq, dk, dv)
        self.scheme.angles_backward(dtheta, dx)
        return dx, dstate

    def attend_by_scheme(self, x, batch, steps, state):
        self.scheme.mask = self.mask
        return self.scheme.attend(x, self.qh, self.kh, self.vh, batch, steps, state)

    def attend_by_scheme_backward(self, dattn, dstate):
        dq, dk, dv, dstate = self.scheme.attend_backward(dattn, dstate)
        dx = self.project_backward(dq, dk, dv)
        self.scheme.input_backward(dx)
        return dx, dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """q, k, v, out, then scores and the weighted sum of values."""
        return (cls.projection_flops(config, batch, steps, 4)
                + cls.attention_flops(config, batch, steps, 2))
