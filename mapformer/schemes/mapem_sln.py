"""``mapem_sln``: MapEM positions on the special linear group SL(2, R) (MapFormer appendix
10.4.1, "MapEM-SLN"), for the conjunctive mixer (kind ``positions``).

Every 2x2 block k of head h has a learned generator A_bar (H, NB, 4), made trace-free,
A = A_bar - (tr A_bar / 2) I (the paper prints A_bar - Tr(A_bar), which is not trace-free);
Delta = W_out W_in x as MapWM's path integration (schemes/mapwm.py) and
Q_P[t] = K_P[t] = exp(Phi_t A) p*, Phi_t = cumsum_t(Delta), one start vector p* per head. The op
``sln_forward`` (csrc/ops/sln.c) uses the closed form exp(Phi A) = C I + S A (cos/sin when
det A > 0, cosh/sinh when det A < 0, series near 0) in double.

Against the hyperbolic case's unbounded growth the op caps |Phi| sqrt(-det A) at
``sln_clamp`` (default 10: |p| <= (cosh 10 + sinh 10 |A| / sqrt(-det A)) |p*| at any
length; the gradient in Phi
is 0 past the cap): a deviation from the paper, which does not say. The generators start as
MapEM's rotations, A = omega S with omega as MapWM's init, so an untrained MapEM-SLN is MapEM.
SL(2) is not orthogonal, so there is no working-memory (relative) form: EM only.
"""
import numpy as np

from ..nn import Linear
from ..registry import Option
from . import Scheme, register_scheme
from .mapem import start_vector_init
from .mapwm import PATH_OPTIONS, omega_init

SLN_CLAMP = Option("sln_clamp", float, 10.0, "MapEM-SLN: cap on |Phi| sqrt(-det A) in the "
                   "hyperbolic blocks (at most 80)", above=0)


@register_scheme
class MapEMSLNPositions(Scheme):
    """Parameters: ``delta_in`` W_in (r, C), ``delta_out`` W_out (H * NB, r), ``gen``
    A_bar (H, NB, 4), ``start`` p* (H, D). Traces: ``delta`` (B, T, H, NB), ``gen`` values."""

    name = "mapem_sln"
    kind = "positions"
    options = PATH_OPTIONS + (SLN_CLAMP,)
    traces = ("delta",)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        options = config.options
        if options["sln_clamp"] > 80:
            raise ValueError(f"sln_clamp must be at most 80, got {options['sln_clamp']!r}")
        c, h, r = config.d_model, config.n_heads, options["delta_rank"]
        self.shape = (h, config.head_dim // 2)
        self.delta_in = Linear(store, f"{name}.delta_in", c, r, ops, bias=False,
                               std=1.0 / c ** 0.5)
        self.delta_out = Linear(store, f"{name}.delta_out", r, h * self.shape[1], ops,
                                bias=False, std=0.5 / r ** 0.5)

        def gen_init(rng, shape):
            omega = omega_init(options["omega_max"], options["omega_grid"], *shape[:2])
            gen = np.zeros(shape)
            gen[..., 1], gen[..., 2] = -omega, omega
            return gen

        self.gen = store.declare(f"{name}.gen", self.shape + (4,), gen_init, decay=False)
        self.start = store.declare(f"{name}.start", (h, config.head_dim), start_vector_init,
                                   decay=False)
        self.clamp = options["sln_clamp"]

    def positions(self, x, batch, steps):
        """x (N, C) -> Q_P = K_P (B, T, H, D)."""
        self.delta_r = self.delta_in.forward(x)
        self.delta = self.delta_out.forward(self.delta_r).reshape((batch, steps) + self.shape)
        p = self.ops.sln_forward(self.delta, self.gen.value, self.start.value, self.clamp)
        return p, p

    def positions_backward(self, dqp, dkp, dx):
        """dqp, dkp (B, T, H, D) -> gradients into W_Delta, the generators and p*, and dx
        (+=)."""
        self.ops.add_(dqp, dkp)  # Q_P = K_P: one gradient (dqp is the mixer's fresh output)
        ddelta = self.ops.sln_backward(dqp, self.delta, self.gen.value,
                                       self.start.value, self.gen.grad, self.start.grad,
                                       self.clamp)
        self.delta_in.backward(self.delta_out.backward(ddelta.reshape(dx.shape[0], -1)), dx)

    @classmethod
    def flops(cls, config, batch, steps):
        """Delta = W_out (W_in x): 2 N r (C + H NB)."""
        h, nb = config.n_heads, config.head_dim // 2
        return 2 * batch * steps * config.options["delta_rank"] * (config.d_model + h * nb)
