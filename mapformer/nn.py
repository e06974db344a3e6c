"""Layers with an explicit backward pass, over one flat parameter buffer.

Every layer declares its parameters on a :class:`ParameterStore`; once the store is built,
each :class:`Param` has ``.value`` and ``.grad``: views into the store's two flat buffers.
``forward`` keeps what ``backward`` needs; ``backward(dy)`` returns the input gradient and
accumulates (+=) into its parameters' ``.grad``. The ops come from a backend
(:mod:`mapformer.backend`): the C core in float32, or the NumPy reference in float64.

Shapes: B batch, T tokens, C = d_model, H heads, D = C / H head dim, NB = D / 2 rotation
blocks, N = B * T rows.
"""
import math
from dataclasses import dataclass

import numpy as np

from .registry import Option


@dataclass
class Param:
    """One named parameter: ``value`` and ``grad`` are views into the store's flat buffers."""

    name: str
    shape: tuple
    init: object  # callable(rng, shape) -> array
    decay: bool
    offset: int = 0
    value: np.ndarray = None
    grad: np.ndarray = None

    @property
    def size(self):
        return math.prod(self.shape)


def normal_init(std):
    return lambda rng, shape: rng.standard_normal(shape) * std


def constant_init(value):
    return lambda rng, shape: np.full(shape, value)


class ParameterStore:
    """All parameters of a model in one flat buffer (``data``), gradients in a second one
    with the same layout (``grad``), and a bool ``decay_mask`` saying which entries AdamW
    decays; the backend ``ops`` allocates them. ``params`` maps names to :class:`Param` in
    declaration order. ``limit``: declaring past that many parameters is a ValueError (a
    checkpoint's config is checked against its arrays before anything is allocated)."""

    def __init__(self, ops, limit=None):
        self.ops = ops
        self.limit = limit
        self.params = {}
        self.data = self.grad = self.decay_mask = None

    def declare(self, name, shape, init, decay):
        if self.data is not None:
            raise RuntimeError("parameters cannot be declared after build()")
        if name in self.params:
            raise ValueError(f"parameter {name!r} declared twice")
        offset = sum(p.size for p in self.params.values())
        param = Param(name, tuple(shape), init, decay, offset)
        if self.limit is not None and offset + param.size > self.limit:
            raise ValueError(f"the parameters reach {offset + param.size} at {name!r} "
                             f"{param.shape}, past {self.limit}")
        self.params[name] = param
        return param

    @property
    def size(self):
        return sum(p.size for p in self.params.values())

    def build(self, rng):
        """Allocate the buffers, point every Param at its slice, and initialise values (drawn
        from the NumPy Generator ``rng`` in declaration order)."""
        self.data = self.ops.zeros(self.size)
        self.grad = self.ops.zeros(self.size)
        self.decay_mask = self.ops.zeros(self.size, dtype=bool)
        for p in self.params.values():
            sl = slice(p.offset, p.offset + p.size)
            p.value = self.data[sl].reshape(p.shape)
            p.grad = self.grad[sl].reshape(p.shape)
            p.value[...] = self.ops.asarray(p.init(rng, p.shape))
            self.decay_mask[sl] = p.decay

    def zero_grad(self):
        self.grad.fill(0)


class Embedding:
    """Token embedding: tokens int32 (N,) -> (N, C)."""

    def __init__(self, store, name, vocab_size, width, ops):
        self.ops = ops
        self.weight = store.declare(f"{name}.weight", (vocab_size, width), normal_init(0.02),
                                    decay=True)

    def forward(self, tokens):
        self.tokens = tokens
        return self.ops.embedding_forward(tokens, self.weight.value)

    def backward(self, dout):
        self.ops.embedding_backward(self.weight.grad, dout, self.tokens)


def fold_heads(ops, heads, weight, bias):
    """heads (H, D, D), weight (H D, Cin), bias (H D,) or None -> the weight and bias of the
    projection followed by heads[h] on each head's D outputs: rows hD..(h+1)D of the weight
    become heads[h] W_h, the bias heads[h] b_h (parameter-side: 2 H D^2 Cin flops)."""
    h, d = heads.shape[0], heads.shape[1]
    w = ops.matmul(heads, weight.reshape(h, d, -1)).reshape(weight.shape)
    b = None if bias is None else ops.matmul(heads, bias.reshape(h, d, 1)).reshape(bias.shape)
    return w, b


def fold_heads_backward(ops, heads, weight, bias, dw, db, dweight, dbias, dheads):
    """The way back through :func:`fold_heads`: dw, db (the folded weight's and bias's
    gradients) -> dweight += heads^T dw, dbias += heads^T db, dheads += dw W^T + db b^T (per
    head; every gradient accumulated)."""
    h, d = heads.shape[0], heads.shape[1]
    heads_t, dw = heads.swapaxes(-1, -2), dw.reshape(h, d, -1)
    ops.add_(dweight, ops.matmul(heads_t, dw).reshape(dweight.shape))
    ops.add_(dheads, ops.matmul(dw, weight.reshape(h, d, -1).swapaxes(-1, -2)))
    if bias is not None:
        db = db.reshape(h, d, 1)
        ops.add_(dbias, ops.matmul(heads_t, db).reshape(dbias.shape))
        ops.add_(dheads, ops.matmul(db, bias.reshape(h, 1, d)))


class Linear:
    """y = x W^T + b: x (N, Cin) -> y (N, Cout); W (Cout, Cin). With ``heads`` (H, D, D),
    Cout = H D: y's head h is then mapped by heads[h], y_h -> heads[h] y_h, folded into the
    weight and bias (:func:`fold_heads`; a positional scheme's change of basis, ape_seq)."""

    def __init__(self, store, name, c_in, c_out, ops, bias=True, std=0.02):
        self.ops = ops
        self.weight = store.declare(f"{name}.weight", (c_out, c_in), normal_init(std), decay=True)
        self.bias = (store.declare(f"{name}.bias", (c_out,), constant_init(0.0), decay=False)
                     if bias else None)

    def forward(self, x, heads=None):
        self.x, self.heads = x, heads
        self.w, self.b = self.weight.value, None if self.bias is None else self.bias.value
        if heads is not None:
            self.w, self.b = fold_heads(self.ops, heads, self.w, self.b)
        return self.ops.linear_forward(x, self.w, self.b)

    def backward(self, dy, dx=None, dheads=None):
        """dy (N, Cout) -> dx (N, Cin), accumulated into ``dx`` when given; with ``heads`` in
        the forward, their gradient is accumulated into ``dheads`` (H, D, D)."""
        if self.heads is None:
            return self.ops.linear_backward(dy, self.x, self.w, self.weight.grad,
                                            None if self.bias is None else self.bias.grad, dx)
        dw = self.ops.zeros_like(self.w)
        db = None if self.b is None else self.ops.zeros_like(self.b)
        dx = self.ops.linear_backward(dy, self.x, self.w, dw, db, dx)
        fold_heads_backward(self.ops, self.heads, self.weight.value,
                            None if self.bias is None else self.bias.value, dw, db,
                            self.weight.grad, None if self.bias is None else self.bias.grad,
                            dheads)
        return dx


class LayerNorm:
    """LayerNorm over the last axis: x (N, C) -> (N, C)."""

    def __init__(self, store, name, width, ops, eps=1e-5):
        self.ops, self.eps = ops, eps
        self.weight = store.declare(f"{name}.weight", (width,), constant_init(1.0), decay=False)
        self.bias = store.declare(f"{name}.bias", (width,), constant_init(0.0), decay=False)

    def forward(self, x):
        self.x = x
        y, self.mean, self.rstd = self.ops.layernorm_forward(x, self.weight.value,
                                                             self.bias.value, self.eps)
        return y

    def backward(self, dy, dx=None):
        return self.ops.layernorm_backward(dy, self.x, self.mean, self.rstd, self.weight.value,
                                           self.weight.grad, self.bias.grad, dx)


class Dropout:
    """Inverted dropout with rate p (identity when p == 0 or not training). The mask is drawn
    from the layer's NumPy generator ``rng``; it is elementwise and off the hot path by
    default."""

    def __init__(self, p, rng, ops):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {p}")
        self.p, self.rng, self.ops, self.training, self.mask = p, rng, ops, True, None

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            self.mask = None
            return x
        y, self.mask = self.ops.dropout(x, self.p, self.rng)
        return y

    def backward(self, dy):
        return dy if self.mask is None else self.ops.dropout_backward(dy, self.mask)


class MLP:
    """Linear(C, 4C) -> GELU -> Linear(4C, C): x (N, C) -> (N, C), one fused op each way
    (``mlp_forward`` keeps the pre-activation h (N, 4C) for ``mlp_backward``).
    ``fc`` and ``proj`` hold the two layers' parameters. ``gelu``: "tanh", the tanh
    approximation (the default: the paper's and this library's), or "erf", the exact
    0.5 x (1 + erf(x / sqrt 2)) (PyTorch's nn.GELU() default, for models ported from it).
    Registered as the feed-forward block of every model (models.FEEDFORWARD), whose option
    ``gelu`` reaches it from ModelConfig.options and the command line (``--gelu erf``)."""

    name = "mlp"
    options = (Option("gelu", str, "tanh", "the MLP's GELU: tanh (approximation) or erf (exact, "
                      "PyTorch's nn.GELU() default)", choices=("tanh", "erf")),)
    APPROXIMATE = {"tanh": "tanh", "erf": "none"}  # gelu -> the ops' approximate (PyTorch's)

    @staticmethod
    def flops(config, batch, steps):
        """The two products' matmul flops, 2 N C (mlp_ratio C) each (models.forward_flops)."""
        return 2 * 2 * batch * steps * config.d_model**2 * config.mlp_ratio

    def __init__(self, store, name, width, ops, ratio=4, out_std=0.02, gelu="tanh"):
        self.ops = ops
        self.approximate = self.APPROXIMATE[gelu]
        self.fc = Linear(store, f"{name}.fc", width, ratio * width, ops)
        self.proj = Linear(store, f"{name}.proj", ratio * width, width, ops, std=out_std)

    def forward(self, x):
        self.x = x
        y, self.h = self.ops.mlp_forward(x, self.fc.weight.value, self.fc.bias.value,
                                         self.proj.weight.value, self.proj.bias.value,
                                         approximate=self.approximate)
        return y

    def backward(self, dy):
        """dy (N, C) -> dx (N, C)."""
        return self.ops.mlp_backward(dy, self.x, self.h, self.fc.weight.value,
                                     self.proj.weight.value, self.fc.weight.grad,
                                     self.fc.bias.grad, self.proj.weight.grad,
                                     self.proj.bias.grad, approximate=self.approximate)


KEEP_ALL = True
"""``keep`` of a forward that is followed by a backward: every layer keeps what it keeps."""

UNWALKED_MODULES = ("mapformer.backend", "mapformer.cuda", "mapformer.models",
                    "mapformer.registry")
UNWALKED_PACKAGES = ("numpy", "cupy", "builtins", "types", "functools", "collections")


def walked(obj):
    """Whether :func:`layer_objects` looks inside ``obj``: an object with instance attributes
    that is not a parameter, a store, a config, a backend, a type, a function or a library's
    (NumPy, CuPy) object."""
    module = type(obj).__module__ or ""
    return (hasattr(obj, "__dict__") and not isinstance(obj, (type, Param, ParameterStore))
            and not callable(getattr(obj, "__func__", None)) and module not in UNWALKED_MODULES
            and module.partition(".")[0] not in UNWALKED_PACKAGES)


def layer_objects(root):
    """``root`` and every object reachable from it through instance attributes (and lists,
    tuples and dicts of them) that :func:`walked` admits: the layer objects whose attributes a
    forward may replace (a plug-in's, registered from outside mapformer, included)."""
    found, stack = {}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in found or not walked(obj):
            continue
        found[id(obj)] = obj
        for value in vars(obj).values():
            if isinstance(value, (list, tuple)):
                stack.extend(value)
            elif isinstance(value, dict):
                stack.extend(value.values())
            else:
                stack.append(value)
    return list(found.values())


def is_activation(value):
    """An array (NumPy, CuPy: anything with an array interface), or a tuple or list of them:
    what a layer keeps for its backward."""
    if isinstance(value, (tuple, list)):
        return bool(value) and all(is_activation(v) for v in value)
    return hasattr(value, "__array_interface__") or hasattr(value, "__cuda_array_interface__")


UNSET = object()  # an attribute the model did not have when it was built


def fresh_state(layers):
    """{id(object): (object, its attributes)} of every layer object under ``layers`` as the
    model was built: what a forward that keeps nothing puts back (:class:`Keeping`)."""
    return {id(obj): (obj, dict(vars(obj))) for layer in layers for obj in layer_objects(layer)}


class Keeping:
    """How a model's forward calls its layers: ``call(layer, method, *args)`` is
    ``getattr(layer, method)(*args)``, after which the layer's objects (:func:`layer_objects`)
    keep only what ``keep`` allows of the arrays on them (:func:`is_activation`):
    :data:`KEEP_ALL` everything (a training forward, for its backward); False none; a tuple of
    attribute names those attributes (the traces an evaluation reads, e.g. ("delta",); a trace
    that is a property, Mamba's delta, is computed from attributes that are not kept). Every
    other array attribute goes back to its value when the model was built (``fresh``, from
    :func:`fresh_state`) or is removed: first on every layer, dropping what an earlier kept
    forward and its backward left, then on each layer as soon as it returns, so the arrays a
    backward would need are freed at once. Everything else the calls do stays as they did it
    (a VQ's auxiliary loss and forward count, caches filled in place). Objects that several of
    ``layers`` reach (a scheme that the embedding and its mixer share, maps that APE's layers
    share) are cleared only at :meth:`close`, the end of the forward, since a later layer may
    read what an earlier one left there. The calls' results are those of plain calls, bit for
    bit; what the layers hold afterwards is not what a kept forward leaves (an attribute the
    model had when built holds that value again), so analyses read traces after a kept
    forward, and ``train.evaluate`` keeps everything."""

    def __init__(self, keep, layers, fresh):
        self.all = keep is KEEP_ALL
        if self.all:
            return
        self.kept, self.fresh = set(keep or ()), fresh
        reach = {id(layer): layer_objects(layer) for layer in layers}
        owners = {}
        for layer, objects in reach.items():
            for obj in objects:
                owners.setdefault(id(obj), (obj, set()))[1].add(layer)
        self.private = {layer: [o for o in objects if len(owners[id(o)][1]) == 1]
                        for layer, objects in reach.items()}
        self.shared = [obj for obj, who in owners.values() if len(who) > 1]
        self.clear(obj for obj, _ in owners.values())

    def clear(self, objects):
        """Put back or remove every array attribute of ``objects`` that is not kept and not
        what it was when the model was built."""
        for obj in objects:
            built = self.fresh.get(id(obj), (None, {}))[1]
            for name, value in list(vars(obj).items()):
                if (name in self.kept or not is_activation(value)
                        or value is built.get(name, UNSET)):
                    continue
                if name in built:
                    setattr(obj, name, built[name])
                else:
                    delattr(obj, name)

    def call(self, layer, method, *args):
        if self.all:
            return getattr(layer, method)(*args)
        try:
            return getattr(layer, method)(*args)
        finally:
            self.clear(self.private[id(layer)])

    def close(self):
        """Clear the shared objects (the end of the forward)."""
        if not self.all:
            self.clear(self.shared)
