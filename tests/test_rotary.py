"""C path integration and rotary ops against the float64 reference, plus the properties that
make them MapFormer's positional encoding (RoPE as a special case, relative positions)."""
import numpy as np
import pytest

from conftest import (assert_close, assert_no_leaks, assert_refuses_bad_versions,
                      assert_same_bits_for_thread_counts, assert_unchanged, copies,
                      expect_error, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

SIZES = [(B, T, H, D) for T in (1, 7, 97, 257) for B in (1, 2) for H in (1, 3)
         for D in (16, 64, 128)]
# Past the single-thread thresholds and past one column block (256 columns / 256 pairs), so the
# OpenMP split and the block loops are exercised too.
BIG = [(2, 257, 3, 200), (3, 130, 3, 256), (5, 33, 1, 2)]


def angle_close(actual, expected, name="theta"):
    """Angles equal modulo 2 pi: compare expected + wrap(actual - expected) with expected."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert_close(expected + ref.wrap_angle(actual - expected), expected, "default", name)


def omega_init(rng, H, NB):
    """Frequencies as the model initialises them: geometric from 2 pi down to 2 pi / 64."""
    om = 2 * np.pi * np.geomspace(1.0, 1.0 / 64, NB)
    return (om * rng.uniform(0.8, 1.2, (H, NB))).astype(np.float32)


# ---- path integration ---------------------------------------------------------------------
@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
def test_path_integration_forward(rng, B, T, H, D):
    NB = D // 2
    delta, omega = randn(rng, B, T, H, NB), omega_init(rng, H, NB)
    before = copies(delta, omega)
    theta = _C.path_integration_forward(delta, omega)
    assert theta.dtype == np.float32 and theta.shape == (B, T, H, NB)
    angle_close(theta, ref.path_integration_forward(delta, omega))
    # wrapped into [-pi, pi] (float32 rounding may land on pi's float neighbour)
    assert np.all(np.abs(theta) <= np.float32(np.pi))
    assert_unchanged(before, [delta, omega])


@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
def test_path_integration_backward(rng, B, T, H, D):
    NB = D // 2
    delta, omega, dtheta = randn(rng, B, T, H, NB), omega_init(rng, H, NB), randn(rng, B, T, H, NB)
    prefill = randn(rng, H, NB)
    domega = prefill.copy()
    before = copies(dtheta, delta, omega)
    ddelta = _C.path_integration_backward(dtheta, delta, omega, domega)
    rdd, rdom = ref.path_integration_backward(dtheta, delta, omega)
    assert ddelta.dtype == np.float32 and ddelta.shape == (B, T, H, NB)
    # both are double sums rounded once to float32
    assert_close(ddelta, rdd, "default", "ddelta")
    assert_close(domega, prefill.astype(np.float64) + rdom, "default", "domega")
    assert_unchanged(before, [dtheta, delta, omega])


def test_path_integration_domega_accumulates(rng):
    B, T, H, NB = 2, 9, 3, 4
    delta, omega, dtheta = randn(rng, B, T, H, NB), omega_init(rng, H, NB), randn(rng, B, T, H, NB)
    _, rdom = ref.path_integration_backward(dtheta, delta, omega)
    domega = np.full((H, NB), 0.5, np.float32)
    for calls in (1, 2, 3):
        _C.path_integration_backward(dtheta=dtheta, delta=delta, omega=omega, domega=domega)
        assert_close(domega, 0.5 + calls * rdom, "default", f"domega after {calls} calls")


def test_path_integration_large_angles(rng):
    """OOD lengths: delta ~ N(0, 3) over T = 2048 gives cumulative angles in the thousands of
    radians. The double cumsum and the wrap keep every angle exact to float32 rounding."""
    B, T, H, NB = 2, 2048, 2, 32
    delta = randn(rng, B, T, H, NB, scale=3.0)
    omega = omega_init(rng, H, NB)
    theta = _C.path_integration_forward(delta, omega)
    exact = ref.path_integration_forward(delta, omega, wrap=False)
    assert np.abs(exact).max() > 500  # the case this test is about
    angle_close(theta, exact)
    # the rotation built from theta is the rotation by the exact angle
    q, k = randn(rng, B, T, H, 2 * NB), randn(rng, B, T, H, 2 * NB)
    q_out, k_out = _C.rotary_forward(q, k, theta)
    rq, rk = ref.rotary_forward(q, k, exact)
    assert_close(q_out, rq, "default", "q_out")
    assert_close(k_out, rk, "default", "k_out")
    # The test can fail: a float32 cumulative sum is off by ~1e-3 rad here.
    naive = omega * np.cumsum(delta, axis=1, dtype=np.float32)
    assert np.abs(ref.wrap_angle(naive - exact)).max() > 1e-4


def test_path_integration_backward_long(rng):
    B, T, H, NB = 2, 2048, 2, 32
    delta, dtheta = randn(rng, B, T, H, NB, scale=3.0), randn(rng, B, T, H, NB)
    omega = omega_init(rng, H, NB)
    domega = np.zeros((H, NB), np.float32)
    ddelta = _C.path_integration_backward(dtheta, delta, omega, domega)
    rdd, rdom = ref.path_integration_backward(dtheta, delta, omega)
    assert_close(ddelta, rdd, "default", "ddelta")
    assert_close(domega, rdom, "default", "domega")


# ---- rotary -------------------------------------------------------------------------------
def rotary_inputs(rng, B, T, H, D, TB, angle_scale=np.pi):
    q, k = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    theta = rng.uniform(-angle_scale, angle_scale, (TB, T, H, D // 2)).astype(np.float32)
    return q, k, theta


@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
@pytest.mark.parametrize("tb", ["one", "B"])
def test_rotary_forward(rng, B, T, H, D, tb):
    TB = 1 if tb == "one" else B
    q, k, theta = rotary_inputs(rng, B, T, H, D, TB)
    before = copies(q, k, theta)
    q_out, k_out = _C.rotary_forward(q, k, theta)
    rq, rk = ref.rotary_forward(q, k, theta)
    assert q_out.dtype == k_out.dtype == np.float32
    assert_close(q_out, rq, "default", "q_out")
    assert_close(k_out, rk, "default", "k_out")
    assert_unchanged(before, [q, k, theta])


@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
@pytest.mark.parametrize("tb", ["one", "B"])
def test_rotary_backward(rng, B, T, H, D, tb):
    TB = 1 if tb == "one" else B
    q, k, theta = rotary_inputs(rng, B, T, H, D, TB)
    dq_out, dk_out = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    before = copies(dq_out, dk_out, q, k, theta)
    dq, dk, dtheta = _C.rotary_backward(dq_out, dk_out, q, k, theta)
    rdq, rdk, rdtheta = ref.rotary_backward(dq_out, dk_out, q, k, theta)
    assert dtheta.shape == (TB, T, H, D // 2) and dtheta.dtype == np.float32
    assert_close(dq, rdq, "default", "dq")
    assert_close(dk, rdk, "default", "dk")
    # dtheta = sum over q and k (and b when TB = 1) of y0 dy1 - y1 dy0: products of O(1)
    # numbers that cancel, so its float32 error is absolute, ~eps32 * |x| |dy| per term.
    assert_close(dtheta, rdtheta, "reduction", "dtheta")
    assert_unchanged(before, [dq_out, dk_out, q, k, theta])


def test_rotary_far_and_special_angles(rng):
    """Angles beyond the polynomial's range (|theta| > 8192) and non-finite ones take the libm
    path; results still match the reference (NaN where the angle is not finite)."""
    B, T, H, D = 2, 5, 1, 64
    q, k, _ = rotary_inputs(rng, B, T, H, D, B)
    theta = rng.uniform(-3e4, 3e4, (B, T, H, D // 2)).astype(np.float32)
    just_past = np.nextafter(np.float32(8192), np.float32(1e9))
    theta[0, 0, 0, :6] = [8192.0, -8192.0, just_past, 0.0, -0.0, 1e30]
    theta[1, 2, 0, 3] = np.inf
    theta[1, 3, 0, 4] = np.nan
    q_out, k_out = _C.rotary_forward(q, k, theta)
    with np.errstate(invalid="ignore"):
        rq, rk = ref.rotary_forward(q, k, theta)
        dq, dk, dtheta = _C.rotary_backward(q, k, q, k, theta)
        rdq, rdk, rdtheta = ref.rotary_backward(q, k, q, k, theta)
    pairs = ((q_out, rq, "q_out"), (k_out, rk, "k_out"), (dq, rdq, "dq"), (dk, rdk, "dk"))
    for got, want, name in pairs:
        bad = ~np.isfinite(want)
        assert np.array_equal(bad, ~np.isfinite(got)), name
        assert_close(np.where(bad, 0, got), np.where(bad, 0, want), "default", name)
    bad = ~np.isfinite(rdtheta)
    assert np.array_equal(bad, ~np.isfinite(dtheta))
    assert_close(np.where(bad, 0, dtheta), np.where(bad, 0, rdtheta), "reduction", "dtheta")


def test_rope_identity(rng):
    """delta = 1 and omega_i = 10000^(-2i/D): path integration then rotary is standard RoPE at
    positions 1..T (the cumulative sum starts at the first token)."""
    B, T, H, D = 2, 257, 2, 64
    NB = D // 2
    omega = np.tile(10000.0 ** (-2.0 * np.arange(NB) / D), (H, 1)).astype(np.float32)
    theta = _C.path_integration_forward(np.ones((B, T, H, NB), np.float32), omega)
    q, k = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    pos = np.arange(1, T + 1, dtype=np.float64)[None, :, None, None]
    ang = pos * omega.astype(np.float64)[None, None]  # (1, T, H, NB), exact
    c, s = np.cos(ang), np.sin(ang)

    def rope(x):
        x = x.astype(np.float64)
        y = np.empty_like(x)
        y[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        y[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return y

    for th in (theta, theta[:1]):  # per-batch angles and the broadcast (TB = 1) form
        q_out, k_out = _C.rotary_forward(q, k, th)
        assert_close(q_out, rope(q), "default", "q_out")
        assert_close(k_out, rope(k), "default", "k_out")


def test_relative_position(rng):
    """(R(theta_i) q_i) . (R(theta_j) k_j) = q_i . R(theta_j - theta_i) k_j depends only on the
    angle differences: shifting every angle by the same offset leaves all scores unchanged."""
    B, T, H, D = 1, 16, 1, 32
    q, k, theta = rotary_inputs(rng, B, T, H, D, 1)
    shift = rng.uniform(-20, 20, (1, 1, 1, D // 2)).astype(np.float32)

    def scores(th):
        q_out, k_out = _C.rotary_forward(q, k, th)
        return np.einsum("id,jd->ij", q_out[0, :, 0].astype(np.float64), k_out[0, :, 0])

    s0 = scores(theta)
    rel = np.empty((T, T))
    for i in range(T):
        for j in range(T):
            d = theta[0, j, 0].astype(np.float64) - theta[0, i, 0]
            kj = k[0, j, 0].astype(np.float64)
            rk = np.empty(D)
            rk[0::2] = kj[0::2] * np.cos(d) - kj[1::2] * np.sin(d)
            rk[1::2] = kj[0::2] * np.sin(d) + kj[1::2] * np.cos(d)
            rel[i, j] = q[0, i, 0].astype(np.float64) @ rk
    # scores are sums over D = 32 products
    assert_close(s0, rel, "reduction", "scores vs q . R(theta_j - theta_i) k")
    assert_close(scores((theta + shift).astype(np.float32)), s0, "reduction", "shifted scores")
    # and the scores do depend on the differences (the test can fail)
    other = theta.copy()
    other[0, 3] += 1.0
    assert np.abs(scores(other) - s0).max() > 1e-2


# ---- bad input ----------------------------------------------------------------------------
def good_args(rng):
    B, T, H, D = 2, 3, 2, 8
    NB = D // 2
    return {
        "pif": dict(delta=randn(rng, B, T, H, NB), omega=randn(rng, H, NB)),
        "pib": dict(dtheta=randn(rng, B, T, H, NB), delta=randn(rng, B, T, H, NB),
                    omega=randn(rng, H, NB), domega=np.zeros((H, NB), np.float32)),
        "rf": dict(q=randn(rng, B, T, H, D), k=randn(rng, B, T, H, D),
                   theta=randn(rng, B, T, H, NB)),
        "rb": dict(dq_out=randn(rng, B, T, H, D), dk_out=randn(rng, B, T, H, D),
                   q=randn(rng, B, T, H, D), k=randn(rng, B, T, H, D),
                   theta=randn(rng, 1, T, H, NB)),
    }


FUNCS = {"pif": "path_integration_forward", "pib": "path_integration_backward",
         "rf": "rotary_forward", "rb": "rotary_backward"}
ARGS = [(f, a) for f, args in (("pif", ("delta", "omega")),
                               ("pib", ("dtheta", "delta", "omega", "domega")),
                               ("rf", ("q", "k", "theta")),
                               ("rb", ("dq_out", "dk_out", "q", "k", "theta")))
        for a in args]


def call(fn, kwargs):
    return getattr(_C, FUNCS[fn])(**kwargs)


def test_good_args_work(rng):
    for fn, kwargs in good_args(rng).items():
        call(fn, kwargs)
    # positional arguments too
    g = good_args(rng)["rb"]
    _C.rotary_backward(g["dq_out"], g["dk_out"], g["q"], g["k"], g["theta"])


FIRST = {"pif": "delta", "pib": "dtheta", "rf": "q", "rb": "dq_out"}


@pytest.mark.parametrize("fn,arg", ARGS)
def test_bad_arrays(rng, fn, arg):
    kwargs = good_args(rng)[fn]
    a = kwargs[arg]
    assert_refuses_bad_versions(lambda value: call(fn, {**kwargs, arg: value}), arg, a)
    # The first array fixes B, T, H, D; a size it gets wrong is reported by the next one.
    blamed = list(kwargs)[1] if arg == FIRST[fn] else arg
    with raises_naming(ValueError, blamed):
        call(fn, {**kwargs, arg: np.zeros(a.shape[:-1] + (a.shape[-1] + 2,), np.float32)})


@pytest.mark.parametrize("fn,arg", [("rf", "q"), ("rb", "dq_out")])
def test_odd_head_dim(rng, fn, arg):
    kwargs = good_args(rng)[fn]
    B, T, H, _ = kwargs[arg].shape
    for name in kwargs:
        if name != "theta":
            kwargs[name] = randn(rng, B, T, H, 7)
    kwargs["theta"] = randn(rng, 1, T, H, 3)
    with pytest.raises(ValueError, match=f"{arg}.*head dim D"):
        call(fn, kwargs)


@pytest.mark.parametrize("fn", ["rf", "rb"])
def test_theta_batch_must_be_one_or_b(rng, fn):
    kwargs = good_args(rng)[fn]
    B = kwargs["q"].shape[0]
    kwargs["theta"] = randn(rng, B + 1, *kwargs["theta"].shape[1:])
    with pytest.raises(ValueError, match="theta.*TB = 1 or TB = B"):
        call(fn, kwargs)


def test_domega_must_be_writeable(rng):
    kwargs = good_args(rng)["pib"]
    kwargs["domega"].flags.writeable = False
    with pytest.raises(ValueError, match="domega"):
        call("pib", kwargs)


def test_missing_and_unknown_keywords(rng):
    kwargs = good_args(rng)["rf"]
    del kwargs["theta"]
    with pytest.raises(TypeError):
        _C.rotary_forward(**kwargs)
    with pytest.raises(TypeError):
        _C.path_integration_forward(delta=np.zeros((1, 1, 1, 1), np.float32),
                                    omega=np.zeros((1, 1), np.float32), gamma=1)


def test_docstrings_give_shapes():
    for name in FUNCS.values():
        doc = getattr(_C, name).__doc__
        assert doc.startswith(name + "(") and "(B, T, H," in doc, name


# ---- hygiene ------------------------------------------------------------------------------
def test_no_reference_or_memory_leaks(rng):
    """~100 KiB of outputs per round: 1000 leaking rounds would grow RSS by ~100 MiB. The error
    paths (a bad last argument, checked after the others) must not leak either. Sizes stay
    under the kernels' threading threshold so the test is quick on a busy machine."""
    B, T, H, D = 2, 32, 2, 64
    q, k, theta = rotary_inputs(rng, B, T, H, D, B)
    delta, omega = randn(rng, B, T, H, D // 2), randn(rng, H, D // 2)
    domega = np.zeros_like(omega)
    bad_theta = theta.astype(np.float64)

    def calls():
        _C.rotary_forward(q, k, theta)
        _C.rotary_backward(q, k, q, k, theta)
        th = _C.path_integration_forward(delta, omega)
        _C.path_integration_backward(th, delta, omega, domega)
        expect_error(_C.rotary_forward, q, k, bad_theta)
        expect_error(_C.rotary_backward, q, k, q, k, bad_theta)

    assert_no_leaks(calls, (q, k, theta, delta, omega, domega, bad_theta))


def test_results_do_not_depend_on_thread_count(tmp_path):
    """domega and dtheta (TB = 1) are reductions across threads' work: they must be race-free,
    and with the fixed-order reductions they are bitwise the same for 1 and 2 threads."""
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(5)\n"
        "B, T, H, D = 16, 300, 3, 64\n"
        "f = lambda *s: rng.standard_normal(s).astype(np.float32)\n"
        "d, om, q, k = f(B, T, H, D // 2), f(H, D // 2), f(B, T, H, D), f(B, T, H, D)\n"
        "th = _C.path_integration_forward(d, om)\n"
        "dom = np.zeros_like(om)\n"
        "dd = _C.path_integration_backward(th, d, om, dom)\n"
        "outs = [th, dd, dom, *_C.rotary_forward(q, k, th), *_C.rotary_forward(q, k, th[:1]),\n"
        "        *_C.rotary_backward(q, k, k, q, th), *_C.rotary_backward(q, k, k, q, th[:1])]\n"
        "np.savez(sys.argv[1], *outs)\n"))
