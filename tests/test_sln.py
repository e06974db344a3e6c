"""MapEM-SLN's op sln (positions exp(cumsum(delta) A) p*, A a trace-free 2x2 generator per
block): the C op against the float64 reference, the reference against finite differences and an
independent matrix exponential, the MapEM oracle (a skew generator is a rotation), the clamp
at 4x a training length, bad input."""
import numpy as np
import pytest

from conftest import (U32, assert_array_argument_checked, assert_no_leaks,
                      assert_same_bits_for_thread_counts, assert_unchanged, assert_within,
                      copies, expect_error, numerical_grad, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

# (B, T, H, NB): 1s, odd and prime sizes; the last is past the single-thread threshold
SIZES = [(1, 1, 1, 1), (3, 7, 2, 3), (2, 13, 3, 5), (5, 41, 2, 8), (4, 257, 2, 16)]


def inputs(rng, B, T, H, NB, scale=0.3):
    """delta, gen (elliptic, hyperbolic and near-zero blocks mixed), start."""
    delta = randn(rng, B, T, H, NB, scale=scale)
    gen = randn(rng, H, NB, 4)
    gen.reshape(-1, 4)[::3] *= 1e-3  # some blocks near q = 0: the series
    return delta, gen, randn(rng, H, 2 * NB)


def expm(m):
    """exp of (..., n, n) float64 matrices by scaling and squaring of a Taylor series."""
    n = max(0, int(np.ceil(np.log2(max(np.abs(m).max(), 1e-300)))) + 4)
    a = m / 2.0**n
    out = np.broadcast_to(np.eye(m.shape[-1]), m.shape).copy()
    term = out.copy()
    for k in range(1, 20):
        term = term @ a / k
        out = out + term
    for _ in range(n):
        out = out @ out
    return out


def test_reference_is_the_matrix_exponential(rng):
    delta, gen, start = (x.astype(np.float64) for x in inputs(rng, 2, 9, 2, 6))
    p = ref.sln_forward(delta, gen, start, clamp=50.0)
    a = gen.reshape(2, 6, 2, 2) - np.trace(gen.reshape(2, 6, 2, 2), axis1=-2,
                                            axis2=-1)[..., None, None] / 2 * np.eye(2)
    assert np.allclose(np.trace(a, axis1=-2, axis2=-1), 0)
    phi = np.cumsum(delta, axis=1)
    expected = expm(phi[..., None, None] * a) @ start.reshape(2, 6, 2, 1)
    assert np.allclose(p, expected.reshape(p.shape), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("clamp", [50.0, 0.5])
def test_reference_matches_finite_differences(rng, clamp):
    delta, gen, start = (x.astype(np.float64) for x in inputs(rng, 2, 5, 2, 3, scale=0.8))
    w = rng.standard_normal((2, 5, 2, 6))
    f = lambda: float((w * ref.sln_forward(delta, gen, start, clamp)).sum())  # noqa: E731
    ddelta, dgen, dstart = ref.sln_backward(w, delta, gen, start, clamp)
    trace_free = numerical_grad(f, gen)
    trace_free[..., [0, 3]] -= trace_free[..., [0, 3]].mean(-1, keepdims=True)
    for got, num, name in [(ddelta, numerical_grad(f, delta), "ddelta"),
                           (dgen, trace_free, "dgen"), (dstart, numerical_grad(f, start),
                                                        "dstart")]:
        assert np.allclose(got, num, rtol=1e-6, atol=1e-6), name
    # the clamp engaged in the second case
    (_, _, _), _, _, dc, _, _, _ = ref._sln_parts(delta, gen, clamp)
    assert (clamp > 1) or (dc == 0).any()


def magnitude_bound(expected):
    """The C op computes in double and rounds once: one float32 rounding of each result plus
    a double-precision floor (1e-9 of the array's largest entry)."""
    return U32 * np.abs(expected) + 1e-9 * np.abs(expected).max()


@pytest.mark.parametrize("B,T,H,NB", SIZES)
def test_c_op_matches_reference(rng, B, T, H, NB):
    delta, gen, start = inputs(rng, B, T, H, NB)
    before = copies(delta, gen, start)
    p = _C.sln_forward(delta, gen, start, 3.0)
    assert p.dtype == np.float32 and p.shape == (B, T, H, 2 * NB)
    expected = ref.sln_forward(delta, gen, start, 3.0)
    assert_within(p, expected, magnitude_bound(expected), "p")
    dp = randn(rng, B, T, H, 2 * NB)
    dgen, dstart = np.full_like(gen, 0.5), np.full_like(start, -0.25)
    ddelta = _C.sln_backward(dp, delta, gen, start, dgen, dstart, 3.0)
    assert_unchanged(before, (delta, gen, start))
    e_ddelta, e_dgen, e_dstart = ref.sln_backward(dp, delta, gen, start, 3.0)
    assert_within(ddelta, e_ddelta, 2 * magnitude_bound(e_ddelta), "ddelta")
    # += rounds twice: the gradient to float32, then the sum with the old value
    assert_within(dgen, e_dgen + 0.5, 2 * magnitude_bound(np.abs(e_dgen) + 0.5), "dgen (+=)")
    assert_within(dstart, e_dstart - 0.25, 2 * magnitude_bound(np.abs(e_dstart) + 0.25),
                  "dstart (+=)")


def test_skew_generator_is_mapem(rng):
    """Oracle: A = omega S (S = [[0, -1], [1, 0]]) gives exp(Phi A) = R(omega Phi): the
    rotary op on path-integrated angles (MapEM)."""
    B, T, H, NB = 3, 11, 2, 4
    delta, _, start = inputs(rng, B, T, H, NB)
    omega = rng.uniform(0.1, 3.0, (H, NB)).astype(np.float32)
    gen = np.stack([np.zeros_like(omega), -omega, omega, np.zeros_like(omega)], axis=-1)
    p = _C.sln_forward(delta, gen, start)
    tiled = np.ascontiguousarray(np.broadcast_to(start, (B, T, H, 2 * NB)))
    mapem, _ = _C.rotary_forward(tiled, tiled, _C.path_integration_forward(delta, omega))
    assert np.allclose(p, mapem, rtol=0, atol=1e-5 * np.abs(start).max())


def test_hyperbolic_growth_is_capped_at_4x_the_training_length(rng):
    """Training length 64, test length 256 with a hyperbolic generator and delta = 1: every
    position and gradient stays finite, |p| never exceeds the clamp's bound, and past the
    clamp the positions stop moving and ddelta is 0 there."""
    B, T, H, NB, clamp = 2, 256, 1, 3, 10.0
    delta = np.ones((B, T, H, NB), np.float32)
    gen = np.tile(np.array([0.5, 0.2, 0.3, -0.5], np.float32), (H, NB, 1))  # q = 0.31
    start = randn(rng, H, 2 * NB)
    p = _C.sln_forward(delta, gen, start, clamp)
    q = 0.5**2 + 0.2 * 0.3
    bound = (np.cosh(clamp) + np.sinh(clamp) / np.sqrt(q) * 0.7) * np.abs(start).max() * 2
    assert np.isfinite(p).all() and np.abs(p).max() <= bound
    capped = int(np.ceil(clamp / np.sqrt(q)))  # Phi = t + 1 > clamp / sqrt(q) from here
    assert np.array_equal(p[:, capped:],
                          np.broadcast_to(p[:, capped:capped + 1], p[:, capped:].shape))
    assert np.abs(p[:, capped]).max() > 1e3 * np.abs(start).max()  # it did grow before
    dgen, dstart = np.zeros_like(gen), np.zeros_like(start)
    dp = randn(rng, B, T, H, 2 * NB)
    ddelta = _C.sln_backward(dp, delta, gen, start, dgen, dstart, clamp)
    assert np.isfinite(ddelta).all() and np.isfinite(dgen).all() and np.isfinite(dstart).all()
    assert (ddelta[:, capped:] == 0).all()


def test_same_bits_for_any_thread_count(tmp_path):
    script = """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(3)
delta = rng.standard_normal((4, 257, 2, 16)).astype(np.float32) * 0.3
gen = rng.standard_normal((2, 16, 4)).astype(np.float32)
start = rng.standard_normal((2, 32)).astype(np.float32)
dp = rng.standard_normal((4, 257, 2, 32)).astype(np.float32)
dgen, dstart = np.zeros_like(gen), np.zeros_like(start)
ddelta = _C.sln_backward(dp, delta, gen, start, dgen, dstart)
np.savez(sys.argv[1], p=_C.sln_forward(delta, gen, start), ddelta=ddelta, dgen=dgen,
         dstart=dstart)
"""
    assert_same_bits_for_thread_counts(tmp_path, script)


def test_bad_input_names_the_argument(rng):
    delta, gen, start = inputs(rng, 2, 3, 2, 3)
    dp = randn(rng, 2, 3, 2, 6)
    assert_array_argument_checked(lambda x: _C.sln_forward(delta, gen, x), "start", start,
                                  sizes=False)
    assert_array_argument_checked(lambda x: _C.sln_forward(x, gen, start), "delta", delta,
                                  sizes=False)  # delta fixes B and T
    with raises_naming(ValueError, "delta"):  # NB must be D / 2
        _C.sln_forward(randn(rng, 2, 3, 2, 4), randn(rng, 2, 4, 4), start)
    assert_array_argument_checked(lambda x: _C.sln_forward(delta, x, start), "gen", gen)

    def backward(**kw):
        args = dict(dp=dp, delta=delta, gen=gen, start=start, dgen=np.zeros_like(gen),
                    dstart=np.zeros_like(start))
        args.update(kw)
        return _C.sln_backward(**args)
    assert_array_argument_checked(lambda x: backward(dp=x), "dp", dp, sizes=False)
    with raises_naming(ValueError, "dp"):  # D fixed by start
        backward(dp=randn(rng, 2, 3, 2, 8))
    assert_array_argument_checked(lambda x: backward(dgen=x), "dgen", gen)
    assert_array_argument_checked(lambda x: backward(dstart=x), "dstart", start)
    for clamp in (0.0, -1.0, 81.0, float("nan")):
        with raises_naming(ValueError, "clamp"):
            _C.sln_forward(delta, gen, start, clamp)
    with raises_naming(ValueError, "start"):  # odd head dim
        _C.sln_forward(delta, gen, randn(rng, 2, 5))


def test_no_leaks(rng):
    delta, gen, start = inputs(rng, 2, 3, 2, 3)
    dp, dgen, dstart = randn(rng, 2, 3, 2, 6), np.zeros_like(gen), np.zeros_like(start)
    bad = randn(rng, 2, 3, 2, 4)

    def calls():
        _C.sln_forward(delta, gen, start)
        _C.sln_backward(dp, delta, gen, start, dgen, dstart)
        expect_error(_C.sln_forward, bad, gen, start)
    assert_no_leaks(calls, (delta, gen, start, dp, dgen, dstart, bad), rounds=300)


# ---- the mapem_sln scheme in a model --------------------------------------------------------
def sln_and_mapem(backend):
    from mapformer.models import ModelConfig, Transformer
    make = lambda positional: Transformer(ModelConfig(  # noqa: E731
        vocab_size=9, d_model=32, n_heads=2, n_layers=1, mixer="conjunctive",
        positional=positional, options={"mapem_scores": "positional"}), seed=2,
        backend=backend)
    sln, mapem = make("mapem_sln"), make("mapem")
    for name, p in mapem.params.params.items():  # the same W_Delta, p*, mixer and head
        if name in sln.params.params:
            sln.params.params[name].value[...] = p.value
    omega = mapem.params.params["blocks.0.mixer.scheme.omega"].value
    gen = sln.params.params["blocks.0.mixer.scheme.gen"].value
    assert np.array_equal(gen[..., 2], omega) and np.array_equal(gen[..., 1], -omega)
    return sln, mapem


@pytest.mark.parametrize("backend,tol", [("numpy", 1e-10), ("c", 1e-4)])
def test_mapem_sln_at_init_is_mapem_s(backend, tol):
    """Initialised to A = omega S with MapEM's parameters, the model is MapEM-s: the same
    logits and the same gradients of W_Delta and p*."""
    sln, mapem = sln_and_mapem(backend)
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 9, (2, 11)), rng.integers(0, 9, (2, 11))
    mask = rng.random((2, 11)) < 0.5
    assert np.isclose(sln.loss(tokens, targets, mask), mapem.loss(tokens, targets, mask),
                      rtol=tol)
    np.testing.assert_allclose(sln.logits, mapem.logits, rtol=tol, atol=tol)
    sln.backward()
    mapem.backward()
    for name in ("delta_in.weight", "delta_out.weight", "start"):
        full = f"blocks.0.mixer.scheme.{name}"
        np.testing.assert_allclose(sln.params.params[full].grad,
                                   mapem.params.params[full].grad, rtol=tol * 10,
                                   atol=tol * 10)


def test_mapem_sln_model_at_4x_the_training_length_stays_finite():
    """Hyperbolic generators and sequences 4x a training length of 32 tokens: the clamp
    keeps every logit and gradient finite."""
    sln, _ = sln_and_mapem("c")
    sln.params.params["blocks.0.mixer.scheme.gen"].value[...] = [3.0, 2.0, 2.0, -3.0]
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 9, (2, 128))
    loss = sln.loss(tokens, rng.integers(0, 9, (2, 128)), np.ones((2, 128), bool))
    assert np.isfinite(loss) and np.isfinite(sln.logits).all()
    sln.backward()
    assert np.isfinite(sln.params.grad).all()
