"""The CUDA scan and group kernels (cuda/scan.cu, sln.cu, b4.cu, nc.cu) executed on the CPU
under the emulation of CUDA's model (tests/cuda_emulation.py) against the float64 reference,
forward and backward, on awkward sizes (1, odd, prime; partial channel blocks and time tiles,
chunks of 1, shorter and longer than a tile), under the three block schedules (the serial
orders must give the same bits: test_cuda_ops.run); the scans' step as the C op's (delta_bias,
softplus, the complex rotation taking the step when delta_angle is None). Tolerances: the scans' normwise bound of
tests/test_scan.py (gamma(4 (T + K)) of the largest value, twice that for gradients); the group
ops the C op tests' categories."""
import ctypes

import numpy as np
import pytest

import test_b4 as b4_tests
import test_nc as nc_tests
import test_sln as sln_tests
from conftest import U32, assert_close, assert_within, gamma, randn, raises_naming
from cuda_emulation import kernels
from mapformer import _C
from mapformer import reference as ref
from test_cuda_backend import gpu
from test_cuda_ops import empty, run
from test_scan import normwise, scan_inputs


@pytest.fixture(scope="module")
def emu():
    e = kernels()
    yield e
    e.schedule("concurrent")


def scratch_floats(emu, function, **fields):
    """The library's <op>_scratch_floats_cuda of the struct with these fields."""
    params = emu.structs["MfScanParams"]()
    for key, value in fields.items():
        setattr(params, key, value)
    fn = getattr(emu.lib, function)
    fn.argtypes = [ctypes.POINTER(emu.structs["MfScanParams"])]
    fn.restype = ctypes.c_int64
    return fn(ctypes.byref(params))


START = 0.25  # the parameter gradients' values before the backward


def run_cuda_scan(emu, inp, dy, chunk, bbar, delta_bias=None, delta_activation="none"):
    """The kernels' forward and backward: y, states, and the gradients as a dict named as
    test_scan.run_ref's (the parameter gradients start from nonzero values: +=), with
    delta_bias's ("delta_bias") when it is given; inp["delta_angle"] None: the rotation takes
    the step (no ddelta_angle)."""
    cx = "omega" in inp
    name = "complex_scan" if cx else "selective_scan"
    B, T, E = inp["x"].shape
    K = inp["A"].shape[1]
    S = inp["B"].shape[2]
    NC = -(-T // chunk)
    sizes = dict(B=B, T=T, E=E, K=K, chunk=chunk, bbar=int(bbar == "zoh"),
                 delta_softplus=int(delta_activation == "softplus"))
    common = dict(x=inp["x"], delta=inp["delta"], A=inp["A"], Bm=inp["B"], Cm=inp["C"],
                  D=inp["D"], delta_bias=delta_bias, **sizes)
    angle = cx and inp["delta_angle"] is not None
    if cx:
        common.update(delta_angle=inp["delta_angle"], omega=inp["omega"])
    y, states = run(emu, f"{name}_forward_cuda", "MfScanParams",
                    lambda: dict(y=empty(B, T, E), states=empty(B, NC, E, S), **common),
                    ["y", "states"])
    n = scratch_floats(emu, f"{name}_backward_scratch_floats_cuda", **sizes)
    assert n > 0
    biased = delta_bias is not None
    start = {k: np.full(inp[k].shape, START, np.float32)
             for k in (("A", "omega", "D") if cx else ("A", "D"))}
    outs = (["dx", "ddelta", "dBm", "dCm", "dA", "dD"] + (["domega"] if cx else [])
            + (["ddelta_angle"] if angle else []) + (["ddelta_bias"] if biased else []))

    def make():
        f = dict(dx=empty(B, T, E), ddelta=empty(B, T, E), dBm=empty(B, T, S),
                 dCm=empty(B, T, S), dA=start["A"].copy(), dD=start["D"].copy(), dy=dy,
                 states_in=states, scratch=empty(n), scratch_floats=n, **common)
        if cx:
            f.update(domega=start["omega"].copy())
        if angle:
            f.update(ddelta_angle=empty(B, T, E))
        if biased:
            f.update(ddelta_bias=np.full(E, START, np.float32))
        return f
    got = dict(zip(outs, run(emu, f"{name}_backward_cuda", "MfScanParams", make, outs)))
    grads = {"x": got["dx"], "delta": got["ddelta"], "B": got["dBm"], "C": got["dCm"],
             "A": got["dA"], "D": got["dD"]}
    if cx:
        grads.update(omega=got["domega"])
    if angle:
        grads.update(delta_angle=got["ddelta_angle"])
    if biased:
        grads.update(delta_bias=got["ddelta_bias"])
    return y, states, grads


def run_ref(inp, dy, chunk, bbar, delta_bias=None, delta_activation="none"):
    """mapformer.reference's forward and backward: y, states and the gradients named as
    run_cuda_scan's (delta_bias's: ddelta summed over b and t)."""
    cx = "omega" in inp
    fwd, bwd = ((ref.complex_scan_forward, ref.complex_scan_backward) if cx else
                (ref.selective_scan_forward, ref.selective_scan_backward))
    step = dict(delta_bias=delta_bias, delta_activation=delta_activation)
    y, states = fwd(*inp.values(), chunk, bbar, **step)
    names = (("x", "delta", "delta_angle", "A", "omega", "B", "C", "D") if cx else
             ("x", "delta", "A", "B", "C", "D"))
    grads = {k: g for k, g in zip(names, bwd(dy, *inp.values(), chunk, bbar, **step))
             if g is not None}
    if delta_bias is not None:
        grads["delta_bias"] = grads["delta"].sum((0, 1))
    return y, states, grads


def check_scan(emu, inp, dy, chunk, bbar, delta_bias=None, delta_activation="none"):
    B, T, K = inp["x"].shape[0], inp["x"].shape[1], inp["A"].shape[1]
    y, states, grads = run_cuda_scan(emu, inp, dy, chunk, bbar, delta_bias, delta_activation)
    ry, rstates, rgrads = run_ref(inp, dy, chunk, bbar, delta_bias, delta_activation)
    n = 4 * (T + K)
    normwise(y, ry, n, "y")
    normwise(states, rstates, n, "states")
    assert set(grads) == set(rgrads)
    for name, g in rgrads.items():
        if name in ("A", "omega", "D"):  # += START: one more float32 rounding
            scale = np.abs(g).max()
            assert_within(grads[name], g + START,
                          gamma(2 * n) * scale + 2 * U32 * np.abs(g + START), f"d{name} (+=)")
        elif name == "delta_bias":  # B T values of ddelta's bound, summed in double, += START
            scale = np.abs(rgrads["delta"]).max()
            assert_within(grads[name], g + START,
                          B * T * gamma(2 * n) * scale + 2 * U32 * np.abs(g + START),
                          "ddelta_bias (+=)")
        else:
            normwise(grads[name], g, 2 * n, f"d{name}")


# (B, T, E, K, chunks): one of everything; chunks of one step; odd sizes with chunks shorter
# than a time tile (SCAN_NT = 16) and one chunk; several tiles with a partial channel block;
# more channels than a backward block (SCAN_EB = 64), with a partial one
SCAN_SIZES = [(1, 1, 1, 1, (1, 256)), (1, 4, 3, 2, (1,)), (2, 13, 5, 3, (5, 256)),
              (1, 37, 11, 2, (256,)), (1, 18, 67, 1, (7,))]


@pytest.mark.parametrize("B,T,E,K,chunks", SCAN_SIZES)
@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_scan(emu, rng, B, T, E, K, chunks, cx, bbar):
    inp = scan_inputs(rng, B, T, E, K, cx)
    dy = randn(rng, B, T, E)
    for chunk in chunks:
        check_scan(emu, inp, dy, chunk, bbar)


@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_complex_scan_signed_angle(emu, rng, bbar):
    inp = scan_inputs(rng, 1, 21, 6, 3, True, signed=True)
    check_scan(emu, inp, randn(rng, 1, 21, 6), 8, bbar)


def test_scan_zero_decay_small_steps(emu, rng):
    """A = 0 (a pure rotation) and steps near zero: ZOH's series branch."""
    inp = scan_inputs(rng, 1, 17, 3, 2, True)
    inp["A"][:] = 0
    inp["delta"][0, :5] = 1e-4
    for bbar in ("euler", "zoh"):
        check_scan(emu, inp, randn(rng, 1, 17, 3), 4, bbar)


def step_inputs(rng, B, T, E, K, cx, angle):
    """scan_inputs with delta the step's pre-activation (softplus(delta + delta_bias) in about
    [0.005, 1.5] as scan_inputs' steps; one step past softplus's threshold, one far below) and
    delta_bias (E,); angle (complex): "array", a signed delta_angle, or "step", None (the
    rotation takes the step). Returns (inputs, delta_bias). delta and delta_bias lie on a grid
    of 2^-12, so that their float32 sum is exact: the reference adds them in float64, and
    softplus(v) far below 0 (about e^v) would turn the sum's rounding into |v| ulps."""
    inp = scan_inputs(rng, B, T, E, K, cx, signed=True)
    grid = lambda a: (np.round(np.asarray(a) * 4096) / 4096).astype(np.float32)  # noqa: E731
    bias = grid(randn(rng, E) * 0.5)
    inp["delta"] = grid(rng.standard_normal((B, T, E)) * 1.5 - 2 - bias)
    inp["delta"][0, -1, 0] = 20.5 - bias[0]
    inp["delta"][-1, 0, -1] = -30.0
    if cx and angle == "step":
        inp["delta_angle"] = None
    return inp, bias


# (B, T, E, K, chunk): one of everything; odd sizes, chunks shorter than a time tile; two
# channel groups (SCAN_EC = 8), the second partial, and steps past a tile (SCAN_NT = 16)
STEP_SIZES = [(1, 1, 1, 1, 1), (2, 13, 5, 3, 5), (1, 18, 9, 2, 7)]


@pytest.mark.parametrize("B,T,E,K,chunk", STEP_SIZES)
@pytest.mark.parametrize("cx,angle", [(False, None), (True, "array"), (True, "step")],
                         ids=["real", "complex", "complex_step_angle"])
@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_scan_step_bias_softplus(emu, rng, B, T, E, K, chunk, cx, angle, bbar):
    """The step softplus(delta + delta_bias) formed inside the scan (and taken by the rotation
    when delta_angle is None): against the reference, ddelta delta's gradient, ddelta_bias
    its sum over b, t (+=)."""
    inp, bias = step_inputs(rng, B, T, E, K, cx, angle)
    check_scan(emu, inp, randn(rng, B, T, E), chunk, bbar, bias, "softplus")


@pytest.mark.parametrize("cx,angle", [(False, None), (True, "step")], ids=["real", "complex"])
def test_scan_step_bias_or_softplus_alone(emu, rng, cx, angle):
    """delta_bias without softplus (steps kept positive), and softplus without delta_bias."""
    inp, bias = step_inputs(rng, 2, 11, 9, 2, cx, angle)
    dy = randn(rng, 2, 11, 9)
    check_scan(emu, inp, dy, 4, "zoh", None, "softplus")
    inp["delta"] = (ref.softplus_forward(inp["delta"]) + 0.5 - bias).astype(np.float32)
    check_scan(emu, inp, dy, 4, "euler", bias, "none")


def test_scan_bad_sizes_and_scratch(emu, rng):
    inp = scan_inputs(rng, 1, 4, 2, 2, False)
    sizes = dict(B=1, T=4, E=2, K=2, chunk=2, bbar=0)
    assert scratch_floats(emu, "selective_scan_backward_scratch_floats_cuda",
                          **{**sizes, "K": 257}) == 0
    common = dict(x=inp["x"], delta=inp["delta"], A=inp["A"], Bm=inp["B"], Cm=inp["C"],
                  D=inp["D"])
    y, st = empty(1, 4, 2), empty(1, 2, 2, 2)
    for bad in (dict(chunk=0), dict(T=0), dict(bbar=2), dict(K=257), dict(delta_softplus=2)):
        assert emu.call("selective_scan_forward_cuda", "MfScanParams", y=y, states=st,
                        **common, **{**sizes, **bad}) == 1, bad
    n = scratch_floats(emu, "selective_scan_backward_scratch_floats_cuda", **sizes)
    g = [empty(1, 4, 2), empty(1, 4, 2), empty(1, 4, 2), empty(1, 4, 2),
         np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]
    assert emu.call("selective_scan_backward_cuda", "MfScanParams", dx=g[0], ddelta=g[1],
                    dBm=g[2], dCm=g[3], dA=g[4], dD=g[5], dy=y, states_in=st,
                    scratch=empty(n), scratch_floats=n - 1, **common, **sizes) == 1
    # delta_bias's gradient goes to ddelta_bias: both or neither
    bias, dbias = np.zeros(2, np.float32), np.zeros(2, np.float32)
    for step in (dict(delta_bias=bias), dict(ddelta_bias=dbias)):
        assert emu.call("selective_scan_backward_cuda", "MfScanParams", dx=g[0], ddelta=g[1],
                        dBm=g[2], dCm=g[3], dA=g[4], dD=g[5], dy=y, states_in=st,
                        scratch=empty(n), scratch_floats=n, **common, **sizes, **step) == 1
    assert not dbias.any() and not g[4].any() and not g[5].any()


# ---- sln, b4, nc: one thread per sequence forward, a block per (h, k) over b backward -------
# (B, T, H, NB): ones; odd and prime; more batch rows than a backward block's 32 threads
GROUP_SIZES = [(1, 1, 1, 1), (3, 7, 2, 3), (2, 13, 3, 5), (37, 3, 1, 2)]


@pytest.mark.parametrize("B,T,H,NB", GROUP_SIZES)
def test_sln(emu, rng, B, T, H, NB):
    delta, gen, start = sln_tests.inputs(rng, B, T, H, NB)
    sizes = dict(B=B, T=T, H=H, NB=NB, D=2 * NB, F=4, clamp=3.0)
    (p,) = run(emu, "sln_forward_cuda", "MfSlnParams",
               lambda: dict(p=empty(B, T, H, 2 * NB), delta=delta, gen=gen, start=start,
                            **sizes), ["p"])
    expected = ref.sln_forward(delta, gen, start, 3.0)
    assert_within(p, expected, sln_tests.magnitude_bound(expected), "p")
    dp = randn(rng, B, T, H, 2 * NB)
    ddelta, dgen, dstart = run(
        emu, "sln_backward_cuda", "MfSlnParams",
        lambda: dict(ddelta=empty(B, T, H, NB), dgen=np.full_like(gen, 0.5),
                     dstart=np.full_like(start, -0.25), dp=dp, delta=delta, gen=gen,
                     start=start, **sizes), ["ddelta", "dgen", "dstart"])
    e_ddelta, e_dgen, e_dstart = ref.sln_backward(dp, delta, gen, start, 3.0)
    bound = sln_tests.magnitude_bound
    assert_within(ddelta, e_ddelta, 2 * bound(e_ddelta), "ddelta")
    assert_within(dgen, e_dgen + 0.5, 2 * bound(np.abs(e_dgen) + 0.5), "dgen (+=)")
    assert_within(dstart, e_dstart - 0.25, 2 * bound(np.abs(e_dstart) + 0.25), "dstart (+=)")


@pytest.mark.parametrize("B,T,H,NB", GROUP_SIZES)
def test_b4(emu, rng, B, T, H, NB):
    delta, gen, start = b4_tests.inputs(rng, B, T, H, NB)
    sizes = dict(B=B, T=T, H=H, NB=NB, D=4 * NB, F=6)
    (p,) = run(emu, "b4_forward_cuda", "MfB4Params",
               lambda: dict(p=empty(B, T, H, 4 * NB), delta=delta, gen=gen, start=start,
                            **sizes), ["p"])
    expected = ref.b4_forward(delta, gen, start)
    assert_within(p, expected, b4_tests.bound(expected, 1), "p")
    dp = randn(rng, B, T, H, 4 * NB)
    ddelta, dgen, dstart = run(
        emu, "b4_backward_cuda", "MfB4Params",
        lambda: dict(ddelta=empty(B, T, H, NB), dgen=np.full_like(gen, 0.5),
                     dstart=np.full_like(start, -0.25), dp=dp, delta=delta, gen=gen,
                     start=start, **sizes), ["ddelta", "dgen", "dstart"])
    e_ddelta, e_dgen, e_dstart = ref.b4_backward(dp, delta, gen, start)
    bound = b4_tests.bound
    assert_within(ddelta, e_ddelta, bound(e_ddelta, T), "ddelta")
    assert_within(dgen, e_dgen + 0.5, bound(np.abs(e_dgen) + 0.5, B * T), "dgen (+=)")
    assert_within(dstart, e_dstart - 0.25, bound(np.abs(e_dstart) + 0.25, B * T),
                  "dstart (+=)")


@pytest.mark.parametrize("B,T,H,NB", GROUP_SIZES)
def test_nc(emu, rng, B, T, H, NB):
    w, start = nc_tests.inputs(rng, B, T, H, NB)
    sizes = dict(B=B, T=T, H=H, NB=NB, D=4 * NB, F=6)
    (p,) = run(emu, "nc_forward_cuda", "MfNcParams",
               lambda: dict(p=empty(B, T, H, 4 * NB), w=w, start=start, **sizes), ["p"])
    expected = ref.nc_forward(w, start)
    dp = randn(rng, B, T, H, 4 * NB)
    bp, bw, bs = nc_tests.bounds(w, start, dp)
    assert_within(p, expected, bp + U32 * np.abs(expected), "p")
    dw, dstart = run(emu, "nc_backward_cuda", "MfNcParams",
                     lambda: dict(dw=empty(B, T, H, 6, NB), dstart=np.full_like(start, -0.25),
                                  dp=dp, w=w, start=start, **sizes), ["dw", "dstart"])
    e_dw, e_dstart = ref.nc_backward(dp, w, start)
    assert_within(dw, e_dw, bw + U32 * np.abs(e_dw), "dw")
    assert_within(dstart, e_dstart - 0.25, bs + 2 * U32 * (np.abs(e_dstart) + 0.25),
                  "dstart (+=)")


def test_group_ops_bad_sizes(emu, rng):
    delta, gen, start = sln_tests.inputs(rng, 1, 2, 1, 2)
    p = empty(1, 2, 1, 4)
    sizes = dict(B=1, T=2, H=1, NB=2, D=4, F=4, clamp=3.0)
    for bad in (dict(D=5), dict(F=6), dict(clamp=0.0), dict(T=-1)):
        assert emu.call("sln_forward_cuda", "MfSlnParams", p=p, delta=delta, gen=gen,
                        start=start, **{**sizes, **bad}) == 1, bad
    for fn, struct in (("b4_forward_cuda", "MfB4Params"), ("nc_forward_cuda", "MfNcParams")):
        assert emu.call(fn, struct, p=p, B=1, T=2, H=1, NB=1, D=4, F=4) == 1
    # nothing to do: no launch, no write
    assert emu.call("nc_forward_cuda", "MfNcParams", p=p, B=1, T=0, H=1, NB=1, D=4, F=6) == 0
    assert np.isnan(p).all()


# ---- the Python wrappers (mapformer.cuda.ops) against the C backend -------------------------
@pytest.fixture(scope="module")
def emulated(emu):
    return emu.ops()


def compare_with_c(ops, rng, dev, host):
    """The scan and group ops of ``ops`` against mapformer._C on small inputs."""
    B, T, E, K = 2, 9, 5, 2
    # the scans as they are, then with the step's delta_bias and softplus (the complex scan's
    # rotation taking the step: delta_angle None)
    for cx, step in ((False, False), (True, False), (False, True), (True, True)):
        inp, bias = step_inputs(rng, B, T, E, K, cx, "step" if step else "array")
        dy = randn(rng, B, T, E)
        args = list(inp.values())
        dv = lambda a: None if a is None else dev(a)  # noqa: E731
        name = "complex_scan" if cx else "selective_scan"
        if step:
            kw, kw_c = (dict(delta_bias=b, delta_activation="softplus") for b in (dv(bias), bias))
        else:
            kw = kw_c = {}
            inp["delta"] = ref.softplus_forward(inp["delta"]).astype(np.float32)
            args = list(inp.values())
        for bbar in ("euler", "zoh"):
            y, st = getattr(ops, f"{name}_forward")(*map(dv, args), chunk=4, bbar=bbar, **kw)
            y_c, st_c = getattr(_C, f"{name}_forward")(*args, chunk=4, bbar=bbar, **kw_c)
            assert_close(host(y), y_c, "reduction", f"{name} y")
            assert_close(host(st), st_c, "reduction", f"{name} states")
            shapes = [inp[k].shape for k in (("A", "omega", "D") if cx else ("A", "D"))]
            params = [dev(np.ones(s, np.float32)) for s in shapes]
            params_c = [np.ones(s, np.float32) for s in shapes]
            grad, grad_c = {}, {}
            if step:  # delta_bias's gradient, += as the parameters'
                grad, grad_c = dict(ddelta_bias=dev(np.ones(E, np.float32))), \
                    dict(ddelta_bias=np.ones(E, np.float32))
            got = getattr(ops, f"{name}_backward")(dev(dy), *map(dv, args), st, *params,
                                                   chunk=4, bbar=bbar, **kw, **grad)
            want = getattr(_C, f"{name}_backward")(dy, *args, st_c, *params_c, chunk=4,
                                                   bbar=bbar, **kw_c, **grad_c)
            assert len(got) == len(want)
            for a, e in zip([*got, *params, *grad.values()],
                            [*want, *params_c, *grad_c.values()]):
                if e is None:  # ddelta_angle without delta_angle
                    assert a is None
                else:
                    assert_close(host(a), e, "gradient", f"{name} backward {bbar} step {step}")
    Bg, Tg, H, NB = 2, 5, 2, 3
    delta, gen, start = sln_tests.inputs(rng, Bg, Tg, H, NB)
    dp = randn(rng, Bg, Tg, H, 2 * NB)
    assert_close(host(ops.sln_forward(dev(delta), dev(gen), dev(start), 3.0)),
                 _C.sln_forward(delta, gen, start, 3.0), "reduction", "sln")
    dg, ds, dg_c, ds_c = (np.zeros_like(a) for a in (gen, start, gen, start))
    dgd, dsd = dev(dg), dev(ds)
    assert_close(host(ops.sln_backward(dev(dp), dev(delta), dev(gen), dev(start), dgd, dsd, 3.0)),
                 _C.sln_backward(dp, delta, gen, start, dg_c, ds_c, 3.0), "gradient", "dsln")
    assert_close(host(dgd), dg_c, "gradient", "sln dgen")
    assert_close(host(dsd), ds_c, "gradient", "sln dstart")
    delta, gen, start = b4_tests.inputs(rng, Bg, Tg, H, NB)
    dp = randn(rng, Bg, Tg, H, 4 * NB)
    assert_close(host(ops.b4_forward(dev(delta), dev(gen), dev(start))),
                 _C.b4_forward(delta, gen, start), "reduction", "b4")
    dg, ds, dg_c, ds_c = (np.zeros_like(a) for a in (gen, start, gen, start))
    dgd, dsd = dev(dg), dev(ds)
    assert_close(host(ops.b4_backward(dev(dp), dev(delta), dev(gen), dev(start), dgd, dsd)),
                 _C.b4_backward(dp, delta, gen, start, dg_c, ds_c), "gradient", "db4")
    assert_close(host(dgd), dg_c, "gradient", "b4 dgen")
    assert_close(host(dsd), ds_c, "gradient", "b4 dstart")
    w, start = nc_tests.inputs(rng, Bg, Tg, H, NB)
    assert_close(host(ops.nc_forward(dev(w), dev(start))), _C.nc_forward(w, start),
                 "reduction", "nc")
    ds, ds_c = np.zeros_like(start), np.zeros_like(start)
    dsd = dev(ds)
    assert_close(host(ops.nc_backward(dev(dp), dev(w), dev(start), dsd)),
                 _C.nc_backward(dp, w, start, ds_c), "gradient", "dnc")
    assert_close(host(dsd), ds_c, "gradient", "nc dstart")


def test_emulated_ops_match_the_c_backend(emulated, rng):
    compare_with_c(emulated, rng, lambda a: a, np.asarray)
    args = (*(np.ones((1, 2, 1), np.float32),) * 2, np.ones((1, 1), np.float32),
            *(np.ones((1, 2, 1), np.float32),) * 2, np.ones(1, np.float32))
    with pytest.raises(ValueError, match="^chunk must be an int >= 1, got 0$"):
        emulated.selective_scan_forward(*args, chunk=0)  # refused by the table, as _C does
    with pytest.raises(ValueError, match="^chunk must be an int >= 1, got 0$"):
        _C.selective_scan_forward(*args, chunk=0)


@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
def test_emulated_scan_bad_shapes(emulated, rng, cx):
    """The scans' wrappers check every array against the sizes of x (B, T, E) and A (E, K)
    (the kernels index by those alone), and the gradients added to in place for float32 and
    their shape: an error naming the argument before any launch, the gradients untouched."""
    inp = scan_inputs(rng, 2, 5, 3, 2, cx, signed=True)
    name = "complex_scan" if cx else "selective_scan"
    forward, backward = (getattr(emulated, f"{name}_{d}") for d in ("forward", "backward"))
    y, st = forward(*inp.values(), chunk=2)
    dy = randn(rng, 2, 5, 3)
    grads = {k: np.full_like(inp[k], 0.5) for k in (("A", "omega", "D") if cx else ("A", "D"))}
    c_forward, c_backward = (getattr(_C, f"{name}_{d}") for d in ("forward", "backward"))

    def same_error(fn, c_fn, *args, **kwargs):
        """the wrapper refuses the call with the C binding's own ValueError (the sizes fixed
        by the table's first array that has them, the disagreeing one named)"""
        with pytest.raises(ValueError) as c_error:
            c_fn(*args, **kwargs)
        with pytest.raises(ValueError) as cuda_error:
            fn(*args, **kwargs)
        assert str(cuda_error.value) == str(c_error.value)

    # a last axis one too long, and x and A with an axis too few
    for arg, a in inp.items():
        wider = np.zeros(a.shape[:-1] + (a.shape[-1] + 1,), np.float32)
        same_error(forward, c_forward, *{**inp, arg: wider}.values(), chunk=2)
        if arg in ("x", "A"):
            same_error(forward, c_forward, *{**inp, arg: a[0]}.values(), chunk=2)
    c_grads = {k: g.copy() for k, g in grads.items()}
    same_error(backward, c_backward, np.ascontiguousarray(dy[:, :4]), *inp.values(), st,
               *grads.values(), chunk=2)
    same_error(backward, c_backward, dy, *inp.values(), st, *grads.values(), chunk=1)
    assert all((g == 0.5).all() for g in c_grads.values())
    for arg in grads:
        g = grads[arg]
        strided = np.zeros(g.shape[:-1] + (2 * g.shape[-1],), np.float32)[..., ::2]
        for bad, exc in ((g.astype(np.float64), TypeError),
                         (np.zeros(g.size + 1, np.float32), ValueError),
                         (strided, ValueError)):
            with raises_naming(exc, "d" + arg):
                backward(dy, *inp.values(), st, *{**grads, arg: bad}.values(), chunk=2)
    for arg, g in grads.items():
        assert (g == 0.5).all(), arg


def test_emulated_scan_step_bad_input(emulated, rng):
    """The wrappers' step arguments: ValueError or TypeError naming the argument, before any
    launch (the gradients untouched)."""
    inp, bias = step_inputs(rng, 1, 5, 3, 2, True, "step")
    args = list(inp.values())
    ops = emulated
    with raises_naming(ValueError, "delta_activation"):
        ops.complex_scan_forward(*args, delta_activation="relu")
    with raises_naming(ValueError, "delta_bias"):
        ops.complex_scan_forward(*args, delta_bias=np.zeros(4, np.float32))
    with raises_naming(TypeError, "delta_bias"):
        ops.complex_scan_forward(*args, delta_bias=np.zeros(3, np.int32))
    step = dict(delta_bias=bias, delta_activation="softplus")
    y, st = ops.complex_scan_forward(*args, chunk=2, **step)
    grads = [np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32), np.zeros(3, np.float32)]
    dy = randn(rng, 1, 5, 3)
    with raises_naming(ValueError, "ddelta_bias"):  # required with delta_bias
        ops.complex_scan_backward(dy, *args, st, *grads, chunk=2, **step)
    with raises_naming(ValueError, "ddelta_bias"):  # given without it
        ops.complex_scan_backward(dy, *args, st, *grads, chunk=2,
                                  ddelta_bias=np.zeros(3, np.float32))
    with raises_naming(TypeError, "ddelta_bias"):  # written in place: float32 only
        ops.complex_scan_backward(dy, *args, st, *grads, chunk=2, **step,
                                  ddelta_bias=np.zeros(3, np.float64))
    with raises_naming(ValueError, "ddelta_bias"):
        ops.complex_scan_backward(dy, *args, st, *grads, chunk=2, **step,
                                  ddelta_bias=np.zeros(4, np.float32))
    with raises_naming(ValueError, "delta_activation"):
        ops.selective_scan_backward(dy, inp["x"], inp["delta"], inp["A"], randn(rng, 1, 5, 2),
                                    randn(rng, 1, 5, 2), inp["D"], st[..., :2].copy(),
                                    grads[0], grads[2], delta_activation="silu")
    assert not any(g.any() for g in grads)


def test_gpu_ops_match_the_c_backend(rng):
    ops, cupy = gpu()
    compare_with_c(ops, rng, cupy.asarray, cupy.asnumpy)
