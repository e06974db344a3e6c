"""``cope``: contextual position encoding (Golovneva et al. 2024), which runs its own attention
(kind ``attention``): gated positions p_ij counted from the query back, interpolated position
embeddings added to the logits (see mapformer/reference/cope.py)."""
from ..nn import normal_init
from ..registry import Option
from . import AttentionScheme, register_scheme

COPE_POSITIONS = Option("cope_positions", int, None,
                        "CoPE's number of position embeddings, positions clamped below it (for "
                        "a task: its sequence length)", minimum=1,
                        from_task=lambda task: task.seq_len)


@register_scheme
class CoPE(AttentionScheme):
    """Logits q_i.k_j (scaled) plus q_i.e[p_ij] at the interpolated contextual position p_ij,
    clamped at cope_positions - 1. Parameter ``pos_emb`` e (H, cope_positions, D). No traces:
    its logits are not products of saved queries and keys."""

    name = "cope"
    options = (COPE_POSITIONS,)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        self.e = store.declare(
            f"{name}.pos_emb", (config.n_heads, config.options["cope_positions"], config.head_dim),
            normal_init(0.02), decay=True)

    def attend(self, x, q, k, v, batch, steps, state):
        self.q, self.k, self.v = q, k, v
        self.out, self.lse = self.ops.cope_forward(q, k, v, self.e.value)
        return self.out, state

    def attend_backward(self, dout, dstate):
        dq, dk, dv = self.ops.cope_backward(dout, self.q, self.k, self.v, self.e.value, self.out,
                                            self.lse, self.e.grad)
        return dq, dk, dv, dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """The position logits z = q e^T: 2 B T H cope_positions D."""
        return 2 * batch * steps * config.d_model * config.options["cope_positions"]
