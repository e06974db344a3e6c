"""``gridpe``: GridPE (Li et al., "GridPE: Unifying positional encoding in transformers with a
grid cell-inspired framework"), in its fixed-frequency form, on the tokens' true
n-dimensional coordinates (``Scheme.coordinates``; the token index when the task gives none,
n = 1), in the four variants the paper names (``gridpe_variant``).

The code. A grid-cell module is n + 1 wave directions u_j (unit vectors of a regular simplex
in R^n: 3 at 120 degrees in 2D, +-1 in 1D) at one scale; S modules at geometric scales
omega_s = omega_max * r^(-s), r = e^(1/n) (the ratio the paper derives as minimising the
number of neurons for a given resolution: N(r) ~ r^n / ln r is least at r = e^(1/n); see
:func:`neuron_count`). Component i = s (n + 1) + j of the code of position x is the complex
exponential e^{i theta_i(x)}, theta_i = omega_s u_j . x (the paper's eq. 17); components
beyond S (n + 1) have frequency 0. In 2D head h's simplex is turned by h 120 / H degrees, so
heads sample different directions. Frequencies are fixed: no parameters, no gradient into
them, and the same on every forward and at evaluation (the 2024 code redraws random
frequencies in every forward, separately for q and k: not copied). Positions are the task's
true coordinates (the 2024 ViT lays every patch on one row: not copied).

The variants. The paper's equations 18-23 are missing from its text; each reading below is
from its prose (and, where that is silent, the authors' 2024 code, minus its bugs):
- ``rotate`` (eqs. 18-20, "rotate pairs of q and k by the code", the default): each head's
  NB = D / 2 rotation planes are the code's components, (q_2i, q_2i+1) turned by theta_i,
  the same for k (the rotary op). The score between tokens at x_m and x_n is
  sum_i Re(q_i conj(k_i) e^{i theta_i(x_m - x_n)}): a function of the displacement only.
  This is MapWM with known displacements and frozen frequencies; in 1D the two directions
  are +-1: RoPE whose frequencies fall by e from one pair of planes to the next.
- ``complex`` (eq. 22, "preserving the complex form", score Re(q~^H k~), q~ = q (.) g(x_m),
  k~ = k (.) g(x_n)): one exponential per real channel, so each head has D components
  (S = D / (n + 1) scales by default) and q' = (q_d cos theta_d, q_d sin theta_d)_d, width 2 D
  (the C op ``gridpe_complex``), the same for k: q'_m . k'_n = sum_d q_d k_d cos(theta_d(x_m)
  - theta_d(x_n)), a cosine kernel per channel, again a function of the displacement only
  (read with the Hermitian product the paper states; the 2024 code omits the conjugate, which
  makes the score depend on x_m + x_n). The attention runs at width 2 D with the logits scaled
  by 1 / sqrt(D) (at theta = 0 it is plain attention); the values are padded to 2 D by the same
  op at angle 0 and the output's even channels kept. Twice the attention's work; the C
  attention kernels take head widths up to 128, so D <= 64.
- ``merge`` (eq. 21, "incorporating the real and imaginary parts into the information
  vectors", "like the original Transformer"): an absolute additive code, the real code
  (s sin theta_i, s cos theta_i) of C / 2 components (one module set over the model width,
  S = C / (2 (n + 1)) scales) added to the token embeddings before the first block, with
  s = ``sinusoidal_scale`` (0.02, the token embeddings' std, as ``sinusoidal``); no rotation in
  the attention. (The 2024 code adds Re g + Im g inside each such attention block, in place.)
- ``deep`` (eq. 23, "pe' = MLP(pe), which does not change the dimension"): per position, the
  rotate variant's real code c = (cos theta_i, sin theta_i)_i of every head (C values) goes
  through a learned two-layer MLP, m = W_2 gelu(W_1 c + b_1) + b_2 (C -> C -> C, one per
  layer, trained with the model), and m multiplies q and k elementwise: q' = q (.) m(x_m),
  k' = k (.) m(x_n) (how the 2024 code uses its output). b_2 starts at 1 and W_2 at
  N(0, 0.02^2), so the factors start near 1 (content attention) and the position enters as
  they are learned. Not relative: an absolute code. (The 2024 code builds a new, untrained
  MLP inside every forward, mixing across token positions: a bug, not copied.)
"""
import math

import numpy as np

from ..nn import Linear, constant_init
from ..registry import Option
from . import AngleScheme, AttentionScheme, register_scheme
from .absolute import SINUSOIDAL_SCALE
from .coordinates import COORD_DIMS, COORD_SOURCE, coordinates_or_index

VARIANTS = ("rotate", "complex", "merge", "deep")

GRIDPE_OPTIONS = (
    COORD_DIMS,
    COORD_SOURCE,
    Option("gridpe_scales", int, 0, "GridPE's number of scales S (0: as many as the code's "
           "K components allow, floor(K / (n + 1)); K = D / 2 for rotate and deep, D for "
           "complex, C / 2 for merge)", minimum=0),
    Option("gridpe_ratio", float, 0.0, "GridPE's scale ratio r (0: e^(1/n), the paper's "
           "optimum)", minimum=0),
    Option("gridpe_omega_max", float, math.pi, "GridPE's fastest frequency (radians per unit "
           "of coordinate)", above=0),
    Option("gridpe_variant", str, "rotate", "GridPE's variant, as the paper names them: "
           "rotate (rotary planes of q and k), complex (one exponential per channel, a cosine "
           "kernel), merge (an additive code on the embeddings), deep (a learned MLP of the "
           "code multiplying q and k)", choices=VARIANTS),
    SINUSOIDAL_SCALE,
)


def simplex_directions(n):
    """(n + 1, n) unit vectors of a regular simplex centred at 0 in R^n (pairwise dot -1/n)."""
    corners = np.eye(n + 1) - 1.0 / (n + 1)
    # Helmert's orthonormal basis of the sum-zero hyperplane: row k-1 is
    # (1, ..., 1, -k, 0, ...) / sqrt(k (k + 1)) (1D: +-1; 2D: u_0 at 30 degrees, 120 apart)
    basis = np.zeros((n, n + 1))
    for k in range(1, n + 1):
        basis[k - 1, :k], basis[k - 1, k] = 1.0, -k
        basis[k - 1] /= math.sqrt(k * (k + 1))
    directions = corners @ basis.T
    return directions / np.linalg.norm(directions, axis=1, keepdims=True)


def gridpe_frequencies(n_heads, n_blocks, n, scales=0, ratio=0.0, omega_max=math.pi):
    """(H, NB, n) frequency vectors: block s (n + 1) + j of head h is omega_max r^(-s) u_j
    (u_j turned by h 120 / H degrees in 2D), the blocks past S (n + 1) zero."""
    scales = scales or n_blocks // (n + 1)
    if scales < 1 or scales * (n + 1) > n_blocks:
        raise ValueError(f"gridpe needs 1 <= S (n + 1) <= K = {n_blocks} components (rotate, "
                         f"deep: D / 2 planes; complex: D; merge: C / 2), got S = {scales}, "
                         f"n = {n} (gridpe_scales, coord_dims)")
    ratio = ratio or math.exp(1.0 / n)
    freq = np.zeros((n_heads, n_blocks, n))
    base = simplex_directions(n)
    for h in range(n_heads):
        u = base
        if n == 2:
            a = 2 * math.pi / 3 * h / n_heads
            u = base @ np.array([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
        for s in range(scales):
            freq[h, s * (n + 1):(s + 1) * (n + 1)] = omega_max * ratio ** (-s) * u
    return freq


def neuron_count(ratio, n, resolution=1000.0, cells=1.0):
    """The paper's neuron count (its eqs. 9-11) for modules whose periods grow by ``ratio``:
    N = c r^n ln R / ln r, R the resolution (largest period over smallest field), c cells per
    location, n the dimension. Least at r = e^(1/n) whatever R and c (dN/dr = 0 <=> ln r =
    1 / n)."""
    ratio = np.asarray(ratio, dtype=np.float64)
    return cells * ratio ** n * math.log(resolution) / np.log(ratio)


def code_kernel(displacements, frequencies):
    """The inner product of two unit GridPE codes at displacement d, averaged over the
    components: mean_i cos(f_i . d), for displacements (..., n) and frequency vectors (K, n)
    (float64). The paper's Fig. 3 plots it over a square area: it decays with |d| (with
    ripples) and is 1 at d = 0."""
    d = np.asarray(displacements, dtype=np.float64)
    return np.cos(d @ np.asarray(frequencies, dtype=np.float64).T).mean(-1)


class FrequencyAngles(AngleScheme):
    """Rotation angles linear in the coordinates with fixed frequency vectors:
    theta[tb, t, h, i] = f[h, i] . x[tb, t] for the coordinates x (TB, T, n) (a subclass
    chooses f: ``rope_axial``). Traces: ``theta`` (TB, T, H, NB) the last forward's angles;
    ``frequencies`` (H, NB, n) the frequency vectors."""

    traces = ("theta", "frequencies")

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        self.frequencies = self.frequency_vectors(config)
        self.weight = ops.asarray(self.frequencies.reshape(-1, config.options["coord_dims"]))

    @classmethod
    def frequency_vectors(cls, config):
        """(H, NB, n) the frequency vectors f[h, i]."""
        raise NotImplementedError

    def angles(self, x, batch, steps):
        self.theta = linear_angles(self, steps)
        return self.theta

    def angles_backward(self, dtheta, dx):
        """Fixed frequencies, and coordinates that do not depend on x: nothing to do."""

    @classmethod
    def flops(cls, config, batch, steps):
        """theta = x f^T: 2 N n H NB."""
        return 2 * batch * steps * config.options["coord_dims"] * config.d_model // 2


def linear_angles(scheme, steps):
    """theta (TB, T) + frequencies.shape[:-1] = the coordinates (TB, T, n) (or the token index)
    times ``scheme.weight`` (K, n) through the backend's linear op."""
    coordinates = coordinates_or_index(scheme, steps)
    tb, n = coordinates.shape[0], coordinates.shape[2]
    theta = scheme.ops.linear_forward(coordinates.reshape(tb * steps, n), scheme.weight)
    return theta.reshape((tb, steps) + scheme.frequencies.shape[:-1])


@register_scheme
class GridPE(AttentionScheme):
    """The four variants (module docstring). Kind ``attention``: it runs the attention on the
    mixer's q, k, v, after what its variant does to them, under the mixer's mask (every
    ``attn_mask``: causal, none for the image tasks, prefix). Parameters: ``deep`` only,
    ``deep_in`` and ``deep_out`` (C -> C each). Traces: ``theta`` the last forward's angles
    (TB, T, H, D / 2) (rotate, deep), (TB, T, H, D) (complex), (TB, T, C / 2) (merge);
    ``frequencies`` (H, K, n) (merge: (C / 2, n)); ``q_att``, ``k_att`` the queries and keys
    the softmax compared ((B, T, H, 2 D) for complex); ``factors`` (TB, T, H, D) deep's m."""

    name = "gridpe"
    options = GRIDPE_OPTIONS
    traces = ("theta", "frequencies", "q_att", "k_att", "factors")
    masks = ("causal", "none", "prefix")  # the mixer's attn_mask values it runs (self.mask)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        o = config.options
        self.variant = o["gridpe_variant"]
        h, d, c = config.n_heads, config.head_dim, config.d_model
        if self.variant == "complex" and 2 * d > 128:
            raise ValueError(f"gridpe_variant 'complex' attends over 2 D = {2 * d} channels "
                             "per head; the attention kernels take at most 128: head_dim "
                             "must be <= 64")
        heads, components = {"merge": (1, c // 2), "complex": (h, d)}.get(self.variant,
                                                                          (h, d // 2))
        self.frequencies = gridpe_frequencies(heads, components, o["coord_dims"],
                                              o["gridpe_scales"], o["gridpe_ratio"],
                                              o["gridpe_omega_max"])
        if self.variant == "merge":
            self.frequencies = self.frequencies[0]
        self.weight = ops.asarray(self.frequencies.reshape(-1, o["coord_dims"]))
        self.scale = 1.0 / math.sqrt(d) if self.variant == "complex" else None
        self.pair = ops.asarray([0.0, o["sinusoidal_scale"]] if self.variant == "merge"
                                else [1.0, 0.0])
        self.unit, self.zero = None, None
        if self.variant == "deep":
            self.deep_in = Linear(store, f"{name}.deep_in", c, c, ops)
            self.deep_out = Linear(store, f"{name}.deep_out", c, c, ops)
            self.deep_out.bias.init = constant_init(1.0)  # the factors start near 1

    def real_code(self, theta):
        """theta (TB, T, K) -> (TB, T, K, 2): the pair ``self.pair`` turned by each angle
        (rotary op): (cos, sin) for (1, 0), (-s sin, s cos) for (0, s)."""
        tb, steps, k = theta.shape
        self.unit = self.ops.broadcast_rows(self.pair, (tb, steps, k, 2), self.unit)
        code, _ = self.ops.rotary_forward(self.unit, self.unit, theta.reshape(tb, steps, k, 1))
        return code

    def embed(self, x, batch, steps):
        """merge: x + the real code of each token's position (absolute, additive)."""
        if self.variant != "merge":
            return x
        self.theta = linear_angles(self, steps)
        code = self.real_code(self.theta).reshape(self.theta.shape[:2] + (-1,))
        if code.shape[0] != batch:
            code = self.ops.broadcast_rows(code[0], (batch,) + code.shape[1:])
        return self.ops.residual_forward(x, code.reshape(x.shape))

    def deep_factors(self, steps):
        """deep: m = MLP(cos, sin of the rotate angles) (TB, T, H, D)."""
        self.theta = linear_angles(self, steps)
        tb = self.theta.shape[0]
        code = self.real_code(self.theta.reshape(tb, steps, -1))
        self.hidden = self.deep_in.forward(code.reshape(tb * steps, -1))
        m = self.deep_out.forward(self.ops.gelu_forward(self.hidden))
        return m.reshape(tb, steps, self.config.n_heads, self.config.head_dim)

    def attend(self, x, q, k, v, batch, steps, state):
        ops, variant = self.ops, self.variant
        self.q, self.k, self.v_att = q, k, v
        if variant == "rotate":
            self.theta = linear_angles(self, steps)
            self.q_att, self.k_att = ops.rotary_forward(q, k, self.theta)
        elif variant == "complex":
            self.theta = linear_angles(self, steps)
            if self.zero is None or self.zero.shape[1] != steps:
                self.zero = ops.zeros((1,) + q.shape[1:])
            self.q_att = ops.gridpe_complex_forward(q, self.theta)
            self.k_att = ops.gridpe_complex_forward(k, self.theta)
            self.v_att = ops.gridpe_complex_forward(v, self.zero)
        elif variant == "deep":
            self.factors = self.deep_factors(steps)
            self.q_att, self.k_att = ops.mul(q, self.factors), ops.mul(k, self.factors)
        else:
            self.q_att, self.k_att = q, k
        self.out, self.lse = ops.attention_forward(self.q_att, self.k_att, self.v_att,
                                                   self.scale, **self.mask)
        if variant == "complex":
            return ops.gridpe_complex_backward(self.out, self.zero), state
        return self.out, state

    def attend_backward(self, dout, dstate):
        ops, variant = self.ops, self.variant
        if variant == "complex":
            dout = ops.gridpe_complex_forward(dout, self.zero)
        dq, dk, dv = ops.attention_backward(dout, self.q_att, self.k_att, self.v_att, self.out,
                                            self.lse, self.scale, **self.mask)
        if variant == "rotate":
            dq, dk, _ = ops.rotary_backward(dq, dk, self.q, self.k, self.theta)
        elif variant == "complex":
            dq = ops.gridpe_complex_backward(dq, self.theta)
            dk = ops.gridpe_complex_backward(dk, self.theta)
            dv = ops.gridpe_complex_backward(dv, self.zero)
        elif variant == "deep":
            dm = ops.mul(dq, self.q)
            ops.add_(dm, ops.mul(dk, self.k))
            if self.factors.shape[0] != dm.shape[0]:
                dm = ops.sum_leading(dm, 1)
            rows = self.factors.shape[0] * self.factors.shape[1]
            dg = self.deep_out.backward(dm.reshape(rows, -1))
            self.deep_in.backward(ops.gelu_backward(dg, self.hidden))
            dq, dk = ops.mul(dq, self.factors), ops.mul(dk, self.factors)
        return dq, dk, dv, dstate

    @classmethod
    def flops(cls, config, batch, steps):
        """theta = x f^T (2 N n K); complex: the attention's two products again (the doubled
        width); deep: its MLP's two C x C products."""
        variant, n = config.options["gridpe_variant"], config.options["coord_dims"]
        c = config.d_model
        components = {"complex": 2 * c, "merge": c // 2}.get(variant, c // 2)
        flops = 2 * batch * steps * n * components
        if variant == "complex":
            flops += 2 * batch * c * steps * steps
        if variant == "deep":
            flops += 2 * 2 * batch * steps * c * c
        return flops
