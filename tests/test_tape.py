"""TAPE ops: the float64 reference against finite differences, the C ops against the reference,
and the properties that make them TAPE's positional encoding (RoPE at initialisation, the
rotary op for unit states, equivariance of the state update)."""
import numpy as np
import pytest

from conftest import (assert_close, assert_no_leaks, assert_refuses_bad_versions,
                      assert_same_bits_for_thread_counts, assert_unchanged, copies,
                      expect_error, numerical_grad, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

SIZES = [(B, T, H, D) for T in (1, 7, 97, 257) for B in (1, 2) for H in (1, 3)
         for D in (16, 64, 128)]
# Past the single-thread threshold and over several work items / row blocks, with D not a
# multiple of the 16 float lanes (200, 2), D over one 256-float chunk (384), more heads (8).
BIG = [(2, 257, 3, 200), (3, 130, 2, 384), (4, 64, 8, 64), (5, 33, 1, 2)]


def state(rng, B, T, H, D):
    """A TAPE state as the model sees it: complex numbers of modulus in [0.5, 1.5] (RoPE at
    initialisation, then rescaled by the head mix)."""
    NB = D // 2
    modulus = rng.uniform(0.5, 1.5, (B, T, H, NB))
    z = modulus * np.exp(1j * rng.uniform(-np.pi, np.pi, (B, T, H, NB)))
    e = np.empty((B, T, H, D), np.float32)
    e[..., 0::2], e[..., 1::2] = z.real, z.imag
    return e


def mix_inputs(rng, B, T, H, D):
    e_att = state(rng, B, T, H, D)
    gate = randn(rng, B, T, H, scale=2.0)
    w = randn(rng, H, H, scale=1.0 / np.sqrt(H))
    return e_att, gate, w


# ---- reference vs finite differences ------------------------------------------------------
@pytest.mark.parametrize("eb", ["B", "one"])
def test_reference_rotate_backward_matches_finite_differences(rng, eb):
    B, T, H, D = 2, 3, 2, 6
    q, k = rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, H, D))
    e = rng.standard_normal((B if eb == "B" else 1, T, H, D))
    dq_out, dk_out = rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, H, D))

    def loss():
        q_out, k_out = ref.tape_rotate_forward(q, k, e)
        return float((q_out * dq_out).sum() + (k_out * dk_out).sum())

    dq, dk, de = ref.tape_rotate_backward(dq_out, dk_out, q, k, e)
    assert de.shape == e.shape
    for got, x, name in ((dq, q, "dq"), (dk, k, "dk"), (de, e, "de")):
        np.testing.assert_allclose(got, numerical_grad(loss, x), rtol=1e-7, atol=1e-8,
                                   err_msg=name)


def test_reference_mix_backward_matches_finite_differences(rng):
    B, T, H, D = 2, 3, 3, 4
    e_att = rng.standard_normal((B, T, H, D))
    gate = rng.standard_normal((B, T, H)) * 2.0
    gate[0, 0, 0], gate[1, 2, 1] = 8.0, -8.0  # both branches of the stable sigmoid
    w = rng.standard_normal((H, H))
    de_new = rng.standard_normal((B, T, H, D))

    def loss():
        return float((ref.tape_mix_forward(e_att, gate, w) * de_new).sum())

    de_att, dgate, dw = ref.tape_mix_backward(de_new, e_att, gate, w)
    for got, x, name in ((de_att, e_att, "de_att"), (dgate, gate, "dgate_logits"),
                         (dw, w, "dw")):
        np.testing.assert_allclose(got, numerical_grad(loss, x), rtol=1e-7, atol=1e-8,
                                   err_msg=name)


def test_reference_mix_is_identity_without_mixing(rng):
    """w = 0, or gates shut (sigmoid(-inf) = 0), leave the state as attention made it; a gate
    wide open adds the full head mix."""
    B, T, H, D = 2, 5, 3, 8
    e_att, gate, w = mix_inputs(rng, B, T, H, D)
    np.testing.assert_array_equal(ref.tape_mix_forward(e_att, gate, np.zeros((H, H))), e_att)
    np.testing.assert_array_equal(ref.tape_mix_forward(e_att, np.full((B, T, H), -np.inf), w),
                                  e_att)
    full = ref.tape_mix_forward(e_att, np.full((B, T, H), np.inf), w)
    w64, e64 = w.astype(np.float64), e_att.astype(np.float64)
    np.testing.assert_allclose(full, e64 + np.einsum("hk,btkd->bthd", w64, e64), rtol=1e-12)


def test_initial_state_is_rope(rng):
    """tape_rotate with the initial state is RoPE: rotary with theta = omega * t, t = 1..T."""
    T, H, D = 50, 2, 16
    e = ref.tape_initial_state(T, H, D)
    assert e.shape == (1, T, H, D)
    z = e[..., 0::2] + 1j * e[..., 1::2]
    np.testing.assert_allclose(np.abs(z), 1.0, rtol=1e-14)
    omega = 10000.0 ** (-2.0 * np.arange(D // 2) / D)
    theta = np.arange(1, T + 1)[None, :, None, None] * omega  # (1, T, 1, NB)
    theta = np.broadcast_to(theta, (1, T, H, D // 2))
    q, k = rng.standard_normal((3, T, H, D)), rng.standard_normal((3, T, H, D))
    for got, want in zip(ref.tape_rotate_forward(q, k, e), ref.rotary_forward(q, k, theta)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # another base changes the frequencies
    assert not np.allclose(ref.tape_initial_state(T, H, D, base=100.0), e)


# ---- C vs reference -----------------------------------------------------------------------
@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
def test_rotate_forward(rng, B, T, H, D):
    q, k, e = randn(rng, B, T, H, D), randn(rng, B, T, H, D), state(rng, B, T, H, D)
    before = copies(q, k, e)
    q_out, k_out = _C.tape_rotate_forward(q, k, e)
    rq, rk = ref.tape_rotate_forward(q, k, e)
    assert q_out.dtype == k_out.dtype == np.float32 and q_out.shape == (B, T, H, D)
    # y0 = x0 e0 - x1 e1 can cancel, but with |e| <= 1.5 its absolute error (~eps32 |x| |e|)
    # stays within the default atol (measured: under 0.1 of the bound)
    assert_close(q_out, rq, "default", "q_out")
    assert_close(k_out, rk, "default", "k_out")
    assert_unchanged(before, [q, k, e])


@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
def test_rotate_backward(rng, B, T, H, D):
    q, k, e = randn(rng, B, T, H, D), randn(rng, B, T, H, D), state(rng, B, T, H, D)
    dq_out, dk_out = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    before = copies(dq_out, dk_out, q, k, e)
    dq, dk, de = _C.tape_rotate_backward(dq_out, dk_out, q, k, e)
    rdq, rdk, rde = ref.tape_rotate_backward(dq_out, dk_out, q, k, e)
    for got, want, name in ((dq, rdq, "dq"), (dk, rdk, "dk"), (de, rde, "de")):
        assert got.dtype == np.float32 and got.shape == (B, T, H, D), name
        # sums of 2 (dq, dk) or 4 (de) products: absolute error ~eps32 |x| |dy|, within the
        # default atol (measured: under 0.3 of the bound for de)
        assert_close(got, want, "default", name)
    assert_unchanged(before, [dq_out, dk_out, q, k, e])


@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
def test_mix_forward(rng, B, T, H, D):
    e_att, gate, w = mix_inputs(rng, B, T, H, D)
    before = copies(e_att, gate, w)
    e_new = _C.tape_mix_forward(e_att, gate, w)
    assert e_new.dtype == np.float32 and e_new.shape == (B, T, H, D)
    # a float32 sum over H <= 8 heads: a few ulps
    assert_close(e_new, ref.tape_mix_forward(e_att, gate, w), "default", "e_new")
    assert_unchanged(before, [e_att, gate, w])


@pytest.mark.parametrize("B,T,H,D", SIZES + BIG)
def test_mix_backward(rng, B, T, H, D):
    e_att, gate, w = mix_inputs(rng, B, T, H, D)
    de_new = randn(rng, B, T, H, D)
    prefill = randn(rng, H, H)
    dw = prefill.copy()
    before = copies(de_new, e_att, gate, w)
    de_att, dgate = _C.tape_mix_backward(de_new, e_att, gate, w, dw)
    rde, rdg, rdw = ref.tape_mix_backward(de_new, e_att, gate, w)
    assert de_att.dtype == dgate.dtype == np.float32
    assert de_att.shape == (B, T, H, D) and dgate.shape == (B, T, H)
    # a float32 sum over H heads; dot products over D in 16 float lanes summed in double; dw
    # sums those dot products over B*T rows in double: all a few ulps
    assert_close(de_att, rde, "default", "de_att")
    assert_close(dgate, rdg, "default", "dgate_logits")
    assert_close(dw, prefill.astype(np.float64) + rdw, "default", "dw")
    assert_unchanged(before, [de_new, e_att, gate, w])


def test_dw_accumulates(rng):
    B, T, H, D = 2, 9, 3, 16
    e_att, gate, w = mix_inputs(rng, B, T, H, D)
    de_new = randn(rng, B, T, H, D)
    _, _, rdw = ref.tape_mix_backward(de_new, e_att, gate, w)
    dw = np.full((H, H), 0.5, np.float32)
    for calls in (1, 2, 3):
        _C.tape_mix_backward(de_new=de_new, e_att=e_att, gate_logits=gate, w=w, dw=dw)
        assert_close(dw, 0.5 + calls * rdw, "default", f"dw after {calls} calls")


def test_large_gate_logits(rng):
    """Saturated gates: g and 1 - g are both taken as sigmoids, so dgate_logits = g (1 - g)
    Y . M keeps its relative accuracy where a float32 1 - g would be exactly 0."""
    B, T, H, D = 2, 4, 2, 16
    e_att, _, w = mix_inputs(rng, B, T, H, D)
    gate = rng.choice([-60.0, -30.0, 30.0, 60.0], (B, T, H)).astype(np.float32)
    de_new = randn(rng, B, T, H, D)
    e_new = _C.tape_mix_forward(e_att, gate, w)
    assert_close(e_new, ref.tape_mix_forward(e_att, gate, w), "default", "e_new")
    _, dgate = _C.tape_mix_backward(de_new, e_att, gate, w, np.zeros((H, H), np.float32))
    _, rdg, _ = ref.tape_mix_backward(de_new, e_att, gate, w)
    assert np.all(rdg != 0) and np.abs(rdg).max() < 1e-12
    np.testing.assert_allclose(dgate, rdg, rtol=1e-4, atol=0)


# ---- properties ---------------------------------------------------------------------------
def test_initial_state_rotate_equals_rope_rotary(rng):
    """tape_rotate with tape_initial_state is RoPE: the float64 RoPE rotation, and the rotary
    op with the RoPE angles from path integration (delta = 1, omega_k = base^(-2k/D))."""
    B, T, H, D = 2, 257, 2, 64
    NB = D // 2
    q, k = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    pos = np.arange(1, T + 1, dtype=np.float64)[None, :, None, None]

    def initial(base):
        e = ref.tape_initial_state(T, H, D, base)
        return np.ascontiguousarray(np.broadcast_to(e, (B, T, H, D)), dtype=np.float32)

    omega = 10000.0 ** (-2.0 * np.arange(NB) / D)
    rq, rk = ref.rotary_forward(q, k, np.broadcast_to(pos * omega, (1, T, H, NB)))
    q_out, k_out = _C.tape_rotate_forward(q, k, initial(10000.0))
    assert_close(q_out, rq, "default", "q_out vs float64 RoPE")
    assert_close(k_out, rk, "default", "k_out vs float64 RoPE")

    # Against the rotary op the frequencies must be the same numbers: path integration takes
    # omega in float32, and at base 10000 its rounding (~3e-8 omega) times t = 257 moves the
    # angles by up to ~1e-5 rad. base = 2^(D/2) gives omega_k = 2^-k, exact in float32.
    base = 2.0 ** (D // 2)
    omega = base ** (-2.0 * np.arange(NB) / D)
    np.testing.assert_array_equal(omega, 2.0 ** -np.arange(NB))
    theta = _C.path_integration_forward(np.ones((B, T, H, NB), np.float32),
                                        np.tile(omega, (H, 1)).astype(np.float32))
    for got, want, name in zip(_C.tape_rotate_forward(q, k, initial(base)),
                               _C.rotary_forward(q, k, theta), ("q_out", "k_out")):
        assert_close(got, want, "default", name + " vs rotary_forward")


def test_unit_state_is_rotary_forward_and_backward(rng):
    """For e = exp(i theta), tape_rotate is rotary: the same outputs, the same dq, dk, and the
    chain rule through e = (cos theta, sin theta) turns de into rotary's dtheta."""
    B, T, H, D = 2, 33, 3, 32
    theta = rng.uniform(-np.pi, np.pi, (B, T, H, D // 2)).astype(np.float32)
    th = theta.astype(np.float64)
    e = np.empty((B, T, H, D), np.float32)
    e[..., 0::2], e[..., 1::2] = np.cos(th), np.sin(th)
    q, k, dq_out, dk_out = (randn(rng, B, T, H, D) for _ in range(4))
    for got, want, name in zip(_C.tape_rotate_forward(q, k, e), _C.rotary_forward(q, k, theta),
                               ("q_out", "k_out")):
        assert_close(got, want, "default", name)
    dq, dk, de = _C.tape_rotate_backward(dq_out, dk_out, q, k, e)
    rdq, rdk, rdtheta = _C.rotary_backward(dq_out, dk_out, q, k, theta)
    assert_close(dq, rdq, "default", "dq")
    assert_close(dk, rdk, "default", "dk")
    dtheta = -de[..., 0::2].astype(np.float64) * np.sin(th) + de[..., 1::2] * np.cos(th)
    assert_close(dtheta, rdtheta, "default", "de chained to dtheta")


def test_state_update_is_equivariant(rng):
    """Multiplying every token's and head's state by the same unit complex numbers r (one per
    block k, a global shift of the positions) leaves the attention scores unchanged and
    multiplies the updated state E_new = mix(A E) by r too: TAPE's equivariance. Attention is
    linear in its values and the head mix has real weights."""
    B, T, H, D = 2, 11, 3, 16
    E = state(rng, B, T, H, D)
    q, k = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    _, gate, w = mix_inputs(rng, B, T, H, D)
    phi = rng.uniform(-np.pi, np.pi, D // 2)
    r = np.exp(1j * phi)

    def shift(x):
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * r
        out = np.empty(x.shape, np.float32)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out

    def layer(E):
        q_out, k_out = _C.tape_rotate_forward(q, k, E)
        scores = np.einsum("bihd,bjhd->bhij", q_out.astype(np.float64), k_out)
        e_att, _ = ref.attention_forward(q_out, k_out, E)  # A E: the state as the values
        return scores, _C.tape_mix_forward(e_att.astype(np.float32), gate, w)

    s0, e0 = layer(E)
    s1, e1 = layer(shift(E))
    assert_close(s1, s0, "reduction", "scores after the shift")
    assert_close(e1, shift(e0), "reduction", "E_new after the shift")
    # the scores do depend on the states (the test can fail)
    other = E.copy()
    other[:, 3] *= 1.5
    assert np.abs(layer(other)[0] - s0).max() > 1e-2


# ---- bad input ----------------------------------------------------------------------------
def good_args(rng):
    B, T, H, D = 2, 3, 3, 8
    f = lambda *s: randn(rng, *s)  # noqa: E731
    return {
        "rf": dict(q=f(B, T, H, D), k=f(B, T, H, D), e=f(B, T, H, D)),
        "rb": dict(dq_out=f(B, T, H, D), dk_out=f(B, T, H, D), q=f(B, T, H, D),
                   k=f(B, T, H, D), e=f(B, T, H, D)),
        "mf": dict(e_att=f(B, T, H, D), gate_logits=f(B, T, H), w=f(H, H)),
        "mb": dict(de_new=f(B, T, H, D), e_att=f(B, T, H, D), gate_logits=f(B, T, H),
                   w=f(H, H), dw=np.zeros((H, H), np.float32)),
    }


FUNCS = {"rf": "tape_rotate_forward", "rb": "tape_rotate_backward",
         "mf": "tape_mix_forward", "mb": "tape_mix_backward"}
ARGS = [(fn, a) for fn, args in (("rf", ("q", "k", "e")),
                                 ("rb", ("dq_out", "dk_out", "q", "k", "e")),
                                 ("mf", ("e_att", "gate_logits", "w")),
                                 ("mb", ("de_new", "e_att", "gate_logits", "w", "dw")))
        for a in args]
FIRST = {"rf": "q", "rb": "dq_out", "mf": "e_att", "mb": "de_new"}


def call(fn, kwargs):
    return getattr(_C, FUNCS[fn])(**kwargs)


def test_good_args_work(rng):
    for fn, kwargs in good_args(rng).items():
        call(fn, kwargs)
    g = good_args(rng)["mb"]  # positional arguments too
    _C.tape_mix_backward(g["de_new"], g["e_att"], g["gate_logits"], g["w"], g["dw"])


@pytest.mark.parametrize("fn,arg", ARGS)
def test_bad_arrays(rng, fn, arg):
    kwargs = good_args(rng)[fn]
    a = kwargs[arg]
    assert_refuses_bad_versions(lambda value: call(fn, {**kwargs, arg: value}), arg, a)
    first = arg == FIRST[fn]
    # The first array fixes B, T, H (and D); a size it gets wrong is reported by the next one.
    with raises_naming(ValueError, list(kwargs)[1] if first else arg):
        call(fn, {**kwargs, arg: np.zeros((a.shape[0] + 1,) + a.shape[1:], np.float32)})
    if not first:  # the first array's last axis is D, which it alone may set in tape_mix
        with raises_naming(ValueError, arg):
            call(fn, {**kwargs, arg: np.zeros(a.shape[:-1] + (a.shape[-1] + 2,), np.float32)})


@pytest.mark.parametrize("fn", list(FUNCS))
def test_odd_head_dim(rng, fn):
    kwargs = good_args(rng)[fn]
    for name, a in kwargs.items():
        if a.ndim == 4:
            kwargs[name] = randn(rng, *a.shape[:3], 7)
    with pytest.raises(ValueError, match=f"{FIRST[fn]}.*head dim D"):
        call(fn, kwargs)


def test_w_must_be_square_over_heads(rng):
    kwargs = good_args(rng)["mf"]
    H = kwargs["w"].shape[0]
    kwargs["w"] = randn(rng, H + 1, H)
    with pytest.raises(ValueError, match=r"w must have shape \(H, H\)"):
        call("mf", kwargs)


def test_dw_must_be_writeable(rng):
    kwargs = good_args(rng)["mb"]
    kwargs["dw"].flags.writeable = False
    with pytest.raises(ValueError, match="dw"):
        call("mb", kwargs)


def test_missing_and_unknown_keywords(rng):
    kwargs = good_args(rng)["mb"]
    del kwargs["dw"]
    with pytest.raises(TypeError):
        _C.tape_mix_backward(**kwargs)
    kwargs = good_args(rng)["rf"]
    with pytest.raises(TypeError):
        _C.tape_rotate_forward(**kwargs, theta=kwargs["e"])


def test_docstrings_give_shapes():
    for name in FUNCS.values():
        doc = getattr(_C, name).__doc__
        assert doc.startswith(name + "(") and "(B, T, H, D)" in doc, name


# ---- hygiene ------------------------------------------------------------------------------
def test_no_reference_or_memory_leaks(rng):
    """~100 KiB of outputs per round: 1000 leaking rounds would grow RSS by ~100 MiB. The error
    paths (a bad last argument, checked after the others) must not leak either. Sizes stay
    under the kernels' threading threshold so the test is quick on a busy machine."""
    B, T, H, D = 2, 32, 2, 64
    q, k, e = randn(rng, B, T, H, D), randn(rng, B, T, H, D), state(rng, B, T, H, D)
    gate, w = randn(rng, B, T, H), randn(rng, H, H)
    dw = np.zeros_like(w)
    bad_e, bad_dw = e.astype(np.float64), dw.astype(np.float64)

    def calls():
        _C.tape_rotate_forward(q, k, e)
        _C.tape_rotate_backward(q, k, q, k, e)
        _C.tape_mix_forward(e, gate, w)
        _C.tape_mix_backward(q, e, gate, w, dw)
        expect_error(_C.tape_rotate_backward, q, k, q, k, bad_e)
        expect_error(_C.tape_mix_backward, q, e, gate, w, bad_dw)

    assert_no_leaks(calls, (q, k, e, gate, w, dw, bad_e, bad_dw))


def test_results_do_not_depend_on_thread_count(tmp_path):
    """dw is a reduction across threads' work: with per-block partials summed in block order it
    is race-free and bitwise the same for 1, 2 and 3 threads (as is everything else)."""
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(5)\n"
        "B, T, H, D = 16, 300, 3, 64\n"
        "f = lambda *s: rng.standard_normal(s).astype(np.float32)\n"
        "q, k, e, dy, g, w = f(B, T, H, D), f(B, T, H, D), f(B, T, H, D), f(B, T, H, D),\\\n"
        "    f(B, T, H), f(H, H)\n"
        "dw = f(H, H)\n"
        "outs = [*_C.tape_rotate_forward(q, k, e), *_C.tape_rotate_backward(dy, q, k, e, q),\n"
        "        _C.tape_mix_forward(e, g, w), *_C.tape_mix_backward(dy, e, g, w, dw), dw]\n"
        "np.savez(sys.argv[1], *outs)\n"), threads=(1, 2, 3))
