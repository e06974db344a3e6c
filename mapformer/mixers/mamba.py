"""``mamba``: the Mamba-1 block (Gu & Dao 2023; state-spaces/mamba ``mamba_simple.py``) as a
token mixer, on the C core's selective scan.

x (N, C) -> in-projections x_in, z (N, E), E = expand * C; x_in through a causal depthwise
conv1d of width d_conv and SiLU -> u (one op each way: causal_conv1d with activation 'silu',
whose backward recomputes the conv); u projected to (dt_in (R), B (S), C (S)), R = dt_rank;
Delta = softplus(dt_proj dt_in + bias) (E per token), the bias initialised so that Delta starts
log-uniform in [1e-3, 1e-1] (floored at 1e-4): the product without its bias, the bias and the
softplus inside the scan (selective_scan_fn's delta_bias and delta_softplus, so no (N, E) array
of steps is kept, and the softplus costs no pass of its own); the scan with A = -exp(A_log),
A_log = log(1..S) in every channel (S4D-real), skip D (init 1); y * SiLU(z) (one op each way:
silu_gate); out-projection back to C.
B_bar is Euler's Delta B (Mamba's code) unless ``zoh`` (eq. 8 of the MapFormer paper).
Mamba's one in_proj (C -> 2E) and x_proj (E -> R + 2S) are written as separate projections of
the same input (in_x, in_z; x_dt, x_B, x_C): the same maps. x_dt, x_B and x_C run as one
product (:func:`x_proj_forward`: their weights stacked, (R + 2S, E)) and one backward: three
thin products of R, S and S columns each read u (N, E) (benchmarks/bench_x_proj.py: 62.6 ms
forward + backward at the training step's shape against 38.3, one thread). A_log and D take no
weight decay, as in Mamba. The Block around it is this library's pre-LayerNorm block (with its
MLP). :mod:`mapformer.mixers.mampa` is the same block with rotation-scaling 2x2 state blocks.
"""
import math

import numpy as np

from ..nn import Linear
from ..registry import Option
from ..schemes import get_scheme
from . import Mixer, register_mixer

D_STATE = Option("d_state", int, 16, "state floats per channel of the Mamba / MAMPa scan "
                 "(MAMPa: d_state / 2 rotation blocks)", minimum=1)
EXPAND = Option("expand", int, 2, "Mamba / MAMPa inner channels E = expand * d_model",
                minimum=1)
D_CONV = Option("d_conv", int, 4, "width of the Mamba / MAMPa causal depthwise conv1d",
                minimum=1)
DT_RANK = Option("dt_rank", int, 0, "rank R of Mamba's / MAMPa's step projection (0: "
                 "ceil(d_model / 16), Mamba's 'auto')", minimum=0)
ZOH = Option("zoh", bool, False, "Mamba / MAMPa: zero-order-hold B_bar = (exp(Delta A) - 1) "
             "A^-1 B (MapFormer eq. 8) instead of Mamba's Euler Delta B")
CHUNK = 256  # steps between the scan's saved states (the backward recomputes inside a chunk)


def uniform_init(bound):
    return lambda rng, shape: rng.uniform(-bound, bound, shape)


def s4d_log_init(rng, shape):
    """log(1..K) along the last axis, in every row: Mamba's A_log (S4D-real)."""
    return np.log(np.broadcast_to(np.arange(1, shape[-1] + 1), shape))


def dt_bias_init(dt_min=1e-3, dt_max=1e-1, floor=1e-4):
    """Mamba's dt_proj bias: softplus^-1(dt), dt log-uniform in [dt_min, dt_max], >= floor."""
    def init(rng, shape):
        dt = np.exp(rng.uniform(math.log(dt_min), math.log(dt_max), shape))
        dt = np.maximum(dt, floor)
        return dt + np.log(-np.expm1(-dt))
    return init


def stacked_rows(layers):
    """Each bias-free Linear of ``layers``: its rows (a slice) of their stacked weight."""
    rows, start = [], 0
    for layer in layers:
        width = layer.weight.value.shape[0]
        rows.append(slice(start, start + width))
        start += width
    return rows


def x_proj_forward(ops, u2, layers):
    """u2 (N, E) through the bias-free Linears ``layers`` (E -> widths) as one product of their
    stacked weight: -> (the stacked weight (sum of widths, E), each layer's contiguous output
    (N, width))."""
    rows = stacked_rows(layers)
    w = ops.zeros((rows[-1].stop, u2.shape[1]))
    for layer, r in zip(layers, rows):
        w[r] = layer.weight.value
    y = ops.linear_forward(u2, w, None)
    return w, [ops.asarray(y[:, r]) for r in rows]


def x_proj_backward(ops, w, u2, layers, dys, du):
    """The stacked product's backward: dys (N, width), one per layer; their products
    accumulated into du (N, E), each layer's weight gradient += its rows of the stacked one."""
    rows = stacked_rows(layers)
    dy = ops.zeros((u2.shape[0], w.shape[0]))
    for g, r in zip(dys, rows):
        dy[:, r] = g
    dw = ops.zeros_like(w)
    ops.linear_backward(dy, u2, w, dw, None, du)
    for layer, r in zip(layers, rows):
        ops.add_(layer.weight.grad, dw[r])


@register_mixer
class Mamba(Mixer):
    """Parameters: ``in_x``, ``in_z`` (C -> E, no bias), ``conv_weight`` (E, d_conv),
    ``conv_bias`` (E,), ``x_dt`` (E -> R), ``x_B``, ``x_C`` (E -> S) (no bias), ``dt``
    (R -> E, bias), the state matrix's (``A_log`` (E, S) here), ``D`` (E,), ``out``
    (E -> C, no bias). Traces: ``delta`` (B, T, E) the steps (formed when read), ``y``
    (B, T, E) the scan's output before the gate."""

    name = "mamba"
    accepts = ("none",)
    options = (D_STATE, EXPAND, D_CONV, DT_RANK, ZOH)
    traces = ("delta", "y")

    def __init__(self, store, name, config, ops, out_std):
        self.config, self.ops = config, ops
        opts, c = config.options, config.d_model
        self.E, self.S, width = opts["expand"] * c, opts["d_state"], opts["d_conv"]
        self.R = opts["dt_rank"] or math.ceil(c / 16)
        self.bbar = "zoh" if opts["zoh"] else "euler"
        E, S, R = self.E, self.S, self.R
        self.in_x = Linear(store, f"{name}.in_x", c, E, ops, bias=False)
        self.in_z = Linear(store, f"{name}.in_z", c, E, ops, bias=False)
        bound = 1.0 / math.sqrt(width)  # PyTorch's Conv1d init (fan-in = width, depthwise)
        self.conv_weight = store.declare(f"{name}.conv_weight", (E, width),
                                         uniform_init(bound), decay=True)
        self.conv_bias = store.declare(f"{name}.conv_bias", (E,), uniform_init(bound),
                                       decay=False)
        self.x_dt = Linear(store, f"{name}.x_dt", E, R, ops, bias=False)
        self.x_B = Linear(store, f"{name}.x_B", E, S, ops, bias=False)
        self.x_C = Linear(store, f"{name}.x_C", E, S, ops, bias=False)
        self.dt = Linear(store, f"{name}.dt", R, E, ops)
        self.dt.weight.init = uniform_init(R ** -0.5)  # Mamba's dt_init "random", dt_scale 1
        self.dt.bias.init = dt_bias_init()
        self.declare_state(store, name, opts)
        self.D = store.declare(f"{name}.D", (E,), lambda rng, shape: np.ones(shape),
                               decay=False)
        self.out = Linear(store, f"{name}.out", E, c, ops, bias=False, std=out_std)
        self.scheme = get_scheme(config.positional)(store, f"{name}.scheme", config, ops)

    def declare_state(self, store, name, opts):
        """A = -exp(A_log), A_log (E, S) = log(1..S) in every channel (S4D-real)."""
        self.A_log = store.declare(f"{name}.A_log", (self.E, self.S), s4d_log_init,
                                   decay=False)

    @property
    def step_args(self):
        """The scan's step from dt_pre: dt's bias, then softplus (keyword arguments)."""
        return dict(delta_bias=self.dt.bias.value, delta_activation="softplus")

    @property
    def delta(self):
        """The last forward's steps (B, T, E), softplus(dt_pre + bias) with the bias that
        forward read: formed here, on demand (the scan forms them inside)."""
        return self.ops.softplus_forward(self.dt_pre + self.dt_bias)

    def scan(self, u, dt_pre, dt_in):
        """The scan on u, dt_pre (the steps before bias and softplus) (B, T, E), B, C
        (B, T, S) -> y (B, T, E)."""
        self.A = -self.ops.exp(self.A_log.value)
        y, self.states = self.ops.selective_scan_forward(u, dt_pre, self.A, self.Bm, self.Cm,
                                                         self.D.value, chunk=CHUNK,
                                                         bbar=self.bbar, **self.step_args)
        return y

    def scan_backward(self, dy):
        """dy (B, T, E) -> du, ddt_pre (B, T, E), ddt_in (N, R) or None, dB, dC (B, T, S);
        accumulates the state parameters', D's and dt's bias's gradients."""
        dA = self.ops.zeros_like(self.A)
        du, ddt_pre, dB, dC = self.ops.selective_scan_backward(
            dy, self.u, self.dt_pre, self.A, self.Bm, self.Cm, self.D.value, self.states, dA,
            self.D.grad, chunk=CHUNK, bbar=self.bbar, ddelta_bias=self.dt.bias.grad,
            **self.step_args)
        self.ops.add_(self.A_log.grad, dA * self.A)  # dA/dA_log = A
        return du, ddt_pre, None, dB, dC

    def forward(self, x, batch, steps, state=None):
        n, shape = batch * steps, (batch, steps, self.E)
        self.x_in = self.in_x.forward(x).reshape(shape)
        self.z = self.in_z.forward(x)
        self.u = self.ops.causal_conv1d_forward(self.x_in, self.conv_weight.value,
                                                self.conv_bias.value, activation="silu")
        u2 = self.u.reshape(n, self.E)
        self.w_proj, (self.dt_in, Bm, Cm) = x_proj_forward(self.ops, u2,
                                                            (self.x_dt, self.x_B, self.x_C))
        self.Bm, self.Cm = Bm.reshape(batch, steps, -1), Cm.reshape(batch, steps, -1)
        self.dt_pre = self.ops.linear_forward(self.dt_in, self.dt.weight.value,
                                              None).reshape(shape)
        self.dt_bias = self.dt.bias.value.copy()  # (E,): for the delta trace
        self.y = self.scan(self.u, self.dt_pre, self.dt_in).reshape(n, self.E)
        return self.out.forward(self.ops.silu_gate_forward(self.y, self.z)), state

    def backward(self, dy, dstate=None):
        batch, steps = self.u.shape[:2]
        n = batch * steps
        dys, dz = self.ops.silu_gate_backward(self.out.backward(dy), self.y, self.z)
        du, ddt_pre, ddt_in, dB, dC = self.scan_backward(dys.reshape(self.u.shape))
        ddt_in = self.ops.linear_backward(ddt_pre.reshape(n, self.E), self.dt_in,
                                          self.dt.weight.value, self.dt.weight.grad, None,
                                          ddt_in)
        du = du.reshape(n, self.E)
        x_proj_backward(self.ops, self.w_proj, self.u.reshape(n, self.E),
                        (self.x_dt, self.x_B, self.x_C),
                        (ddt_in, dB.reshape(n, -1), dC.reshape(n, -1)), du)
        dx_in = self.ops.causal_conv1d_backward(du.reshape(self.u.shape), self.x_in,
                                                self.conv_weight.value, self.conv_weight.grad,
                                                self.conv_bias.grad, bias=self.conv_bias.value,
                                                activation="silu")
        dx = self.in_x.backward(dx_in.reshape(n, self.E))
        self.in_z.backward(dz, dx)
        return dx, dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """in_x, in_z, x_dt, x_B, x_C, dt and out products (the scan and conv are not
        matmuls)."""
        opts, c = config.options, config.d_model
        e, s = opts["expand"] * c, opts["d_state"]
        r = opts["dt_rank"] or math.ceil(c / 16)
        return 2 * batch * steps * (2 * c * e + e * (r + 2 * s) + r * e + e * c)
