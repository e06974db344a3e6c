"""Models built from a :class:`ModelConfig`: a pre-LayerNorm transformer whose positional
scheme is one switch (``positional``); the schemes are described in
:mod:`mapformer.attention`.

Shapes: tokens int32 (B, T); logits (B, T, V); C = d_model, H heads, D = C / H, NB = D / 2.
"""
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from . import backend as backends
from . import reference
from .attention import ATTENTION, CONJUNCTIVE_MODES
from .nn import Dropout, Embedding, LayerNorm, Linear, MLP, ParameterStore

POSITIONAL_SCHEMES = tuple(ATTENTION)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a model. Every field is validated; a bad value raises ValueError.

    vocab_size: number of token ids. d_model, n_heads: width and heads (head dim d_model /
    n_heads must be even, 16..128). n_layers: pre-LN blocks, each attention + MLP
    (mlp_ratio x width, GELU). dropout: residual dropout rate. positional: one of
    POSITIONAL_SCHEMES. delta_rank: r, the rank of Delta = W_out W_in x (the world's
    dimension in the paper). omega_max, omega_grid: MapWM frequencies start geometrically
    spaced from omega_max down to omega_max / omega_grid (appendix 10.2, with the exponent's
    sign read so that omega decreases). rope_base: RoPE's (and TAPE's initial state's) base.
    cope_positions: CoPE's number of position embeddings (positions are clamped below it),
    required for positional='cope'; the CLI defaults it to the training sequence length.
    mapem_mode: how MapEM-os combines content and positional scores (score_product,
    softmax_product or sum). mapem_separate_start: separate start vectors q*, k* (the paper's
    appendix form) instead of one shared p* per head.
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
    cope_positions: int = None
    mapem_mode: str = "score_product"
    mapem_separate_start: bool = False
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
        if self.positional == "cope" and (
                not isinstance(self.cope_positions, (int, np.integer)) or self.cope_positions < 1):
            raise ValueError("cope_positions must be an integer >= 1 for positional='cope', got "
                             f"{self.cope_positions!r}")
        if self.mapem_mode not in CONJUNCTIVE_MODES:
            raise ValueError(f"mapem_mode must be one of {CONJUNCTIVE_MODES}, got "
                             f"{self.mapem_mode!r}")
        if not isinstance(self.mapem_separate_start, bool):
            raise ValueError("mapem_separate_start must be a bool, got "
                             f"{self.mapem_separate_start!r}")
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


class Block:
    """Pre-LN transformer block: x + drop(attn(ln1 x)), then h + drop(mlp(ln2 h))."""

    def __init__(self, store, name, config, ops, rng):
        out_std = 0.02 / math.sqrt(2 * config.n_layers)
        self.ops = ops
        self.ln1 = LayerNorm(store, f"{name}.ln1", config.d_model, ops, config.layernorm_eps)
        self.attn = ATTENTION[config.positional](store, f"{name}.attn", config, ops, out_std)
        self.ln2 = LayerNorm(store, f"{name}.ln2", config.d_model, ops, config.layernorm_eps)
        self.mlp = MLP(store, f"{name}.mlp", config.d_model, ops, config.mlp_ratio, out_std)
        self.drop1 = Dropout(config.dropout, rng)
        self.drop2 = Dropout(config.dropout, rng)

    def forward(self, x, batch, steps, state):
        """x (N, C), positional state -> (N, C), the state for the next block."""
        a, state = self.attn.forward(self.ln1.forward(x), batch, steps, state)
        h = self.ops.residual_forward(x, self.drop1.forward(a))
        y = self.ops.residual_forward(h, self.drop2.forward(self.mlp.forward(self.ln2.forward(h))))
        return y, state

    def backward(self, dout, dstate):
        """dout (N, C) -> dx (N, C) (dout is consumed: gradients are accumulated into it),
        and the gradient of the incoming positional state."""
        dh = self.ln2.backward(self.mlp.backward(self.drop2.backward(dout)), dout)
        da, dstate = self.attn.backward(self.drop1.backward(dh), dstate)
        return self.ln1.backward(da, dh), dstate


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
        self.tape_states = {}

    def train(self, mode=True):
        """Switch dropout on (training) or off (evaluation)."""
        for block in self.blocks:
            block.drop1.training = block.drop2.training = mode

    def initial_state(self, batch, steps):
        """The positional state entering the first block: TAPE's RoPE state (B, T, H, D),
        None for the other schemes."""
        if self.config.positional != "tape":
            return None
        if steps not in self.tape_states:
            cfg = self.config
            self.tape_states[steps] = reference.tape_initial_state(
                steps, cfg.n_heads, cfg.head_dim, cfg.rope_base).astype(self.ops.dtype)
        state = self.tape_states[steps]
        return np.ascontiguousarray(np.broadcast_to(state, (batch,) + state.shape[1:]))

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
        state = self.initial_state(batch, steps)
        for block in self.blocks:
            x, state = block.forward(x, batch, steps, state)
        self.final_state = state
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
        # the last block's output state feeds nothing: its gradient is zero
        dstate = None if self.final_state is None else np.zeros_like(self.final_state)
        for block in reversed(self.blocks):
            dx, dstate = block.backward(dx, dstate)
        self.embed.backward(dx)
