"""``relative``: Shaw, Uszkoreit and Vaswani's relative position representations (NAACL 2018),
which run their own attention (kind ``attention``, every mask): learned embeddings of the
key-query offset, clipped at +-``rel_window``, one table per layer shared by the heads, in the
logits and (Shaw et al.'s reading) in the values (see mapformer/reference/relative.py)."""
from ..nn import normal_init
from ..registry import Option
from . import AttentionScheme, register_scheme

# the readings of the baseline, by what each adds to plain attention:
# shaw: logits scale q.(k + a^K_c) and outputs sum_j P_ij (v_j + a^V_c) (the paper's eqs. 3-4);
# ape_code: logits scale q.k + q.a^K_c, no value term (the APE paper's code, its "Relative")
READINGS = ("shaw", "ape_code")

REL_WINDOW = Option("rel_window", int, None,
                    "the relative scheme's clip distance k: offsets j - i beyond +-k share the "
                    "embedding of +-k (2k + 1 embeddings; for a task: its sequence length, "
                    "which clips nothing)", minimum=0, from_task=lambda task: task.seq_len)
REL_READING = Option("rel_reading", str, "shaw",
                     "which relative scheme: shaw (Shaw et al.: the offset's embedding in the "
                     "keys and the values, scaled with the content logits) or ape_code (the "
                     "APE paper's code: in the logits only, unscaled)", choices=READINGS)


@register_scheme
class Relative(AttentionScheme):
    """Logits scale q_i.k_j + rel_scale q_i.a^K[c_ij] and outputs sum_j P_ij (v_j +
    a^V[c_ij]), c_ij = clip(j - i, -k, k) + k (``relative_forward``). Parameters
    ``rel_k`` a^K and (reading shaw) ``rel_v`` a^V, each (2 rel_window + 1, head_dim). No
    traces: its logits are not products of saved queries and keys."""

    name = "relative"
    options = (REL_WINDOW, REL_READING)
    masks = ("causal", "none", "prefix")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        rows = 2 * config.options["rel_window"] + 1
        shaw = config.options["rel_reading"] == "shaw"
        self.rel_k = store.declare(f"{name}.rel_k", (rows, config.head_dim), normal_init(0.02),
                                   decay=True)
        self.rel_v = store.declare(f"{name}.rel_v", (rows, config.head_dim), normal_init(0.02),
                                   decay=True) if shaw else None
        self.rel_scale = None if shaw else 1.0  # None: the content logits' scale

    def _values(self):
        return None if self.rel_v is None else self.rel_v.value

    def attend(self, x, q, k, v, batch, steps, state):
        self.q, self.k, self.v = q, k, v
        self.out, self.lse = self.ops.relative_forward(
            q, k, v, self.rel_k.value, self._values(), None, self.rel_scale, **self.mask)
        return self.out, state

    def attend_backward(self, dout, dstate):
        dq, dk, dv = self.ops.relative_backward(
            dout, self.q, self.k, self.v, self.rel_k.value, self.out, self.lse, self.rel_k.grad,
            self._values(), None if self.rel_v is None else self.rel_v.grad, None,
            self.rel_scale, **self.mask)
        return dq, dk, dv, dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """The relative logits Q (a^K)^T, and with a^V the outputs W a^V: 2 B T H R2 D each
        (R2 = 2 rel_window + 1); the causal half of the offsets' sums is not a product."""
        rows = 2 * config.options["rel_window"] + 1
        products = 2 if config.options["rel_reading"] == "shaw" else 1
        return products * 2 * batch * steps * config.d_model * rows
