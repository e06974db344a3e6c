"""``tape``: TAPE (Zhu et al. 2025) as the MapFormer paper describes it, a positional state
carried across layers (kind ``attention``: it runs the attention itself).

Every token carries a per-head complex state E (B, T, H, D), RoPE in the first layer
(:meth:`TAPE.initial_state`). Queries and keys are multiplied by it pairwise as complex
numbers; after attention E_att = A E (the same attention, E as the values) and
E_new = E_att + g * (W E_att over heads), g = sigmoid(x W_g^T + b_g) (B, T, H): the state for
the next layer (see mapformer/reference/tape.py).
"""
from ..geometry import tape_initial_state
from ..nn import Linear, constant_init
from . import AttentionScheme, register_scheme
from .rope import ROPE_BASE


@register_scheme
class TAPE(AttentionScheme):
    """Parameters: ``gate`` (W_g (H, C), b_g (H,)) and ``mix`` W (H, H). Traces: ``q_att``,
    ``k_att`` (B, T, H, D) the queries and keys multiplied by the state (the softmax compares
    these); ``state`` and ``new_state`` (B, T, H, D) the state in and out."""

    name = "tape"
    options = (ROPE_BASE,)
    traces = ("q_att", "k_att", "state", "new_state")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        h = config.n_heads
        self.gate = Linear(store, f"{name}.gate", config.d_model, h, ops)
        self.mix = store.declare(f"{name}.mix", (h, h), constant_init(0.0), decay=True)
        self.rope_states = {}

    def initial_state(self, batch, steps):
        """(B, T, H, D): the RoPE state exp(i omega_k t), t = 1..T, for every sequence (a new
        array per call)."""
        cfg = self.config
        if steps not in self.rope_states:
            self.rope_states[steps] = self.ops.asarray(tape_initial_state(
                steps, cfg.n_heads, cfg.head_dim, cfg.options["rope_base"])[0])
        state = self.rope_states[steps]
        return self.ops.broadcast_rows(state, (batch,) + state.shape)

    def attend(self, x, q, k, v, batch, steps, state):
        self.q, self.k, self.v, self.state = q, k, v, state
        self.q_att, self.k_att = self.ops.tape_rotate_forward(q, k, state)
        self.out, self.lse = self.ops.attention_forward(self.q_att, self.k_att, v)
        self.state_att, self.state_lse = self.ops.attention_forward(self.q_att, self.k_att,
                                                                    state)
        self.gate_logits = self.gate.forward(x).reshape(batch, steps, -1)
        self.new_state = self.ops.tape_mix_forward(self.state_att, self.gate_logits,
                                                   self.mix.value)
        return self.out, self.new_state

    def attend_backward(self, dout, dstate):
        dstate_att, self.dgate = self.ops.tape_mix_backward(dstate, self.state_att,
                                                            self.gate_logits, self.mix.value,
                                                            self.mix.grad)
        dq_att, dk_att, dv = self.ops.attention_backward(dout, self.q_att, self.k_att, self.v,
                                                         self.out, self.lse)
        dq2, dk2, dstate_v = self.ops.attention_backward(dstate_att, self.q_att, self.k_att,
                                                         self.state, self.state_att,
                                                         self.state_lse)
        self.ops.add_(dq_att, dq2)
        self.ops.add_(dk_att, dk2)
        dq, dk, dstate_in = self.ops.tape_rotate_backward(dq_att, dk_att, self.q, self.k,
                                                          self.state)
        self.ops.add_(dstate_in, dstate_v)
        return dq, dk, dv, dstate_in

    def input_backward(self, dx):
        """The gate's gradient into dx (N, C) (+=)."""
        self.gate.backward(self.dgate.reshape(dx.shape[0], -1), dx)

    @classmethod
    def flops(cls, config, batch, steps):
        """The state's attention A E (the scores are the mixer's: B H T^2 D over the causal
        half) and the gate x W_g^T (2 N C H)."""
        n = batch * steps
        return batch * config.d_model * steps * steps + 2 * n * config.d_model * config.n_heads
