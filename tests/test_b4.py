"""MapEM-b4's op b4 (positions exp(cumsum(delta) S) p* for a skew 4x4 generator per block,
S = L(u) + R(v) through unit quaternions): the reference against the matrix exponential and
finite differences, the C op against the reference, the oracles (u = v is a single-plane
rotation at rate 2|u|; u, v along one axis is MapEM on the block's two pairs), the scheme in
a model, threads, bad input."""
import numpy as np
import pytest

from conftest import (U32, assert_array_argument_checked, assert_no_leaks,
                      assert_same_bits_for_thread_counts, assert_unchanged, assert_within,
                      copies, expect_error, numerical_grad, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref
from test_sln import expm

# (B, T, H, NB): 1s, odd and prime sizes; the last is past the single-thread threshold
SIZES = [(1, 1, 1, 1), (3, 7, 2, 3), (2, 13, 3, 5), (4, 257, 2, 8)]


def inputs(rng, B, T, H, NB):
    delta = randn(rng, B, T, H, NB, scale=0.5)
    gen = randn(rng, H, NB, 6)
    gen.reshape(-1, 6)[::3, :3] *= 1e-3  # some u near 0: the series
    return delta, gen, randn(rng, H, 4 * NB)


def test_generator_is_skew_and_reference_is_the_matrix_exponential(rng):
    delta, gen, start = (x.astype(np.float64) for x in inputs(rng, 2, 6, 2, 3))
    S = ref.quaternion_generator(gen[..., :3], gen[..., 3:])
    assert np.allclose(S, -np.swapaxes(S, -1, -2))
    # |S|_F^2 = 4 (|u|^2 + |v|^2): an orthogonal change of basis of so(4), scaled
    assert np.allclose((S**2).sum((-1, -2)), 4 * (gen**2).sum(-1))
    phi = np.cumsum(delta, axis=1)
    expected = expm(phi[..., None, None] * S) @ start.reshape(2, 3, 4, 1)
    p = ref.b4_forward(delta, gen, start)
    assert np.allclose(p, expected.reshape(p.shape), rtol=1e-10, atol=1e-10)


def test_reference_matches_finite_differences(rng):
    delta, gen, start = (x.astype(np.float64) for x in inputs(rng, 2, 5, 2, 3))
    w = rng.standard_normal((2, 5, 2, 12))
    f = lambda: float((w * ref.b4_forward(delta, gen, start)).sum())  # noqa: E731
    ddelta, dgen, dstart = ref.b4_backward(w, delta, gen, start)
    for got, x, name in [(ddelta, delta, "ddelta"), (dgen, gen, "dgen"),
                         (dstart, start, "dstart")]:
        assert np.allclose(got, numerical_grad(f, x), rtol=1e-6, atol=1e-6), name


def bound(expected, terms):
    """Computed in double, rounded once: one float32 rounding plus a double-precision floor
    (1e-9 of the array's largest entry, times the number of summed terms)."""
    return 2 * U32 * np.abs(expected) + 1e-9 * terms * np.abs(expected).max()


@pytest.mark.parametrize("B,T,H,NB", SIZES)
def test_c_op_matches_reference(rng, B, T, H, NB):
    delta, gen, start = inputs(rng, B, T, H, NB)
    before = copies(delta, gen, start)
    p = _C.b4_forward(delta, gen, start)
    assert p.dtype == np.float32 and p.shape == (B, T, H, 4 * NB)
    expected = ref.b4_forward(delta, gen, start)
    assert_within(p, expected, bound(expected, 1), "p")
    dp = randn(rng, B, T, H, 4 * NB)
    dgen, dstart = np.full_like(gen, 0.5), np.full_like(start, -0.25)
    ddelta = _C.b4_backward(dp, delta, gen, start, dgen, dstart)
    assert_unchanged(before, (delta, gen, start))
    e_ddelta, e_dgen, e_dstart = ref.b4_backward(dp, delta, gen, start)
    assert_within(ddelta, e_ddelta, bound(e_ddelta, T), "ddelta")
    # += rounds twice: the gradient to float32, then the sum with the old value
    assert_within(dgen, e_dgen + 0.5, bound(np.abs(e_dgen) + 0.5, B * T), "dgen (+=)")
    assert_within(dstart, e_dstart - 0.25, bound(np.abs(e_dstart) + 0.25, B * T),
                  "dstart (+=)")


def test_u_equal_v_is_a_single_plane_rotation_at_twice_its_norm(rng):
    """Oracle: S = L(u) + R(u) rotates the plane span(1, u_hat) at rate 2|u| and fixes its
    orthogonal complement."""
    B, T, H, NB = 2, 9, 1, 2
    delta = randn(rng, B, T, H, NB, scale=0.7)
    u = randn(rng, H, NB, 3)
    gen = np.concatenate([u, u], -1)
    start = randn(rng, H, 4 * NB)
    p = _C.b4_forward(delta, gen, start).astype(np.float64)
    phi = np.cumsum(delta.astype(np.float64), axis=1)
    for k in range(NB):
        n = np.linalg.norm(u[0, k].astype(np.float64))
        e1, e2 = np.eye(4)[0], np.concatenate([[0.0], u[0, k] / n])
        s = start[0, 4 * k:4 * k + 4].astype(np.float64)
        x1, x2 = s @ e1, s @ e2
        rest = s - x1 * e1 - x2 * e2
        ang = 2 * n * phi[:, :, 0, k, None]
        expected = ((x1 * np.cos(ang) - x2 * np.sin(ang)) * e1
                    + (x1 * np.sin(ang) + x2 * np.cos(ang)) * e2 + rest)
        assert np.allclose(p[:, :, 0, 4 * k:4 * k + 4], expected, atol=1e-5)


def test_one_axis_generator_is_mapem_on_the_block_pairs(rng):
    """u = (a, 0, 0), v = (b, 0, 0): pairs (0, 1) and (2, 3) of the block rotate at a + b and
    a - b: the rotary op on path-integrated angles with Delta shared by the two pairs."""
    B, T, H, NB = 3, 11, 2, 3
    delta, _, start = inputs(rng, B, T, H, NB)
    gen = np.zeros((H, NB, 6), np.float32)
    gen[..., 0], gen[..., 3] = rng.uniform(0.5, 2, (H, NB)), rng.uniform(-0.4, 0.4, (H, NB))
    omega = np.stack([gen[..., 0] + gen[..., 3], gen[..., 0] - gen[..., 3]], -1).reshape(H, -1)
    theta = _C.path_integration_forward(np.ascontiguousarray(np.repeat(delta, 2, axis=-1)),
                                        np.ascontiguousarray(omega))
    tiled = np.ascontiguousarray(np.broadcast_to(start, (B, T, H, 4 * NB)))
    mapem, _ = _C.rotary_forward(tiled, tiled, theta)
    assert np.allclose(_C.b4_forward(delta, gen, start), mapem, rtol=0,
                       atol=1e-5 * np.abs(start).max())


def test_same_bits_for_any_thread_count(tmp_path):
    script = """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(3)
delta = rng.standard_normal((4, 257, 2, 8)).astype(np.float32) * 0.3
gen = rng.standard_normal((2, 8, 6)).astype(np.float32)
start = rng.standard_normal((2, 32)).astype(np.float32)
dp = rng.standard_normal((4, 257, 2, 32)).astype(np.float32)
dgen, dstart = np.zeros_like(gen), np.zeros_like(start)
ddelta = _C.b4_backward(dp, delta, gen, start, dgen, dstart)
np.savez(sys.argv[1], p=_C.b4_forward(delta, gen, start), ddelta=ddelta, dgen=dgen,
         dstart=dstart)
"""
    assert_same_bits_for_thread_counts(tmp_path, script)


def test_bad_input_names_the_argument(rng):
    delta, gen, start = inputs(rng, 2, 3, 2, 2)
    dp = randn(rng, 2, 3, 2, 8)
    assert_array_argument_checked(lambda x: _C.b4_forward(delta, gen, x), "start", start,
                                  sizes=False)
    assert_array_argument_checked(lambda x: _C.b4_forward(x, gen, start), "delta", delta,
                                  sizes=False)
    assert_array_argument_checked(lambda x: _C.b4_forward(delta, x, start), "gen", gen)
    with raises_naming(ValueError, "delta"):  # NB must be D / 4
        _C.b4_forward(randn(rng, 2, 3, 2, 3), randn(rng, 2, 3, 6), start)
    with raises_naming(ValueError, "start"):  # D not a multiple of 4
        _C.b4_forward(randn(rng, 2, 3, 2, 3), randn(rng, 2, 3, 6), randn(rng, 2, 6))

    def backward(**kw):
        args = dict(dp=dp, delta=delta, gen=gen, start=start, dgen=np.zeros_like(gen),
                    dstart=np.zeros_like(start))
        args.update(kw)
        return _C.b4_backward(**args)
    assert_array_argument_checked(lambda x: backward(dp=x), "dp", dp, sizes=False)
    assert_array_argument_checked(lambda x: backward(dgen=x), "dgen", gen)
    assert_array_argument_checked(lambda x: backward(dstart=x), "dstart", start)


def test_no_leaks(rng):
    delta, gen, start = inputs(rng, 2, 3, 2, 2)
    dp, dgen, dstart = randn(rng, 2, 3, 2, 8), np.zeros_like(gen), np.zeros_like(start)
    bad = randn(rng, 2, 3, 2, 3)

    def calls():
        _C.b4_forward(delta, gen, start)
        _C.b4_backward(dp, delta, gen, start, dgen, dstart)
        expect_error(_C.b4_forward, bad, gen, start)
    assert_no_leaks(calls, (delta, gen, start, dp, dgen, dstart, bad), rounds=300)


# ---- the mapem_b4 scheme in a model ---------------------------------------------------------
@pytest.mark.parametrize("backend,tol", [("numpy", 1e-10), ("c", 1e-4)])
def test_mapem_b4_at_init_is_mapem_with_a_shared_delta(backend, tol):
    """At initialisation MapEM-b4 is MapEM-s whose two pairs of a block share one Delta: copy
    W_Delta's rows to both pairs and the rest of the parameters; logits agree."""
    from mapformer.models import ModelConfig, Transformer
    make = lambda positional: Transformer(ModelConfig(  # noqa: E731
        vocab_size=9, d_model=32, n_heads=2, n_layers=1, mixer="conjunctive",
        positional=positional, options={"mapem_scores": "positional"}), seed=2,
        backend=backend)
    b4, mapem = make("mapem_b4"), make("mapem")
    for name, p in b4.params.params.items():
        if name in mapem.params.params and "delta_out" not in name:
            mapem.params.params[name].value[...] = p.value
    out = b4.params.params["blocks.0.mixer.scheme.delta_out.weight"].value  # (H NB4, r)
    mapem.params.params["blocks.0.mixer.scheme.delta_out.weight"].value[...] = np.repeat(
        out, 2, axis=0)
    tokens = np.random.default_rng(0).integers(0, 9, (2, 11))
    np.testing.assert_allclose(b4.forward(tokens), mapem.forward(tokens), rtol=tol, atol=tol)
    targets = np.random.default_rng(1).integers(0, 9, (2, 11))
    b4.loss(tokens, targets, np.ones((2, 11), bool))
    b4.backward()
    assert np.isfinite(b4.params.grad).all()
    assert np.abs(b4.params.params["blocks.0.mixer.scheme.gen"].grad).max() > 0
