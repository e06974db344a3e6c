"""Definitions the runtime and the float64 reference (:mod:`mapformer.reference`) share, so that
the schemes and mixers do not import the test oracle: distances on sequences, grids and binary
trees and their decay tables (APE's logit decay), the generator of RoPE's rotations (APE's
"with init") and TAPE's initial state, and conjunctive attention's combination modes. Each is
a definition of an input or a constant, not an op: the reference re-exports them for its
tests.
"""
import numpy as np

CONJ_MODES = ("score_product", "softmax_product", "sum")


def tree_distance(a, b):
    """Edges on the path between binary-tree nodes of heap numbers a, b >= 1 (root 1, children
    2h and 2h + 1), elementwise on int arrays: depth(a) + depth(b) - 2 depth(lca(a, b)), with
    depth(h) = floor(log2 h) (|a| + |b| - 2 lcp(a, b) on their root paths)."""
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    if np.any(a < 1) or np.any(b < 1):
        raise ValueError("heap numbers start at 1 (the root)")
    a, b = a.copy(), b.copy()
    dist = np.zeros(a.shape, np.int64)
    while np.any(a != b):  # lift the deeper (larger) of each unequal pair one level
        up_a = (a != b) & (a > b)
        up_b = (a != b) & (b > a)
        a[up_a] >>= 1
        b[up_b] >>= 1
        dist += up_a + up_b
    return dist


def grid_distance(x, y):
    """floor of the Euclidean distance between integer coordinates x, y (..., n): APE's grid
    distance (its public code), elementwise over the leading axes."""
    d = np.asarray(x, np.int64) - np.asarray(y, np.int64)
    sq = (d * d).sum(-1)
    r = np.floor(np.sqrt(sq)).astype(np.int64)
    r -= r * r > sq  # exact integer floor(sqrt) despite float rounding
    r += (r + 1) * (r + 1) <= sq
    return r


def decay_table(distance, gamma):
    """A pair_factor table gamma^distance (float32, (N, N)) of integer distances (N, N)."""
    return (np.float64(gamma) ** np.asarray(distance, np.float64)).astype(np.float32)


def tape_initial_state(T, H, D, base=10000.0):
    """-> e (1, T, H, D): the RoPE state e[0, t-1, h] = exp(i omega_k t) for t = 1..T, stored as
    (cos, sin) pairs, omega_k = base^(-2k/D), k = 0..D/2-1 (the same for every head).
    tape_rotate_forward with this state is rotary_forward with theta = omega * t, i.e. path
    integration with delta = 1 and omega_k for every head."""
    omega = base ** (-2.0 * np.arange(D // 2) / D)
    ang = np.arange(1, T + 1, dtype=np.float64)[:, None] * omega  # (T, NB)
    z = np.exp(1j * ang)  # (T, D / 2) complex
    e = np.empty((T, D))  # stored as (cos, sin) pairs
    e[:, 0::2], e[:, 1::2] = z.real, z.imag
    return np.broadcast_to(e[None, :, None, :], (1, T, H, D)).copy()


def rope_generator(frequencies, n_generators=1):
    """frequencies (H, NB) -> generator (n_generators, H, 2 NB, 2 NB) whose W = expm(A - A^T)
    is RoPE's block-diagonal rotation by omega_i on the pair (2i, 2i+1) (as rotate_pairs turns
    it: A[2i+1, 2i] = omega_i, so W^p rotates the pair by p omega_i)."""
    h, nb = frequencies.shape
    a = np.zeros((n_generators, h, 2 * nb, 2 * nb))
    i = np.arange(nb)
    a[:, :, 2 * i + 1, 2 * i] = frequencies
    return a
