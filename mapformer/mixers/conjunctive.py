"""``conjunctive``: MapFormer episodic memory's attention (paper section 3.5.1).

Content scores q_x.k_x times (or plus) positional scores q_p.k_p, the positional queries and
keys coming from a ``positions`` scheme (mapem). ``mapem_scores``: ``both`` (MapEM-os) combines
the two by ``mapem_mode`` (conjunctive attention: score_product, softmax_product or sum; see
mapformer/reference/conj_attention.py); ``positional`` (MapEM-s) attends with the positional scores alone,
without content queries and keys. Values always come from content.

The query-scaling options (``attn_scale``, ``attn_log_scale``, ``attn_log_clamp``; see
:class:`mapformer.mixers.base.QKVMixer`) multiply every logit of row i by the same factor:
they scale the positional query, and the content query too unless the mode is score_product
(whose logit is the product of the two scores).

``attn_mask``, ``attn_prefix`` (:data:`mapformer.mixers.base.MASK_OPTIONS`): which keys a query
sees, causal by default, as for ``attention``.
"""
from ..geometry import CONJ_MODES
from ..registry import Option
from ..schemes import get_scheme
from . import QKVMixer, register_mixer
from .base import MASK_OPTIONS, QUERY_SCALE_OPTIONS, mask_arguments

MODE = Option("mapem_mode", str, "score_product",
              "how MapEM-os combines content and positional scores: score_product (softmax of "
              "their scaled product), softmax_product (eq. 13 read literally) or sum",
              choices=CONJ_MODES)
SCORES = Option("mapem_scores", str, "both",
                "scores MapEM attends with: both content and positional (MapEM-os) or "
                "positional alone (MapEM-s: no content queries and keys)",
                choices=("both", "positional"))


@register_mixer
class ConjunctiveAttention(QKVMixer):
    """Parameters: ``q``, ``k`` (not with positional scores alone), ``v``, ``out``, then the
    scheme's. Traces: ``vh``, ``attn``, ``lse`` as for attention; ``qx``, ``kx`` (B, T, H, D)
    content queries and keys (None with positional scores alone); ``qp``, ``kp`` (B, T, H, D)
    the scheme's positional queries and keys (qx and qp times the query factors as the
    module says). ``mode`` and ``scores`` are the options."""

    name = "conjunctive"
    accepts = ("positions",)
    options = (MODE, SCORES) + QUERY_SCALE_OPTIONS + MASK_OPTIONS
    traces = ("vh", "attn", "lse", "qx", "kx", "qp", "kp")

    def __init__(self, store, name, config, ops, out_std):
        self.mode, self.scores = config.options["mapem_mode"], config.options["mapem_scores"]
        super().__init__(store, name, config, ops, out_std, content_qk=self.scores == "both")
        self.scale_content = self.mode != "score_product"
        self.scheme = get_scheme(config.positional)(store, f"{name}.scheme", config, ops)

    def forward(self, x, batch, steps, state=None):
        self.mask = mask_arguments(self.config.options, self.prefix, batch, steps)
        self.qx, self.kx, self.vh = self.project(x, batch, steps)
        qp, self.kp = self.scheme.positions(x, batch, steps)
        self.qp = self.scale_queries(qp)
        if self.qx is None:
            attn, self.lse = self.ops.attention_forward(self.qp, self.kp, self.vh, **self.mask)
        else:
            attn, self.lse = self.ops.conj_attention_forward(self.qx, self.kx, self.qp, self.kp,
                                                             self.vh, mode=self.mode,
                                                             **self.mask)
        return self.output(attn), state

    def backward(self, dy, dstate=None):
        dattn = self.output_backward(dy)
        if self.qx is None:
            dqx = dkx = None
            dqp, dkp, dv = self.ops.attention_backward(dattn, self.qp, self.kp, self.vh,
                                                       self.attn, self.lse, **self.mask)
        else:
            dqx, dkx, dqp, dkp, dv = self.ops.conj_attention_backward(
                dattn, self.qx, self.kx, self.qp, self.kp, self.vh, self.attn, self.lse,
                mode=self.mode, **self.mask)
        dx = self.project_backward(dqx, dkx, dv)
        self.scheme.positions_backward(self.scale_queries_backward(dqp), dkp, dx)
        return dx, dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """Projections (q, k only with content scores), then the score products (content
        and positional, or positional alone) and the weighted sum of values."""
        both = config.options["mapem_scores"] == "both"
        return (cls.projection_flops(config, batch, steps, 4 if both else 2)
                + cls.attention_flops(config, batch, steps, 3 if both else 2))
