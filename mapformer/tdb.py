"""TDB, the transformer with a discrete bottleneck (Dedieu et al. 2024, section 3).

Input x_1, a_1, ..., x_N, a_N (observation first: :meth:`mapformer.tasks.rooms.Walks.tokens`),
a causal transformer (the library's blocks; RoPE or any registered scheme in place of the
paper's Transformer-XL relative positions), the final LayerNorm's output at every observation
position snapped to codes by the VQ bottleneck (:mod:`mapformer.bottlenecks.vq`: M codebooks
of K codes; ``codebook_width`` 'split' gives each d_model / M channels, a product quantiser
whose code is d_model wide; 'full' gives each the whole width and concatenates the M codes,
M d_model wide, as the paper's Sec. 3.5 does), then S heads: head s (0 <= s < S) predicts x_{n+s+1} from the
code of x_n and the embeddings of a_n, ..., a_{n+s} (the input embedding's action rows),
a two-layer GELU MLP. Its first layer takes the concatenation (code, E(a_n), ..., E(a_{n+s}))
without building it: one Linear per part, summed. Loss: the mean over the heads of their
cross-entropies (each averaged over the positions whose target exists) plus the VQ loss.
``enc`` (section 3.5, eq. 5; BYOL-style): a teacher of the same architecture, its weights
the exponential moving average (``ema``, 0.99) of the student's after every step
(:meth:`TDB.update_teacher`), started as a copy; a head g (the heads' form, output d_model)
maps (code of x_n, E(a_n)) to a vector whose L2-normalised value regresses onto the teacher's
normalised code of x_{n+1}: L_enc = ||g/|g| - sg(t/|t|)||^2, averaged over the positions
with a next observation (the paper sums; averaging keeps it on the cross-entropy's scale),
added to the loss. The teacher runs without dropout; its codebook is the EMA of the
student's. The normalisations (``l2_normalize_forward`` / ``_backward``, eps 1e-12) and the
teacher's update (``ema_update``) are backend ops: C ops on the C backend.

The vanilla transformer and the LSTM of the paper's Table 1 need no class of their own: a
:class:`mapformer.models.Transformer` on the same tokens with targets x_{n+1} at the action
positions (:func:`mapformer.tasks.rooms.next_observation_targets`).

TDB trains through :func:`mapformer.train.train` as a Transformer does (its model kind "tdb"
there: :data:`mapformer.train.MODEL_KINDS`): :meth:`TDB.loss` and :meth:`TDB.backward` take the
loop's arguments, the teacher's EMA runs after every optimizer step, and the library's
checkpoint holds what an exact resume needs beside the parameters
(:meth:`TDB.checkpoint_state`: the teacher, the VQ's usage and restart state).
"""
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from . import backend as backends
from .bottlenecks.vq import VQ
from .models import Block, ModelConfig, forward_flops as body_forward_flops
from .nn import LayerNorm, Linear, ParameterStore, normal_init


@dataclass(frozen=True)
class TDBConfig:
    """n_obs (O), n_actions: the symbols; d_model, n_heads, n_layers, mlp_ratio, dropout,
    positional: the transformer; steps (S): the heads; codebooks (M), codes (K), beta,
    reduction, restart_dead, codebook_width: the VQ bottleneck's options (the last its
    ``vq_width``: 'split' or the paper's 'full'); head_hidden: the heads' hidden width; enc,
    ema: the next-encoding objective and its teacher's EMA rate."""

    n_obs: int
    n_actions: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 2
    dropout: float = 0.0
    positional: str = "rope"
    steps: int = 1
    codebooks: int = 1
    codes: int = 500
    beta: float = 0.25
    reduction: str = "mean"
    restart_dead: int = 0
    head_hidden: int = 256
    enc: bool = False
    ema: float = 0.99
    codebook_width: str = "split"

    def __post_init__(self):
        for name in ("n_obs", "n_actions", "steps", "head_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"ema must be in [0, 1), got {self.ema!r}")
        if self.codebook_width not in ("split", "full"):
            raise ValueError(f"codebook_width must be 'split' or 'full', got "
                             f"{self.codebook_width!r}")
        self.body_config()  # validates the rest

    @property
    def vocab_size(self):
        return self.n_obs + self.n_actions

    @property
    def code_width(self):
        """The width of a code the heads read: d_model, or M d_model (codebook_width 'full',
        M > 1)."""
        full = self.codebook_width == "full"
        return self.d_model * (self.codebooks if full else 1)

    @property
    def label(self):
        """'TDB(3, 1)', 'TDB(1, enc, 1)': the paper's name of the model (S, M)."""
        return f"TDB({self.steps}, {'enc, ' if self.enc else ''}{self.codebooks})"

    def to_dict(self):
        """The fields; codebook_width (added after records existed) only when not 'split',
        so those records' run ids stay what they were."""
        values = asdict(self)
        if values["codebook_width"] == "split":
            del values["codebook_width"]
        return values

    @classmethod
    def from_dict(cls, values):
        """The config of ``values`` (its to_dict()); TypeError for an unknown field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(f"TDBConfig has no field {unknown[0]!r}")
        return cls(**values)

    def body_config(self, bottleneck="none"):
        """The ModelConfig of the transformer body (or, with bottleneck 'vq', of the VQ)."""
        options = {} if bottleneck == "none" else dict(
            vq_codes=self.codes, vq_codebooks=self.codebooks, vq_width=self.codebook_width,
            vq_beta=self.beta,
            vq_reduction=self.reduction, vq_restart_dead=self.restart_dead,
            vq_every_block=True)
        return ModelConfig(vocab_size=self.vocab_size, d_model=self.d_model,
                           n_heads=self.n_heads, n_layers=self.n_layers,
                           mlp_ratio=self.mlp_ratio, dropout=self.dropout, mixer="attention",
                           positional=self.positional, bottleneck=bottleneck, options=options)


def head_inputs(tokens, n_obs, steps):
    """tokens int (B, 2N) -> (action ids (S, B N): row s the input-embedding id of
    a_{n+s} (0 past the end), targets (S, B N): x_{n+s+1} (0 past the end), masks (S, B N):
    1 where x_{n+s+1} exists)."""
    tokens = np.asarray(tokens)
    obs, act = tokens[:, 0::2], tokens[:, 1::2]
    B, N = obs.shape
    ids, targets = np.zeros((steps, B, N), np.int32), np.zeros((steps, B, N), np.int32)
    masks = np.zeros((steps, B, N), np.float64)
    for s in range(min(steps, N)):  # a head s >= N has no target in a walk of N
        ids[s, :, :N - s] = act[:, s:]
        targets[s, :, :N - s - 1] = obs[:, s + 1:]
        masks[s, :, :N - s - 1] = 1.0
    return ids.reshape(steps, -1), targets.reshape(steps, -1), masks.reshape(steps, -1)


def encode_flops(config, batch, tokens):
    """Matmul flops of :meth:`TDB.encode` on (batch, tokens) tokens (tokens = 2N): the
    transformer body's blocks (:func:`mapformer.models.forward_flops`, less its head, TDB
    having none) and the VQ's distances at the N observations of a row (2 B N C K: every
    codebook's C/M channels against its K codes; codebook_width 'full': 2 B N M C K)."""
    c, body = config.d_model, config.body_config()
    blocks = body_forward_flops(body, batch, tokens) - 2 * batch * tokens * c * body.vocab_size
    return blocks + 2 * batch * (tokens // 2) * config.code_width * config.codes


def forward_flops(config, batch, tokens):
    """Matmul flops of the student's forward: :func:`encode_flops`, and per head s its code
    layer (2 B N W H, W = the code's width, H = head_hidden), output layer (2 B N H O; the
    enc head's 2 B N H W) and action tables (s + 1 products of the (V, C) embedding, 2 V C H
    each)."""
    c, h, v, w = config.d_model, config.head_hidden, config.vocab_size, config.code_width
    n = batch * (tokens // 2)
    heads = [(s, config.n_obs) for s in range(config.steps)] + ([(0, w)] if config.enc else [])
    return encode_flops(config, batch, tokens) + sum(
        2 * n * w * h + 2 * n * h * n_out + (s + 1) * 2 * v * c * h for s, n_out in heads)


def step_flops(config, batch, tokens):
    """Matmul flops of a training step: 3 x the student's forward (its backward twice its
    forward's), plus the enc teacher's encode (no backward)."""
    teacher = encode_flops(config, batch, tokens) if config.enc else 0
    return 3 * forward_flops(config, batch, tokens) + teacher


class Head:
    """f^(s): logits = W2 gelu(Wc code + sum_j Wj E(a_{n+j}) + b) + b2, j = 0..s; n_out
    outputs (default: the observations). E(a) is a row of the input embedding, so each action
    part Wj E(a) is a row of the table E Wj^T (vocabulary x hidden), computed once per forward
    and gathered at the ids; its gradient is the table's (the rows' gradients summed per id),
    so the step multiplies (V, C) by (C, hidden) where a product per position would multiply
    (B N, C)."""

    def __init__(self, store, name, config, ops, s, n_out=None):
        c, hidden = config.d_model, config.head_hidden
        self.ops = ops
        self.code = Linear(store, f"{name}.code", config.code_width, hidden, ops)
        self.actions = [Linear(store, f"{name}.action{j}", c, hidden, ops, bias=False)
                        for j in range(s + 1)]
        self.out = Linear(store, f"{name}.out", hidden, n_out or config.n_obs, ops)

    def forward(self, code, ids, embedding):
        """code (B N, W: the code's width), ids [(B N,) int: the embedding row of a_{n+j},
        j = 0..s], embedding (V, C) -> logits (B N, n_out)."""
        pre = self.code.forward(code)
        self.ids = ids
        for layer, i in zip(self.actions, ids):
            self.ops.add_(pre, self.ops.embedding_forward(i, layer.forward(embedding)))
        self.pre = pre
        return self.out.forward(self.ops.gelu_forward(pre))

    def backward(self, dlogits, dcode, dembedding):
        """The code's gradient is accumulated into dcode (B N, W), the embedding's into
        dembedding (V, C)."""
        dpre = self.ops.gelu_backward(self.out.backward(dlogits), self.pre)
        self.code.backward(dpre, dcode)
        for layer, i in zip(self.actions, self.ids):
            dtable = self.ops.zeros((dembedding.shape[0], dpre.shape[1]))
            self.ops.embedding_backward(dtable, dpre, i)
            layer.backward(dtable, dembedding)


class TDB:
    """The model: ``params`` one flat store (ParameterStore); ``backend`` 'c' or 'numpy';
    ``declare_only=P``: only declare the parameters, at most P (as
    :class:`mapformer.models.Transformer`'s; no teacher); ``rng`` the dropout masks'
    generator (a checkpoint saves its state)."""

    STATE_ARRAYS = ("teacher", "vq_counts", "vq_restart_counts")  # checkpoint_state's arrays

    def __init__(self, config, seed=0, backend="c", declare_only=None):
        self.config = config
        self.ops = backends.get(backend)
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.params = ParameterStore(self.ops, limit=declare_only)
        body = config.body_config()
        self.embed = self.params.declare("embed.weight", (config.vocab_size, config.d_model),
                                         normal_init(0.02), decay=True)
        self.blocks = [Block(self.params, f"blocks.{i}", body, self.ops, rng)
                       for i in range(config.n_layers)]
        self.ln_f = LayerNorm(self.params, "ln_f", config.d_model, self.ops,
                              body.layernorm_eps)
        self.vq = VQ(self.params, "vq", config.body_config("vq"), self.ops)
        self.heads = [Head(self.params, f"heads.{s}", config, self.ops, s)
                      for s in range(config.steps)]
        # declared last: the teacher's parameters are a prefix of the student's
        self.enc = (Head(self.params, "enc", config, self.ops, 0, n_out=config.code_width)
                    if config.enc else None)
        self.teacher = None
        if declare_only is not None:
            return
        self.params.build(rng)
        if config.enc:
            self.teacher = TDB(replace(config, enc=False, dropout=0.0, restart_dead=0),
                               seed=seed, backend=backend)
            self.teacher.params.data[:] = self.params.data[:self.teacher.params.size]

    def update_teacher(self):
        """teacher = ema teacher + (1 - ema) student, after an optimizer step (enc only)."""
        if self.teacher is None:
            return
        t = self.teacher.params.data
        self.ops.ema_update(t, self.params.data[:t.shape[0]], self.config.ema)

    def train(self, mode=True):
        """Dropout and the VQ's usage counts and restarts on (training) or off."""
        for block in self.blocks:
            block.drop1.training = block.drop2.training = mode
        self.vq.training = mode

    def encode(self, tokens):
        """tokens int (B, 2N) -> (codes (B N, W) at the observation positions (W =
        config.code_width), indices (B, N, M) int)."""
        ops = self.ops
        self.tokens = ops.as_indices(tokens)
        B, T = self.tokens.shape
        x = self.blocks[0].mixer.scheme.embed(
            ops.embedding_forward(self.tokens.reshape(-1), self.embed.value), B, T)
        state = self.blocks[0].initial_state(B, T)
        for block in self.blocks:
            x, state = block.forward(x, B, T, state)
        self.final_state = state
        y = self.ln_f.forward(x).reshape(B, T, -1)
        codes = self.vq.forward(ops.asarray(y[:, 0::2]).reshape(B * (T // 2), -1))
        return codes, self.vq.indices.reshape(B, T // 2, -1)

    def loss(self, tokens, targets=None, mask=None, coordinates=None, prefix=None, pool=None):
        """Mean over the heads of the masked next-observation cross-entropy, plus the VQ
        loss (float). Keeps what backward() needs; ``self.logits[s]`` (B N, O). The other
        arguments are the training loop's (:meth:`mapformer.models.Transformer.loss`'s): the
        heads' targets come from ``tokens`` (x_{n+s+1}), so a task's ``targets`` and ``mask``
        (the rooms task's: x_{n+1} at a_n, head 0's) are not read; ``coordinates``, ``prefix``
        and ``pool`` must be None (TDB reads no positions, is causal and predicts per token)."""
        for name, value in (("coordinates", coordinates), ("prefix", prefix), ("pool", pool)):
            if value is not None:
                raise ValueError(f"TDB.loss: {name} must be None (TDB has no use for it)")
        ops, c = self.ops, self.config
        codes, _ = self.encode(tokens)
        ids, targets, masks = head_inputs(ops.to_numpy(self.tokens), c.n_obs, c.steps)
        self.ids = [ops.as_indices(i) for i in ids]
        self.targets = [ops.as_indices(t) for t in targets]
        self.masks = [ops.asarray(m) for m in masks]
        self.logits, total = [], 0.0
        for s, head in enumerate(self.heads):
            logits = head.forward(codes, self.ids[:s + 1], self.embed.value)
            self.logits.append(logits)
            total += ops.softmax_xent_forward(logits, self.targets[s], self.masks[s])[1]
        total = total / c.steps + self.vq.aux_loss()
        if self.enc is not None:
            total += self.enc_loss(tokens, codes)
        return total

    def enc_loss(self, tokens, codes):
        """L_enc (see the module) of the last encode; keeps what its backward needs."""
        B, T = self.tokens.shape
        N, C = T // 2, self.config.code_width
        target, _ = self.teacher.encode(tokens)
        target, _ = self.ops.l2_normalize_forward(target, 1e-12)
        nxt = self.ops.zeros((B, N, C))
        nxt[:, :-1] = target.reshape(B, N, C)[:, 1:]
        g = self.enc.forward(codes, self.ids[:1], self.embed.value)
        self.enc_y, self.enc_norm = self.ops.l2_normalize_forward(g, 1e-12)
        mask = self.masks[0].reshape(-1, 1)
        self.enc_count = max(float(mask.sum()), 1.0)
        self.enc_diff = (self.enc_y - nxt.reshape(B * N, C)) * mask
        return float((self.enc_diff * self.enc_diff).sum()) / self.enc_count

    def enc_backward(self, dcode):
        """L_enc's gradient through g/|g| and g into dcode and the embedding's gradient."""
        dy = (2.0 / self.enc_count) * self.enc_diff
        dg = self.ops.l2_normalize_backward(dy, self.enc_y, self.enc_norm)
        self.enc.backward(dg, dcode, self.embed.grad)

    def backward(self, scored=None):
        """Gradient of the last loss() into ``self.params.grad`` (zeroed first). ``scored``
        (the training loop's count of scored positions) is not read: each head's loss is a
        mean over its own positions."""
        ops, c = self.ops, self.config
        self.params.zero_grad()
        B, T = self.tokens.shape
        dcode = ops.zeros((B * (T // 2), c.code_width))
        for s, head in enumerate(self.heads):
            scale = 1.0 / (c.steps * max(float(self.masks[s].sum()), 1.0))
            dlogits = ops.softmax_xent_backward(self.logits[s], self.targets[s],
                                                self.masks[s], scale)
            head.backward(dlogits, dcode, self.embed.grad)
        if self.enc is not None:
            self.enc_backward(dcode)
        dz = self.vq.backward(dcode)
        dy = ops.zeros((B, T, c.d_model))
        dy[:, 0::2] = dz.reshape(B, T // 2, -1)
        dx = self.ln_f.backward(dy.reshape(B * T, -1))
        dstate = None if self.final_state is None else ops.zeros_like(self.final_state)
        for block in reversed(self.blocks):
            dx, dstate = block.backward(dx, dstate)
        self.blocks[0].mixer.scheme.embed_backward(dx)
        ops.embedding_backward(self.embed.grad, dx, self.tokens.reshape(-1))

    def token_scores(self):
        """float (B, 2N, V): the s = 0 head's logits of the last loss() at each action a_n's
        position (its prediction of x_{n+1}, aligned with the rooms task's targets), 0
        elsewhere."""
        B, T = self.tokens.shape
        logits = self.ops.to_numpy(self.logits[0])
        out = np.zeros((B, T, logits.shape[-1]), logits.dtype)
        out[:, 1::2] = logits.reshape(B, T // 2, -1)
        return out

    def checkpoint_state(self):
        """(meta, arrays): what a checkpoint holds beside the parameters so that a resumed run
        goes on as the uninterrupted one: the teacher's parameters (enc; float32), the VQ's
        usage and restart counts (int64 (M, K)), its count of forwards and its restart
        generator's state."""
        arrays = {"vq_counts": self.vq.counts.copy(),
                  "vq_restart_counts": self.vq.restart_counts.copy()}
        if self.teacher is not None:
            arrays["teacher"] = np.asarray(self.ops.to_numpy(self.teacher.params.data),
                                           np.float32)
        return {"vq_forwards": self.vq.forwards,
                "vq_rng": self.vq.rng.bit_generator.state}, arrays

    def restore_state(self, meta, arrays):
        """Set what :meth:`checkpoint_state` returned; ValueError naming the field that is
        missing or does not fit this model."""
        shape = self.vq.counts.shape
        for name in ("vq_counts", "vq_restart_counts"):
            a = arrays.get(name)
            if a is None or a.dtype != np.int64 or a.shape != shape or (a < 0).any():
                raise ValueError(f"{name} must be int64 counts >= 0 of shape {shape}, got "
                                 + ("none" if a is None else f"{a.dtype} of shape {a.shape}"))
        forwards = meta.get("vq_forwards")
        if not isinstance(forwards, int) or isinstance(forwards, bool) or forwards < 0:
            raise ValueError(f"state field 'vq_forwards' must be an integer >= 0, got "
                             f"{forwards!r:.80}")
        try:
            self.vq.rng.bit_generator.state = meta.get("vq_rng")
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"state field 'vq_rng' is not a state of "
                             f"{type(self.vq.rng.bit_generator).__name__}: {exc}") from None
        if self.teacher is not None:
            t, size = arrays.get("teacher"), self.teacher.params.size
            if t is None or t.dtype != np.float32 or t.shape != (size,) or \
                    not np.isfinite(t).all():
                raise ValueError(f"teacher must be finite float32 of shape ({size},) (the enc "
                                 "teacher's parameters), got "
                                 + ("none" if t is None else f"{t.dtype} of shape {t.shape}"))
            self.teacher.params.data[:] = self.ops.asarray(t)
        self.vq.counts[...] = arrays["vq_counts"]
        self.vq.restart_counts[...] = arrays["vq_restart_counts"]
        self.vq.forwards = forwards
