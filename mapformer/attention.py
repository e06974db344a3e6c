"""Causal self-attention layers, one per positional scheme: x (N, C) -> (N, C).

Every layer has ``forward(x, batch, steps, state) -> (y, state)`` and
``backward(dy, dstate) -> (dx, dstate)``; ``state`` is the positional state carried from
layer to layer (TAPE's per-token encodings), None for the other schemes.

- ``rope``: fixed rotary angles theta[t, h, i] = omega_i * t, omega_i = base^(-2i/D).
- ``mapwm``: MapFormer working memory (paper sections 3.5.2 and 4). Every token yields a
  signed integration time Delta_t = W_out W_in x_t (rank r, no bias, no abs or softplus, so
  an action and its inverse can cancel); theta = omega * cumsum_t(Delta) (path integration)
  with learnable omega (H, NB); queries and keys are rotated by theta. Delta = 1 gives RoPE.
- ``cope``: contextual position encoding (Golovneva et al. 2024): gated, interpolated
  positions counted from the query back, n_pos position embeddings per head.
- ``tape``: a per-token, per-head complex positional state, RoPE at the input, multiplied
  into queries and keys, then updated after attention by the attention-weighted average of
  the states and a content-gated head-mixing map (see mapformer/reference.py, TAPE).
- ``mapem_os``, ``mapem_s``, ``mapem_o``: MapFormer episodic memory (paper section 3.5.1).
  Positional queries and keys rotate start vectors by the path-integrated angles,
  Q_P[t] = R(theta_t) q*, K_P[t] = R(theta_t) k* (one shared p* = q* = k* per head unless
  ``mapem_separate_start``). MapEM-os combines content scores q_x.k_x and positional scores
  by ``mapem_mode`` (conjunctive attention: score_product, softmax_product or sum); MapEM-s
  attends with the positional scores alone; MapEM-o with the content scores alone (no
  positional information at all: the control).

Shapes: N = B*T rows, C = d_model, H heads, D = C / H, NB = D / 2.
"""
import math

import numpy as np

from .nn import Linear, constant_init, normal_init


def omega_init(omega_max, grid, n_heads, n_blocks):
    """(H, NB) frequencies omega_max * grid^(-i / (NB - 1)), i = 0..NB-1, for every head:
    MapFormer appendix 10.2 with the exponent's sign read so that omega decreases from
    omega_max to omega_max / grid."""
    exponents = np.arange(n_blocks) / max(n_blocks - 1, 1)
    return np.tile(omega_max * grid ** (-exponents), (n_heads, 1))


def rope_frequencies(base, n_heads, n_blocks):
    """(H, NB) RoPE frequencies base^(-2i / D), D = 2 NB."""
    return np.tile(base ** (-np.arange(n_blocks) / n_blocks), (n_heads, 1))


class PathIntegrator:
    """theta = omega * cumsum_t(Delta), Delta = W_out W_in x: x (N, C) -> theta (B, T, H, NB)."""

    def __init__(self, store, name, config, ops):
        c, h, r = config.d_model, config.n_heads, config.delta_rank
        nb = config.head_dim // 2
        self.ops, self.shape = ops, (h, nb)
        self.delta_in = Linear(store, f"{name}.delta_in", c, r, ops, bias=False,
                               std=1.0 / math.sqrt(c))
        self.delta_out = Linear(store, f"{name}.delta_out", r, h * nb, ops, bias=False,
                                std=0.5 / math.sqrt(r))
        self.omega = store.declare(
            f"{name}.omega", (h, nb),
            lambda rng, shape: omega_init(config.omega_max, config.omega_grid, *shape),
            decay=False)

    def forward(self, x, batch, steps):
        self.delta = self.delta_out.forward(self.delta_in.forward(x)).reshape(
            (batch, steps) + self.shape)
        return self.ops.path_integration_forward(self.delta, self.omega.value)

    def backward(self, dtheta, dx):
        """Accumulates the input gradient into dx (N, C)."""
        ddelta = self.ops.path_integration_backward(dtheta, self.delta, self.omega.value,
                                                    self.omega.grad)
        self.delta_in.backward(self.delta_out.backward(ddelta.reshape(dx.shape[0], -1)), dx)


class Attention:
    """Query, key, value and output projections shared by every scheme (``content_qk=False``:
    values only, for attention driven by positions alone)."""

    def __init__(self, store, name, config, ops, out_std, content_qk=True):
        c = config.d_model
        self.ops, self.config = ops, config
        self.q = Linear(store, f"{name}.q", c, c, ops) if content_qk else None
        self.k = Linear(store, f"{name}.k", c, c, ops) if content_qk else None
        self.v = Linear(store, f"{name}.v", c, c, ops)
        self.out = Linear(store, f"{name}.out", c, c, ops, std=out_std)

    def heads(self, batch, steps):
        return (batch, steps, self.config.n_heads, self.config.head_dim)

    def project(self, x, batch, steps):
        """x (N, C) -> q, k, v (B, T, H, D); q, k are None without content projections."""
        shape = self.heads(batch, steps)
        v = self.v.forward(x).reshape(shape)
        if self.q is None:
            return None, None, v
        return self.q.forward(x).reshape(shape), self.k.forward(x).reshape(shape), v

    def project_backward(self, dq, dk, dv):
        """dq, dk (None without content projections), dv (B, T, H, D) -> dx (N, C)."""
        n = dv.shape[0] * dv.shape[1]
        dx = self.v.backward(dv.reshape(n, -1))
        if self.q is not None:
            self.q.backward(dq.reshape(n, -1), dx)
            self.k.backward(dk.reshape(n, -1), dx)
        return dx

    def output(self, attn):
        """attn (B, T, H, D) -> y (N, C)."""
        self.attn = attn
        return self.out.forward(attn.reshape(attn.shape[0] * attn.shape[1], -1))

    def output_backward(self, dy):
        return self.out.backward(dy).reshape(self.attn.shape)


class RotaryAttention(Attention):
    """``rope`` (fixed angles (1, T, H, NB)) or ``mapwm`` (path-integrated input-dependent
    angles (B, T, H, NB)): queries and keys rotated by theta, then causal attention."""

    def __init__(self, store, name, config, ops, out_std):
        super().__init__(store, name, config, ops, out_std)
        nb = config.head_dim // 2
        if config.positional == "mapwm":
            self.path = PathIntegrator(store, f"{name}.path", config, ops)
        else:
            self.path = None
            self.rope_omega = rope_frequencies(config.rope_base, config.n_heads, nb)
            self.rope_theta = {}

    def angles(self, x, batch, steps):
        if self.path is not None:
            return self.path.forward(x, batch, steps)
        if steps not in self.rope_theta:
            ones = np.ones((1, steps) + self.rope_omega.shape, x.dtype)
            self.rope_theta[steps] = self.ops.path_integration_forward(
                ones, self.rope_omega.astype(x.dtype))
        return self.rope_theta[steps]

    def forward(self, x, batch, steps, state=None):
        self.qh, self.kh, self.vh = self.project(x, batch, steps)
        self.theta = self.angles(x, batch, steps)
        self.q_rot, self.k_rot = self.ops.rotary_forward(self.qh, self.kh, self.theta)
        attn, self.lse = self.ops.attention_forward(self.q_rot, self.k_rot, self.vh)
        return self.output(attn), state

    def backward(self, dy, dstate=None):
        dq_rot, dk_rot, dv = self.ops.attention_backward(
            self.output_backward(dy), self.q_rot, self.k_rot, self.vh, self.attn, self.lse)
        dq, dk, dtheta = self.ops.rotary_backward(dq_rot, dk_rot, self.qh, self.kh, self.theta)
        dx = self.project_backward(dq, dk, dv)
        if self.path is not None:
            self.path.backward(dtheta, dx)
        return dx, dstate


class CoPEAttention(Attention):
    """CoPE: logits q_i.k_j (scaled) plus q_i.e[p_ij] at the interpolated contextual position
    p_ij, clamped at ``cope_positions`` - 1; e (H, cope_positions, D)."""

    def __init__(self, store, name, config, ops, out_std):
        super().__init__(store, name, config, ops, out_std)
        self.e = store.declare(f"{name}.pos_emb",
                               (config.n_heads, config.cope_positions, config.head_dim),
                               normal_init(0.02), decay=True)

    def forward(self, x, batch, steps, state=None):
        self.qh, self.kh, self.vh = self.project(x, batch, steps)
        attn, self.lse = self.ops.cope_forward(self.qh, self.kh, self.vh, self.e.value)
        return self.output(attn), state

    def backward(self, dy, dstate=None):
        dq, dk, dv = self.ops.cope_backward(self.output_backward(dy), self.qh, self.kh,
                                            self.vh, self.e.value, self.attn, self.lse,
                                            self.e.grad)
        return self.project_backward(dq, dk, dv), dstate


class TAPEAttention(Attention):
    """TAPE: queries and keys multiplied (as complex pairs) by the positional state
    E (B, T, H, D); after attention E_att = A E and E_new = E_att + g * (W E_att over heads),
    g = sigmoid(x W_g^T + b_g) (B, T, H). The state E_new goes to the next layer."""

    def __init__(self, store, name, config, ops, out_std):
        super().__init__(store, name, config, ops, out_std)
        h = config.n_heads
        self.gate = Linear(store, f"{name}.gate", config.d_model, h, ops)
        self.mix = store.declare(f"{name}.mix", (h, h), constant_init(0.0), decay=True)

    def forward(self, x, batch, steps, state):
        self.x = x
        self.qh, self.kh, self.vh = self.project(x, batch, steps)
        self.state = state
        self.q_rot, self.k_rot = self.ops.tape_rotate_forward(self.qh, self.kh, state)
        attn, self.lse = self.ops.attention_forward(self.q_rot, self.k_rot, self.vh)
        self.state_att, self.state_lse = self.ops.attention_forward(self.q_rot, self.k_rot,
                                                                    state)
        self.gate_logits = self.gate.forward(x).reshape(batch, steps, -1)
        new_state = self.ops.tape_mix_forward(self.state_att, self.gate_logits, self.mix.value)
        return self.output(attn), new_state

    def backward(self, dy, dstate):
        dstate_att, dgate = self.ops.tape_mix_backward(dstate, self.state_att,
                                                       self.gate_logits, self.mix.value,
                                                       self.mix.grad)
        dq_rot, dk_rot, dv = self.ops.attention_backward(
            self.output_backward(dy), self.q_rot, self.k_rot, self.vh, self.attn, self.lse)
        dq2, dk2, dstate_v = self.ops.attention_backward(dstate_att, self.q_rot, self.k_rot,
                                                         self.state, self.state_att,
                                                         self.state_lse)
        dq_rot += dq2
        dk_rot += dk2
        dq, dk, dstate_in = self.ops.tape_rotate_backward(dq_rot, dk_rot, self.qh, self.kh,
                                                          self.state)
        dstate_in += dstate_v
        dx = self.project_backward(dq, dk, dv)
        self.gate.backward(dgate.reshape(dx.shape[0], -1), dx)
        return dx, dstate_in


def start_vector_init(rng, shape):
    """(H, D) start vectors p*, standard normal: |p*|^2 ~ D, so the positional logits
    scale * s_P(i, j) = p*^T R(theta_j - theta_i) p* / sqrt(D) span about +-sqrt(D) and a
    positional match can dominate a softmax from the start (with unit vectors they span
    +-1/sqrt(D) and MapEM-s attention stays nearly uniform: measured 0.55 vs 0.49 floor after
    600 steps). Every block gets mass: a block with p*_b = 0 would get no gradient (the
    derivative of s_P in p*_b is (R(d) + R(-d)) p*_b)."""
    return rng.standard_normal(shape)


class EMAttention(Attention):
    """MapEM-os / -s / -o (see the module docstring). Values always come from content."""

    def __init__(self, store, name, config, ops, out_std):
        self.variant = config.positional
        super().__init__(store, name, config, ops, out_std,
                         content_qk=self.variant != "mapem_s")
        self.path = None
        self.tiles = [None, None]
        if self.variant != "mapem_o":
            self.path = PathIntegrator(store, f"{name}.path", config, ops)
            shape = (config.n_heads, config.head_dim)
            self.start_q = store.declare(f"{name}.start", shape, start_vector_init, decay=False)
            self.start_k = (store.declare(f"{name}.start_k", shape, start_vector_init,
                                          decay=False)
                            if config.mapem_separate_start else self.start_q)

    def positional(self, x, batch, steps):
        """Q_P, K_P (B, T, H, D): the start vectors rotated by the path-integrated angles."""
        self.theta = self.path.forward(x, batch, steps)
        shape = self.heads(batch, steps)
        self.pq = self.tile(0, self.start_q.value, shape)
        self.pk = self.pq if self.start_k is self.start_q else self.tile(1, self.start_k.value,
                                                                         shape)
        return self.ops.rotary_forward(self.pq, self.pk, self.theta)

    def tile(self, slot, start, shape):
        """start (H, D) copied to every (b, t) of a (B, T, H, D) buffer kept from step to step
        (a fresh array each step: MapEM-os step 1.05x on one thread, from its page faults)."""
        buf = self.tiles[slot]
        if buf is None or buf.shape != shape:
            buf = self.tiles[slot] = np.empty(shape, start.dtype)
        buf[...] = start
        return buf

    def forward(self, x, batch, steps, state=None):
        self.qx, self.kx, self.vh = self.project(x, batch, steps)
        if self.variant == "mapem_o":
            attn, self.lse = self.ops.attention_forward(self.qx, self.kx, self.vh)
        else:
            self.qp, self.kp = self.positional(x, batch, steps)
            if self.variant == "mapem_s":
                attn, self.lse = self.ops.attention_forward(self.qp, self.kp, self.vh)
            else:
                attn, self.lse = self.ops.conj_attention_forward(
                    self.qx, self.kx, self.qp, self.kp, self.vh, mode=self.config.mapem_mode)
        return self.output(attn), state

    def backward(self, dy, dstate=None):
        dattn = self.output_backward(dy)
        dqx = dkx = None
        if self.variant == "mapem_o":
            dqx, dkx, dv = self.ops.attention_backward(dattn, self.qx, self.kx, self.vh,
                                                       self.attn, self.lse)
        elif self.variant == "mapem_s":
            dqp, dkp, dv = self.ops.attention_backward(dattn, self.qp, self.kp, self.vh,
                                                       self.attn, self.lse)
        else:
            dqx, dkx, dqp, dkp, dv = self.ops.conj_attention_backward(
                dattn, self.qx, self.kx, self.qp, self.kp, self.vh, self.attn, self.lse,
                mode=self.config.mapem_mode)
        dx = self.project_backward(dqx, dkx, dv)
        if self.path is not None:
            dpq, dpk, dtheta = self.ops.rotary_backward(dqp, dkp, self.pq, self.pk, self.theta)
            self.start_q.grad += dpq.sum((0, 1))
            self.start_k.grad += dpk.sum((0, 1))
            self.path.backward(dtheta, dx)
        return dx, dstate


ATTENTION = {"rope": RotaryAttention, "mapwm": RotaryAttention, "cope": CoPEAttention,
             "tape": TAPEAttention, "mapem_os": EMAttention, "mapem_s": EMAttention,
             "mapem_o": EMAttention}
CONJUNCTIVE_MODES = ("score_product", "softmax_product", "sum")
