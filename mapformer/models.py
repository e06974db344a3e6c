"""Models built from a :class:`ModelConfig`: a pre-LayerNorm transformer whose positional
scheme is one switch.

- ``rope``: fixed rotary angles theta[t, h, i] = omega_i * t with omega_i = base^(-2i/D).
- ``mapwm``: MapFormer working memory (MapFormer paper, sections 3.5.2 and 4): every token
  x_t yields a signed integration time Delta_t = W_out W_in x_t (rank r, no bias, no abs or
  softplus, so an action and its inverse can cancel), theta = omega * cumsum_t(Delta)
  (path integration) with learnable omega (H, NB), and queries and keys are rotated by theta.
  With Delta = 1 this is RoPE.

Shapes: tokens int32 (B, T); logits (B, T, V); C = d_model, H heads, D = C / H, NB = D / 2.
"""
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from . import backend as backends
from .nn import (Dropout, Embedding, LayerNorm, Linear, MLP, ParameterStore, constant_init,
                 normal_init)

POSITIONAL_SCHEMES = ("rope", "mapwm")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a model. Every field is validated; a bad value raises ValueError.

    vocab_size: number of token ids. d_model, n_heads: width and heads (head dim d_model /
    n_heads must be even, 16..128). n_layers: pre-LN blocks, each attention + MLP
    (mlp_ratio x width, GELU). dropout: residual dropout rate. positional: 'rope' or 'mapwm'.
    delta_rank: r, the rank of Delta = W_out W_in x (the world's dimension in the paper).
    omega_max, omega_grid: MapWM frequencies start geometrically spaced from omega_max down to
    omega_max / omega_grid (appendix 10.2, with the exponent's sign read so that omega
    decreases). rope_base: RoPE's base.
    """

    vocab_size: int
    d_model: int = 128
    n_heads: int = 2
    n_layers: int = 1
    mlp_ratio: int = 4
    dropout: float = 0.0
    positional: str = "mapwm"
    delta_rank: int = 2
    omega_max: float = math.pi
    omega_grid: float = 64.0
    rope_base: float = 10000.0
    layernorm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "mlp_ratio", "delta_rank"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads "
                             f"({self.n_heads})")
        if self.head_dim % 2 or not 16 <= self.head_dim <= 128:
            raise ValueError(f"head dim d_model / n_heads = {self.head_dim} must be even and in "
                             "[16, 128]")
        if self.positional not in POSITIONAL_SCHEMES:
            raise ValueError(f"positional must be one of {POSITIONAL_SCHEMES}, got "
                             f"{self.positional!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name in ("omega_max", "omega_grid", "rope_base", "layernorm_eps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite positive number, got {value!r}")

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**values)


def omega_init(omega_max, grid, n_heads, n_blocks):
    """(H, NB) frequencies omega_max * grid^(-i / (NB - 1)), i = 0..NB-1, for every head."""
    exponents = np.arange(n_blocks) / max(n_blocks - 1, 1)
    return np.tile(omega_max * grid ** (-exponents), (n_heads, 1))


def rope_frequencies(base, n_heads, n_blocks):
    """(H, NB) RoPE frequencies base^(-2i / D), D = 2 NB."""
    return np.tile(base ** (-np.arange(n_blocks) / n_blocks), (n_heads, 1))


class RotaryAttention:
    """Causal self-attention with queries and keys rotated by angles theta:
    x (N, C) -> (N, C). RoPE uses fixed angles (1, T, H, NB); MapWM path-integrates the
    input-dependent Delta (B, T, H, NB)."""

    def __init__(self, store, name, config, ops, out_std):
        c, h = config.d_model, config.n_heads
        self.ops, self.config = ops, config
        self.n_blocks = config.head_dim // 2
        self.q = Linear(store, f"{name}.q", c, c, ops)
        self.k = Linear(store, f"{name}.k", c, c, ops)
        self.v = Linear(store, f"{name}.v", c, c, ops)
        self.out = Linear(store, f"{name}.out", c, c, ops, std=out_std)
        if config.positional == "mapwm":
            r = config.delta_rank
            self.delta_in = Linear(store, f"{name}.delta_in", c, r, ops, bias=False,
                                   std=1.0 / math.sqrt(c))
            self.delta_out = Linear(store, f"{name}.delta_out", r, h * self.n_blocks, ops,
                                    bias=False, std=0.5 / math.sqrt(r))
            self.omega = store.declare(
                f"{name}.omega", (h, self.n_blocks),
                lambda rng, shape: omega_init(config.omega_max, config.omega_grid, *shape),
                decay=False)
        else:
            self.rope_omega = rope_frequencies(config.rope_base, h, self.n_blocks)
            self.rope_theta = {}

    def angles(self, x, batch, steps):
        """theta (B or 1, T, H, NB) for the normalised input x (N, C)."""
        h, nb = self.config.n_heads, self.n_blocks
        if self.config.positional == "mapwm":
            self.delta = self.delta_out.forward(self.delta_in.forward(x)).reshape(
                batch, steps, h, nb)
            return self.ops.path_integration_forward(self.delta, self.omega.value)
        if steps not in self.rope_theta:
            dtype = x.dtype
            self.rope_theta[steps] = self.ops.path_integration_forward(
                np.ones((1, steps, h, nb), dtype), self.rope_omega.astype(dtype))
        return self.rope_theta[steps]

    def forward(self, x, batch, steps):
        shape = (batch, steps, self.config.n_heads, self.config.head_dim)
        self.qh = self.q.forward(x).reshape(shape)
        self.kh = self.k.forward(x).reshape(shape)
        self.vh = self.v.forward(x).reshape(shape)
        self.theta = self.angles(x, batch, steps)
        self.q_rot, self.k_rot = self.ops.rotary_forward(self.qh, self.kh, self.theta)
        self.attn, self.lse = self.ops.attention_forward(self.q_rot, self.k_rot, self.vh)
        return self.out.forward(self.attn.reshape(x.shape))

    def backward(self, dy):
        """dy (N, C) -> dx (N, C)."""
        n, c = dy.shape
        d_attn = self.out.backward(dy).reshape(self.attn.shape)
        dq_rot, dk_rot, dv = self.ops.attention_backward(d_attn, self.q_rot, self.k_rot,
                                                         self.vh, self.attn, self.lse)
        dq, dk, dtheta = self.ops.rotary_backward(dq_rot, dk_rot, self.qh, self.kh, self.theta)
        dx = self.q.backward(dq.reshape(n, c))
        self.k.backward(dk.reshape(n, c), dx)
        self.v.backward(dv.reshape(n, c), dx)
        if self.config.positional == "mapwm":
            ddelta = self.ops.path_integration_backward(dtheta, self.delta, self.omega.value,
                                                        self.omega.grad)
            d_mid = self.delta_out.backward(ddelta.reshape(n, -1))
            self.delta_in.backward(d_mid, dx)
        return dx


class Block:
    """Pre-LN transformer block: x + drop(attn(ln1 x)), then h + drop(mlp(ln2 h))."""

    def __init__(self, store, name, config, ops, rng):
        out_std = 0.02 / math.sqrt(2 * config.n_layers)
        self.ops = ops
        self.ln1 = LayerNorm(store, f"{name}.ln1", config.d_model, ops, config.layernorm_eps)
        self.attn = RotaryAttention(store, f"{name}.attn", config, ops, out_std)
        self.ln2 = LayerNorm(store, f"{name}.ln2", config.d_model, ops, config.layernorm_eps)
        self.mlp = MLP(store, f"{name}.mlp", config.d_model, ops, config.mlp_ratio, out_std)
        self.drop1 = Dropout(config.dropout, rng)
        self.drop2 = Dropout(config.dropout, rng)

    def forward(self, x, batch, steps):
        h = self.ops.residual_forward(
            x, self.drop1.forward(self.attn.forward(self.ln1.forward(x), batch, steps)))
        return self.ops.residual_forward(h, self.drop2.forward(self.mlp.forward(self.ln2.forward(h))))

    def backward(self, dout):
        """dout (N, C) -> dx (N, C). dout is consumed: gradients are accumulated into it."""
        dh = self.ln2.backward(self.mlp.backward(self.drop2.backward(dout)), dout)
        return self.ln1.backward(self.attn.backward(self.drop1.backward(dh)), dh)


class Transformer:
    """Token embedding, ``n_layers`` blocks, final LayerNorm and a linear head.

    ``backend`` is 'c' (the C core, float32) or 'numpy' (the float64 reference ops).
    All parameters live in ``self.params`` (a :class:`ParameterStore`)."""

    def __init__(self, config, seed=0, backend="c"):
        self.config = config
        self.ops = backends.get(backend)
        rng = np.random.default_rng(seed)
        self.params = ParameterStore(self.ops.dtype)
        c = config.d_model
        self.embed = Embedding(self.params, "embed", config.vocab_size, c, self.ops)
        self.blocks = [Block(self.params, f"blocks.{i}", config, self.ops, rng)
                       for i in range(config.n_layers)]
        self.ln_f = LayerNorm(self.params, "ln_f", c, self.ops, config.layernorm_eps)
        self.head = Linear(self.params, "head", c, config.vocab_size, self.ops)
        self.params.build(rng)

    def train(self, mode=True):
        """Switch dropout on (training) or off (evaluation)."""
        for block in self.blocks:
            block.drop1.training = block.drop2.training = mode

    def check_tokens(self, tokens):
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.size == 0:
            raise ValueError(f"tokens must have shape (B, T) with B, T >= 1, got {tokens.shape}")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"tokens must be integers, got dtype {tokens.dtype}")
        return np.ascontiguousarray(tokens, dtype=np.int32)

    def forward(self, tokens):
        """tokens int (B, T) -> logits (B, T, V). Keeps the activations for backward()."""
        tokens = self.check_tokens(tokens)
        batch, steps = tokens.shape
        x = self.embed.forward(tokens.reshape(-1))
        for block in self.blocks:
            x = block.forward(x, batch, steps)
        self.logits = self.head.forward(self.ln_f.forward(x))
        return self.logits.reshape(batch, steps, -1)

    def loss(self, tokens, targets, mask):
        """Masked next-token cross-entropy: tokens, targets int (B, T), mask bool (B, T) ->
        mean loss over the masked positions (float). Keeps what backward() needs."""
        logits = self.forward(tokens)
        if np.shape(targets) != logits.shape[:2] or np.shape(mask) != logits.shape[:2]:
            raise ValueError(f"targets and mask must have the tokens' shape {logits.shape[:2]}, "
                             f"got {np.shape(targets)} and {np.shape(mask)}")
        self.targets = np.ascontiguousarray(targets, dtype=np.int32).reshape(-1)
        self.mask = np.ascontiguousarray(mask, dtype=self.ops.dtype).reshape(-1)
        _, loss = self.ops.softmax_xent_forward(self.logits, self.targets, self.mask)
        return loss

    def backward(self):
        """Gradient of the last loss() into ``self.params.grad`` (zeroed first)."""
        self.params.zero_grad()
        scale = 1.0 / max(float(self.mask.sum()), 1.0)
        dx = self.head.backward(
            self.ops.softmax_xent_backward(self.logits, self.targets, self.mask, scale))
        dx = self.ln_f.backward(dx)
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        self.embed.backward(dx)
