"""The C lstm op (TDB's baseline) against the float64 reference; the reference against finite
differences; thread counts and bad input."""
import numpy as np
import pytest

from conftest import (assert_array_argument_checked, assert_close,
                      assert_same_bits_for_thread_counts, numerical_grad, randn, raises_naming)
from mapformer import _C, backend
from mapformer import reference as ref

# (B, T, C, H): one of everything, odd and prime sizes, enough rows to thread the products
SIZES = [(1, 1, 1, 1), (3, 7, 5, 2), (2, 13, 17, 11), (5, 9, 32, 24)]


def make(rng, B, T, C, H, initial=False):
    s = 1.0 / np.sqrt(H)
    x, w_ih, w_hh, b = (randn(rng, B, T, C), randn(rng, 4 * H, C, scale=s),
                        randn(rng, 4 * H, H, scale=s), randn(rng, 4 * H, scale=s))
    h0, c0 = (randn(rng, B, H), randn(rng, B, H)) if initial else (None, None)
    return x, w_ih, w_hh, b, h0, c0


@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("B,T,C,H", SIZES)
def test_forward(rng, B, T, C, H, initial):
    args = make(rng, B, T, C, H, initial)
    h, c, gates = _C.lstm_forward(*args)
    assert h.shape == c.shape == (B, T, H) and gates.shape == (B, T, 4 * H)
    r_h, r_c, r_gates = ref.lstm_forward(*args)
    # every step's pre-activations are sums of C + H products; the state carries the error
    # of earlier steps, damped by the gates (|f| < 1)
    assert_close(gates, r_gates, "reduction", "gates")
    assert_close(c, r_c, "reduction", "c")
    assert_close(h, r_h, "reduction", "h")


@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("B,T,C,H", SIZES)
def test_backward(rng, B, T, C, H, initial):
    x, w_ih, w_hh, b, h0, c0 = make(rng, B, T, C, H, initial)
    h, c, gates = _C.lstm_forward(x, w_ih, w_hh, b, h0, c0)
    dh = randn(rng, B, T, H)
    grads = [randn(rng, *a.shape) for a in (w_ih, w_hh, b)]
    prefill = [g.copy() for g in grads]
    dx, dh0, dc0 = _C.lstm_backward(dh, x, w_ih, w_hh, h, c, gates, *grads, h0=h0, c0=c0)
    r = ref.lstm_backward(dh, x, w_ih, w_hh, h, c, gates, h0, c0)
    assert_close(dx, r[0], "gradient", "dx")
    for name, g, p, rg in zip(("dw_ih", "dw_hh", "db"), grads, prefill, r[1:4]):
        assert_close(g, p + rg, "gradient", name)  # += over B T rows
    assert_close(dh0, r[4], "gradient", "dh0")
    assert_close(dc0, r[5], "gradient", "dc0")


def test_numpy_backend_entry(rng):
    x, w_ih, w_hh, b, h0, c0 = (a.astype(np.float64) for a in make(rng, 2, 3, 4, 2, True))
    h, c, gates = backend.NUMPY.lstm_forward(x, w_ih, w_hh, b, h0, c0)
    dh = rng.standard_normal(h.shape)
    dw_ih, dw_hh, db = np.zeros_like(w_ih), np.zeros_like(w_hh), np.zeros_like(b)
    dx, dh0, dc0 = backend.NUMPY.lstm_backward(dh, x, w_ih, w_hh, h, c, gates, dw_ih, dw_hh,
                                               db, h0, c0)
    r = ref.lstm_backward(dh, x, w_ih, w_hh, h, c, gates, h0, c0)
    for got, want in zip((dx, dw_ih, dw_hh, db, dh0, dc0), r):
        assert np.array_equal(got, want)


def test_reference_gradients_by_finite_differences(rng):
    B, T, C, H = 2, 4, 3, 2
    x, w_ih, w_hh, b, h0, c0 = (a.astype(np.float64) for a in make(rng, B, T, C, H, True))
    proj = rng.standard_normal((B, T, H))

    def loss():
        return (proj * ref.lstm_forward(x, w_ih, w_hh, b, h0, c0)[0]).sum()

    h, c, gates = ref.lstm_forward(x, w_ih, w_hh, b, h0, c0)
    grads = ref.lstm_backward(proj, x, w_ih, w_hh, h, c, gates, h0, c0)
    for name, arr, g in zip(("x", "w_ih", "w_hh", "b", "h0", "c0"),
                            (x, w_ih, w_hh, b, h0, c0), grads):
        assert np.allclose(numerical_grad(loss, arr), g, rtol=1e-6, atol=1e-8), name


def test_forget_gate_carries_the_cell():
    """Gates saturated open (i = f = o = 1, g = tanh(1)): c_t = c_{t-1} + tanh(1)."""
    B, T, C, H = 1, 5, 1, 3
    w_ih, w_hh = np.zeros((4 * H, C), np.float32), np.zeros((4 * H, H), np.float32)
    b = np.full(4 * H, 30.0, np.float32)
    b[2 * H:3 * H] = 1.0
    h, c, _ = _C.lstm_forward(np.zeros((B, T, C), np.float32), w_ih, w_hh, b)
    assert np.allclose(c[0, :, 0], np.tanh(1.0) * np.arange(1, T + 1), rtol=1e-6)


def test_same_bits_for_any_thread_count(tmp_path):
    script = (
        "import sys\nimport numpy as np\nfrom mapformer import _C\n"
        "r = np.random.default_rng(5)\n"
        "f = lambda *s: (r.standard_normal(s) * 0.2).astype(np.float32)\n"
        "x, wi, wh, b = f(40, 9, 64), f(256, 64), f(256, 64), f(256)\n"
        "h, c, g = _C.lstm_forward(x, wi, wh, b)\n"
        "dwi, dwh, db = np.zeros_like(wi), np.zeros_like(wh), np.zeros_like(b)\n"
        "dx, dh0, dc0 = _C.lstm_backward(f(40, 9, 64), x, wi, wh, h, c, g, dwi, dwh, db)\n"
        "np.savez(sys.argv[1], h=h, c=c, g=g, dx=dx, dh0=dh0, dc0=dc0, dwi=dwi, dwh=dwh,"
        " db=db)\n")
    assert_same_bits_for_thread_counts(tmp_path, script, (1, 2))


def test_bad_inputs(rng):
    x, w_ih, w_hh, b, h0, c0 = make(rng, 2, 3, 4, 2, True)
    assert_array_argument_checked(lambda v: _C.lstm_forward(v, w_ih, w_hh, b), "x", x,
                                  sizes=False)
    assert_array_argument_checked(lambda v: _C.lstm_forward(x, v, w_hh, b), "w_ih", w_ih)
    for bad, exc in ((h0.astype(np.float64), TypeError), (h0[:1], ValueError),
                     (h0[:, :1], ValueError),
                     (np.repeat(h0, 2, axis=-1)[:, ::2], ValueError)):  # strided
        with raises_naming(exc, "h0"):
            _C.lstm_forward(x, w_ih, w_hh, b, bad)
    with raises_naming(ValueError, "w_hh"):  # not (4H, H)
        _C.lstm_forward(x, w_ih[:6], w_hh[:6, :2], b[:6])
    with raises_naming(ValueError, "b"):
        _C.lstm_forward(x, w_ih, w_hh, b[:-1])
    h, c, gates = _C.lstm_forward(x, w_ih, w_hh, b)
    grads = [np.zeros_like(a) for a in (w_ih, w_hh, b)]
    dh = randn(rng, *h.shape)

    def back(**kw):
        a = dict(dh=dh, x=x, w_ih=w_ih, w_hh=w_hh, h=h, c=c, gates=gates, dw_ih=grads[0],
                 dw_hh=grads[1], db=grads[2])
        a.update(kw)
        return _C.lstm_backward(**a)

    assert_array_argument_checked(lambda v: back(dh=v), "dh", dh, sizes=False)
    assert_array_argument_checked(lambda v: back(gates=v), "gates", gates)
    assert_array_argument_checked(lambda v: back(dw_hh=v), "dw_hh", grads[1])
    with raises_naming(ValueError, "dw_ih"):  # a gradient sharing memory with an input
        back(dw_ih=w_ih)
    assert not any(g.any() for g in grads)
