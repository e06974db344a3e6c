"""CoPE attention: the float64 reference against finite differences, the C op against the
reference, and the C op's argument checks."""
import sys

import numpy as np
import pytest

from conftest import (assert_close, assert_refuses_bad_versions, assert_scale_checked,
                      numerical_grad, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

# (B, T, H, D, n_pos): T = 1, 7, 33, 97 (not a multiple of the 64-row block or of 16 lanes)
# and 257 once; B, H in {1, 2, 3}; D in {16, 64}; n_pos = T (the model's default), n_pos < T
# (positions clamped; n_pos = 1: every position is 0) and n_pos > T + 1 (rows of e no
# position reaches).
CONFIGS = [
    (1, 1, 1, 16, 1),
    (1, 33, 2, 16, 1),
    (2, 7, 3, 16, 7),
    (1, 7, 1, 64, 3),
    (2, 97, 3, 64, 97),
    (1, 97, 1, 16, 20),
    (2, 97, 1, 64, 150),
    (2, 257, 3, 64, 257),
]


def cope_inputs(rng, B, T, H, D, n_pos):
    """q, k with scale * q . k ~ N(0, 1), so the gates spread over (0, 1); e such that the
    position logits q . e are of order 1."""
    q, k, v = randn(rng, B, T, H, D), randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    e = randn(rng, H, n_pos, D, scale=1.0 / np.sqrt(D))
    return q, k, v, e


def positions(q, k, e, scale=None):
    """Unclamped positions p_raw (B, H, T, T) of the reference, below the diagonal only."""
    q, k, e = (np.asarray(x, np.float64) for x in (q, k, e))
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    parts = ref._cope_parts(q, k, e, scale)
    return parts["p_raw"][..., parts["causal"]]


# ---- the reference against central finite differences ------------------------------------
@pytest.mark.parametrize("n_pos", [3, 6, 9])
def test_reference_gradients(rng, n_pos):
    """n_pos = 3 clamps most positions of the later rows, 6 = T, 9 > T + 1. Finite differences
    with eps = 1e-6 are only valid away from the kinks of the interpolation (integer
    positions) and of the clamp: the test asserts every position is at least 1e-3 from an
    integer, which moves by far less than that under the perturbation."""
    B, T, H, D = 2, 6, 2, 4
    q, k, v = (rng.standard_normal((B, T, H, D)) for _ in range(3))
    e = rng.standard_normal((H, n_pos, D))
    W = rng.standard_normal((B, T, H, D))
    scale = 0.7
    p_raw = positions(q, k, e, scale)
    assert np.abs(p_raw - np.round(p_raw)).min() > 1e-3, "a position sits on a kink"
    if n_pos == 3:
        assert (p_raw > n_pos - 1).sum() >= 5, "the clamp is not exercised"

    def loss():
        return (ref.cope_forward(q, k, v, e, scale)[0] * W).sum()

    dq, dk, dv, de = ref.cope_backward(W, q, k, v, e, scale)
    for name, x, analytic in (("q", q, dq), ("k", k, dk), ("v", v, dv), ("e", e, de)):
        numeric = numerical_grad(loss, x)
        assert np.abs(numeric).max() > 1e-2, f"{name}: gradient vanishes"
        err = np.abs(analytic - numeric)
        assert np.all(err <= 1e-8 + 1e-6 * np.abs(numeric)), f"{name}: max |err| {err.max():.3g}"
    if n_pos == 9:  # rows n > T of e are never reached
        assert not de[:, T + 1 :].any()


def test_reference_is_attention_without_positions(rng):
    """With e = 0 the position logits vanish and CoPE is causal softmax attention."""
    B, T, H, D = 2, 9, 2, 8
    q, k, v, dout = (rng.standard_normal((B, T, H, D)) for _ in range(4))
    e = np.zeros((H, 5, D))
    out, lse = ref.cope_forward(q, k, v, e)
    out_a, lse_a = ref.attention_forward(q, k, v)
    np.testing.assert_allclose(out, out_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse_a, rtol=1e-12, atol=1e-12)
    grads = ref.cope_backward(dout, q, k, v, e)
    for g, g_a in zip(grads[:3], ref.attention_backward(dout, q, k, v)):
        np.testing.assert_allclose(g, g_a, rtol=1e-10, atol=1e-12)


# ---- the C op against the reference -------------------------------------------------------
@pytest.mark.parametrize("B,T,H,D,n_pos", CONFIGS)
def test_forward(rng, B, T, H, D, n_pos):
    q, k, v, e = cope_inputs(rng, B, T, H, D, n_pos)
    before = [x.copy() for x in (q, k, v, e)]
    out, lse = _C.cope_forward(q, k, v, e)
    assert out.dtype == np.float32 and out.shape == (B, T, H, D)
    assert lse.dtype == np.float32 and lse.shape == (B, H, T)
    out_r, lse_r = ref.cope_forward(q, k, v, e)
    # softmax over up to T keys: sums over a long axis in float32
    assert_close(out, out_r, "reduction", "out")
    assert_close(lse, lse_r, "reduction", "lse")
    for x, x0 in zip((q, k, v, e), before):
        assert np.array_equal(x, x0)
    if n_pos < T:
        assert (positions(q, k, e) > n_pos - 1).any(), "the clamp is not exercised"


@pytest.mark.parametrize("B,T,H,D,n_pos", CONFIGS)
def test_backward(rng, B, T, H, D, n_pos):
    q, k, v, e = cope_inputs(rng, B, T, H, D, n_pos)
    dout = randn(rng, B, T, H, D)
    out, lse = _C.cope_forward(q, k, v, e, scale=0.3)
    prefill = randn(rng, H, n_pos, D)
    de = prefill.copy()
    before = [x.copy() for x in (dout, q, k, v, e, out, lse)]
    dq, dk, dv = _C.cope_backward(dout, q, k, v, e, out, lse, de, scale=0.3)
    for x in (dq, dk, dv):
        assert x.dtype == np.float32 and x.shape == (B, T, H, D)
    dq_r, dk_r, dv_r, de_r = ref.cope_backward(dout, q, k, v, e, scale=0.3)
    # sums over T keys and then over D (dq, dk) or over B*T rows (de): "gradient"
    assert_close(dq, dq_r, "gradient", "dq")
    assert_close(dk, dk_r, "gradient", "dk")
    assert_close(dv, dv_r, "gradient", "dv")
    assert_close(de - prefill, de_r, "gradient", "de (accumulated into a pre-filled de)")
    for x, x0 in zip((dout, q, k, v, e, out, lse), before):
        assert np.array_equal(x, x0)
    if n_pos > T + 1:  # no position reaches these rows: de keeps its exact old values
        assert np.array_equal(de[:, T + 1 :], prefill[:, T + 1 :])


def test_backward_accumulates_and_is_deterministic(rng):
    B, T, H, D, n_pos = 2, 97, 3, 16, 40
    q, k, v, e = cope_inputs(rng, B, T, H, D, n_pos)
    dout = randn(rng, B, T, H, D)
    out, lse = _C.cope_forward(q, k, v, e)
    de1, de2 = np.zeros_like(e), np.zeros_like(e)
    grads1 = _C.cope_backward(dout, q, k, v, e, out, lse, de1)
    grads2 = _C.cope_backward(dout=dout, q=q, k=k, v=v, e=e, out=out, lse=lse, de=de2)
    for g1, g2 in zip(grads1, grads2):
        assert np.array_equal(g1, g2)
    assert np.array_equal(de1, de2)
    _C.cope_backward(dout, q, k, v, e, out, lse, de1)  # a second call adds again (+=)
    assert_close(de1, 2.0 * de2, "default", "de after two calls")


def test_forward_deterministic_and_scale(rng):
    B, T, H, D, n_pos = 3, 70, 2, 32, 70
    q, k, v, e = cope_inputs(rng, B, T, H, D, n_pos)
    out1, lse1 = _C.cope_forward(q, k, v, e, scale=0.25)
    out2, lse2 = _C.cope_forward(q, k, v, e, 0.25)
    assert np.array_equal(out1, out2) and np.array_equal(lse1, lse2)
    out_r, lse_r = ref.cope_forward(q, k, v, e, scale=0.25)
    assert_close(out1, out_r, "reduction", "out (scale 0.25)")
    assert_close(lse1, lse_r, "reduction", "lse (scale 0.25)")
    out_d, _ = _C.cope_forward(q, k, v, e)  # default 1/sqrt(D) differs from 0.25
    assert not np.allclose(out_d, out1)


def test_saturated_gates(rng):
    """Scores of exactly +-50: gates are 1 or ~2e-22 in float32 and float64 alike, so positions
    are exact integers (w = 0, c = f: no position gradient) or tiny, and with n_pos = 5 most
    rows are clamped. Outputs stay finite and match the reference. (Positions that are
    integers in one precision and not in the other would make the one-sided derivatives
    differ: the interpolation has a kink at every integer.)"""
    B, T, H, D, n_pos = 2, 40, 2, 16, 5
    _, _, v, e = cope_inputs(rng, B, T, H, D, n_pos)
    e *= 0.02  # position logits 50 e[.., 0] of order 1
    q = np.zeros((B, T, H, D), np.float32)
    q[..., 0] = 50.0
    k = np.zeros((B, T, H, D), np.float32)
    k[..., 0] = np.sign(rng.standard_normal((B, T, H)))
    p_raw = positions(q, k, e, scale=1.0)
    assert (np.abs(p_raw - np.round(p_raw)) < 1e-12).mean() > 0.5  # mostly on the kinks
    out, lse = _C.cope_forward(q, k, v, e, scale=1.0)
    out_r, lse_r = ref.cope_forward(q, k, v, e, scale=1.0)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    assert_close(out, out_r, "reduction", "out")
    assert_close(lse, lse_r, "reduction", "lse")
    dout = randn(rng, B, T, H, D)
    de = np.zeros_like(e)
    grads = _C.cope_backward(dout, q, k, v, e, out, lse, de, scale=1.0)
    grads_r = ref.cope_backward(dout, q, k, v, e, scale=1.0)
    for name, g, g_r in zip(("dq", "dk", "dv"), grads, grads_r):
        assert_close(g, g_r, "gradient", name)
    assert_close(de, grads_r[3], "gradient", "de")


def test_nan_scores_stay_in_bounds(rng):
    """A NaN in q gives NaN outputs for that head, never an out-of-range read or a crash."""
    B, T, H, D, n_pos = 1, 33, 2, 16, 10
    q, k, v, e = cope_inputs(rng, B, T, H, D, n_pos)
    q[0, 5, 1, 3] = np.nan
    out, lse = _C.cope_forward(q, k, v, e)
    assert np.isnan(out[0, 5, 1]).all() and np.isfinite(out[:, :, 0]).all()
    de = np.zeros_like(e)
    dq, _, _ = _C.cope_backward(randn(rng, B, T, H, D), q, k, v, e, out, lse, de)
    assert np.isfinite(dq[:, :, 0]).all()


# ---- argument checks -----------------------------------------------------------------------
def good_args(rng, B=2, T=5, H=3, D=16, n_pos=4):
    q, k, v, e = cope_inputs(rng, B, T, H, D, n_pos)
    out, lse = _C.cope_forward(q, k, v, e)
    return dict(dout=randn(rng, B, T, H, D), q=q, k=k, v=v, e=e, out=out, lse=lse,
                de=np.zeros_like(e))


FWD = ("q", "k", "v", "e")
BWD = ("dout", "q", "k", "v", "e", "out", "lse", "de")


def call(which, args):
    """Call cope_forward or cope_backward by keyword with the arguments it takes."""
    names = (FWD if which == "forward" else BWD) + ("scale",)
    fn = _C.cope_forward if which == "forward" else _C.cope_backward
    return fn(**{n: args[n] for n in names if n in args})


ALL_ARGS = [("forward", n) for n in FWD] + [("backward", n) for n in BWD]


@pytest.mark.parametrize("which,name", ALL_ARGS)
def test_bad_arrays(rng, which, name):
    """Every message starts with the bad argument's name."""
    args = good_args(rng)

    def call_with(value):
        return call(which, {**args, name: value})

    assert_refuses_bad_versions(call_with, name, args[name])
    if name != "q":  # q fixes B, T, H, D: a q of another size is reported on the others
        with raises_naming(ValueError, name):
            call_with(np.ascontiguousarray(args[name][..., :-1]))
    call(which, args)  # the good arguments still work


@pytest.mark.parametrize("which", ["forward", "backward"])
@pytest.mark.parametrize("D", [15, 14, 130, 8])
def test_bad_head_dim(rng, which, D):
    B, T, H, n_pos = 1, 4, 2, 3
    args = dict(dout=randn(rng, B, T, H, D), q=randn(rng, B, T, H, D), k=randn(rng, B, T, H, D),
                v=randn(rng, B, T, H, D), e=randn(rng, H, n_pos, D), out=randn(rng, B, T, H, D),
                lse=randn(rng, B, H, T), de=np.zeros((H, n_pos, D), np.float32))
    with pytest.raises(ValueError, match="head dim"):
        call(which, args)


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_bad_scale(rng, which):
    args = good_args(rng)
    assert_scale_checked(lambda scale: call(which, {**args, "scale": scale}))


def test_mismatched_e_and_lse(rng):
    args = good_args(rng, H=3, D=16, n_pos=4)
    for name, bad in (("e", randn(rng, 2, 4, 16)), ("e", randn(rng, 3, 4, 32)),
                      ("lse", randn(rng, 2, 5, 3)), ("de", np.zeros((3, 5, 16), np.float32))):
        bad_args = dict(args, **{name: bad})
        with pytest.raises(ValueError, match=f"^{name} "):
            call("backward" if name in ("lse", "de") else "forward", bad_args)
        if name == "e":
            with pytest.raises(ValueError, match=f"^{name} "):
                call("backward", bad_args)


def test_read_only_de(rng):
    args = good_args(rng)
    args["de"].flags.writeable = False
    with pytest.raises(ValueError, match="^de .*writeable"):
        call("backward", args)


def test_missing_and_unknown_arguments(rng):
    args = good_args(rng)
    with pytest.raises(TypeError):
        _C.cope_forward(args["q"], args["k"], args["v"])
    with pytest.raises(TypeError):
        _C.cope_backward(*(args[n] for n in BWD[:-1]))
    with pytest.raises(TypeError):
        _C.cope_forward(args["q"], args["k"], args["v"], args["e"], None, 1)


def test_reference_counts(rng):
    """No call, successful or failing, leaks or steals a reference to its arguments."""
    args = good_args(rng)
    counts = {n: sys.getrefcount(a) for n, a in args.items()}
    for _ in range(50):
        call("forward", args)
        call("backward", args)
        with pytest.raises(ValueError):
            call("backward", dict(args, lse=args["lse"][:, :1]))
        with pytest.raises(ValueError):
            call("forward", dict(args, scale=float("nan")))
    assert {n: sys.getrefcount(a) for n, a in args.items()} == counts
    out, lse = _C.cope_forward(args["q"], args["k"], args["v"], args["e"])
    assert sys.getrefcount(out) == 2 and sys.getrefcount(lse) == 2  # only ours
