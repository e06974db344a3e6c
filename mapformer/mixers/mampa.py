"""``mampa``: MAMPa (MapFormer paper section 3.4 and appendix 10.1): the Mamba block whose
state matrix A is block-diagonal with 2x2 blocks -alpha I + omega S (S the rotation generator),
i.e. one complex state per pair with eigenvalue -alpha + i omega, on the C core's complex scan.

Readings (the paper fixes only "Mamba with 2x2 skew-symmetric blocks", N = 16):
- d_state = 16 state floats per channel = 8 rotation blocks (the same memory as Mamba's 16);
- ``mampa_alpha`` (default off: alpha = 0, pure rotations, the paper's literal A := S of its
  section 10.1); on: a learned decay alpha = exp(alpha_log) >= 0, alpha_log = log(1..K) as
  Mamba's A_log (Mamba's complex A). Off is the default by measurement: on Table 3's task at
  the cpu scale's 38,400 sequences the decay keeps the model on the causal conv's window (the
  scan's state carries 2-5 % of its output through training, object recalls 1.00 at lags 2-3
  and 0.00 beyond: exactly Mamba's accuracies, seed by seed), where without it the state
  takes over (60 % of the output from step ~300 at d_model 128) and recalls beyond the window
  begin; at 200,000 sequences the decay-free model is the best SSM on every set;
- omega (E, K) learned, initialised as MapWM's frequencies (omega_max down to
  omega_max / omega_grid, geometric), the same in every channel;
- ``signed_angle`` (default off): the rotation's step is a separate signed projection of the
  same dt_in (no softplus), so an action and its inverse can undo each other; the decay keeps
  the softplus step. Off: the angle is omega * Delta (Delta > 0), Mamba's complex A;
- ``zoh``: as for Mamba; the default is Euler's Delta B.
B and C are (re, im) pairs: y = sum_k c_re h_re + c_im h_im (selective_scan_ref's complex
convention with C' = (c_re - i c_im) / 2).
"""
from ..nn import Linear
from ..registry import Option
from ..schemes.mapwm import PATH_OPTIONS, omega_init
from . import register_mixer
from .mamba import (CHUNK, D_CONV, D_STATE, DT_RANK, EXPAND, ZOH, Mamba, s4d_log_init,
                    uniform_init)

ALPHA = Option("mampa_alpha", bool, False, "MAMPa: a learned decay alpha >= 0 on each "
               "rotation block, initialised as Mamba's A (off, the default: pure rotations, "
               "the paper's A := S)")
SIGNED = Option("signed_angle", bool, False, "MAMPa: a separate signed step for the rotation "
                "angle (the decay keeps the softplus step)")
OMEGA_MAX, OMEGA_GRID = PATH_OPTIONS[1], PATH_OPTIONS[2]


def frequency_init(omega_max, grid):
    """omega (E, K): MapWM's frequencies (omega_max down to omega_max / grid) per channel."""
    return lambda rng, shape: omega_init(omega_max, grid, *shape)


@register_mixer
class MAMPa(Mamba):
    """Mamba's parameters with the state's: ``alpha_log`` (E, K) (with mampa_alpha),
    ``omega`` (E, K), and ``dt_angle`` (R -> E, bias; with signed_angle). Traces: ``delta``,
    ``y`` as Mamba's."""

    name = "mampa"
    options = (D_STATE, EXPAND, D_CONV, DT_RANK, ZOH, ALPHA, SIGNED, OMEGA_MAX, OMEGA_GRID)

    def declare_state(self, store, name, opts):
        if self.S % 2:
            raise ValueError(f"d_state must be even for mampa (pairs of state floats), got "
                             f"{self.S}")
        K = self.S // 2
        self.alpha_log = (store.declare(f"{name}.alpha_log", (self.E, K), s4d_log_init,
                                        decay=False) if opts["mampa_alpha"] else None)
        self.omega = store.declare(f"{name}.omega", (self.E, K),
                                   frequency_init(opts["omega_max"], opts["omega_grid"]),
                                   decay=False)
        self.dt_angle = None
        if opts["signed_angle"]:
            self.dt_angle = Linear(store, f"{name}.dt_angle", self.R, self.E, self.ops)
            self.dt_angle.weight.init = uniform_init(self.R ** -0.5)

    def scan(self, u, dt_pre, dt_in):
        """The complex scan; the rotation takes the step (delta_angle None) unless
        signed_angle gives it its own."""
        self.A = (-self.ops.exp(self.alpha_log.value) if self.alpha_log is not None
                  else self.ops.zeros(self.omega.value.shape))
        self.delta_angle = (None if self.dt_angle is None
                            else self.dt_angle.forward(dt_in).reshape(dt_pre.shape))
        y, self.states = self.ops.complex_scan_forward(
            u, dt_pre, self.delta_angle, self.A, self.omega.value, self.Bm, self.Cm,
            self.D.value, chunk=CHUNK, bbar=self.bbar, **self.step_args)
        return y

    def scan_backward(self, dy):
        dA = self.ops.zeros_like(self.A)
        du, ddt_pre, ddangle, dB, dC = self.ops.complex_scan_backward(
            dy, self.u, self.dt_pre, self.delta_angle, self.A, self.omega.value, self.Bm,
            self.Cm, self.D.value, self.states, dA, self.omega.grad, self.D.grad, chunk=CHUNK,
            bbar=self.bbar, ddelta_bias=self.dt.bias.grad, **self.step_args)
        if self.alpha_log is not None:
            self.ops.add_(self.alpha_log.grad, dA * self.A)  # dA/dalpha_log = A
        if self.dt_angle is None:  # ddt_pre holds the rotation's part
            return du, ddt_pre, None, dB, dC
        n = dy.shape[0] * dy.shape[1]
        return du, ddt_pre, self.dt_angle.backward(ddangle.reshape(n, self.E)), dB, dC

    @classmethod
    def flops(cls, config, batch, steps):
        """Mamba's products, and the signed angle's projection (R -> E) when on."""
        extra = 0
        if config.options["signed_angle"]:
            opts, c = config.options, config.d_model
            extra = 2 * batch * steps * (opts["dt_rank"] or -(-c // 16)) * opts["expand"] * c
        return super().flops(config, batch, steps) + extra
