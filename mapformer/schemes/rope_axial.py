"""``rope_axial``: axial RoPE on the tokens' n-dimensional coordinates (``Scheme.coordinates``;
the token index when the task gives none, n = 1): each head's NB = D / 2 rotation pairs are
split into n chunks of NB / n consecutive pairs, chunk a turning with axis a alone at RoPE's
frequencies of a head of D / n, theta[tb, t, h, a m + i] = base^(-i / m) x_a[tb, t]
(m = NB / n). Fixed frequencies, no parameters: the score between tokens at x and y is a
sum over the axes of RoPE's relative terms, a function of the displacement y - x only. The
same layout as ``ape_grid``'s chunks at its RoPE initialisation (which is this scheme, with
trainable generators), and GridPE's angles with one wave direction per axis (e_a) in place
of the simplex's n + 1.

With ``rope_trainable`` (as ``rope``'s "RoPE tuned") each pair's frequency is a parameter
omega (H, NB), from the values above, shared by every layer (declared by the first); pair
a m + i still turns with axis a alone, theta[tb, t, h, a m + i] = omega[h, a m + i]
x_a[tb, t], so scores stay functions of the displacement. The gradient: d omega[h, p] =
sum over tokens of dtheta[tb, t, h, p] x_a(p)[tb, t], the linear op's weight gradient masked
to each pair's axis (every layer adds its share)."""
import numpy as np

from . import register_scheme, shared_once
from .coordinates import COORD_DIMS, COORD_SOURCE, coordinates_or_index
from .gridpe import FrequencyAngles
from .rope import ROPE_BASE, ROPE_TRAINABLE


def axial_frequencies(base, n_heads, n_blocks, n):
    """(H, NB, n) frequency vectors: pair a m + i of every head is base^(-i / m) e_a,
    m = NB / n. ValueError unless n divides NB."""
    if n_blocks % n:
        raise ValueError(f"rope_axial splits the head's D / 2 = {n_blocks} rotation pairs over "
                         f"n = {n} axes: D / 2 must be a multiple of n (coord_dims)")
    m = n_blocks // n
    freq = np.zeros((n_heads, n_blocks, n))
    for a in range(n):
        freq[:, a * m:(a + 1) * m, a] = base ** (-np.arange(m) / m)
    return freq


@register_scheme
class AxialRoPE(FrequencyAngles):
    """GridPE's machinery (theta = f . x, a linear map of the coordinates) with the axial
    frequency vectors. Parameter (``rope_trainable`` only, declared by the first layer):
    ``omega`` (H, NB). Traces: ``theta`` (TB, T, H, NB); ``frequencies`` (H, NB, n) (the
    initial ones; with ``rope_trainable`` omega is the current)."""

    name = "rope_axial"
    options = (ROPE_BASE, ROPE_TRAINABLE, COORD_DIMS, COORD_SOURCE)

    def __init__(self, store, name, config, ops):
        super().__init__(store, name, config, ops)
        self.omega = None
        if config.options["rope_trainable"]:
            initial = self.frequencies.sum(axis=-1)  # (H, NB): each pair's one nonzero entry
            self.omega = shared_once(store, self.name, lambda: store.declare(
                f"{name}.omega", initial.shape, lambda rng, shape: initial, decay=False))
            # (H NB, n): 1 where pair p turns with axis a
            self.axis_mask = ops.asarray((self.frequencies != 0).reshape(self.weight.shape))

    def angles(self, x, batch, steps):
        if self.omega is not None:  # the weight (H NB, n) from the current omega
            self.weight = self.ops.mul(self.omega.value.reshape(-1, 1), self.axis_mask)
        return super().angles(x, batch, steps)

    def angles_backward(self, dtheta, dx):
        """No dependence on x; trainable frequencies get this layer's share (+=)."""
        if self.omega is None:
            return
        tb, steps = dtheta.shape[:2]
        coordinates = coordinates_or_index(self, steps)
        n = coordinates.shape[2]
        dweight = self.ops.zeros(self.weight.shape)
        self.ops.linear_backward(dtheta.reshape(tb * steps, -1),
                                 coordinates.reshape(coordinates.shape[0] * steps, n),
                                 self.weight, dweight)
        self.ops.add_(self.omega.grad, self.ops.mul(dweight, self.axis_mask).sum(axis=1)
                      .reshape(self.omega.shape))

    @classmethod
    def frequency_vectors(cls, config):
        return axial_frequencies(config.options["rope_base"], config.n_heads,
                                 config.head_dim // 2, config.options["coord_dims"])
