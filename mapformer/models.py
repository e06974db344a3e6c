"""Models built from a :class:`ModelConfig`: a pre-LayerNorm transformer whose blocks are a
token mixer with a positional scheme, a bottleneck slot and an MLP. The config names the
three components; each comes from its registry (:mod:`mapformer.mixers`,
:mod:`mapformer.schemes`, :mod:`mapformer.bottlenecks`) and declares its own options, which
the config holds in one dict, with those of the MLP (FEEDFORWARD: every model's). MODELS
names the paper's models as presets of the three.

Shapes: tokens int32 (B, T); logits (B, T, V); C = d_model, H heads, D = C / H, NB = D / 2.
"""
import contextlib
import math
import numbers
from collections import namedtuple
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from . import backend as backends
from .bottlenecks import BOTTLENECKS, get_bottleneck
from .mixers import MIXERS, get_mixer
from .nn import (KEEP_ALL, Dropout, Embedding, Keeping, LayerNorm, Linear, MLP, ParameterStore,
                 fresh_state, layer_objects)
from .registry import Registry, reserve, resolve_options
from .schemes import SCHEMES

FEEDFORWARD = Registry("feed-forward block", "mlp")  # one entry, in every model: its options
FEEDFORWARD.register(MLP)

Preset = namedtuple("Preset", "mixer positional options")
Preset.__doc__ = "A named model: its mixer, positional scheme and options (no bottleneck)."

MODELS = {
    "rope": Preset("attention", "rope", {}),
    "mapwm": Preset("attention", "mapwm", {}),
    "mapem_os": Preset("conjunctive", "mapem", {"mapem_scores": "both"}),
    "mapem_s": Preset("conjunctive", "mapem", {"mapem_scores": "positional"}),
    "mapem_o": Preset("attention", "none", {}),
    "cope": Preset("attention", "cope", {}),
    "tape": Preset("attention", "tape", {}),
    "mamba": Preset("mamba", "none", {}),
    "mampa": Preset("mampa", "none", {}),
}


def components(mixer, positional, bottleneck="none"):
    """{registry: component class} of the named mixer, positional scheme and bottleneck, and
    the MLP (FEEDFORWARD).
    ValueError for a name no registry holds, or a scheme of a kind the mixer does not
    accept (naming both)."""
    chosen = {MIXERS: MIXERS.get(mixer), SCHEMES: SCHEMES.get(positional),
              BOTTLENECKS: BOTTLENECKS.get(bottleneck), FEEDFORWARD: MLP}
    accepts, kind = chosen[MIXERS].accepts, chosen[SCHEMES].kind
    if kind not in accepts:
        kinds = [repr(k) for k in accepts]
        kinds = " or ".join([", ".join(kinds[:-1]), kinds[-1]] if kinds[1:] else kinds)
        fitting = [name for name, cls in sorted(SCHEMES.entries.items()) if cls.kind in accepts]
        raise ValueError(f"mixer {mixer!r} takes positional schemes of kind {kinds} "
                         f"({', '.join(fitting)}), not {positional!r} (kind {kind!r})")
    return chosen


def options_of(mixer, positional, bottleneck="none"):
    """{option name: Option} of every option the three components declare."""
    return {name: option for cls in components(mixer, positional, bottleneck).values()
            for name, option in Registry.options_of(cls).items()}


def preset_parts(name, mixer=None, positional=None, bottleneck=None):
    """(mixer, positional, bottleneck, options) of the preset ``name`` (MODELS), with the
    parts given here in place of its own; the preset's options that the chosen components do
    not declare are dropped."""
    try:
        preset = MODELS[name]
    except KeyError:
        raise ValueError(f"model must be one of the presets {sorted(MODELS)}, got {name!r}"
                         ) from None
    parts = (mixer or preset.mixer, positional or preset.positional, bottleneck or "none")
    owned = options_of(*parts)
    return parts + ({k: v for k, v in preset.options.items() if k in owned},)


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a model. Every field and option is validated; a bad value raises
    ValueError.

    vocab_size: number of token ids. d_model, n_heads: width and heads (head dim d_model /
    n_heads must be even, 16..128). n_layers: pre-LN blocks, each mixer, bottleneck, MLP
    (mlp_ratio x width, GELU). dropout: residual dropout rate. mixer, positional, bottleneck:
    the registered names of the token mixer, its positional scheme and the bottleneck (the
    mixer must accept the scheme's kind). layernorm_eps: LayerNorm's epsilon.
    options: {name: value} for options the three components declare (see ``python -m
    mapformer train -h`` or their modules); validated by their declarations and completed
    with their defaults, so two configs that differ only by defaults are equal. An option no
    chosen component declares is refused, naming who declares it.

    :meth:`preset` builds a config from a paper model's name (MODELS), :meth:`for_task` also
    takes the task's defaults (vocab_size, omega_grid, cope_positions, coord_dims,
    ape_positions).
    """

    vocab_size: int
    d_model: int = 128
    n_heads: int = 2
    n_layers: int = 1
    mlp_ratio: int = 4
    dropout: float = 0.0
    mixer: str = "attention"
    positional: str = "mapwm"
    bottleneck: str = "none"
    layernorm_eps: float = 1e-5
    options: dict = field(default_factory=dict, hash=False)

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads "
                             f"({self.n_heads})")
        if self.head_dim % 2 or not 16 <= self.head_dim <= 128:
            raise ValueError(f"head dim d_model / n_heads = {self.head_dim} must be even and in "
                             "[16, 128]")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        value = self.layernorm_eps
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"layernorm_eps must be a finite positive number, got {value!r}")
        if not isinstance(self.options, dict):
            raise ValueError(f"options must be a dict of option values, got {self.options!r}")
        chosen = components(self.mixer, self.positional, self.bottleneck)
        object.__setattr__(self, "options", resolve_options(chosen, self.options))

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @property
    def label(self):
        """The name of the preset this config is (e.g. 'mapem_s'), else
        'mixer/positional[/bottleneck]'."""
        for name, preset in MODELS.items():
            if ((self.mixer, self.positional, self.bottleneck)
                    == (preset.mixer, preset.positional, "none")
                    and all(self.options[k] == v for k, v in preset.options.items())):
                return name
        parts = (self.mixer, self.positional) + ((self.bottleneck,) if self.bottleneck != "none"
                                                 else ())
        return "/".join(parts)

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**values)

    @classmethod
    def preset(cls, name, vocab_size, **values):
        """The config of the preset ``name`` (MODELS: rope, mapwm, mapem_os, mapem_s, mapem_o,
        cope, tape). values: ModelConfig fields (``mixer``, ``positional``, ``bottleneck``
        replace the preset's parts) and options (over the preset's own), e.g.
        ``ModelConfig.preset("mapem_os", 20, d_model=64, mapem_mode="sum")``."""
        names = {f.name for f in fields(cls)} - {"options"}
        config_fields = {k: v for k, v in values.items() if k in names}
        options = {k: v for k, v in values.items() if k not in names}
        mixer, positional, bottleneck, preset_options = preset_parts(
            name, *(config_fields.pop(part, None) for part in ("mixer", "positional",
                                                                "bottleneck")))
        return cls(vocab_size=vocab_size, mixer=mixer, positional=positional,
                   bottleneck=bottleneck, options={**preset_options, **options}, **config_fields)

    @classmethod
    def for_task(cls, name, task, **values):
        """:meth:`preset` for a run on ``task`` (a task config): vocab_size is the task's, and
        every option of the chosen components with a task default (``Option.from_task``:
        omega_grid, cope_positions, coord_dims, ape_positions) takes it unless given in
        ``values``."""
        parts = preset_parts(name, *(values.get(part) for part in ("mixer", "positional",
                                                                   "bottleneck")))[:3]
        from_task = {option.name: option.from_task(task)
                     for option in options_of(*parts).values()
                     if option.from_task is not None and option.name not in values}
        return cls.preset(name, task.vocab_size, **from_task, **values)


reserve(f.name for f in fields(ModelConfig))


def forward_flops(config, batch, steps):
    """Matmul flops of one forward on (batch, steps) tokens: per layer the mixer's, its
    scheme's and its bottleneck's own products and the MLP's two (2 N C (mlp_ratio C) each),
    then the head's (2 N C V)."""
    n, c = batch * steps, config.d_model
    parts = components(config.mixer, config.positional, config.bottleneck).values()
    layer = sum(cls.flops(config, batch, steps) for cls in parts)
    return config.n_layers * layer + 2 * n * c * config.vocab_size


class Block:
    """Pre-LN block: h = x + drop(mixer(ln1 x)), h = bottleneck(h), then
    h + drop(mlp(ln2 h))."""

    def __init__(self, store, name, config, ops, rng):
        out_std = 0.02 / math.sqrt(2 * config.n_layers)
        self.ops = ops
        self.ln1 = LayerNorm(store, f"{name}.ln1", config.d_model, ops, config.layernorm_eps)
        self.mixer = get_mixer(config.mixer)(store, f"{name}.mixer", config, ops, out_std)
        self.bottleneck = get_bottleneck(config.bottleneck)(store, f"{name}.bottleneck", config,
                                                            ops)
        self.ln2 = LayerNorm(store, f"{name}.ln2", config.d_model, ops, config.layernorm_eps)
        self.mlp = MLP(store, f"{name}.mlp", config.d_model, ops, config.mlp_ratio, out_std,
                       config.options["gelu"])
        self.drop1 = Dropout(config.dropout, rng, ops)
        self.drop2 = Dropout(config.dropout, rng, ops)

    def initial_state(self, batch, steps):
        """The positional state entering this block when it is the first (its scheme's)."""
        return self.mixer.initial_state(batch, steps)

    def layers(self):
        """The layers :meth:`forward` calls, in order."""
        return (self.ln1, self.mixer, self.drop1, self.bottleneck, self.ln2, self.mlp,
                self.drop2)

    def forward(self, x, batch, steps, state, keeping=None):
        """x (N, C), positional state -> (N, C), the state for the next block. keeping: how
        the layers are called (a :class:`mapformer.nn.Keeping`; None: plainly, each keeping
        what its backward needs)."""
        def call(layer, *args):
            return layer.forward(*args) if keeping is None else keeping.call(layer, "forward",
                                                                             *args)

        a, state = call(self.mixer, call(self.ln1, x), batch, steps, state)
        h = call(self.bottleneck, self.ops.residual_forward(x, call(self.drop1, a)))
        y = self.ops.residual_forward(h, call(self.drop2, call(self.mlp, call(self.ln2, h))))
        return y, state

    def decode(self, x, batch, steps, cache, start):
        """:meth:`forward` of ``steps`` new tokens per sequence after ``start`` positions the
        mixer's ``cache`` holds (None: none), without dropout -> (N, C), the mixer's new
        cache. Only without a bottleneck (a VQ's forward counts code usage and restarts dead
        codes: NotImplementedError)."""
        if self.bottleneck.name != "none":
            raise NotImplementedError(f"bottleneck {self.bottleneck.name!r} has no incremental "
                                      "decoding")
        a, cache = self.mixer.decode(self.ln1.forward(x), batch, steps, cache, start)
        h = self.ops.residual_forward(x, a)
        return self.ops.residual_forward(h, self.mlp.forward(self.ln2.forward(h))), cache

    def backward(self, dout, dstate):
        """dout (N, C) -> dx (N, C) (dout is consumed: gradients are accumulated into it),
        and the gradient of the incoming positional state."""
        dh = self.bottleneck.backward(
            self.ln2.backward(self.mlp.backward(self.drop2.backward(dout)), dout))
        da, dstate = self.mixer.backward(self.drop1.backward(dh), dstate)
        return self.ln1.backward(da, dh), dstate


class DecodeCache(namedtuple("DecodeCache", "length layers frontier ops")):
    """What :meth:`Transformer.decode` keeps of the tokens decoded so far: ``length``
    positions, and per block its mixer's cache, a tuple of arrays (B, capacity, ...) whose
    first ``length`` positions are these tokens' (attention: the rotated keys and the values
    (B, capacity, H, D); LSTM: the hidden states and cells (B, capacity, C)); a decode writes
    its new positions into them in place while they have room. ``frontier`` ([int], shared by
    the caches on the same arrays): how many positions have been written into them; a decode
    from a cache that is not at its arrays' frontier (another decode went on from it) copies
    them first, so a cache stays valid whatever is decoded from it. ``ops``: the model's
    backend."""

    __slots__ = ()

    def select(self, rows, length=None, room=0):
        """The cache of the sequences ``rows`` (an index array, repeats allowed: one cached
        prefix for many continuations) cut to their first ``length`` positions (all: None),
        in new arrays with room for ``room`` more positions."""
        length = self.length if length is None else length
        if not 1 <= length <= self.length:
            raise ValueError(f"length must be in [1, {self.length}], got {length}")
        layers = []
        for layer in self.layers:
            arrays = []
            for a in layer:
                part = a[rows, :length]
                arrays.append(self.ops.zeros(part.shape[:1] + (length + room,) + part.shape[2:]))
                arrays[-1][:, :length] = part
            layers.append(tuple(arrays))
        return DecodeCache(length, tuple(layers), [length], self.ops)


def check_tokens(tokens):
    """Integer tokens (B, T), B, T >= 1 (any array-like) -> a NumPy array; the error names
    what is wrong."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.size == 0:
        raise ValueError(f"tokens must have shape (B, T) with B, T >= 1, got {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"tokens must be integers, got dtype {tokens.dtype}")
    return tokens


def check_coordinates(coordinates, shape):
    """Per-token coordinates (B, T, n) (or (B, T) for n = 1) of tokens of shape (B, T), any
    finite real array-like, -> a NumPy array (B, T, n); the error names what is wrong."""
    coordinates = np.asarray(coordinates)
    if coordinates.shape == shape:
        coordinates = coordinates[..., None]
    if coordinates.ndim != 3 or coordinates.shape[:2] != shape or coordinates.shape[2] < 1:
        raise ValueError(f"coordinates must have shape (B, T, n) = {shape} + (n,), got "
                         f"{coordinates.shape}")
    if not (np.issubdtype(coordinates.dtype, np.number) and np.isfinite(coordinates).all()):
        raise ValueError(f"coordinates must be finite numbers, got dtype {coordinates.dtype}")
    return coordinates


def check_targets(targets, mask, shape):
    """targets and mask of the tokens' shape (B, T), the mask bool or finite weights >= 0, or
    ValueError naming what is wrong."""
    if np.shape(targets) != shape or np.shape(mask) != shape:
        raise ValueError(f"targets and mask must have the tokens' shape {shape}, got "
                         f"{np.shape(targets)} and {np.shape(mask)}")
    mask = np.asarray(mask)
    if mask.dtype != bool:
        bad = np.flatnonzero(~(np.isfinite(mask) & (mask >= 0)))
        if bad.size:
            index = np.unravel_index(bad[0], mask.shape)
            raise ValueError(f"mask[{', '.join(map(str, index))}] = {mask[index]} must be a "
                             "finite weight >= 0")


def mean_weights(shape):
    """The weights of a mean over T tokens as a (1, T) row or a (T, 1) column (float64, each
    1 / T): the pooling of Transformer.forward(pool='mean') and its backward."""
    return np.full(shape, 1.0 / max(shape))


class Transformer:
    """Token embedding (plus the positional code of an additive scheme: the first block's
    ``scheme.embed``), ``n_layers`` blocks, final LayerNorm and a linear head.

    ``backend`` is 'c' (the C core, float32), 'numpy' (the float64 reference ops), 'cuda'
    (the CUDA kernels on CuPy arrays, float32: mapformer.backend.get) or a backend object.
    All parameters live in ``self.params`` (a :class:`ParameterStore`). ``declare_only=P``:
    only declare them (names, shapes, ``params.size``; nothing allocated, the model cannot
    run), ValueError past P of them: how a checkpoint's config is checked against its arrays
    before the model is built."""

    def __init__(self, config, seed=0, backend="c", declare_only=None):
        self.config = config
        self.ops = backends.get(backend)
        rng = np.random.default_rng(seed)
        self.params = ParameterStore(self.ops, limit=declare_only)
        c = config.d_model
        self.embed = Embedding(self.params, "embed", config.vocab_size, c, self.ops)
        self.blocks = [Block(self.params, f"blocks.{i}", config, self.ops, rng)
                       for i in range(config.n_layers)]
        self.ln_f = LayerNorm(self.params, "ln_f", c, self.ops, config.layernorm_eps)
        self.head = Linear(self.params, "head", c, config.vocab_size, self.ops)
        if declare_only is None:
            self.params.build(rng)
        self.rng = rng  # draws the dropout masks from here on (a checkpoint saves its state)
        self.kept = False  # whether the last forward kept what backward() needs
        self.fresh = None if declare_only is not None else fresh_state(self.layers())

    def layers(self):
        """Every layer the forward calls, in order (the first block's scheme embeds)."""
        return (self.embed, self.blocks[0].mixer.scheme,
                *(layer for block in self.blocks for layer in block.layers()), self.ln_f,
                self.head)

    def train(self, mode=True):
        """Switch dropout, and the bottlenecks' usage counts and restarts, on (training) or
        off (evaluation)."""
        for block in self.blocks:
            block.drop1.training = block.drop2.training = block.bottleneck.training = mode

    @contextlib.contextmanager
    def evaluating(self):
        """Evaluation mode (``train(False)``) inside the ``with`` block; afterwards each
        block's dropout and bottleneck flags are what they were before it (a model analysed
        in the middle of its training goes on training, its codebook's usage counts and
        restarts included)."""
        was = [(b.drop1.training, b.drop2.training, b.bottleneck.training) for b in self.blocks]
        self.train(False)
        try:
            yield self
        finally:
            for block, (drop1, drop2, bottleneck) in zip(self.blocks, was):
                block.drop1.training, block.drop2.training = drop1, drop2
                block.bottleneck.training = bottleneck

    def forward(self, tokens, coordinates=None, prefix=None, pool=None, keep=KEEP_ALL):
        """tokens int (B, T) -> logits (B, T, V), or (B, 1, V) with ``pool='mean'``: the logits
        of the mean over the tokens of the final (layer-normed) features, a sequence
        classifier's (the head is linear, so they are the mean of the tokens' logits). Keeps
        the activations for backward().
        keep: True (the default) keeps every layer's activations for backward(); False keeps
        none, and a tuple of trace names (of those the layers declare in ``traces``) only those
        attributes (e.g. ("delta",), which an evaluation reads): each layer's activations are
        freed as soon as the layer returns
        (the inference path: the same logits bit for bit, a peak of about one layer's working
        set instead of every layer's, :class:`mapformer.nn.Keeping`), and backward()
        refuses to run. After such a forward an array attribute of a layer that the forward
        sets holds its as-built value (or is gone): read what a forward leaves (traces, a
        scheme's derived weights) after a kept forward, or name it in ``keep``.
        coordinates (B, T, n): the tokens' positions as the task knows them (navigation: the
        agent's cell), given to every positional scheme (``scheme.coordinates``); None: the
        schemes that read them use the token index. prefix int (B,): each sequence's prefix
        length (a prefix LM's source), read by attention with ``attn_mask='prefix'``
        (``mixer.prefix``; None: its ``attn_prefix``)."""
        tokens = self.ops.as_indices(check_tokens(tokens), "tokens")
        batch, steps = tokens.shape
        if not (keep is KEEP_ALL or keep is False or (
                isinstance(keep, tuple) and all(isinstance(k, str) for k in keep))):
            raise TypeError(f"keep must be True, False or a tuple of trace names, got {keep!r}")
        if isinstance(keep, tuple):
            declared = {name for layer in self.layers() for obj in layer_objects(layer)
                        for name in getattr(type(obj), "traces", ())}
            unknown = sorted(set(keep) - declared)
            if unknown:
                raise ValueError(f"keep names traces of this model's layers "
                                 f"({', '.join(sorted(declared)) or 'none'}), not "
                                 f"{', '.join(map(repr, unknown))}")
        if pool not in (None, "mean"):
            raise ValueError(f"pool must be None or 'mean', got {pool!r}")
        self.kept = False  # until this forward has run whole
        if coordinates is not None:
            coordinates = self.ops.asarray(check_coordinates(coordinates, (batch, steps)))
        keeping = Keeping(keep, self.layers(), self.fresh)  # first: it clears the layers
        for block in self.blocks:
            block.mixer.scheme.coordinates = coordinates
            block.mixer.prefix = prefix
        scheme = self.blocks[0].mixer.scheme
        try:
            x = keeping.call(scheme, "embed", keeping.call(self.embed, "forward",
                                                           tokens.reshape(-1)), batch, steps)
            state = self.blocks[0].initial_state(batch, steps)
            for block in self.blocks:
                x, state = block.forward(x, batch, steps, state, keeping)
            self.final_state = state if keep is KEEP_ALL else None
            h = keeping.call(self.ln_f, "forward", x)
            self.pooled = None
            if pool == "mean":  # (1, T) @ (B, T, C) -> (B, 1, C): the weights are sizes only
                self.pooled = (batch, steps)
                h = self.ops.matmul(self.ops.asarray(mean_weights((1, steps))),
                                    h.reshape(batch, steps, -1)).reshape(batch, -1)
            self.logits = keeping.call(self.head, "forward", h)
        finally:
            keeping.close()
        self.kept = keep is KEEP_ALL
        return self.logits.reshape(batch, 1 if pool else steps, -1)

    def decode(self, tokens, cache=None):
        """Incremental decoding: tokens int (B, T) that follow the positions of ``cache`` (a
        :class:`DecodeCache` of the same B sequences from the last call; None: a sequence's
        start) -> (logits (B, T, V), the cache extended by these tokens). The logits are
        :meth:`forward`'s last T rows on the whole sequence (without coordinates and dropout;
        to rounding: the attention of the new tokens runs on the cached keys), at a cost in
        the new tokens only (attention: also linear in the cached ones). Mixers and schemes
        without a decoding path (``decode``, ``angles_at``, ``embed_at``) raise
        NotImplementedError. Keeps nothing for backward()."""
        tokens = self.ops.as_indices(check_tokens(tokens), "tokens")
        batch, steps = tokens.shape
        self.kept = False
        start = 0 if cache is None else cache.length
        if cache is not None and cache.layers[0][0].shape[0] != batch:
            raise ValueError(f"tokens have {batch} sequences, the cache "
                             f"{cache.layers[0][0].shape[0]}")
        if cache is not None and cache.frontier[0] != start:  # another decode went on from it
            cache = DecodeCache(start, tuple(tuple(a[:, :start].copy() for a in layer)
                                             for layer in cache.layers), [start], self.ops)
        for block in self.blocks:
            block.mixer.scheme.coordinates = None
        x = self.blocks[0].mixer.scheme.embed_at(self.embed.forward(tokens.reshape(-1)), batch,
                                                 steps, start)
        layers = []
        for i, block in enumerate(self.blocks):
            x, layer = block.decode(x, batch, steps, None if cache is None else cache.layers[i],
                                    start)
            layers.append(layer)
        logits = self.head.forward(self.ln_f.forward(x)).reshape(batch, steps, -1)
        frontier = [0] if cache is None else cache.frontier
        frontier[0] = start + steps
        return logits, DecodeCache(start + steps, tuple(layers), frontier, self.ops)

    def loss(self, tokens, targets, mask, coordinates=None, prefix=None, pool=None,
             keep=KEEP_ALL):
        """Masked next-token cross-entropy plus the bottlenecks' auxiliary losses (none
        without a bottleneck): tokens, targets int (B, T), mask bool (B, T) -> mean loss over
        the masked positions (float); coordinates, prefix, pool, keep as for :meth:`forward`
        (with ``pool='mean'`` targets and mask are (B, 1): a class per sequence). Keeps what
        backward() needs unless ``keep`` says otherwise."""
        logits = self.forward(tokens, coordinates, prefix, pool, keep)
        check_targets(targets, mask, logits.shape[:2])
        self.targets = self.ops.as_indices(targets, "targets").reshape(-1)
        self.mask = self.ops.asarray(mask).reshape(-1)
        _, loss = self.ops.softmax_xent_forward(self.logits, self.targets, self.mask)
        return loss + sum(block.bottleneck.aux_loss() for block in self.blocks)

    def backward(self, scored=None):
        """Gradient of the last loss() into ``self.params.grad`` (zeroed first). scored: the
        count of scored positions the loss is a mean over (default: the last loss's mask's;
        data-parallel training gives the whole batch's, mapformer.parallel)."""
        if not self.kept:
            raise RuntimeError("backward() needs a loss() before it that kept its activations "
                               "(keep=True, the default)")
        self.params.zero_grad()
        scale = 1.0 / max(float(self.mask.sum() if scored is None else scored), 1.0)
        dx = self.head.backward(
            self.ops.softmax_xent_backward(self.logits, self.targets, self.mask, scale))
        if self.pooled is not None:  # every token gets 1/T of the pooled features' gradient
            batch, steps = self.pooled
            dx = self.ops.matmul(self.ops.asarray(mean_weights((steps, 1))),
                                 dx.reshape(batch, 1, -1)).reshape(batch * steps, -1)
        dx = self.ln_f.backward(dx)
        # the last block's output state feeds nothing: its gradient is zero
        dstate = None if self.final_state is None else self.ops.zeros_like(self.final_state)
        for block in reversed(self.blocks):
            dx, dstate = block.backward(dx, dstate)
        self.blocks[0].mixer.scheme.embed_backward(dx)
        self.embed.backward(dx)
