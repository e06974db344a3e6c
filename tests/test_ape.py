"""APE's ops: the C op ape_apply (per-token orthogonal maps on q or k) against the float64
reference, the reference against finite differences, bad input; and the generator-side
reference (expm, its Frechet derivative, powers by doubling and their gradient, ape_seq's
basis through the skew eigendecomposition)."""
import numpy as np
import pytest

from conftest import (assert_no_leaks, assert_refuses_bad_versions,
                      assert_same_bits_for_thread_counts, assert_unchanged, assert_within,
                      copies, expect_error, gamma, numerical_grad, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

# (B, T, H, D, A, P, TB): 1s, odd and prime sizes, chunks of odd size, TB = 1 and B; the last
# is past the single-thread threshold (B T H D >= 16384)
SIZES = [(1, 1, 1, 2, 1, 1, 1), (3, 7, 2, 6, 3, 5, 3), (2, 5, 3, 10, 1, 9, 1),
         (4, 13, 1, 16, 2, 4, 4), (5, 97, 2, 64, 2, 11, 5), (7, 61, 2, 64, 1, 61, 1)]


def orthogonal(rng, *shape):
    """float32 random orthogonal matrices (..., E, E) (QR of Gaussians)."""
    q, _ = np.linalg.qr(rng.standard_normal(shape))
    return q.astype(np.float32)


def inputs(rng, B, T, H, D, A, P, TB):
    E = D // A
    x = randn(rng, B, T, H, D)
    maps = orthogonal(rng, A, P, H, E, E)
    index = rng.integers(0, P, (TB, T, A)).astype(np.int32)
    return x, maps, index


@pytest.mark.parametrize("B,T,H,D,A,P,TB", SIZES)
def test_forward_matches_reference(rng, B, T, H, D, A, P, TB):
    x, maps, index = inputs(rng, B, T, H, D, A, P, TB)
    before = copies(x, maps, index)
    y = _C.ape_apply_forward(x, maps, index)
    assert y.dtype == np.float32 and y.shape == x.shape
    # each output a float32 sum of E products: within gamma(E + 1) of the sum of |terms|
    E = D // A
    assert_within(y, ref.ape_apply_forward(x, maps, index),
                  gamma(E + 1) * ref.ape_apply_forward(np.abs(x), np.abs(maps), index), "y")
    assert_unchanged(before, [x, maps, index])


@pytest.mark.parametrize("B,T,H,D,A,P,TB", SIZES)
def test_backward_matches_reference(rng, B, T, H, D, A, P, TB):
    x, maps, index = inputs(rng, B, T, H, D, A, P, TB)
    dy = randn(rng, B, T, H, D)
    prefill = randn(rng, *maps.shape)
    dmaps = prefill.copy()
    before = copies(dy, x, maps, index)
    dx = _C.ape_apply_backward(dy, x, maps, index, dmaps)
    rdx, rdmaps = ref.ape_apply_backward(dy, x, maps, index)
    adx, admaps = ref.ape_apply_backward(np.abs(dy), np.abs(x), np.abs(maps), index)
    E = D // A
    assert dx.dtype == np.float32 and dx.shape == x.shape
    assert_within(dx, rdx, gamma(E + 1) * adx, "dx")
    # dmaps: prefill plus a sum over the B T tokens at most that share a position
    assert_within(dmaps, prefill.astype(np.float64) + rdmaps,
                  gamma(B * T + 2) * (admaps + np.abs(prefill)), "dmaps")
    assert_unchanged(before, [dy, x, maps, index])


def test_reference_gradients_match_finite_differences(rng):
    B, T, H, D, A, P, TB = 2, 4, 2, 6, 2, 3, 2
    x, maps, index = inputs(rng, B, T, H, D, A, P, TB)
    x, maps = x.astype(np.float64), maps.astype(np.float64)
    w = rng.standard_normal(x.shape)
    dx, dmaps = ref.ape_apply_backward(w, x, maps, index)
    f = lambda: (ref.ape_apply_forward(x, maps, index) * w).sum()
    np.testing.assert_allclose(dx, numerical_grad(f, x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dmaps, numerical_grad(f, maps), rtol=1e-6, atol=1e-8)
    # positions no token uses get no gradient, and the maps act chunk by chunk
    assert np.all(dmaps[0, np.setdiff1d(np.arange(P), index[..., 0])] == 0)


def test_expm_of_skew_is_orthogonal_and_rope_closed_form(rng):
    a = rng.standard_normal((2, 3, 8, 8))
    w = ref.expm(a - np.swapaxes(a, -1, -2))
    np.testing.assert_allclose(w @ np.swapaxes(w, -1, -2), np.broadcast_to(np.eye(8), w.shape),
                               atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(w), 1.0, atol=1e-12)
    # RoPE's generator: W is the block rotation, W^p rotates pair i by p omega_i
    omega = np.array([[0.3, 1.1], [2.5, 0.01]])
    maps = ref.ape_powers_forward(ref.rope_generator(omega), 9)[0]  # (P, H, 4, 4)
    x = rng.standard_normal((1, 9, 2, 4))
    theta = omega[None, None] * np.arange(9)[None, :, None, None]
    np.testing.assert_allclose(np.einsum("thij,bthj->bthi", maps, x),
                               ref.rotate_pairs(x, theta), atol=1e-12)


def test_expm_frechet_matches_finite_differences(rng):
    x, g = rng.standard_normal((2, 5, 5)), rng.standard_normal((2, 5, 5))
    eps = 1e-6
    numeric = (ref.expm(x + eps * g) - ref.expm(x - eps * g)) / (2 * eps)
    np.testing.assert_allclose(ref.expm_frechet(x, g), numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("steps", [1, 2, 7, 8, 13])
def test_powers_by_doubling(rng, steps):
    a = rng.standard_normal((2, 2, 4, 4)) * 0.5
    w = ref.expm(a - np.swapaxes(a, -1, -2))
    maps = ref.ape_powers_forward(a, steps)
    assert maps.shape == (2, steps, 2, 4, 4)
    expected = np.stack([np.linalg.matrix_power(w[g, h], p) for g in range(2)
                         for p in range(steps) for h in range(2)]).reshape(maps.shape)
    np.testing.assert_allclose(maps, expected, atol=1e-12)
    c = rng.standard_normal(maps.shape)
    np.testing.assert_allclose(
        ref.ape_powers_backward(c, a),
        numerical_grad(lambda: (ref.ape_powers_forward(a, steps) * c).sum(), a),
        rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("scale", [0.0, 1e-3, 0.5, 3.0])
def test_basis_is_expm_of_skew_and_its_gradient(rng, scale):
    """ape_basis_* (through the eigendecomposition of the skew A - A^T) against expm and the
    block-triangular Frechet derivative, and against finite differences; scale 0 is the
    identity (every eigenvalue equal), 1e-3 nearly equal ones."""
    a = rng.standard_normal((2, 3, 6, 6)) * scale
    s, g = a - np.swapaxes(a, -1, -2), rng.standard_normal(a.shape)
    m = ref.ape_basis_forward(a)
    np.testing.assert_allclose(m, ref.expm(s), atol=1e-13)
    np.testing.assert_allclose(m @ np.swapaxes(m, -1, -2), np.broadcast_to(np.eye(6), m.shape),
                               atol=1e-13)
    ds = ref.expm_frechet(np.swapaxes(s, -1, -2), g)
    np.testing.assert_allclose(ref.ape_basis_backward(g, a), ds - np.swapaxes(ds, -1, -2),
                               atol=1e-12)
    np.testing.assert_allclose(
        ref.ape_basis_backward(g, a),
        numerical_grad(lambda: (ref.ape_basis_forward(a) * g).sum(), a), rtol=1e-6, atol=1e-8)


def test_basis_of_a_degenerate_rotation(rng):
    """Two 2x2 blocks at the same angle (repeated eigenvalues, RoPE-like): still exact."""
    a = np.zeros((1, 6, 6))
    a[0, 1, 0] = a[0, 3, 2] = 0.7
    s, g = a - np.swapaxes(a, -1, -2), rng.standard_normal(a.shape)
    np.testing.assert_allclose(ref.ape_basis_forward(a), ref.expm(s), atol=1e-14)
    ds = ref.expm_frechet(np.swapaxes(s, -1, -2), g)
    np.testing.assert_allclose(ref.ape_basis_backward(g, a), ds - np.swapaxes(ds, -1, -2),
                               atol=1e-13)


@pytest.mark.parametrize("name", ["c", "numpy"])
def test_basis_ops_of_the_backends(rng, name):
    """ops.ape_basis_forward -> (M in the backend's dtype, the eigendecomposition the backward
    takes); ops.ape_basis_backward accumulates (+=)."""
    from mapformer import backend
    ops = backend.get(name)
    a = rng.standard_normal((2, 6, 6)).astype(ops.dtype)
    g = rng.standard_normal(a.shape)
    m, eig = ops.ape_basis_forward(a)
    assert m.dtype == ops.dtype and m.flags.c_contiguous
    np.testing.assert_allclose(m, ref.ape_basis_forward(a), atol=1e-6)
    da = np.ones_like(a)
    ops.ape_basis_backward(g.astype(ops.dtype), eig, da)
    np.testing.assert_allclose(da, 1 + ref.ape_basis_backward(g, a), atol=1e-5)


# ---- bad input ----------------------------------------------------------------------------
def good_args(rng):
    x, maps, index = inputs(rng, 2, 5, 2, 8, 2, 3, 2)
    return {"forward": dict(x=x, maps=maps, index=index),
            "backward": dict(dy=randn(rng, *x.shape), x=x, maps=maps, index=index,
                             dmaps=np.zeros_like(maps))}


OPS = {"forward": "ape_apply_forward", "backward": "ape_apply_backward"}


def call(op, kwargs):
    return getattr(_C, OPS[op])(**kwargs)


def test_good_args_work_positionally(rng):
    g = good_args(rng)
    y = _C.ape_apply_forward(*g["forward"].values())
    dx = _C.ape_apply_backward(*g["backward"].values())
    assert y.shape == dx.shape == (2, 5, 2, 8)


@pytest.mark.parametrize("op,arg", [("forward", "x"), ("forward", "maps"),
                                    ("backward", "dy"), ("backward", "x"),
                                    ("backward", "maps"), ("backward", "dmaps")])
def test_bad_float_arrays(rng, op, arg):
    kwargs = good_args(rng)[op]
    assert_refuses_bad_versions(lambda v: call(op, {**kwargs, arg: v}), arg, kwargs[arg])


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_bad_index(rng, op):
    kwargs = good_args(rng)[op]
    index = kwargs["index"]
    with raises_naming(TypeError, "index"):
        call(op, {**kwargs, "index": index.astype(np.int64)})
    with raises_naming(ValueError, "index"):
        call(op, {**kwargs, "index": np.asfortranarray(index)})
    bad = index.copy()
    bad[1, 2, 1] = 3  # P = 3
    with pytest.raises(ValueError, match=r"index\[\d+\] = 3 is out of range \[0, 3\)"):
        call(op, {**kwargs, "index": bad})
    bad[1, 2, 1] = -1
    with pytest.raises(ValueError, match="index.*out of range"):
        call(op, {**kwargs, "index": bad})
    with pytest.raises(ValueError, match="index.*TB = 1 or TB = B"):
        call(op, {**kwargs, "index": np.zeros((3, 5, 2), np.int32)})
    with raises_naming(ValueError, "index"):  # A differs from the maps'
        call(op, {**kwargs, "index": np.zeros((2, 5, 3), np.int32)})


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_chunks_must_tile_the_head(rng, op):
    kwargs = good_args(rng)[op]
    maps = orthogonal(rng, 2, 3, 2, 3, 3)  # A E = 6, D = 8
    extra = {"dmaps": np.zeros_like(maps)} if op == "backward" else {}
    with pytest.raises(ValueError, match="maps must have shape .*A E = D"):
        call(op, {**kwargs, "maps": maps, **extra})


def test_dmaps_must_be_writeable(rng):
    kwargs = good_args(rng)["backward"]
    kwargs["dmaps"].flags.writeable = False
    with raises_naming(ValueError, "dmaps"):
        call("backward", kwargs)


def test_docstrings_give_shapes():
    for name in OPS.values():
        doc = getattr(_C, name).__doc__
        assert doc.startswith(name + "(") and "(B, T, H, D)" in doc, name


def test_no_reference_or_memory_leaks(rng):
    g = good_args(rng)
    x, maps, index, dy, dmaps = (g["backward"][k] for k in ("x", "maps", "index", "dy",
                                                            "dmaps"))
    bad = index.astype(np.int64)

    def calls():
        _C.ape_apply_forward(x, maps, index)
        _C.ape_apply_backward(dy, x, maps, index, dmaps)
        expect_error(_C.ape_apply_forward, x, maps, bad)
        expect_error(_C.ape_apply_backward, dy, x, maps, bad, dmaps)

    assert_no_leaks(calls, (x, maps, index, dy, dmaps, bad), rounds=300)


def test_results_do_not_depend_on_thread_count(tmp_path):
    """dmaps sums the tokens at each position: one owner per map, a fixed order, so the bits
    are the same for 1 and 2 threads (TB = 1 and TB = B)."""
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(5)\n"
        "B, T, H, D, A, P = 8, 70, 2, 64, 2, 9\n"
        "f = lambda *s: rng.standard_normal(s).astype(np.float32)\n"
        "x, dy, maps = f(B, T, H, D), f(B, T, H, D), f(A, P, H, D // A, D // A)\n"
        "outs = []\n"
        "for tb in (1, B):\n"
        "    index = rng.integers(0, P, (tb, T, A)).astype(np.int32)\n"
        "    dmaps = np.zeros_like(maps)\n"
        "    outs += [_C.ape_apply_forward(x, maps, index),\n"
        "             _C.ape_apply_backward(dy, x, maps, index, dmaps), dmaps]\n"
        "np.savez(sys.argv[1], *outs)\n"))


def test_tree_maps_are_ordered_products_along_the_path(rng):
    a = rng.standard_normal((2, 2, 4, 4)) * 0.5
    w = ref.expm(a - np.swapaxes(a, -1, -2))
    maps = ref.ape_tree_forward(a, 3)[0]  # heap numbers 0..15
    assert maps.shape == (16, 2, 4, 4)
    eye = np.broadcast_to(np.eye(4), (2, 4, 4))
    np.testing.assert_allclose(maps[1], eye, atol=0)  # the root (and 0, no node)
    np.testing.assert_allclose(maps[0], eye, atol=0)
    for h in range(2, 16):  # the bits after the leading 1 are the path, 0 left, 1 right
        product = eye
        for bit in bin(h)[3:]:
            product = product @ w[int(bit)]
        np.testing.assert_allclose(maps[h], product, atol=1e-12)
    assert np.abs(maps[5] - maps[6]).max() > 1e-2  # left-right is not right-left
    c = rng.standard_normal((1,) + maps.shape)
    np.testing.assert_allclose(
        ref.ape_tree_backward(c, a),
        numerical_grad(lambda: (ref.ape_tree_forward(a, 3) * c).sum(), a),
        rtol=1e-6, atol=1e-8)
