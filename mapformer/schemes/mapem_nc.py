"""``mapem_nc``: MapEM positions with non-commutative path integration (MapFormer eq. 20 and
appendix 10.4.2, "MapEM-NC-L" / "MapEM-NC-NL"), for the conjunctive mixer (kind
``positions``).

Blocks of 4. Every token t gives each block a step generator S_t in so(4) and the positions
are the ordered product Q_P[t] = K_P[t] = exp(S_t) exp(S_{t-1}) ... exp(S_1) p* (the op
``nc_forward``, csrc/ops/nc.c: exp(S_t) q = qexp(u_t) q qexp(v_t) on quaternions, float32),
one start vector
p* per head. The paper's S_t = sum_i theta_t,i S_i with K = b(b-1)/2 = 6 learned generators per
block and theta_t a linear map (NC-L) or an MLP (NC-NL) of the token: with K = 6 the S_i are
(generically) a basis of so(4), so the composite token -> S_t is any linear map (NC-L) or any
such MLP (NC-NL), and this scheme learns that composite directly, as the coordinates
(u_t, v_t) of S_t = L(u_t) + R(v_t). Other K, and generic block sizes, are not implemented.

``nc_map``: ``linear`` (NC-L: (u_t, v_t) = W x_t) or ``mlp`` (NC-NL: W_2 GELU(W_1 x_t + b_1),
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
)


@register_scheme
class MapEMNCPositions(Scheme):
    """Parameters: ``steps`` (Linear C -> H NB 6, NC-L) or ``hidden`` and ``steps`` (NC-NL),
    ``start`` p* (H, D); NB = D / 4. Traces: ``w`` (B, T, H, NB, 6) the step generators."""

    name = "mapem_nc"
    kind = "positions"
    options = NC_OPTIONS
    traces = ("w",)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        if config.head_dim % 4:
            raise ValueError(f"positional scheme 'mapem_nc' needs a head dim divisible by 4, "
                             f"got {config.head_dim}")
        c, h = config.d_model, config.n_heads
        self.shape = (h, config.head_dim // 4, 6)
        width = h * self.shape[1] * 6
        self.hidden = None
        if config.options["nc_map"] == "mlp":
            n = config.options["nc_hidden"] or 4 * c
            self.hidden = Linear(store, f"{name}.hidden", c, n, ops, std=1.0 / c ** 0.5)
            c = n
        self.steps = Linear(store, f"{name}.steps", c, width, ops, bias=False,
                            std=0.5 / c ** 0.5)
        self.start = store.declare(f"{name}.start", (h, config.head_dim), start_vector_init,
                                   decay=False)

    def positions(self, x, batch, steps):
        """x (N, C) -> Q_P = K_P (B, T, H, D)."""
        if self.hidden is not None:
            self.pre = self.hidden.forward(x)
            x = self.ops.gelu_forward(self.pre)
        self.w = self.steps.forward(x).reshape((batch, steps) + self.shape)
        p = self.ops.nc_forward(self.w, self.start.value)
        return p, p

    def positions_backward(self, dqp, dkp, dx):
        """dqp, dkp (B, T, H, D) -> gradients into the map and p*, and dx (+=)."""
        self.ops.add_(dqp, dkp)  # Q_P = K_P: one gradient (dqp is the mixer's fresh output)
        dw = self.ops.nc_backward(dqp, self.w, self.start.value, self.start.grad)
        dw = dw.reshape(dx.shape[0], -1)
        if self.hidden is None:
            self.steps.backward(dw, dx)
            return
        dpre = self.ops.gelu_backward(self.steps.backward(dw), self.pre)
        self.hidden.backward(dpre, dx)

    @classmethod
    def flops(cls, config, batch, steps):
        """The map's products: 2 N C (H NB 6) (linear), 2 N n (C + H NB 6) (mlp)."""
        c, out = config.d_model, config.n_heads * (config.head_dim // 4) * 6
        if config.options["nc_map"] == "linear":
            return 2 * batch * steps * c * out
        n = config.options["nc_hidden"] or 4 * c
        return 2 * batch * steps * n * (c + out)
