"""``mapem_b4``: MapEM positions with 4x4 blocks and one skew generator per block (MapFormer
section 4 and appendix 10.4.1, "MapEM-b4"), for the conjunctive mixer (kind ``positions``).

Each 4-block k of head h has a learned skew generator S in so(4), stored by its coordinates
(u, v) (H, NB, 6) in the split S = L(u) + R(v) into left and right quaternion
multiplications (an orthogonal change of basis of so(4), |S|_F^2 = 4 (|u|^2 + |v|^2): the
same function class as S = S_bar - S_bar^T, with the gradient's scale changed). With
Delta = W_out W_in x (one Delta per 4-block) and Phi_t = cumsum_t(Delta),
Q_P[t] = K_P[t] = exp(Phi_t S) p* = qexp(Phi_t u) p* qexp(Phi_t v) (the op ``b4_forward``,
csrc/ops/b4.c), one start vector p* per head. A block rotates its two invariant planes at
|u| + |v| and ||u| - |v||, both driven by the one Delta.

Initialisation: u = ((w_a + w_b) / 2, 0, 0), v = ((w_a - w_b) / 2, 0, 0) with w_a, w_b the
block's two MapWM frequencies (omega_init), so an untrained MapEM-b4 rotates the block's
pairs (0, 1) and (2, 3) at w_a and w_b: MapEM with one Delta shared by the block's two pairs.
"""
import numpy as np

from ..nn import Linear
from . import Scheme, register_scheme
from .mapem import start_vector_init
from .mapwm import PATH_OPTIONS, omega_init


@register_scheme
class MapEMB4Positions(Scheme):
    """Parameters: ``delta_in`` W_in (r, C), ``delta_out`` W_out (H * NB, r), ``gen`` (u, v)
    (H, NB, 6), ``start`` p* (H, D); NB = D / 4. Traces: ``delta`` (B, T, H, NB)."""

    name = "mapem_b4"
    kind = "positions"
    options = PATH_OPTIONS
    traces = ("delta",)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        options = config.options
        if config.head_dim % 4:
            raise ValueError(f"positional scheme 'mapem_b4' needs a head dim divisible by 4, "
                             f"got {config.head_dim}")
        c, h, r = config.d_model, config.n_heads, options["delta_rank"]
        self.shape = (h, config.head_dim // 4)
        self.delta_in = Linear(store, f"{name}.delta_in", c, r, ops, bias=False,
                               std=1.0 / c ** 0.5)
        self.delta_out = Linear(store, f"{name}.delta_out", r, h * self.shape[1], ops,
                                bias=False, std=0.5 / r ** 0.5)

        def gen_init(rng, shape):
            omega = omega_init(options["omega_max"], options["omega_grid"], h, 2 * shape[1])
            gen = np.zeros(shape)
            gen[..., 0] = (omega[:, 0::2] + omega[:, 1::2]) / 2
            gen[..., 3] = (omega[:, 0::2] - omega[:, 1::2]) / 2
            return gen

        self.gen = store.declare(f"{name}.gen", self.shape + (6,), gen_init, decay=False)
        self.start = store.declare(f"{name}.start", (h, config.head_dim), start_vector_init,
                                   decay=False)

    def positions(self, x, batch, steps):
        """x (N, C) -> Q_P = K_P (B, T, H, D)."""
        self.delta_r = self.delta_in.forward(x)
        self.delta = self.delta_out.forward(self.delta_r).reshape((batch, steps) + self.shape)
        p = self.ops.b4_forward(self.delta, self.gen.value, self.start.value)
        return p, p

    def positions_backward(self, dqp, dkp, dx):
        """dqp, dkp (B, T, H, D) -> gradients into W_Delta, the generators and p*, and dx
        (+=)."""
        self.ops.add_(dqp, dkp)  # Q_P = K_P: one gradient (dqp is the mixer's fresh output)
        ddelta = self.ops.b4_backward(dqp, self.delta, self.gen.value, self.start.value,
                                      self.gen.grad, self.start.grad)
        self.delta_in.backward(self.delta_out.backward(ddelta.reshape(dx.shape[0], -1)), dx)

    @classmethod
    def flops(cls, config, batch, steps):
        """Delta = W_out (W_in x): 2 N r (C + H NB)."""
        h, nb = config.n_heads, config.head_dim // 4
        return 2 * batch * steps * config.options["delta_rank"] * (config.d_model + h * nb)
