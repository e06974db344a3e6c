"""MapEM-NC's op nc (the ordered product exp(S_t) ... exp(S_1) p* of per-token 4x4 rotations,
through a pair of unit-quaternion prefix products): the reference against a product of matrix
exponentials and finite differences, the C op against the reference, the oracle (commuting
steps, all along one generator, equal b4's cumulative-sum path integration), norm preservation
at length 4096, threads, bad input."""
import numpy as np
import pytest

from conftest import (U32, assert_array_argument_checked, assert_no_leaks,
                      assert_sampled_param_grads, assert_same_bits_for_thread_counts,
                      assert_unchanged, assert_within, copies, expect_error, numerical_grad,
                      randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref
from test_sln import expm

# (B, T, H, NB): 1s, odd and prime sizes, NB blocks per head (a group of the op's lanes is
# consecutive blocks of one head) of 1, 3, 12, 5, 8, 20 and 33 (within one group, a partial
# group after whole ones at every vector width); the last is past the single-thread threshold
SIZES = [(1, 1, 1, 1), (3, 7, 2, 3), (1, 9, 3, 3), (2, 5, 1, 12), (2, 13, 3, 5),
         (2, 7, 2, 20), (1, 5, 1, 33), (4, 257, 2, 8)]


def inputs(rng, B, T, H, NB):
    """w (B, T, H, 6, NB), start (H, 4 NB) in the op's feature-major layout
    (ref.nc_blocks)."""
    w = randn(rng, B, T, H, NB, 6, scale=0.5)
    w.reshape(-1, 6)[::3, :3] *= 1e-3  # some steps near 0: the series
    return ref.nc_features(w), randn(rng, H, 4 * NB)


def test_reference_is_the_ordered_product_of_matrix_exponentials(rng):
    w, start = (x.astype(np.float64) for x in inputs(rng, 2, 5, 2, 3))
    wb = ref.nc_blocks(w, 6)  # (B, T, H, NB, 6)
    S = ref.quaternion_generator(wb[..., :3], wb[..., 3:])  # (B, T, H, NB, 4, 4)
    P = np.broadcast_to(np.eye(4), (2, 2, 3, 4, 4))
    p = ref.nc_blocks(ref.nc_forward(w, start), 4)  # (B, T, H, NB, 4)
    for t in range(5):
        P = expm(S[:, t]) @ P
        assert np.allclose(p[:, t], (P @ ref.nc_blocks(start, 4)[..., None])[..., 0],
                           atol=1e-10)
    # the steps do not commute: the reversed order gives another product
    reversed_p = ref.nc_blocks(ref.nc_forward(w[:, ::-1].copy(), start), 4)
    assert np.abs(reversed_p[:, -1] - p[:, -1]).max() > 1e-2


def test_reference_matches_finite_differences(rng):
    w, start = (x.astype(np.float64) for x in inputs(rng, 2, 5, 2, 2))
    g = rng.standard_normal((2, 5, 2, 8))
    f = lambda: float((g * ref.nc_forward(w, start)).sum())  # noqa: E731
    dw, dstart = ref.nc_backward(g, w, start)
    assert np.allclose(dw, numerical_grad(f, w), rtol=1e-6, atol=1e-6)
    assert np.allclose(dstart, numerical_grad(f, start), rtol=1e-6, atol=1e-6)


def test_commuting_steps_are_cumulative_sum_path_integration(rng):
    """Oracle: every step along one generator, w_t = delta_t (u, v): the ordered product is
    exp(cumsum(delta) S), b4's path integration."""
    B, T, H, NB = 3, 17, 2, 3
    delta = randn(rng, B, T, H, NB, scale=0.5)
    gen = randn(rng, H, NB, 6)
    start = randn(rng, H, 4 * NB)
    w = ref.nc_features(delta[..., None] * gen)  # b4's layout is block-major
    p = _C.nc_forward(w, ref.nc_features(start.reshape(H, NB, 4)))
    assert np.allclose(p, ref.nc_features(_C.b4_forward(delta, gen, start).reshape(
        B, T, H, NB, 4)), atol=2e-5 * np.abs(start).max())


def chain_error(w):
    """Float32 error bound of the op's chains (p_t = a_t p_{t-1} c_t in the forward, A_t and
    C_t in the backward), in units of U32 (times |p*| for p), per (B, t, H, NB) (w
    block-major: (B, T, H, NB, 6)): each step adds
    its own. qexp per component: below |w| = 1.5 Horner sums of degree 6 in |w|^2, gamma_12
    times cosh 1.5 (cos) or sinh(1.5) / 1.5 (sinc), so at most 30; above, the norm's relative
    error (sqrt, 2.5 ulp) times |w| through vsincos (1 ulp) and the division: 4 + 3 |w|;
    2 (30 + 3 |w|) in the 2-norm, for u and v. Each quaternion product gamma_4 (each
    component a sum of 4 products of unit factors) and the renormalisation 3 ulp: 2 (4 + 3) in
    the 2-norm, twice. Products by unit quaternions carry the earlier errors unchanged in norm.
    So sum over tau <= t of 150 + 6 (|u_tau| + |v_tau|)."""
    w = w.astype(np.float64)
    step = 150 + 6 * (np.linalg.norm(w[..., :3], axis=-1) + np.linalg.norm(w[..., 3:], axis=-1))
    return np.cumsum(step, axis=1)


def bounds(w, start, dp):
    """Elementwise float32 bounds of the op against the float64 reference (chain_error E_A):
    p_t: |p*| U32 (E_A(t) + 16), plus its own rounding;
    dw_t = |p*| (c1 y + c2 (w.y) w + c3 X) with y = Z_{t+1} + vec(g_t conj(phat_t)) and
    Z_t = conj(a_t) y a_t (for u; W_t the same with c_t for v), phat_t = p_t / |p*| (the chain
    from p* / |p*|): each term vec(g_tau conj(phat_tau)) is off by at most |g_tau| U32
    (E_A(tau) + 16), each rotation of Z (coefficients from the same qexp, whose error E_A counts
    per step) adds at most its step's share of E_A(T) times |Z| <= G = sum_tau |g_tau|, the
    float sums of at most T terms gamma_T of their magnitudes; with E = max_t E_A(t) this is
    within |p*| G U32 (3 E + T + 40) (the bound of the earlier form of the backward, through
    the prefix products A_t, C_t, kept); the gradient's map multiplies by at most
    1 + |w| + |w|^2 (as sinc cos y + k (w.y) w + sinc^2 w x y, k = (1 - sinc cos) / n^2 <= 2/3,
    |sinc^2 w| < 1) and its own coefficients (k's series to degree 7 in |w|^2: gamma_14 of
    magnitudes near 1) add 16 ulp of |y| <= |p*| G to each of the three terms.
    dp* = sum_b E_1, E_1 = (sig_1, Z_1) phat: G U32 (E + T + 16) per row, summed in double.
    Arguments and bounds in the op's layout."""
    w = ref.nc_blocks(w, 6)
    B, T, H, NB, _ = w.shape
    ea = chain_error(w)  # (B, T, H, NB)
    s = np.linalg.norm(start.astype(np.float64).reshape(H, NB, 4), axis=-1)
    g = np.linalg.norm(dp.astype(np.float64).reshape(B, T, H, NB, 4), axis=-1).sum(1)  # (B,H,NB)
    bp = ref.nc_features(np.repeat((s * U32 * (ea + 16))[..., None], 4, axis=-1))
    e = ea.max(1)  # (B, H, NB)
    da = s * g * U32 * (3 * e + T + 40)
    wn = np.maximum(np.linalg.norm(w[..., :3].astype(np.float64), axis=-1),
                    np.linalg.norm(w[..., 3:].astype(np.float64), axis=-1))
    bw = ref.nc_features(np.repeat(((1 + wn + wn ** 2) * (da + 16 * U32 * s * g)[:, None])[
        ..., None], 6, axis=-1))
    bs = ref.nc_features(np.repeat((g * U32 * (e + T + 16)).sum(0)[..., None], 4, axis=-1))
    return bp, bw, bs


@pytest.mark.parametrize("B,T,H,NB", SIZES)
def test_c_op_matches_reference(rng, B, T, H, NB):
    w, start = inputs(rng, B, T, H, NB)
    before = copies(w, start)
    p = _C.nc_forward(w, start)
    assert p.dtype == np.float32 and p.shape == (B, T, H, 4 * NB)
    expected = ref.nc_forward(w, start)
    dp = randn(rng, B, T, H, 4 * NB)
    bp, bw, bs = bounds(w, start, dp)
    assert_within(p, expected, bp + U32 * np.abs(expected), "p")
    dstart = np.full_like(start, -0.25)
    dw = _C.nc_backward(dp, w, start, dstart)
    assert_unchanged(before, (w, start))
    e_dw, e_dstart = ref.nc_backward(dp, w, start)
    assert_within(dw, e_dw, bw + U32 * np.abs(e_dw), "dw")
    assert_within(dstart, e_dstart - 0.25, bs + 2 * U32 * (np.abs(e_dstart) + 0.25),
                  "dstart (+=)")


def test_zero_start_blocks(rng):
    """A block with p* = 0 (the backward runs its chain from p* / |p*|, from 1 there): p and
    dw are 0 on it, dp* is still E_1 = sum_t conj(A_t) g_t conj(C_t). A block with
    |p*|^2 <= 1e-30 is such a block (it grew by the renormalisation's 3/2 a step before)."""
    w, start = inputs(rng, 2, 9, 1, 3)
    start[0, 1::3] = 0.0  # block 1: components at f NB + 1
    start[0, 2::3] = 1e-17  # block 2: |p*|^2 = 4e-34
    dp = randn(rng, 2, 9, 1, 12)
    p = _C.nc_forward(w, start)
    assert np.all(p[..., 1::3] == 0.0) and np.all(p[..., 2::3] == 0.0)
    dstart = np.zeros_like(start)
    dw = _C.nc_backward(dp, w, start, dstart)
    assert np.all(dw[..., 1] == 0.0)
    e_dw, e_dstart = ref.nc_backward(dp, w, start)
    bp, bw, bs = bounds(w, start, dp)
    assert_within(dw, e_dw, bw + U32 * np.abs(e_dw), "dw")
    assert_within(dstart, e_dstart, bs + 2 * U32 * np.abs(e_dstart), "dstart")
    assert np.abs(e_dstart[0, 1::3]).max() > 0.1


def test_rotations_stay_orthogonal_over_long_sequences(rng):
    """4096 steps: the norm of every block of p_t is |p*|'s (the prefix products are
    renormalised every step)."""
    w, start = inputs(rng, 1, 4096, 1, 2)
    p = ref.nc_blocks(_C.nc_forward(w, start), 4)
    norms = np.linalg.norm(p.astype(np.float64), axis=-1)
    expected = np.linalg.norm(ref.nc_blocks(start, 4).astype(np.float64), axis=-1)
    assert np.allclose(norms, expected, rtol=8 * U32)


def test_same_bits_for_any_thread_count(tmp_path):
    script = """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(3)
out = {}
# 8, 5 and 20 blocks a row (partial and several groups a head); the fourth writes p and dw by
# non-temporal stores on AVX-512 (nc.c: 64-byte aligned, NB a multiple of 16)
for i, (B, T, H, NB) in enumerate([(4, 257, 2, 8), (3, 191, 3, 5), (2, 129, 2, 20),
                                   (32, 256, 2, 16)]):
    w = rng.standard_normal((B, T, H, 6, NB)).astype(np.float32) * 0.3
    start = rng.standard_normal((H, 4 * NB)).astype(np.float32)
    dp = rng.standard_normal((B, T, H, 4 * NB)).astype(np.float32)
    dstart = np.zeros_like(start)
    out[f"dw{i}"] = _C.nc_backward(dp, w, start, dstart)
    out[f"p{i}"], out[f"dstart{i}"] = _C.nc_forward(w, start), dstart
np.savez(sys.argv[1], **out)
"""
    assert_same_bits_for_thread_counts(tmp_path, script)


@pytest.mark.parametrize("B,T,H,NB", [(3, 7, 2, 3), (2, 13, 3, 5), (2, 9, 2, 16),
                                     (2, 11, 3, 11), (2, 7, 2, 20), (1, 5, 1, 33),
                                     (4, 257, 2, 8), (32, 256, 2, 16), (19, 256, 2, 32),
                                     (43, 256, 2, 12)])
def test_same_bits_on_every_kernel_set(rng, B, T, H, NB):
    """The active kernel set picks the group width (16 lanes on AVX-512, the target_clones'
    width elsewhere): the lanes never interact, so every set gives the same bits, for heads
    of 3 to 33 blocks (partial groups, whole ones, several a head). (32, 256, 2, 16) and
    (19, 256, 2, 32) write p and dw (4 MB and more) by non-temporal stores on AVX-512 (nc.c);
    the last is as large with partial groups, stored the ordinary way."""
    w, start = inputs(rng, B, T, H, NB)
    w.reshape(-1, 6)[::7] *= 4.0  # steps past the Taylor range
    dp = randn(rng, B, T, H, 4 * NB)
    before, results = _C.kernels(), {}
    try:
        for kset in _C.kernel_sets():
            _C.set_kernels(kset)
            dstart = np.full_like(start, 0.5)
            results[kset] = (_C.nc_forward(w, start), _C.nc_backward(dp, w, start, dstart),
                             dstart)
    finally:
        _C.set_kernels(before)
    first = next(iter(results.values()))
    for kset, got in results.items():
        for a, b, name in zip(got, first, ("p", "dw", "dstart")):
            assert np.array_equal(a, b), f"{name} on {kset}"


def test_bad_input_names_the_argument(rng):
    w, start = inputs(rng, 2, 3, 2, 2)
    dp = randn(rng, 2, 3, 2, 8)
    assert_array_argument_checked(lambda x: _C.nc_forward(w, x), "start", start, sizes=False)
    assert_array_argument_checked(lambda x: _C.nc_forward(x, start), "w", w, sizes=False)
    with raises_naming(ValueError, "w"):  # NB must be D / 4
        _C.nc_forward(randn(rng, 2, 3, 2, 6, 3), start)
    with raises_naming(ValueError, "w"):  # 6 numbers per block
        _C.nc_forward(randn(rng, 2, 3, 2, 5, 2), start)
    with raises_naming(ValueError, "start"):  # D not a multiple of 4
        _C.nc_forward(randn(rng, 2, 3, 2, 6, 1), randn(rng, 2, 6))
    assert_array_argument_checked(lambda x: _C.nc_backward(x, w, start, np.zeros_like(start)),
                                  "dp", dp, sizes=False)
    assert_array_argument_checked(lambda x: _C.nc_backward(dp, w, start, x), "dstart", start)


def test_no_leaks(rng):
    w, start = inputs(rng, 2, 3, 2, 2)
    dp, dstart = randn(rng, 2, 3, 2, 8), np.zeros_like(start)
    bad = randn(rng, 2, 3, 2, 6, 3)

    def calls():
        _C.nc_forward(w, start)
        _C.nc_backward(dp, w, start, dstart)
        expect_error(_C.nc_forward, bad, start)
    assert_no_leaks(calls, (w, start, dp, dstart, bad), rounds=300)


# ---- the mapem_nc scheme in a model ---------------------------------------------------------
@pytest.mark.parametrize("nc_map", ["linear", "mlp"])
def test_mapem_nc_gradients_match_finite_differences(nc_map):
    """The numpy (float64) backend: the loss's gradient in the step map's weights, the start
    vectors and the token embedding against central differences."""
    from mapformer.models import ModelConfig, Transformer
    model = Transformer(ModelConfig(
        vocab_size=7, d_model=32, n_heads=2, n_layers=1, mixer="conjunctive",
        positional="mapem_nc", options={"mapem_scores": "positional", "nc_map": nc_map,
                                        "nc_hidden": 8}), seed=4, backend="numpy")
    rng = np.random.default_rng(5)
    tokens, targets = rng.integers(0, 7, (2, 6)), rng.integers(0, 7, (2, 6))
    mask = np.ones((2, 6), bool)
    loss = lambda: model.loss(tokens, targets, mask)  # noqa: E731
    loss()
    model.params.grad[...] = 0
    model.backward()
    names = ["blocks.0.mixer.scheme.steps.weight", "blocks.0.mixer.scheme.start"]
    if nc_map == "mlp":
        names.append("blocks.0.mixer.scheme.hidden.weight")
    assert_sampled_param_grads(model, loss, names, rng)


def test_cli_trains_mapem_nc_on_rotation4d(tmp_path, capsys):
    import json
    from mapformer.__main__ import main
    main(["train", "--task", "rotation4d", "--steps", "6", "--n-objects", "3",
          "--sequences", "16", "--batch-size", "8", "--eval-sequences", "4", "--d-model",
          "32", "--n-heads", "2", "--mixer", "conjunctive", "--positional", "mapem_nc",
          "--nc-map", "mlp", "--nc-hidden", "16", "--no-progress", "--json",
          "--out", str(tmp_path)])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 2
    assert all(0.0 <= result["eval"][n]["accuracy"] <= 1.0 for n in ("iid", "ood_sparse"))
