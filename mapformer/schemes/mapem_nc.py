"""``mapem_nc``: MapEM positions with non-commutative path integration (MapFormer eq. 20 and
appendix 10.4.2, "MapEM-NC-L" / "MapEM-NC-NL"), for the conjunctive mixer (kind
``positions``).

Blocks of b = ``nc_block`` coordinates (default 4). Every token t gives each block a step
generator X_t = sum_i theta_t,i S_i from K = ``nc_generators`` generators (0: b(b-1)/2, a basis
of so(b)) and the positions are the ordered product
Q_P[t] = K_P[t] = exp(X_t) exp(X_{t-1}) ... exp(X_1) p*, one start vector p* per head, with
theta_t a linear map (NC-L) or an MLP (NC-NL) of the token.

b = 4, K = 6 (the default): the S_i are (generically) a basis of so(4), so the composite
token -> X_t is any linear map (NC-L) or any such MLP (NC-NL), and this scheme learns that
composite directly, as the coordinates (u_t, v_t) of X_t = L(u_t) + R(v_t) (the op
``nc_forward``, csrc/ops/nc.c: exp(X_t) q = qexp(u_t) q qexp(v_t) on quaternions, float32).
That op's layout is feature-major within a head: the step map emits its H 6 NB outputs as
(H, 6, NB) and p* and the positions hold component f of block k at f NB + k (the mixer uses
only dot products of the positions, so the coordinates' order does not change the model's
function; a checkpoint of this path saved before the layout changed holds its weights in the
block-major order and would mean another model: train.check_version refuses it, a
version 2-3 checkpoint).
Any other (b, K): learned generators S_i = A_i - A_i^T per head and block (``gen`` stores A,
initialised N(0, 1/K) so that X_t's entries have the variance of the quaternion path's,
2 theta^2), through the op ``nc_general`` (csrc/ops/nc_general.c: exp by scaling and squaring,
in double).

``nc_map``: ``linear`` (NC-L: theta_t = W x_t) or ``mlp`` (NC-NL: W_2 GELU(W_1 x_t + b_1),
hidden width ``nc_hidden``, 0 meaning 4 d_model, the width a public PyTorch reproduction uses).
"""
from ..nn import Linear
from ..registry import Option
from . import Scheme, register_scheme
from .mapem import start_vector_init

NC_OPTIONS = (
    Option("nc_map", str, "linear", "MapEM-NC: the map from a token to its step generators: "
           "linear (NC-L) or mlp (NC-NL)", choices=("linear", "mlp")),
    Option("nc_hidden", int, 0, "MapEM-NC-NL: the MLP's hidden width (0: 4 d_model)",
           minimum=0),
    Option("nc_block", int, 4, "MapEM-NC: the block size b (2 to 16; head_dim a multiple of "
           "b)", minimum=2),
    Option("nc_generators", int, 0, "MapEM-NC: the learned generators K per block (0: "
           "b(b-1)/2); b = 4 with K = 6 is the quaternion path", minimum=0),
)
MAX_BLOCK = 16  # the op nc_general's largest block


def block_and_generators(options):
    """(b, K) of the options, K = 0 meaning b(b-1)/2."""
    b = options["nc_block"]
    return b, options["nc_generators"] or b * (b - 1) // 2


def generator_init(rng, shape):
    """A (H, NB, K, b, b) ~ N(0, 1/K): S = A - A^T has off-diagonal entries of variance 2/K."""
    return rng.standard_normal(shape) / shape[2] ** 0.5


@register_scheme
class MapEMNCPositions(Scheme):
    """Parameters: ``steps`` (Linear C -> H NB K, NC-L) or ``hidden`` and ``steps`` (NC-NL),
    ``start`` p* (H, D), and for (b, K) other than (4, 6) ``gen`` A (H, NB, K, b, b) with
    S_i = A_i - A_i^T; NB = D / b. Traces: ``w`` the step coordinates, (B, T, H, 6, NB)
    ((u_t, v_t), feature-major) on the quaternion path, else (B, T, H, NB, K)."""

    name = "mapem_nc"
    kind = "positions"
    options = NC_OPTIONS
    traces = ("w",)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        b, k = block_and_generators(config.options)
        if b > MAX_BLOCK:
            raise ValueError(f"nc_block must be at most {MAX_BLOCK} for positional scheme "
                             f"'mapem_nc', got {b}")
        if config.head_dim % b:
            raise ValueError(f"positional scheme 'mapem_nc' needs a head dim divisible by "
                             f"nc_block = {b}, got head dim {config.head_dim}")
        c, h = config.d_model, config.n_heads
        self.quaternion = (b, k) == (4, 6)
        nb = config.head_dim // b
        self.shape = (h, k, nb) if self.quaternion else (h, nb, k)
        width = h * nb * k
        self.hidden = None
        if config.options["nc_map"] == "mlp":
            n = config.options["nc_hidden"] or 4 * c
            self.hidden = Linear(store, f"{name}.hidden", c, n, ops, std=1.0 / c ** 0.5)
            c = n
        self.steps = Linear(store, f"{name}.steps", c, width, ops, bias=False,
                            std=0.5 / c ** 0.5)
        self.start = store.declare(f"{name}.start", (h, config.head_dim), start_vector_init,
                                   decay=False)
        self.gen = None
        if not self.quaternion:
            self.gen = store.declare(f"{name}.gen", (h, nb, k, b, b), generator_init,
                                     decay=False)

    def positions(self, x, batch, steps):
        """x (N, C) -> Q_P = K_P (B, T, H, D)."""
        if self.hidden is not None:
            self.pre = self.hidden.forward(x)
            x = self.ops.gelu_forward(self.pre)
        self.w = self.steps.forward(x).reshape((batch, steps) + self.shape)
        if self.quaternion:
            p = self.ops.nc_forward(self.w, self.start.value)
            return p, p
        a = self.gen.value
        self.skew = (a - a.swapaxes(-1, -2)).copy()  # S = A - A^T
        p = self.ops.nc_general_forward(self.w, self.skew, self.start.value)
        return p, p

    def positions_backward(self, dqp, dkp, dx):
        """dqp, dkp (B, T, H, D) -> gradients into the map, the generators and p*, and dx
        (+=)."""
        self.ops.add_(dqp, dkp)  # Q_P = K_P: one gradient (dqp is the mixer's fresh output)
        if self.quaternion:
            dw = self.ops.nc_backward(dqp, self.w, self.start.value, self.start.grad)
        else:
            dskew = self.ops.zeros_like(self.skew)
            dw = self.ops.nc_general_backward(dqp, self.w, self.skew, self.start.value, dskew,
                                              self.start.grad)
            self.gen.grad += dskew - dskew.swapaxes(-1, -2)  # dA = dS - dS^T
        dw = dw.reshape(dx.shape[0], -1)
        if self.hidden is None:
            self.steps.backward(dw, dx)
            return
        dpre = self.ops.gelu_backward(self.steps.backward(dw), self.pre)
        self.hidden.backward(dpre, dx)

    @classmethod
    def flops(cls, config, batch, steps):
        """The map's products: 2 N C (H NB K) (linear), 2 N n (C + H NB K) (mlp)."""
        b, k = block_and_generators(config.options)
        c, out = config.d_model, config.n_heads * (config.head_dim // b) * k
        if config.options["nc_map"] == "linear":
            return 2 * batch * steps * c * out
        n = config.options["nc_hidden"] or 4 * c
        return 2 * batch * steps * n * (c + out)
