"""MapEM-NC's generic op nc_general (any block size b, K generators per block: the ordered
product exp(X_t) ... exp(X_1) p*, X_t = sum_i theta_t,i S_i, exp by scaling and squaring):
the reference against finite differences and a product of matrix exponentials, the C op
against the reference on awkward sizes, the oracles (b = 4, K = 6 on nc's quaternion basis
equals nc_forward / nc_backward; commuting plane rotations equal cumulative-sum path
integration), norm preservation over 4096 steps, threads, bad input."""
import numpy as np
import pytest

from conftest import (U32, assert_array_argument_checked, assert_no_leaks,
                      assert_sampled_param_grads, assert_same_bits_for_thread_counts,
                      assert_unchanged, assert_within, copies, expect_error, numerical_grad,
                      randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref
from test_nc import bounds as nc_bounds
from test_sln import expm

# (B, T, H, NB, b, K): 1s, odd and prime sizes, b = 2, 3, 5, 6 and 16, K = 1, 2, 7 and more
# than b(b-1)/2; the last is past the single-thread threshold
SIZES = [(1, 1, 1, 1, 2, 1), (2, 5, 1, 3, 3, 2), (1, 7, 2, 2, 5, 7), (2, 3, 1, 1, 6, 16),
         (3, 4, 2, 1, 4, 6), (1, 2, 1, 1, 16, 3), (4, 129, 2, 4, 3, 3)]


def skew(rng, H, NB, K, b, scale=1.0):
    a = rng.standard_normal((H, NB, K, b, b)) * scale / b ** 0.5
    return (a - np.swapaxes(a, -1, -2)).astype(np.float32)


def inputs(rng, B, T, H, NB, b, K):
    return (randn(rng, B, T, H, NB, K, scale=0.7), skew(rng, H, NB, K, b),
            randn(rng, H, NB * b))


def scales(theta, gen, start, dp):
    """Per (B, H, NB): |p*|, sum_t |g_t| and max_i ||S_i||_F: the magnitudes the double
    precision chain's errors (about 1e-14 relative a step, see nc_general.c) are relative to."""
    B, T, H, NB, K = theta.shape
    b = gen.shape[-1]
    s = np.linalg.norm(start.astype(np.float64).reshape(H, NB, b), axis=-1)
    g = np.linalg.norm(dp.astype(np.float64).reshape(B, T, H, NB, b), axis=-1).sum(1)
    sn = np.linalg.norm(gen.astype(np.float64), axis=(-2, -1)).max(-1)
    return s, g, sn


def test_reference_is_the_ordered_product_of_matrix_exponentials(rng):
    theta, gen, start = (x.astype(np.float64) for x in inputs(rng, 2, 5, 2, 2, 3, 2))
    X = np.einsum("bthki,hkirc->bthkrc", theta, gen)
    P = np.broadcast_to(np.eye(3), (2, 2, 2, 3, 3))
    p = ref.nc_general_forward(theta, gen, start).reshape(2, 5, 2, 2, 3)
    for t in range(5):
        P = expm(X[:, t]) @ P
        assert np.allclose(p[:, t], (P @ start.reshape(2, 2, 3, 1))[..., 0], atol=1e-10)
    reversed_p = ref.nc_general_forward(theta[:, ::-1].copy(), gen, start).reshape(p.shape)
    assert np.abs(reversed_p[:, -1] - p[:, -1]).max() > 1e-2  # the steps do not commute


@pytest.mark.parametrize("b,K", [(3, 2), (5, 1)])
def test_reference_matches_finite_differences(rng, b, K):
    theta, gen, start = (x.astype(np.float64) for x in inputs(rng, 2, 4, 1, 2, b, K))
    gen = gen + rng.standard_normal(gen.shape) * 0.2  # any generators, not only skew ones
    g = rng.standard_normal((2, 4, 1, 2 * b))
    f = lambda: float((g * ref.nc_general_forward(theta, gen, start)).sum())  # noqa: E731
    dtheta, dgen, dstart = ref.nc_general_backward(g, theta, gen, start)
    for got, x in ((dtheta, theta), (dgen, gen), (dstart, start)):
        assert np.allclose(got, numerical_grad(f, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("B,T,H,NB,b,K", SIZES)
def test_c_op_matches_reference(rng, B, T, H, NB, b, K):
    """The op works in double and rounds each output once: within U32 of the value plus
    1e-9 of the magnitudes (the double chains' error, about 1e-14 a step, with margin)."""
    theta, gen, start = inputs(rng, B, T, H, NB, b, K)
    before = copies(theta, gen, start)
    p = _C.nc_general_forward(theta, gen, start)
    assert p.dtype == np.float32 and p.shape == (B, T, H, NB * b)
    expected = ref.nc_general_forward(theta, gen, start)
    dp = randn(rng, B, T, H, NB * b)
    s, g, sn = scales(theta, gen, start, dp)
    bp = np.repeat(np.broadcast_to(s, (B, T, H, NB))[..., None] * 1e-9, b, -1)
    assert_within(p, expected, bp.reshape(p.shape) + U32 * np.abs(expected), "p")
    dgen, dstart = np.full_like(gen, -0.25), np.full_like(start, 0.5)
    dtheta = _C.nc_general_backward(dp, theta, gen, start, dgen, dstart)
    assert_unchanged(before, (theta, gen, start))
    e_dth, e_dgen, e_dstart = ref.nc_general_backward(dp, theta, gen, start)
    mag = s * g * sn  # |dX_t| <= |lam_t| |p_{t-1}| ||.||, lam_t <= sum |g|
    assert_within(dtheta, e_dth, 1e-9 * (mag * sn)[:, None, ..., None] + U32 * np.abs(e_dth),
                  "dtheta")
    th = np.abs(theta.astype(np.float64)).sum((0, 1))  # (H, NB, K)
    assert_within(dgen, e_dgen - 0.25, 1e-9 * (mag.sum(0)[..., None] * th)[..., None, None]
                  + 2 * U32 * (np.abs(e_dgen) + 0.25), "dgen (+=)")
    assert_within(dstart, e_dstart + 0.5, 2 * U32 * (np.abs(e_dstart) + 0.5)
                  + np.repeat(1e-9 * g.sum(0), b, -1).reshape(H, NB * b), "dstart (+=)")


def quaternion_basis(H, NB):
    """nc.c's coordinates: S_i = L(e_i) (i < 3), R(e_{i-3}) (i >= 3), (H, NB, 6, 4, 4)."""
    e, z = np.eye(3), np.zeros((3, 3))
    basis = np.concatenate([ref.quaternion_generator(e, z), ref.quaternion_generator(z, e)])
    return np.ascontiguousarray(np.broadcast_to(basis, (H, NB, 6, 4, 4)), np.float32)


def test_b4_k6_on_the_quaternion_basis_is_nc(rng):
    """Oracle: with nc.c's basis, theta = (u, v) and nc_general is nc_forward / nc_backward
    (within nc's float32 bounds, test_nc.bounds, plus this op's U32; nc's arrays are
    feature-major, nc_general's block-major: ref.nc_blocks converts)."""
    import test_nc
    B, T, H, NB = 2, 9, 2, 3
    w, start = test_nc.inputs(rng, B, T, H, NB)
    gen = quaternion_basis(H, NB)
    dp = randn(rng, B, T, H, 4 * NB)
    bp, bw, bs = (ref.nc_blocks(x, f) for x, f in zip(nc_bounds(w, start, dp), (4, 6, 4)))
    theta, bstart = (np.ascontiguousarray(ref.nc_blocks(x, f)) for x, f in ((w, 6), (start, 4)))
    bstart = bstart.reshape(H, 4 * NB)
    bdp = np.ascontiguousarray(ref.nc_blocks(dp, 4)).reshape(dp.shape)  # block-major dp
    p = _C.nc_general_forward(theta, gen, bstart).reshape(B, T, H, NB, 4)
    assert_within(p, ref.nc_blocks(_C.nc_forward(w, start), 4), bp + 2 * U32 * np.abs(p), "p")
    dgen, dstart, dstart_nc = np.zeros_like(gen), np.zeros_like(bstart), np.zeros_like(start)
    dtheta = _C.nc_general_backward(bdp, theta, gen, bstart, dgen, dstart)
    dw = ref.nc_blocks(_C.nc_backward(dp, w, start, dstart_nc), 6)
    assert_within(dtheta, dw, bw + 2 * U32 * np.abs(dw), "dtheta")
    dstart = dstart.reshape(H, NB, 4)
    assert_within(dstart, ref.nc_blocks(dstart_nc, 4), bs + 2 * U32 * np.abs(dstart), "dstart")


def test_commuting_plane_rotations_are_cumulative_sum_path_integration(rng):
    """Oracle: b = 6, K = 3 generators omega_i J in the disjoint planes (2i, 2i+1): the
    ordered product rotates plane i by omega_i cumsum_t(theta_t,i)."""
    B, T, H, NB, b, K = 2, 33, 2, 2, 6, 3
    theta = randn(rng, B, T, H, NB, K, scale=0.5)
    omega = randn(rng, H, NB, K)
    gen = np.zeros((H, NB, K, b, b), np.float32)
    for i in range(K):
        gen[..., i, 2 * i + 1, 2 * i], gen[..., i, 2 * i, 2 * i + 1] = omega[..., i], -omega[..., i]
    start = randn(rng, H, NB * b)
    phi = np.cumsum(theta.astype(np.float64), axis=1) * omega  # (B, T, H, NB, K)
    x, y = (start.astype(np.float64).reshape(H, NB, K, 2)[..., j] for j in (0, 1))
    c, s = np.cos(phi), np.sin(phi)
    expected = np.stack([c * x - s * y, s * x + c * y], -1).reshape(B, T, H, NB * b)
    p = _C.nc_general_forward(theta, gen, start)
    assert_within(p, expected, U32 * np.abs(expected) + 1e-9 * np.abs(start).max(), "p")


def test_rotations_stay_orthogonal_over_long_sequences(rng):
    """4096 steps of random skew generators (b = 5, K = 3): every block keeps |p*| (the chain
    is carried in double; the output is rounded once)."""
    theta, gen, start = inputs(rng, 1, 4096, 1, 2, 5, 3)
    p = _C.nc_general_forward(theta, gen, start).reshape(1, 4096, 1, 2, 5)
    norms = np.linalg.norm(p.astype(np.float64), axis=-1)
    expected = np.linalg.norm(start.reshape(1, 2, 5).astype(np.float64), axis=-1)
    assert np.allclose(norms, expected, rtol=2 * U32, atol=0)


def test_same_bits_for_any_thread_count(tmp_path):
    script = """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(3)
out = {}
for i, (B, T, H, NB, b, K) in enumerate([(4, 129, 2, 4, 3, 3), (3, 100, 3, 5, 4, 6)]):
    theta = rng.standard_normal((B, T, H, NB, K)).astype(np.float32) * 0.3
    a = rng.standard_normal((H, NB, K, b, b))
    gen = (a - np.swapaxes(a, -1, -2)).astype(np.float32)
    start = rng.standard_normal((H, NB * b)).astype(np.float32)
    dp = rng.standard_normal((B, T, H, NB * b)).astype(np.float32)
    dgen, dstart = np.zeros_like(gen), np.zeros_like(start)
    out[f"dtheta{i}"] = _C.nc_general_backward(dp, theta, gen, start, dgen, dstart)
    out[f"p{i}"] = _C.nc_general_forward(theta, gen, start)
    out[f"dgen{i}"], out[f"dstart{i}"] = dgen, dstart
np.savez(sys.argv[1], **out)
"""
    assert_same_bits_for_thread_counts(tmp_path, script)


def test_bad_input_names_the_argument(rng):
    theta, gen, start = inputs(rng, 2, 3, 2, 2, 3, 2)
    dp = randn(rng, 2, 3, 2, 6)
    dgen, dstart = np.zeros_like(gen), np.zeros_like(start)
    assert_array_argument_checked(lambda x: _C.nc_general_forward(theta, gen, x), "start",
                                  start, sizes=False)
    assert_array_argument_checked(lambda x: _C.nc_general_forward(x, gen, start), "theta",
                                  theta, sizes=False)
    assert_array_argument_checked(lambda x: _C.nc_general_forward(theta, x, start), "gen", gen)
    with raises_naming(ValueError, "gen"):  # b = 17: the message names b
        _C.nc_general_forward(randn(rng, 1, 2, 1, 1, 1), randn(rng, 1, 1, 1, 17, 17),
                              randn(rng, 1, 17))
    with pytest.raises(ValueError, match="block size b = 1"):
        _C.nc_general_forward(randn(rng, 1, 2, 1, 1, 1), randn(rng, 1, 1, 1, 1, 1),
                              randn(rng, 1, 1))
    with raises_naming(ValueError, "start"):  # D = 7 is not NB b = 6
        _C.nc_general_forward(theta, gen, randn(rng, 2, 7))
    assert_array_argument_checked(
        lambda x: _C.nc_general_backward(x, theta, gen, start, dgen, dstart), "dp", dp,
        sizes=False)
    assert_array_argument_checked(
        lambda x: _C.nc_general_backward(dp, theta, gen, start, x, dstart), "dgen", gen)
    assert_array_argument_checked(
        lambda x: _C.nc_general_backward(dp, theta, gen, start, dgen, x), "dstart", start)


def test_no_leaks(rng):
    theta, gen, start = inputs(rng, 2, 3, 2, 2, 3, 2)
    dp, dgen, dstart = randn(rng, 2, 3, 2, 6), np.zeros_like(gen), np.zeros_like(start)
    bad = randn(rng, 2, 7)

    def calls():
        _C.nc_general_forward(theta, gen, start)
        _C.nc_general_backward(dp, theta, gen, start, dgen, dstart)
        expect_error(_C.nc_general_forward, theta, gen, bad)
    assert_no_leaks(calls, (theta, gen, start, dp, dgen, dstart, bad), rounds=300)


# ---- the mapem_nc scheme with nc_block / nc_generators ----------------------------------------
def nc_model(backend, **options):
    from mapformer.models import ModelConfig, Transformer
    return Transformer(ModelConfig(
        vocab_size=7, d_model=48, n_heads=2, n_layers=1, mixer="conjunctive",
        positional="mapem_nc", options={"mapem_scores": "positional", "nc_hidden": 8,
                                        **options}), seed=4, backend=backend)


@pytest.mark.parametrize("options", [dict(nc_block=3, nc_map="linear"),
                                     dict(nc_block=6, nc_generators=2, nc_map="mlp"),
                                     dict(nc_block=4, nc_generators=2, nc_map="linear")])
def test_mapem_nc_general_gradients_match_finite_differences(options):
    """The numpy (float64) backend: the loss's gradient in the step map's weights, the
    generators A (S = A - A^T) and the start vectors against central differences."""
    model = nc_model("numpy", **options)
    b = options["nc_block"]
    k = options.get("nc_generators") or b * (b - 1) // 2
    assert model.params.params["blocks.0.mixer.scheme.gen"].value.shape == (2, 24 // b, k, b, b)
    rng = np.random.default_rng(5)
    tokens, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    mask = np.ones((2, 5), bool)
    loss = lambda: model.loss(tokens, targets, mask)  # noqa: E731
    loss()
    model.params.grad[...] = 0
    model.backward()
    names = ["blocks.0.mixer.scheme.steps.weight", "blocks.0.mixer.scheme.start",
             "blocks.0.mixer.scheme.gen"]
    assert_sampled_param_grads(model, loss, names, rng)


def test_default_block_keeps_the_quaternion_path():
    """nc_block 4 with K 0 or 6: no generator parameters, the same parameters and loss as the
    defaults (the nc op); another K declares ``gen``."""
    rng = np.random.default_rng(2)
    tokens, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    mask = np.ones((2, 5), bool)
    base = nc_model("c")
    for options in (dict(nc_block=4), dict(nc_block=4, nc_generators=6)):
        model = nc_model("c", **options)
        assert list(model.params.params) == list(base.params.params)
        assert model.loss(tokens, targets, mask) == base.loss(tokens, targets, mask)
    assert "blocks.0.mixer.scheme.gen" in nc_model("c", nc_block=4, nc_generators=5).params.params


def test_bad_block_names_the_option():
    with pytest.raises(ValueError, match="nc_block = 5, got head dim 24"):
        nc_model("c", nc_block=5)
    with pytest.raises(ValueError, match="nc_block must be at most 16"):
        nc_model("c", nc_block=24)


def test_c_backend_trains_a_generic_block(rng):
    """The C backend (float32) matches the numpy backend's loss and gradients on b = 3 and
    the loss falls over a few AdamW steps."""
    tokens, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    mask = np.ones((2, 5), bool)
    models = [nc_model(backend, nc_block=3, nc_generators=2) for backend in ("numpy", "c")]
    losses = [m.loss(tokens, targets, mask) for m in models]
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0])
    for m in models:
        m.params.grad[...] = 0
        m.backward()
    g64, g32 = (m.params.params["blocks.0.mixer.scheme.gen"].grad for m in models)
    assert np.allclose(g32, g64, rtol=1e-3, atol=1e-4 * np.abs(g64).max())


def test_cli_trains_mapem_nc_with_a_generic_block(tmp_path, capsys):
    import json
    from mapformer.__main__ import main
    main(["train", "--task", "rotation4d", "--steps", "4", "--n-objects", "3",
          "--sequences", "16", "--batch-size", "8", "--eval-sequences", "4", "--d-model",
          "48", "--n-heads", "2", "--mixer", "conjunctive", "--positional", "mapem_nc",
          "--nc-block", "6", "--nc-generators", "4", "--no-progress", "--json",
          "--out", str(tmp_path)])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 2
    assert all(0.0 <= result["eval"][n]["accuracy"] <= 1.0 for n in ("iid", "ood_sparse"))


def test_cuda_backend_names_the_missing_nc_general_kernel():
    """nc_general has no CUDA kernel: a backend of kernels without it raises MissingKernel
    naming the op and its family."""
    from types import SimpleNamespace

    from mapformer import backend as backends
    ops = backends.cuda_backend(SimpleNamespace(sln_forward=None), np, np.asarray)
    assert ops.families == ("sln",)
    with pytest.raises(backends.MissingKernel, match="nc_general_forward .family 'nc_general'"):
        ops.nc_general_forward
