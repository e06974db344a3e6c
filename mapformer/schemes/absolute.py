"""``sinusoidal`` and ``learned_abs``: absolute positional codes added to the token embeddings
(:class:`AdditiveScheme`, before the first block), the baselines of the APE and GridPE
tables.

``sinusoidal`` (Vaswani et al. 2017, section 3.5): the code of position p is, per pair of
the model width, (s sin(p f_i), s cos(p f_i)) with f_i = 10000^(-2i / C) (Vaswani's layout:
sin at even, cos at odd components). p is the token index 0..T-1 when the task gives no
coordinates (n = 1); with the task's coordinates (B, T, n) (``Scheme.coordinates``,
``coord_dims`` = n) the model width C is split into n chunks of C / n, chunk a carrying the
sinusoids of axis a alone, f_i = 10000^(-2i / (C / n)) (a true nD code, not sinusoids of a
flattened index). s = ``sinusoidal_scale``, by default 0.02, the token embeddings' initial
std: Vaswani scales unit-size embeddings by sqrt(C) before adding a unit code; here the
embeddings start at 0.02, so the code is scaled down to keep their ratio. The sines and
cosines come from the rotary op (the pair (0, s) turned by -p f_i), so the code runs on
any backend. No parameters.

``learned_abs``: a learned table (P, C) (``abs_positions`` = P rows, N(0, 0.02^2) like the
token embeddings, weight-decayed like them), row t added to the token at index t (the task's
coordinates are not read: this is the flattened-index table of GPT and ViT). P defaults to
the longest sequence of the task's training and evaluation sets (navigation's ood_sparse set
holds 4x the steps), so rows past the training length are never trained: they keep their
random initial values. A sequence longer than P raises ValueError naming the position.
One table per model, declared by the first layer's scheme.
"""
import sys

import numpy as np

from ..nn import normal_init
from ..registry import Option
from . import AdditiveScheme, register_scheme, shared_once
from .coordinates import COORD_DIMS, COORD_SOURCE, coordinates_or_index, task_coordinates


def longest_sequence(task):
    """Tokens in the longest sequence of a task's training and evaluation sets: its own
    ``seq_len`` and that of each set its module's ``ood_sets`` derives (when it has one)."""
    ood_sets = getattr(sys.modules[type(task).__module__], "ood_sets", lambda task: {})
    return max(t.seq_len for t in [task, *ood_sets(task).values()])


def sinusoid_frequencies(width, n):
    """(width / 2, n) float64: pair a m + i (m = width / (2 n)) has frequency
    10000^(-i / m) = 10000^(-2i / (width / n)) on axis a, 0 on the others."""
    m = width // (2 * n)
    freq = np.zeros((width // 2, n))
    for a in range(n):
        freq[a * m:(a + 1) * m, a] = 10000.0 ** (-np.arange(m) / m)
    return freq


SINUSOIDAL_SCALE = Option("sinusoidal_scale", float, 0.02, "amplitude of the sinusoidal code "
                          "(0.02: the token embeddings' initial std)", above=0)
ABS_POSITIONS = Option("abs_positions", int, 512, "rows of learned_abs's table: positions "
                       "0..P-1 (for a task: its longest sequence, OOD sets included)",
                       minimum=1, from_task=longest_sequence)


@register_scheme
class Sinusoidal(AdditiveScheme):
    """Traces: ``sinusoids`` (TB, T, C) the last forward's code."""

    name = "sinusoidal"
    options = (COORD_DIMS, COORD_SOURCE, SINUSOIDAL_SCALE)
    traces = ("sinusoids",)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        c, n = config.d_model, config.options["coord_dims"]
        if c % (2 * n):
            raise ValueError(f"sinusoidal splits d_model = {c} into n = {n} chunks of pairs: "
                             "d_model must be a multiple of 2 n (coord_dims)")
        self.weight = ops.asarray(-sinusoid_frequencies(c, n))
        self.pair = ops.asarray([0.0, config.options["sinusoidal_scale"]])
        self.unit = None
        self.by_steps = {}

    def code(self, batch, steps):
        """theta = -(f . x) per pair, then (0, s) turned by theta: (s sin, s cos) of f . x;
        computed once per length when the positions are the token index."""
        if task_coordinates(self) is None and steps in self.by_steps:
            self.sinusoids = self.by_steps[steps]
            return self.sinusoids
        positions = coordinates_or_index(self, steps)
        tb, n = positions.shape[0], positions.shape[2]
        pairs = self.weight.shape[0]
        theta = self.ops.linear_forward(positions.reshape(tb * steps, n), self.weight)
        self.unit = self.ops.broadcast_rows(self.pair, (tb, steps, pairs, 2), self.unit)
        code, _ = self.ops.rotary_forward(self.unit, self.unit,
                                          theta.reshape(tb, steps, pairs, 1))
        self.sinusoids = code.reshape(tb, steps, 2 * pairs)
        if task_coordinates(self) is None:
            self.by_steps[steps] = self.sinusoids
        return self.sinusoids

    @classmethod
    def flops(cls, config, batch, steps):
        """theta = x f^T: 2 N n C / 2."""
        return batch * steps * config.options["coord_dims"] * config.d_model


@register_scheme
class LearnedAbsolute(AdditiveScheme):
    """Parameter ``table`` (P, C), declared by the first layer. Traces: ``positions`` (T,)
    int32 the rows the last forward read."""

    name = "learned_abs"
    options = (ABS_POSITIONS,)
    traces = ("positions",)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        shape = (config.options["abs_positions"], config.d_model)
        self.table = shared_once(store, self.name, lambda: store.declare(
            f"{name}.table", shape, normal_init(0.02), decay=True))
        self.index = {}

    def code(self, batch, steps):
        rows = self.table.shape[0]
        if steps > rows:
            raise ValueError(f"positional scheme 'learned_abs': token position {steps - 1} is "
                             f"beyond its table of abs_positions = {rows} positions (0.."
                             f"{rows - 1}); build the model with a larger abs_positions "
                             "(--abs-positions)")
        if steps not in self.index:
            self.index[steps] = self.ops.as_indices(range(steps), "positions")
        self.positions = self.index[steps]
        return self.ops.embedding_forward(self.positions, self.table.value).reshape(
            1, steps, -1)

    def code_backward(self, dcode):
        """Summed over the batch into the rows read (+=)."""
        self.ops.embedding_backward(self.table.grad, self.ops.sum_leading(dcode, 1),
                                    self.positions)
