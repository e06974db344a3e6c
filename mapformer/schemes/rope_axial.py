"""``rope_axial``: axial RoPE on the tokens' n-dimensional coordinates (``Scheme.coordinates``;
the token index when the task gives none, n = 1): each head's NB = D / 2 rotation pairs are
split into n chunks of NB / n consecutive pairs, chunk a turning with axis a alone at RoPE's
frequencies of a head of D / n, theta[tb, t, h, a m + i] = base^(-i / m) x_a[tb, t]
(m = NB / n). Fixed frequencies, no parameters: the score between tokens at x and y is a
sum over the axes of RoPE's relative terms, a function of the displacement y - x only. The
same layout as ``ape_grid``'s chunks at its RoPE initialisation (which is this scheme, with
trainable generators), and GridPE's angles with one wave direction per axis (e_a) in place
of the simplex's n + 1."""
import numpy as np

from . import register_scheme
from .coordinates import COORD_DIMS, COORD_SOURCE
from .gridpe import FrequencyAngles
from .rope import ROPE_BASE


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
    frequency vectors. Traces: ``theta`` (TB, T, H, NB); ``frequencies`` (H, NB, n)."""

    name = "rope_axial"
    options = (ROPE_BASE, COORD_DIMS, COORD_SOURCE)

    @classmethod
    def frequency_vectors(cls, config):
        return axial_frequencies(config.options["rope_base"], config.n_heads,
                                 config.head_dim // 2, config.options["coord_dims"])
