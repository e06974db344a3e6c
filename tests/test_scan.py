"""The Mamba / MAMPa block's C ops against the float64 reference: SiLU, softplus, the SiLU
gate, the causal depthwise conv1d (plain and through SiLU) and the selective scans (real and
complex), forward and backward; the reference against finite differences; the scan oracles
(omega = 0 is Mamba's real scan, a pure rotation with Euler B_bar is linear MapWM attention,
selective_scan_ref's complex convention); a T = 4096 run; thread-count independence; bad
input.

Tolerances of the scans are normwise, from the problem: a float32 recurrence of T steps over K
states whose every step rounds a few products (and an exponential of a few ulps) is within
gamma(4 (T + K)) of the largest |value| of each array (gamma(8 (T + K)) for the gradients,
a forward and a reverse sweep); the elementwise ops use the "default" tolerance."""
import numpy as np
import pytest

from conftest import (assert_array_argument_checked, assert_close,
                      assert_same_bits_for_thread_counts, assert_unchanged, assert_within, copies, gamma, numerical_grad, randn,
                      raises_naming)
from mapformer import _C, backend
from mapformer import reference as ref


def normwise(got, expected, n, name):
    """|got - expected| <= gamma(n) * max |expected| (+ a float32 ulp of it) elementwise."""
    scale = np.abs(np.asarray(expected, np.float64)).max()
    assert_within(got, expected, gamma(n) * scale + 1e-30, name)


# ---- SiLU, softplus, the SiLU gate ---------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (7,), (97, 33), (3, 5, 7), (20011,)])
def test_silu_softplus(rng, shape):
    x, dy = randn(rng, *shape, scale=6.0), randn(rng, *shape)
    x0 = x.copy()
    ops = {"silu": (_C.silu_forward, _C.silu_backward, ref.silu_forward, ref.silu_backward),
           "softplus": (_C.softplus_forward, _C.softplus_backward, ref.softplus_forward,
                        ref.softplus_backward)}
    for name, (fwd, bwd, rfwd, rbwd) in ops.items():
        y = fwd(x)
        assert y.shape == shape and y.dtype == np.float32
        assert_close(y, rfwd(x), "default", f"{name} y")
        assert_close(bwd(dy, x), rbwd(dy, x), "default", f"{name} dx")
    assert np.array_equal(x, x0)


def test_softplus_threshold_and_tails():
    x = np.array([-100.0, -20.0, 0.0, 19.99, 20.0, 20.01, 50.0], np.float32)
    y = _C.softplus_forward(x)
    assert y[0] >= 0 and y[0] < 1e-40 and y[2] == np.float32(np.log(2.0))
    assert y[5] == x[5] and y[6] == x[6]  # above the threshold: x itself
    assert_close(y, ref.softplus_forward(x), "default", "y")
    dx = _C.softplus_backward(np.ones_like(x), x)
    assert dx[5] == 1.0 and dx[6] == 1.0 and dx[2] == 0.5
    assert_close(dx, ref.softplus_backward(np.ones_like(x), x), "default", "dx")
    s = _C.silu_forward(np.array([0.0, -100.0, 100.0], np.float32))
    assert s[0] == 0 and abs(s[1]) < 1e-30 and s[2] == 100.0


@pytest.mark.parametrize("mode", ["keep", "flush"])
def test_softplus_accuracy_over_its_range(mode):
    """The vector softplus (an exp by Cody-Waite reduction, then log1p by one polynomial over
    [0, 1]) is within a few float32 ulps of the float64 value wherever exp(x) is a normal float
    (x >= -87), as float32 NumPy's log1p(exp(x)) is (4.7 ulps on this grid; the op: 2.5);
    below, exp(x) is subnormal and the op gives 0 (an absolute error under the smallest normal
    float). With subnormals flushed (the ops' default) the accurate range is narrower: measured
    here, from x >= -76 (softplus(x) >= 1e-33); below, the result is off by less than 1e-33
    (which intermediate passes through the subnormals is not found)."""
    before = _C.subnormals()
    _C.set_subnormals(mode)
    try:
        x = np.linspace(-100, 30, 200_003).astype(np.float32)
        y = _C.softplus_forward(x).astype(np.float64)
    finally:
        _C.set_subnormals(before)
    xd = x.astype(np.float64)
    exact = np.where(xd > 20, xd, np.logaddexp(0, xd))
    normal = xd >= -87 if mode == "keep" else exact >= 1e-33
    ulps = np.abs(y - exact)[normal] / (exact[normal] * 2.0 ** -24)
    assert ulps.max() <= 8, f"softplus: {ulps.max():.1f} ulps at x = {x[normal][ulps.argmax()]}"
    off = y if mode == "keep" else np.abs(y - exact)  # kept: the op's value is subnormal
    below = float(np.finfo(np.float32).tiny) if mode == "keep" else 1e-33
    assert np.all(y[~normal] >= 0) and np.all(off[~normal] < below)


@pytest.mark.parametrize("shape", [(1,), (7,), (97, 33), (3, 5, 7), (20011,)])
def test_silu_gate(rng, shape):
    """out = y silu(z) and its two gradients against the reference, and bit for bit the three
    passes the op replaces in the Mamba block (silu, then the products)."""
    y, z, dout = randn(rng, *shape, scale=3.0), randn(rng, *shape, scale=6.0), randn(rng, *shape)
    before = copies(y, z, dout)
    out = _C.silu_gate_forward(y, z)
    assert out.shape == shape and out.dtype == np.float32
    assert_close(out, ref.silu_gate_forward(y, z), "default", "out")
    dy, dz = _C.silu_gate_backward(dout, y, z)
    rdy, rdz = ref.silu_gate_backward(dout, y, z)
    assert_close(dy, rdy, "default", "dy")
    assert_close(dz, rdz, "default", "dz")
    assert_unchanged(before, [y, z, dout])
    gate = _C.silu_forward(z)
    assert np.array_equal(out, y * gate)
    assert np.array_equal(dy, dout * gate)
    assert np.array_equal(dz, _C.silu_backward(dout * y, z))


def test_silu_gate_bad_input(rng):
    y, z, dout = randn(rng, 4, 6), randn(rng, 4, 6), randn(rng, 4, 6)
    # the first array fixes the shape ("..."): a wrong one of it is reported against the next
    for bad, exc in [(y.astype(np.float64), TypeError), (y.tolist(), TypeError),
                     (None, TypeError), (np.asfortranarray(y), ValueError),
                     (np.repeat(y, 2, axis=-1)[..., ::2], ValueError)]:
        with raises_naming(exc, "y"):
            _C.silu_gate_forward(bad, z)
        with raises_naming(exc, "dout"):
            _C.silu_gate_backward(bad, y, z)
    assert_array_argument_checked(lambda v: _C.silu_gate_forward(y, v), "z", z)
    assert_array_argument_checked(lambda v: _C.silu_gate_backward(dout, v, z), "y", y)
    assert_array_argument_checked(lambda v: _C.silu_gate_backward(dout, y, v), "z", z)
    with raises_naming(ValueError, "y"):
        _C.silu_gate_forward(np.zeros((4, 0), np.float32), np.zeros((4, 0), np.float32))


def test_activation_reference_gradients():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(9) * 5
    x[0] = 25.0  # above softplus's threshold
    for name in ("silu", "softplus"):
        f = getattr(ref, f"{name}_forward")
        assert_close(getattr(ref, f"{name}_backward")(np.ones(9), x),
                     numerical_grad(lambda: f(x).sum(), x), "gradient", name)
    y, dout = rng.standard_normal(9), rng.standard_normal(9)
    dy, dz = ref.silu_gate_backward(dout, y, x)
    loss = lambda: (ref.silu_gate_forward(y, x) * dout).sum()
    assert_close(dy, numerical_grad(loss, y), "gradient", "silu_gate dy")
    assert_close(dz, numerical_grad(loss, x), "gradient", "silu_gate dz")


# ---- causal conv1d ----------------------------------------------------------------------
CONV_SIZES = [(1, 1, 1, 1), (2, 7, 5, 4), (3, 13, 17, 3), (1, 5, 3, 8), (2, 131, 37, 4)]


@pytest.mark.parametrize("B,T,E,W", CONV_SIZES)
def test_causal_conv1d(rng, B, T, E, W):
    x, w, b, dy = randn(rng, B, T, E), randn(rng, E, W), randn(rng, E), randn(rng, B, T, E)
    before = copies(x, w, b, dy)
    y = _C.causal_conv1d_forward(x, w, b)
    assert_close(y, ref.causal_conv1d_forward(x, w, b), "reduction", "y")
    dw0, db0 = randn(rng, E, W), randn(rng, E)
    dw, db = dw0.copy(), db0.copy()
    dx = _C.causal_conv1d_backward(dy, x, w, dw, db)
    gx, gw, gb = ref.causal_conv1d_backward(dy, x, w)
    assert_close(dx, gx, "reduction", "dx")
    assert_close(dw, dw0 + gw, "gradient", "dweight")
    assert_close(db, db0 + gb, "gradient", "dbias")
    assert_unchanged(before, [x, w, b, dy])
    if T >= W:  # y at t depends on x up to t only: a change at the last step moves y[T-1]
        x2 = x.copy()
        x2[:, -1] += 1
        y2 = _C.causal_conv1d_forward(x2, w, b)
        assert np.array_equal(y2[:, :-1], y[:, :-1])


@pytest.mark.parametrize("B,T,E,W", CONV_SIZES + [(2, 150, 9, 4)])
def test_causal_conv1d_silu(rng, B, T, E, W):
    """activation='silu': the conv and SiLU in one pass each way, against the reference, and
    bit for bit the plain conv and the SiLU ops in turn (T = 150: items of 64 steps whose
    gradient rows reach into the next item's)."""
    x, w, b = randn(rng, B, T, E), randn(rng, E, W), randn(rng, E)
    dy = randn(rng, B, T, E)
    before = copies(x, w, b, dy)
    u = _C.causal_conv1d_forward(x, w, b, activation="silu")
    assert_close(u, ref.causal_conv1d_forward(x, w, b, activation="silu"), "reduction", "u")
    c = _C.causal_conv1d_forward(x, w, b)
    assert np.array_equal(u, _C.silu_forward(c))
    dw0, db0 = randn(rng, E, W), randn(rng, E)
    dw, db, dw2, db2 = dw0.copy(), db0.copy(), dw0.copy(), db0.copy()
    dx = _C.causal_conv1d_backward(dy, x, w, dw, db, bias=b, activation="silu")
    gx, gw, gb = ref.causal_conv1d_backward(dy, x, w, bias=b, activation="silu")
    assert_close(dx, gx, "reduction", "dx")
    assert_close(dw, dw0 + gw, "gradient", "dweight")
    assert_close(db, db0 + gb, "gradient", "dbias")
    assert_unchanged(before, [x, w, b, dy])
    dx2 = _C.causal_conv1d_backward(_C.silu_backward(dy, c), x, w, dw2, db2)
    for got, want in ((dx, dx2), (dw, dw2), (db, db2)):
        assert np.array_equal(got, want)


def test_causal_conv1d_reference_gradients():
    rng = np.random.default_rng(4)
    x, w, b, dy = (rng.standard_normal(s) for s in ((2, 6, 3), (3, 4), (3,), (2, 6, 3)))
    for activation in ("none", "silu"):
        gx, gw, gb = ref.causal_conv1d_backward(dy, x, w, bias=b, activation=activation)
        loss = lambda: (ref.causal_conv1d_forward(x, w, b, activation=activation) * dy).sum()
        for name, got, arr in (("dx", gx, x), ("dweight", gw, w), ("dbias", gb, b)):
            assert_close(got, numerical_grad(loss, arr), "gradient", f"{name} {activation}")


def test_causal_conv1d_same_bits_for_thread_counts(tmp_path):
    """B T E past the one-thread threshold, T = 150 in items of 64 steps: plain and SiLU."""
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(6)\n"
        "B, T, E, W = 3, 150, 80, 4\n"
        "f = lambda *s: rng.standard_normal(s).astype(np.float32)\n"
        "x, dy, w, b = f(B, T, E), f(B, T, E), f(E, W), f(E)\n"
        "outs = []\n"
        "for act in ('none', 'silu'):\n"
        "    dw, db = np.zeros((E, W), np.float32), np.zeros(E, np.float32)\n"
        "    kw = {'bias': b} if act == 'silu' else {}\n"
        "    outs += [_C.causal_conv1d_forward(x, w, b, activation=act),\n"
        "             _C.causal_conv1d_backward(dy, x, w, dw, db, activation=act, **kw), dw, db]\n"
        "np.savez(sys.argv[1], *outs)\n"))


def test_causal_conv1d_bad_input(rng):
    x, w, b = randn(rng, 2, 5, 3), randn(rng, 3, 4), randn(rng, 3)
    assert_array_argument_checked(lambda v: _C.causal_conv1d_forward(v, w, b), "x", x,
                                  sizes=False)
    assert_array_argument_checked(lambda v: _C.causal_conv1d_forward(x, v, b), "weight", w,
                                  sizes=False)
    with raises_naming(ValueError, "bias"):
        _C.causal_conv1d_forward(x, w, randn(rng, 4))
    dw = np.zeros((3, 4), np.float32)
    with raises_naming(ValueError, "dweight"):
        _C.causal_conv1d_backward(x, x, w, dw[:, :3].copy(), np.zeros(3, np.float32))
    with raises_naming(ValueError, "dbias"):
        _C.causal_conv1d_backward(x, x, w, dw, np.zeros(3, np.float32)[::-1])
    db = np.zeros(3, np.float32)
    with raises_naming(ValueError, "bias"):  # SiLU's backward recomputes the convolution
        _C.causal_conv1d_backward(x, x, w, dw, db, activation="silu")
    with raises_naming(ValueError, "bias"):  # and only it reads the bias
        _C.causal_conv1d_backward(x, x, w, dw, db, bias=b)
    with raises_naming(ValueError, "bias"):
        _C.causal_conv1d_backward(x, x, w, dw, db, bias=randn(rng, 4), activation="silu")
    with raises_naming(TypeError, "bias"):
        _C.causal_conv1d_backward(x, x, w, dw, db, bias=b.astype(np.float64),
                                  activation="silu")
    with raises_naming(ValueError, "activation"):
        _C.causal_conv1d_forward(x, w, b, activation="relu")
    with raises_naming(ValueError, "activation"):
        _C.causal_conv1d_backward(x, x, w, dw, db, bias=b, activation="gelu")
    assert not dw.any() and not db.any()


def test_causal_conv1d_numpy_backend_bad_input(rng):
    """The NumPy backend (the float64 reference) rejects what the C op rejects: without the
    check NumPy would read bias=None as NaN, and an unknown activation as none."""
    x, w, b = randn(rng, 2, 5, 3), randn(rng, 3, 4), randn(rng, 3)
    dw, db = np.zeros((3, 4), np.float32), np.zeros(3, np.float32)
    ops = backend.NUMPY
    with raises_naming(ValueError, "bias"):
        ops.causal_conv1d_backward(x, x, w, dw, db, activation="silu")
    with raises_naming(ValueError, "bias"):
        ops.causal_conv1d_backward(x, x, w, dw, db, bias=b)
    with raises_naming(ValueError, "activation"):
        ops.causal_conv1d_forward(x, w, b, activation="relu")
    with raises_naming(ValueError, "activation"):
        ops.causal_conv1d_backward(x, x, w, dw, db, bias=b, activation="gelu")
    assert not dw.any() and not db.any()


# ---- selective scans -------------------------------------------------------------------------
def scan_inputs(rng, B, T, E, K, cx, signed=False):
    """Inputs as the Mamba block makes them: delta = softplus(...) in about [0.005, 1.5],
    A = -exp(A_log) with A_log = log(1..K) (and a spread), omega as MapWM's frequencies."""
    S = 2 * K if cx else K
    x = randn(rng, B, T, E)
    delta = ref.softplus_forward(rng.standard_normal((B, T, E)) * 1.5 - 2).astype(np.float32)
    A = (-np.arange(1, K + 1) * rng.uniform(0.05, 1.0, (E, 1))).astype(np.float32)
    Bm, Cm, D = randn(rng, B, T, S), randn(rng, B, T, S), randn(rng, E)
    if not cx:
        return dict(x=x, delta=delta, A=A, B=Bm, C=Cm, D=D)
    omega = (2 * np.pi * np.geomspace(1, 1 / 64, K) * rng.uniform(0.8, 1.2, (E, K))).astype(
        np.float32)
    dangle = randn(rng, B, T, E) if signed else delta
    return dict(x=x, delta=delta, delta_angle=dangle, A=A, omega=omega, B=Bm, C=Cm, D=D)


def run_c(inp, dy, chunk, bbar, **step):
    """The C forward and backward: y, states, and the gradients as a dict; ``step``: the
    step's delta_bias and delta_activation (delta_bias's gradient then under 'delta_bias')."""
    cx = "omega" in inp
    fwd, bwd = ((_C.complex_scan_forward, _C.complex_scan_backward) if cx else
                (_C.selective_scan_forward, _C.selective_scan_backward))
    y, states = fwd(*inp.values(), chunk=chunk, bbar=bbar, **step)
    params = {k: np.zeros_like(inp[k]) for k in (("A", "omega", "D") if cx else ("A", "D"))}
    bias = step.get("delta_bias")
    dbias = None if bias is None else np.zeros_like(bias)
    outs = bwd(dy, *inp.values(), states, *params.values(), chunk=chunk, bbar=bbar,
               ddelta_bias=dbias, **step)
    names = ("x", "delta", "delta_angle", "B", "C") if cx else ("x", "delta", "B", "C")
    grads = {**dict(zip(names, outs)), **params}
    return y, states, grads if dbias is None else {**grads, "delta_bias": dbias}


def run_ref(inp, dy, chunk, bbar, **step):
    cx = "omega" in inp
    fwd, bwd = ((ref.complex_scan_forward, ref.complex_scan_backward) if cx else
                (ref.selective_scan_forward, ref.selective_scan_backward))
    y, states = fwd(*inp.values(), chunk, bbar, **step)
    names = (("x", "delta", "delta_angle", "A", "omega", "B", "C", "D") if cx else
             ("x", "delta", "A", "B", "C", "D"))
    grads = dict(zip(names, bwd(dy, *inp.values(), chunk, bbar, **step)))
    if step.get("delta_bias") is not None:
        grads["delta_bias"] = grads["delta"].sum((0, 1))
    return y, states, grads


def check_scan(inp, dy, chunk, bbar, **step):
    """C against the float64 reference, normwise; the inputs unchanged; a gradient the
    reference gives as None (ddelta_angle without delta_angle) None from C too."""
    B, T, E = inp["x"].shape
    K = inp["A"].shape[1]
    arrays = [v for v in (*inp.values(), *step.values()) if isinstance(v, np.ndarray)]
    before = copies(*arrays, dy)
    y, states, grads = run_c(inp, dy, chunk, bbar, **step)
    ry, rstates, rgrads = run_ref(inp, dy, chunk, bbar, **step)
    assert states.shape == (B, -(-T // chunk), E, inp["B"].shape[2])
    n = 4 * (T + K)
    normwise(y, ry, n, "y")
    normwise(states, rstates, n, "states")
    for name, g in rgrads.items():
        if g is None:
            assert grads[name] is None, name
        else:
            # delta's through the softplus: its slope's few ulps on top (16)
            bound = 2 * n + (16 if step else 0)
            normwise(grads[name], g, bound * T if name == "delta_bias" else bound, f"d{name}")
    assert_unchanged(before, [*arrays, dy])


# K 16 (real) and 8 (complex): the avx512 set's unrolled Euler scans (kernels/scan.h
# SCAN_FIXED_K); every other K its general loops
SCAN_SIZES = [(1, 1, 1, 1), (2, 13, 5, 3), (3, 37, 17, 4), (1, 20, 2, 16), (2, 21, 19, 8)]


@pytest.mark.parametrize("B,T,E,K", SCAN_SIZES)
@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_scan_against_reference(rng, B, T, E, K, cx, bbar):
    inp = scan_inputs(rng, B, T, E, K, cx)
    dy = randn(rng, B, T, E)
    for chunk in (1, 5, 256):
        check_scan(inp, dy, chunk, bbar)


@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_complex_scan_signed_angle(rng, bbar):
    inp = scan_inputs(rng, 2, 29, 6, 5, True, signed=True)
    check_scan(inp, randn(rng, 2, 29, 6), 8, bbar)


@pytest.fixture
def restore_kernels():
    active = _C.kernels()
    yield
    _C.set_kernels(active)


def grid(rng, *shape, scale=1.0, shift=0.0):
    """float32 normals (times scale, plus shift) on a 2^-12 grid: delta + delta_bias is then
    exact in float32 as in the reference's float64 (far below 0 softplus(v) ~ e^v would turn
    the sum's rounding into |v| ulps of the step)."""
    v = rng.standard_normal(shape) * scale + shift
    return (np.round(v * 4096) / 4096).astype(np.float32)


def step_inputs(rng, B, T, E, K, angle):
    """scan_inputs with delta the steps before softplus (about -2 +- 1.5, one step past the
    threshold and one far below when there are several), and delta_bias (E,); angle: 'real',
    'shared' (complex, delta_angle None) or 'signed' (complex, its own array)."""
    inp = scan_inputs(rng, B, T, E, K, angle != "real", signed=angle == "signed")
    inp["delta"] = grid(rng, B, T, E, scale=1.5, shift=-2.0)
    if inp["delta"].size > 2:
        inp["delta"].flat[1], inp["delta"].flat[-1] = 21.5, -30.0
    if angle == "shared":
        inp["delta_angle"] = None
    return inp, grid(rng, E, scale=0.5)


STEP_ANGLES = ["real", "shared", "signed"]


@pytest.mark.parametrize("B,T,E,K", SCAN_SIZES[:3])
@pytest.mark.parametrize("angle", STEP_ANGLES)
@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_scan_step_bias_and_softplus_against_reference(rng, B, T, E, K, angle, bbar):
    """The step softplus(delta + delta_bias) formed in the scan (Mamba's delta_bias and
    delta_softplus), the rotation taking it when delta_angle is None: forward and every
    gradient (delta's through the softplus, delta_bias's its sum) against float64; softplus
    alone and the bias alone too."""
    inp, bias = step_inputs(rng, B, T, E, K, angle)
    dy = randn(rng, B, T, E)
    for chunk in (1, 5, 256):
        check_scan(inp, dy, chunk, bbar, delta_bias=bias, delta_activation="softplus")
    check_scan(inp, dy, 4, bbar, delta_activation="softplus")
    check_scan({**inp, "delta": np.abs(inp["delta"])}, dy, 4, bbar, delta_bias=np.abs(bias))


@pytest.mark.parametrize("angle", STEP_ANGLES)
@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_scan_step_reference_gradients(angle, bbar):
    """The reference's step (bias, softplus, the shared rotation) against finite differences,
    delta_bias's gradient included."""
    rng = np.random.default_rng(11)
    inp, bias = step_inputs(rng, 2, 5, 3, 2, angle)
    inp = {k: None if v is None else v.astype(np.float64) for k, v in inp.items()}
    step = dict(delta_bias=bias.astype(np.float64), delta_activation="softplus")
    inp["delta"] = rng.standard_normal(inp["delta"].shape)
    dy = rng.standard_normal((2, 5, 3))
    fwd = ref.selective_scan_forward if angle == "real" else ref.complex_scan_forward
    _, _, grads = run_ref(inp, dy, 2, bbar, **step)
    loss = lambda: (fwd(*inp.values(), 2, bbar, **step)[0] * dy).sum()
    for name, g in grads.items():
        if g is not None:
            x = step["delta_bias"] if name == "delta_bias" else inp[name]
            assert_close(g, numerical_grad(loss, x), "gradient", f"d{name}")


@pytest.mark.parametrize("angle", STEP_ANGLES)
def test_scan_step_same_bits_as_the_separate_ops(rng, restore_kernels, angle):
    """On every kernel set the step inside the scan gives the bits of softplus_forward on
    delta + delta_bias before a plain scan, and its gradient those of softplus_backward on
    the plain scan's ddelta (+ ddelta_angle when the rotation shares the step); every other
    output the same bits too."""
    inp, bias = step_inputs(rng, 2, 23, 21, 5, angle)
    dy = randn(rng, 2, 23, 21)
    pre = inp["delta"] + bias
    plain = {**inp, "delta": _C.softplus_forward(pre)}
    if angle == "shared":
        plain["delta_angle"] = plain["delta"]
    for kset in _C.kernel_sets():
        _C.set_kernels(kset)
        for bbar in ("euler", "zoh"):
            y, states, grads = run_c(inp, dy, 7, bbar, delta_bias=bias,
                                     delta_activation="softplus")
            py, pstates, pgrads = run_c(plain, dy, 7, bbar)
            assert y.tobytes() == py.tobytes() and states.tobytes() == pstates.tobytes()
            ddelta = pgrads["delta"]
            if angle == "shared":
                ddelta = ddelta + pgrads.pop("delta_angle")
                assert grads.pop("delta_angle") is None
            pgrads["delta"] = _C.softplus_backward(ddelta, pre)
            for name, g in pgrads.items():
                assert grads[name].tobytes() == g.tobytes(), (kset, bbar, name)
            assert_close(grads["delta_bias"], pgrads["delta"].sum((0, 1)), "default",
                         "ddelta_bias")


def test_scan_step_bad_input(rng):
    """delta_bias, delta_activation and ddelta_bias refused by name, by the C ops and the
    NumPy backend's."""
    for cx in (False, True):
        inp, bias = step_inputs(rng, 2, 9, 3, 4, "shared" if cx else "real")
        fwd = _C.complex_scan_forward if cx else _C.selective_scan_forward
        bwd = _C.complex_scan_backward if cx else _C.selective_scan_backward
        args = list(inp.values())
        with raises_naming(ValueError, "delta_activation"):
            fwd(*args, delta_activation="relu")
        with raises_naming(ValueError, "delta_bias"):
            fwd(*args, delta_bias=np.zeros(4, np.float32))
        with raises_naming(TypeError, "delta_bias"):
            fwd(*args, delta_bias=bias.astype(np.float64))
        y, states = fwd(*args, delta_bias=bias, chunk=4)
        dy = randn(rng, 2, 9, 3)
        params = [np.zeros_like(inp[k]) for k in (("A", "omega", "D") if cx else ("A", "D"))]
        for ops in (_C, backend.NUMPY):
            call = getattr(ops, bwd.__name__)
            with raises_naming(ValueError, "ddelta_bias"):  # its gradient has nowhere to go
                call(dy, *args, states, *params, chunk=4, delta_bias=bias)
            with raises_naming(ValueError, "ddelta_bias"):
                call(dy, *args, states, *params, chunk=4, ddelta_bias=np.zeros_like(bias))
        with raises_naming(ValueError, "ddelta_bias"):
            bwd(dy, *args, states, *params, chunk=4, delta_bias=bias,
                ddelta_bias=np.zeros(4, np.float32))
    real, bias = step_inputs(rng, 2, 9, 3, 4, "real")
    with raises_naming(ValueError, "delta_activation"):
        ref.selective_scan_forward(*real.values(), delta_activation="exp")
    for wrong in (np.zeros(1), np.zeros((9, 3))):  # NumPy would broadcast them
        with raises_naming(ValueError, "delta_bias"):
            backend.NUMPY.selective_scan_forward(*real.values(), delta_bias=wrong)
    y, states = backend.NUMPY.selective_scan_forward(*real.values(), delta_bias=bias)
    with raises_naming(ValueError, "ddelta_bias"):
        backend.NUMPY.selective_scan_backward(
            randn(rng, 2, 9, 3), *real.values(), states, np.zeros((3, 4)), np.zeros(3),
            delta_bias=bias, ddelta_bias=np.zeros((9, 3)))


def test_scan_with_zero_decay_and_angle(rng):
    """A = 0 (MAMPa's pure rotation) and steps near zero: the ZOH factor's series branch."""
    inp = scan_inputs(rng, 2, 17, 3, 4, True)
    inp["A"][:] = 0
    inp["delta"][0, :5] = 1e-4
    for bbar in ("euler", "zoh"):
        check_scan(inp, randn(rng, 2, 17, 3), 4, bbar)


def zoh_factors_exact(z):
    """phi(z) = (e^z - 1) / z and phi'(z) = (e^z - phi) / z in float64 (complex): e^z - 1
    without cancellation, and Taylor series of both below |z| = 1/2 (to z^16: the rest below
    1e-19)."""
    zr, zi = z.real, z.imag
    n1 = np.expm1(zr) * np.cos(zi) - 2 * np.sin(zi / 2) ** 2 + 1j * np.exp(zr) * np.sin(zi)
    small = np.abs(z) < 0.5
    zs = np.where(small, 1.0, z)
    fact = np.cumprod([1.0] + list(range(1, 20)))  # fact[n] = n!
    phi_series = sum(z ** n / fact[n + 1] for n in range(17))
    dphi_series = sum((n + 1) * z ** n / fact[n + 2] for n in range(17))
    phi = np.where(small, phi_series, n1 / zs)
    return phi, np.where(small, dphi_series, (np.exp(z) - phi) / zs)


def test_zoh_factors_error_bound():
    """The C scans' phi(z) and phi'(z) (float vectors, scan.c's zoh_factors) within the bound
    derived in scan.c's header, 12 u and 22 u per component (u = 2^-24) for Re z <= 0, over a
    grid of z: 0, the series' edge |z|^2 = 2^-24, the branches at |zr| = ln 2 / 2, |z| = 1,
    the quadrants of the rotation, strong decays. Read through a one-step scan: with x = delta
    = delta_angle = 1 the op's z is (A, omega) exactly, y = Re or Im of phi (B' = 1, C' = 1 or
    -i, D = 0) and the backward's dA = Re phi', domega = -Im phi' (dy = 1 on the first row)."""
    zr = np.concatenate([np.linspace(-30, 0, 121), -np.geomspace(1e-9, 2, 80),
                         np.linspace(-1.1, 0, 56), [0.0, -2.0 ** -12, -0.3466, -0.3467]])
    zi = np.concatenate([np.linspace(-13, 13, 105), np.geomspace(1e-9, 2, 60),
                         -np.geomspace(1e-9, 2, 60), np.linspace(-1.1, 1.1, 45),
                         [0.0, 2.0 ** -12, np.pi / 4, 3 * np.pi / 4, 2 * np.pi]])
    ZR, ZI = (g.ravel().astype(np.float32) for g in np.meshgrid(zr, zi))
    E = ZR.size
    ones = np.ones((2, 1, E), np.float32)
    A, om = ZR.reshape(E, 1).copy(), ZI.reshape(E, 1).copy()
    Bm = np.zeros((2, 1, 2), np.float32)
    Bm[:, :, 0] = 1
    Cm = np.zeros((2, 1, 2), np.float32)
    Cm[0, 0, 0] = Cm[1, 0, 1] = 1
    D = np.zeros(E, np.float32)
    dy = np.zeros((2, 1, E), np.float32)
    dy[0] = 1
    u = 2.0 ** -24
    phi, dphi = zoh_factors_exact(ZR.astype(np.float64) + 1j * ZI.astype(np.float64))
    y, st = _C.complex_scan_forward(ones, ones, ones, A, om, Bm, Cm, D, chunk=1, bbar="zoh")
    g = [np.zeros_like(A), np.zeros_like(om), np.zeros_like(D)]
    _C.complex_scan_backward(dy, ones, ones, ones, A, om, Bm, Cm, D, st, *g, chunk=1,
                             bbar="zoh")
    assert_within(y[0, 0], phi.real, 12 * u, "Re phi")
    assert_within(y[1, 0], phi.imag, 12 * u, "Im phi")
    assert_within(g[0][:, 0], dphi.real, 22 * u, "Re phi'")
    assert_within(-g[1][:, 0], dphi.imag, 22 * u, "Im phi'")
    # the real scan's (zi = 0): the same arithmetic
    r = np.ascontiguousarray(zr.astype(np.float32))
    n = r.size
    one = np.ones((1, 1, n), np.float32)
    yr, sr = _C.selective_scan_forward(one, one, r.reshape(n, 1), np.ones((1, 1, 1), np.float32),
                                       np.ones((1, 1, 1), np.float32), np.zeros(n, np.float32),
                                       chunk=1, bbar="zoh")
    gr = [np.zeros((n, 1), np.float32), np.zeros(n, np.float32)]
    _C.selective_scan_backward(one, one, one, r.reshape(n, 1), np.ones((1, 1, 1), np.float32),
                               np.ones((1, 1, 1), np.float32), np.zeros(n, np.float32), sr,
                               *gr, chunk=1, bbar="zoh")
    phr, dphr = zoh_factors_exact(r.astype(np.float64) + 0j)
    assert_within(yr[0, 0], phr.real, 12 * u, "phi (real scan)")
    assert_within(gr[0][:, 0], dphr.real, 22 * u, "phi' (real scan)")


@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_scan_reference_gradients(cx, bbar):
    rng = np.random.default_rng(7)
    inp = {k: v.astype(np.float64) for k, v in scan_inputs(rng, 2, 5, 3, 2, cx, True).items()}
    dy = rng.standard_normal((2, 5, 3))
    fwd = ref.complex_scan_forward if cx else ref.selective_scan_forward
    _, _, grads = run_ref(inp, dy, 2, bbar)
    loss = lambda: (fwd(*inp.values(), 2, bbar)[0] * dy).sum()
    for name, g in grads.items():
        assert_close(g, numerical_grad(loss, inp[name]), "gradient", f"d{name}")


def test_complex_scan_with_zero_omega_is_the_real_scan(rng):
    """Each complex state with omega = 0 is two real states (re, im) with the same decay."""
    inp = scan_inputs(rng, 2, 23, 5, 3, True)
    inp["omega"][:] = 0
    dy = randn(rng, 2, 23, 5)
    real = dict(x=inp["x"], delta=inp["delta"], A=np.repeat(inp["A"], 2, axis=1),
                B=inp["B"], C=inp["C"], D=inp["D"])
    for bbar in ("euler", "zoh"):
        y, states, g = run_c(inp, dy, 7, bbar)
        ry, rstates, rg = run_c(real, dy, 7, bbar)
        normwise(y, ry, 4 * 26, "y")
        assert np.array_equal(states, rstates)
        for name in ("x", "delta", "B", "C", "D"):
            normwise(g[name], rg[name], 8 * 26, f"d{name}")
        normwise(g["A"], rg["A"][:, 0::2] + rg["A"][:, 1::2], 8 * 26, "dA")


def test_pure_rotation_euler_is_linear_mapwm_attention(rng):
    """alpha = 0 and Euler B_bar: y_t = sum_{s <= t} <R(-omega Phi_t) c_t, R(-omega Phi_s) b_s>
    delta_s x_s + D x_t with Phi the cumulative (signed) angle step: MapFormer eq. 17, linear
    (softmax-free) attention with q = C, k = B, v = delta x and cumulative rotations."""
    B, T, E, K = 2, 19, 3, 4
    inp = scan_inputs(rng, B, T, E, K, True, signed=True)
    inp["A"][:] = 0
    y, _ = _C.complex_scan_forward(*inp.values())
    phi = np.cumsum(inp["delta_angle"].astype(np.float64), axis=1)  # (B, T, E)
    rot = np.exp(-1j * phi[..., None] * inp["omega"])  # (B, T, E, K)
    q = (inp["C"][..., 0::2] + 1j * inp["C"][..., 1::2])[:, :, None] * rot
    k = (inp["B"][..., 0::2] + 1j * inp["B"][..., 1::2])[:, :, None] * rot
    scores = np.einsum("btek,bsek->bets", q.conj(), k).real * np.tril(np.ones((T, T)))
    v = (inp["delta"] * inp["x"]).astype(np.float64)
    expected = np.einsum("bets,bse->bte", scores, v) + inp["D"] * inp["x"]
    normwise(y, expected, 4 * (T + K), "y")


def test_complex_scan_follows_selective_scan_ref(rng):
    """state-spaces/mamba's selective_scan_ref loop with complex A = A + i omega, B' = b_re +
    i b_im, C' = (c_re - i c_im) / 2 and y = 2 Re(sum_n h C') + D u (written here in NumPy)."""
    B, T, E, K = 2, 11, 4, 3
    inp = scan_inputs(rng, B, T, E, K, True)
    u, delta = inp["x"].astype(np.float64), inp["delta"].astype(np.float64)
    Ac = inp["A"] + 1j * inp["omega"].astype(np.float64)
    Bc = inp["B"][..., 0::2] + 1j * inp["B"][..., 1::2]
    Cc = (inp["C"][..., 0::2] - 1j * inp["C"][..., 1::2]) / 2
    deltaA = np.exp(np.einsum("bld,dn->bldn", delta, Ac))
    deltaB_u = np.einsum("bld,bln,bld->bldn", delta, Bc, u)
    h = np.zeros((B, E, K), complex)
    ys = []
    for i in range(T):
        h = deltaA[:, i] * h + deltaB_u[:, i]
        ys.append(np.einsum("bdn,bn->bd", h, Cc[:, i]))
    expected = 2 * np.stack(ys, 1).real + inp["D"] * u
    y, _ = _C.complex_scan_forward(*inp.values())
    normwise(y, expected, 4 * (T + K), "y")


@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
def test_scan_long_sequence(rng, cx):
    """T = 4096 (16 chunks of 256): forward and every gradient against float64."""
    inp = scan_inputs(rng, 1, 4096, 2, 4, cx, signed=cx)
    check_scan(inp, randn(rng, 1, 4096, 2), 256, "euler")


def test_scan_same_bits_for_thread_counts(tmp_path):
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(5)\n"
        "B, T, E, K = 5, 40, 70, 8\n"
        "f = lambda *s: rng.standard_normal(s).astype(np.float32)\n"
        "x, dl, da, dy = f(B, T, E), np.abs(f(B, T, E)), f(B, T, E), f(B, T, E)\n"
        "A, om, D = -np.abs(f(E, K)), f(E, K), f(E)\n"
        "Bm, Cm = f(B, T, 2 * K), f(B, T, 2 * K)\n"
        "y, st = _C.complex_scan_forward(x, dl, da, A, om, Bm, Cm, D, chunk=16)\n"
        "g = [np.zeros_like(A), np.zeros_like(om), np.zeros_like(D)]\n"
        "outs = _C.complex_scan_backward(dy, x, dl, da, A, om, Bm, Cm, D, st, *g, chunk=16)\n"
        "Br, Cr = Bm[..., :K].copy(), Cm[..., :K].copy()\n"
        "y2, st2 = _C.selective_scan_forward(x, dl, A, Br, Cr, D, bbar='zoh')\n"
        "g2 = [np.zeros_like(A), np.zeros_like(D)]\n"
        "outs2 = _C.selective_scan_backward(dy, x, dl, A, Br, Cr, D, st2, *g2, bbar='zoh')\n"
        "w, b, dw, db = f(E, 4), f(E), np.zeros((E, 4), np.float32), np.zeros(E, np.float32)\n"
        "cv = [_C.causal_conv1d_forward(x, w, b), _C.causal_conv1d_backward(dy, x, w, dw, db)]\n"
        "y3, st3 = _C.complex_scan_forward(x, dl, da, A, om, Bm, Cm, D, chunk=16, bbar='zoh')\n"
        "g3 = [np.zeros_like(A), np.zeros_like(om), np.zeros_like(D)]\n"
        "outs3 = _C.complex_scan_backward(dy, x, dl, da, A, om, Bm, Cm, D, st3, *g3, chunk=16,\n"
        "                                 bbar='zoh')\n"
        "bias = f(E)\n"
        "step = dict(delta_bias=bias, delta_activation='softplus')\n"
        "y4, st4 = _C.complex_scan_forward(x, da, None, A, om, Bm, Cm, D, chunk=16, **step)\n"
        "g4 = [np.zeros_like(A), np.zeros_like(om), np.zeros_like(D), np.zeros_like(bias)]\n"
        "outs4 = _C.complex_scan_backward(dy, x, da, None, A, om, Bm, Cm, D, st4, *g4[:3],\n"
        "                                 chunk=16, ddelta_bias=g4[3], **step)\n"
        "np.savez(sys.argv[1], y, st, *outs, *g, y2, st2, *outs2, *g2, *cv, dw, db, y3, st3,\n"
        "         *outs3, *g3, y4, st4, *(o for o in outs4 if o is not None), *g4)\n"))


def test_scan_bad_input(rng):
    inp = scan_inputs(rng, 2, 9, 3, 4, True)
    args = list(inp.values())
    names = list(inp)
    for i, name in enumerate(names[:-1]):  # D (one axis) below
        def call(v, i=i):
            a = list(args)
            a[i] = v
            return _C.complex_scan_forward(*a)
        assert_array_argument_checked(call, name, args[i], sizes=(i > 0 and name != "A"),
                                      none_ok=name == "delta_angle")
    with raises_naming(ValueError, "D"):
        _C.complex_scan_forward(*args[:-1], randn(rng, 4))
    with raises_naming(TypeError, "D"):
        _C.complex_scan_forward(*args[:-1], inp["D"].astype(np.float64))
    with raises_naming(ValueError, "chunk"):
        _C.complex_scan_forward(*args, chunk=0)
    with raises_naming(ValueError, "bbar"):
        _C.complex_scan_forward(*args, bbar="exact")
    big = {**inp, "A": np.zeros((3, 129), np.float32), "omega": np.zeros((3, 129), np.float32),
           "B": randn(rng, 2, 9, 258), "C": randn(rng, 2, 9, 258)}
    with raises_naming(ValueError, "A"):
        _C.complex_scan_forward(*big.values())
    y, states = _C.complex_scan_forward(*args, chunk=4)
    dy = randn(rng, 2, 9, 3)
    grads = [np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32), np.zeros(3, np.float32)]
    with raises_naming(ValueError, "states"):  # 3 chunks of 4 saved, 2 of 5 asked for
        _C.complex_scan_backward(dy, *args, states, *grads, chunk=5)
    with raises_naming(ValueError, "dA"):
        _C.complex_scan_backward(dy, *args, states, grads[0][:, :3].copy(), *grads[1:], chunk=4)
    with raises_naming(ValueError, "dA"):  # written in place: must not alias an input
        _C.complex_scan_backward(dy, *args[:3], grads[0], *args[4:], states, grads[0],
                                 *grads[1:], chunk=4)
    real = [inp["x"], inp["delta"], inp["A"], inp["B"], inp["C"], inp["D"]]
    with raises_naming(ValueError, "B"):  # the real scan's B has K states, not 2K
        _C.selective_scan_forward(*real)


def test_complex_scan_rotation_is_sin_cos_of_the_step_angle():
    """The Euler rotation (scan.c's vsincos_fused) through the complex scan: with A = 0,
    omega = 1, one state and h_0 = (1, 0), the state after step 1 is (cos, sin) of that step's
    angle, exactly as vsincos_fused returns them (e^0 = 1, no other rounding). Against float64
    on |angle| <= 300 and near multiples of pi/2: within 2 ulps of the value, plus 1e-11 (the
    reduction by a three-part pi/2, near a zero)."""
    rng = np.random.default_rng(11)
    near = (np.arange(-400, 400) * (np.pi / 2)).astype(np.float32)
    th = np.concatenate([rng.uniform(-300, 300, 12000), rng.uniform(-4, 4, 4000), near,
                         np.nextafter(near, np.float32(np.inf)), [0.0, -0.0]]).astype(np.float32)
    E = th.size
    x = np.zeros((1, 2, E), np.float32)
    x[0, 0] = 1
    dangle = np.zeros((1, 2, E), np.float32)
    dangle[0, 1] = th
    Bm = np.array([[[1, 0], [0.5, 0.25]]], np.float32)
    _, states = _C.complex_scan_forward(x, np.ones((1, 2, E), np.float32), dangle,
                                        np.zeros((E, 1), np.float32), np.ones((E, 1), np.float32),
                                        Bm, np.ones((1, 2, 2), np.float32),
                                        np.zeros(E, np.float32), chunk=2)
    t64 = th.astype(np.float64)
    for name, got, expected in (("cos", states[0, 0, :, 0], np.cos(t64)),
                                ("sin", states[0, 0, :, 1], np.sin(t64))):
        ulp = np.spacing(np.abs(expected).astype(np.float32)).astype(np.float64)
        assert_within(got, expected, 2 * ulp + 1e-11, name)
    assert states[0, 0, -1, 0] == 1 and states[0, 0, -1, 1] == 0


def test_scan_same_bits_at_any_alignment(rng):
    """Every input at float offsets 0 .. 7 of a fresh buffer (rows straddling cache lines in
    every way the vector loads and their prefetches meet): the same bits as the fresh arrays,
    forward and backward, real and complex, E = 37 (full groups and a tail)."""
    B, T, E, K = 2, 21, 37, 3

    def shifted(a, off):
        buf = np.empty(a.size + 8, np.float32)
        view = buf[off:off + a.size].reshape(a.shape)
        view[...] = a
        return view

    for cx in (False, True):
        inp = scan_inputs(rng, B, T, E, K, cx)
        dy = randn(rng, B, T, E)
        y, states, grads = run_c(inp, dy, 8, "euler")
        for off in range(8):
            moved = {name: shifted(v, off) for name, v in inp.items()}
            y2, states2, grads2 = run_c(moved, shifted(dy, off), 8, "euler")
            assert np.array_equal(y, y2) and np.array_equal(states, states2), off
            for name, g in grads.items():
                assert np.array_equal(g, grads2[name]), (off, name)


@pytest.mark.parametrize("E", [5, 17, 24, 40, 70])
def test_scan_same_bits_on_every_kernel_set(rng, restore_kernels, E):
    """The scans run 16 channels per group on the avx512 set and 8 (x86-64) on every other:
    the same bits on each, forward and backward (dB, dC sum over channels by one tree), real
    and complex, Euler and ZOH; E in full groups of 8 and 16, and tails of either; K 16 and 8
    (the avx512 set's unrolled real and complex Euler scans) and 5."""
    for cx in (False, True):
        for bbar in ("euler", "zoh"):
            inp = scan_inputs(rng, 2, 19, E, {24: 16, 40: 8}.get(E, 5), cx)
            dy = randn(rng, 2, 19, E)
            runs = {}
            for kset in _C.kernel_sets():
                _C.set_kernels(kset)
                y, states, grads = run_c(inp, dy, 7, bbar)
                runs[kset] = [y, states, *(grads[k] for k in sorted(grads))]
            first, *others = runs.values()
            for kset, outs in zip(list(runs)[1:], others):
                for a, b in zip(first, outs):
                    assert a.tobytes() == b.tobytes(), (kset, cx, bbar)


@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
def test_scan_chunk_beyond_t_is_one_chunk(rng, restore_kernels, cx):
    """A chunk longer than T is one chunk of T steps: clamped to T before any arithmetic, so
    huge ones (2**31: scratch sized by chunk was a MemoryError; 2**60: its scratch size
    wrapped int64 and the backward wrote past it; 2**63 - 1: ceil(T / chunk) wrapped to 0
    chunks and the forward wrote past states) give chunk = T's bits, states of one chunk, on
    every kernel set, Euler and ZOH."""
    T = 5
    inp = scan_inputs(rng, 2, T, 9, 3, cx)
    dy = randn(rng, 2, T, 9)
    for kset in _C.kernel_sets():
        _C.set_kernels(kset)
        for bbar in ("euler", "zoh"):
            want = run_c(inp, dy, T, bbar)
            for chunk in (T + 1, 2**31, 2**60, 2**62, 2**63 - 1):
                y, states, grads = run_c(inp, dy, chunk, bbar)
                assert states.shape == (2, 1, 9, inp["B"].shape[2])
                assert y.tobytes() == want[0].tobytes(), (kset, bbar, chunk)
                assert states.tobytes() == want[1].tobytes(), (kset, bbar, chunk)
                for name in grads:
                    assert grads[name].tobytes() == want[2][name].tobytes(), (name, chunk)
    check_scan(inp, dy, 2**63 - 1, "euler")  # and both against the reference


@pytest.mark.parametrize("cx,K", [(False, 129), (False, 256), (True, 128)],
                         ids=["real-129", "real-256", "complex-128"])
def test_scan_at_the_bindings_state_limit(rng, restore_kernels, cx, K):
    """K up to the binding's limit (real: 256 states; complex: 128, 2K = 256 floats) against
    the reference on every kernel set (the real backward's domega runs, sized for 128
    vectors, were zeroed for every k < K: past the array for 128 < K; UBSan saw it), and one
    state past it refused naming A."""
    inp = scan_inputs(rng, 1, 6, 3, K, cx)
    dy = randn(rng, 1, 6, 3)
    for kset in _C.kernel_sets():
        _C.set_kernels(kset)
        check_scan(inp, dy, 4, "euler")
    wide = scan_inputs(rng, 1, 6, 3, K + 1 if K in (128, 256) else 257, cx)
    fwd = _C.complex_scan_forward if cx else _C.selective_scan_forward
    with raises_naming(ValueError, "A"):
        fwd(*wide.values())


def test_activations_same_bits_on_every_kernel_set(rng, restore_kernels):
    """SiLU, softplus and the SiLU gate run 16 floats a vector on the avx512 set, 8 on the
    others: the same bits (lengths with tails of every size, softplus past its threshold and
    in its tails)."""
    for n in (1, 7, 15, 17, 33, 20011):
        x = (rng.standard_normal(n) * 12).astype(np.float32)
        dy, y = randn(rng, n), randn(rng, n)
        runs = []
        for kset in _C.kernel_sets():
            _C.set_kernels(kset)
            runs.append([_C.silu_forward(x), _C.silu_backward(dy, x), _C.softplus_forward(x),
                         _C.softplus_backward(dy, x), _C.silu_gate_forward(y, x),
                         *_C.silu_gate_backward(dy, y, x)])
        for outs in runs[1:]:
            for a, b in zip(runs[0], outs):
                assert a.tobytes() == b.tobytes(), n
