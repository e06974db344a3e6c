"""C GELU and residual ops against the float64 reference, and their argument checks."""
import re

import numpy as np
import pytest

from conftest import assert_close, randn
from mapformer import _C
from mapformer import reference as ref

# any ndim >= 1; 300007 elements spans several OpenMP chunks with a ragged tail
SHAPES = [(1,), (7,), (97, 33), (257, 16), (3, 5, 7), (2, 3, 4, 5), (300007,), (1, 1, 1, 1, 1)]


def raises(exc, name):
    """pytest.raises for an error whose message starts with the argument's name."""
    return pytest.raises(exc, match=rf"^{re.escape(name)}\b")


@pytest.mark.parametrize("shape", SHAPES)
def test_gelu(rng, shape):
    x, dy = randn(rng, *shape, scale=3.0), randn(rng, *shape)
    x0, dy0 = x.copy(), dy.copy()
    y = _C.gelu_forward(x)
    assert y.shape == shape and y.dtype == np.float32
    assert_close(y, ref.gelu_forward(x), "default", "y")
    dx = _C.gelu_backward(dy, x)
    assert dx.shape == shape and dx.dtype == np.float32
    assert_close(dx, ref.gelu_backward(dy, x), "default", "dx")
    assert np.array_equal(x, x0) and np.array_equal(dy, dy0)
    assert np.array_equal(_C.gelu_forward(x=x), y)
    assert np.array_equal(_C.gelu_backward(dy=dy, x=x), dx)


def test_gelu_dense_range():
    """Every float32 step of [-12, 12] in a fine grid, and the exponential's accuracy: against
    an oracle that rounds the exponent a = (x + 0.044715 x^3) * (-2 sqrt(2/pi) log2(e)) to
    float32 as the kernel does (simd.h's vgelu: y = x / (1 + 2^a); the error that rounding
    brings is the problem's conditioning, not the kernel's) the result is within 4 ulps
    wherever |y| > 1e-30. Below that (x < -9.3) the kernel clamps a at 127 and returns values
    of about 1e-38 or less instead of the exact tiny ones."""
    x = np.linspace(-12, 12, 480001, dtype=np.float32)
    y = _C.gelu_forward(x)
    assert_close(y, ref.gelu_forward(x), "default", "y")
    assert_close(_C.gelu_backward(np.ones_like(x), x), ref.gelu_backward(np.ones_like(x), x),
                 "default", "dx")
    a32 = (x + np.float32(0.044715) * (x * x) * x) * np.float32(-2.302208198144325)
    oracle = x / (1.0 + np.exp2(a32.astype(np.float64)))
    big = np.abs(oracle) > 1e-30
    ulps = np.abs(y - oracle)[big] / np.spacing(np.abs(oracle[big]).astype(np.float32))
    assert ulps.max() <= 4.0, ulps.max()
    assert np.all(np.abs(y[~big]) < 1e-30)


def test_gelu_special_values():
    x = np.array([np.nan, np.inf, 0.0, -0.0, 1e30, -1e30, 200.0, -200.0], np.float32)
    y = _C.gelu_forward(x)
    assert np.isnan(y[0]) and y[1] == np.inf and y[2] == 0 and y[3] == 0
    assert y[4] == np.float32(1e30) and y[6] == np.float32(200.0)
    assert abs(y[5]) < 1e-6 and abs(y[7]) < 1e-30
    dx = _C.gelu_backward(np.ones_like(x), x)
    assert np.isnan(dx[0]) and dx[2] == 0.5 and dx[3] == 0.5 and dx[6] == 1.0 and abs(dx[7]) < 1e-30


def test_gelu_same_bits_on_every_kernel_set(rng):
    """GELU's kernels run 16 floats a vector on the avx512 set, 8 on the others
    (csrc/ops/kernels/gelu.h): the same bits, tanh and exact, forward and backward (lengths
    with tails of every size, special values), restoring the active set after."""
    before = _C.kernels()
    try:
        for n in (1, 7, 15, 17, 33, 20011):
            x = randn(rng, n, scale=6.0)
            x[: min(n, 4)] = np.array([np.nan, np.inf, -1e30, 200.0], np.float32)[: min(n, 4)]
            dy = randn(rng, n)
            runs = []
            for kset in _C.kernel_sets():
                _C.set_kernels(kset)
                runs.append([f(*args, approximate=a) for a in ("tanh", "none")
                             for f, args in ((_C.gelu_forward, (x,)),
                                             (_C.gelu_backward, (dy, x)))])
            for outs in runs[1:]:
                for a, b in zip(runs[0], outs):
                    assert a.tobytes() == b.tobytes(), n
    finally:
        _C.set_kernels(before)


@pytest.mark.parametrize("shape", SHAPES)
def test_residual(rng, shape):
    a, b = randn(rng, *shape), randn(rng, *shape)
    a0, b0 = a.copy(), b.copy()
    out = _C.residual_forward(a, b)
    assert out.shape == shape and out.dtype == np.float32
    assert np.array_equal(out, a + b)  # one float32 add: exact
    assert_close(out, ref.residual_forward(a, b), "default", "out")
    assert np.array_equal(a, a0) and np.array_equal(b, b0)
    dx0, dout = randn(rng, *shape), randn(rng, *shape)
    dx = dx0.copy()
    assert _C.residual_backward(dx, dout) is None
    da, _ = ref.residual_backward(dout)
    assert np.array_equal(dx, dx0 + dout)  # += in place
    assert_close(dx, dx0 + da, "default", "dx")
    _C.residual_backward(dx=dx, dout=dout)
    assert np.array_equal(dx, (dx0 + dout) + dout)


@pytest.mark.parametrize("op,args", [
    ("gelu_forward", ("x",)),
    ("gelu_backward", ("dy", "x")),
    ("residual_forward", ("a", "b")),
    ("residual_backward", ("dx", "dout")),
])
def test_bad_inputs(rng, op, args):
    fn = getattr(_C, op)
    ok = {name: randn(rng, 4, 6) for name in args}
    before = {name: a.copy() for name, a in ok.items()}
    cases = []
    for name in args:
        cases += [
            (name, ok[name].astype(np.float64), TypeError),
            (name, ok[name].astype(np.int32), TypeError),
            (name, ok[name].tolist(), TypeError),
            (name, np.zeros((4, 0), np.float32), ValueError),  # empty axis
            (name, np.ones((), np.float32), ValueError),  # 0-d
            (name, randn(rng, 4, 12)[:, ::2], ValueError),  # strided
            (name, np.asfortranarray(randn(rng, 4, 6)), ValueError),  # layout
        ]
    if len(args) == 2:  # the second array must have the first one's shape
        second = args[1]
        cases += [
            (second, randn(rng, 4, 7), ValueError),
            (second, randn(rng, 6, 4), ValueError),
            (second, randn(rng, 24), ValueError),
            (second, randn(rng, 4, 6, 1), ValueError),
        ]
    for name, bad, exc in cases:
        if len(args) == 2 and name == args[0] and exc is ValueError:
            continue  # a bad first array is then reported against the second: covered below
        with raises(exc, name):
            fn(**{**ok, name: bad})
    if len(args) == 2:
        first = args[0]
        with raises(ValueError, first):
            fn(**{**ok, first: np.zeros((4, 0), np.float32)})
        with raises(ValueError, first):
            fn(**{**ok, first: randn(rng, 4, 12)[:, ::2]})
    for name in args:
        assert np.array_equal(ok[name], before[name])


def test_residual_backward_needs_writeable_disjoint_dx(rng):
    dx, dout = randn(rng, 3, 4), randn(rng, 3, 4)
    dx.flags.writeable = False
    with raises(ValueError, "dx"):
        _C.residual_backward(dx, dout)
    buf = randn(rng, 13)
    with raises(ValueError, "dx"):
        _C.residual_backward(buf[:12], buf[1:])
    with raises(ValueError, "dx"):
        _C.residual_backward(dout, dout)
