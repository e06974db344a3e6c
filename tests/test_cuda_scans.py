"""The CUDA scan and group kernels (cuda/scan.cu, sln.cu, b4.cu, nc.cu) executed on the CPU
under the emulation of CUDA's model (tests/cuda_emulation.py) against the float64 reference,
forward and backward, on awkward sizes (1, odd, prime; partial channel blocks and time tiles,
chunks of 1, shorter and longer than a tile), under the three block schedules (the serial
orders must give the same bits: test_cuda_ops.run). Tolerances: the scans' normwise bound of
tests/test_scan.py (gamma(4 (T + K)) of the largest value, twice that for gradients); the group
ops the C op tests' categories."""
import ctypes

import numpy as np
import pytest

from conftest import assert_close, randn
from cuda_emulation import Emulation, build
from mapformer import reference as ref
from test_cuda_ops import empty, run
from test_scan import normwise, run_ref, scan_inputs


@pytest.fixture(scope="module")
def emu():
    e = Emulation(build())
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


def run_cuda_scan(emu, inp, dy, chunk, bbar):
    """The kernels' forward and backward: y, states, and the gradients as a dict named as
    test_scan.run_ref's (the parameter gradients start from nonzero values: +=)."""
    cx = "omega" in inp
    name = "complex_scan" if cx else "selective_scan"
    B, T, E = inp["x"].shape
    K = inp["A"].shape[1]
    S = inp["B"].shape[2]
    NC = -(-T // chunk)
    sizes = dict(B=B, T=T, E=E, K=K, chunk=chunk, bbar=int(bbar == "zoh"))
    common = dict(x=inp["x"], delta=inp["delta"], A=inp["A"], Bm=inp["B"], Cm=inp["C"],
                  D=inp["D"], **sizes)
    if cx:
        common.update(delta_angle=inp["delta_angle"], omega=inp["omega"])
    y, states = run(emu, f"{name}_forward_cuda", "MfScanParams",
                    lambda: dict(y=empty(B, T, E), states=empty(B, NC, E, S), **common),
                    ["y", "states"])
    n = scratch_floats(emu, f"{name}_backward_scratch_floats_cuda", **sizes)
    assert n > 0
    start = {k: np.full(inp[k].shape, 0.25, np.float32)
             for k in (("A", "omega", "D") if cx else ("A", "D"))}
    outs = ["dx", "ddelta", "dBm", "dCm", "dA", "dD"] + (["ddelta_angle", "domega"] if cx else [])

    def make():
        f = dict(dx=empty(B, T, E), ddelta=empty(B, T, E), dBm=empty(B, T, S),
                 dCm=empty(B, T, S), dA=start["A"].copy(), dD=start["D"].copy(), dy=dy,
                 states_in=states, scratch=empty(n), scratch_floats=n, **common)
        if cx:
            f.update(ddelta_angle=empty(B, T, E), domega=start["omega"].copy())
        return f
    got = dict(zip(outs, run(emu, f"{name}_backward_cuda", "MfScanParams", make, outs)))
    grads = {"x": got["dx"], "delta": got["ddelta"], "B": got["dBm"], "C": got["dCm"],
             "A": got["dA"] - start["A"], "D": got["dD"] - start["D"]}
    if cx:
        grads.update(delta_angle=got["ddelta_angle"], omega=got["domega"] - start["omega"])
    return y, states, grads


def check_scan(emu, inp, dy, chunk, bbar):
    T, K = inp["x"].shape[1], inp["A"].shape[1]
    y, states, grads = run_cuda_scan(emu, inp, dy, chunk, bbar)
    ry, rstates, rgrads = run_ref(inp, dy, chunk, bbar)
    n = 4 * (T + K)
    normwise(y, ry, n, "y")
    normwise(states, rstates, n, "states")
    assert set(grads) == set(rgrads)
    for name, g in rgrads.items():
        normwise(grads[name], g, 2 * n, f"d{name}")


# (B, T, E, K): one of everything; odd sizes; a partial channel block and time tile; more
# channels than a backward block (SCAN_EB = 64) with a partial one
SCAN_SIZES = [(1, 1, 1, 1), (2, 13, 5, 3), (1, 37, 11, 2), (2, 18, 67, 1)]


@pytest.mark.parametrize("B,T,E,K", SCAN_SIZES)
@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_scan(emu, rng, B, T, E, K, cx, bbar):
    inp = scan_inputs(rng, B, T, E, K, cx)
    dy = randn(rng, B, T, E)
    for chunk in ((1, 5, 256) if T * E < 300 else (7,)):
        check_scan(emu, inp, dy, chunk, bbar)


@pytest.mark.parametrize("bbar", ["euler", "zoh"])
def test_complex_scan_signed_angle(emu, rng, bbar):
    inp = scan_inputs(rng, 2, 21, 6, 3, True, signed=True)
    check_scan(emu, inp, randn(rng, 2, 21, 6), 8, bbar)


def test_scan_zero_decay_small_steps(emu, rng):
    """A = 0 (a pure rotation) and steps near zero: ZOH's series branch."""
    inp = scan_inputs(rng, 1, 17, 3, 2, True)
    inp["A"][:] = 0
    inp["delta"][0, :5] = 1e-4
    for bbar in ("euler", "zoh"):
        check_scan(emu, inp, randn(rng, 1, 17, 3), 4, bbar)


def test_scan_bad_sizes_and_scratch(emu, rng):
    inp = scan_inputs(rng, 1, 4, 2, 2, False)
    sizes = dict(B=1, T=4, E=2, K=2, chunk=2, bbar=0)
    assert scratch_floats(emu, "selective_scan_backward_scratch_floats_cuda",
                          **{**sizes, "K": 257}) == 0
    common = dict(x=inp["x"], delta=inp["delta"], A=inp["A"], Bm=inp["B"], Cm=inp["C"],
                  D=inp["D"])
    y, st = empty(1, 4, 2), empty(1, 2, 2, 2)
    for bad in (dict(chunk=0), dict(T=0), dict(bbar=2), dict(K=257)):
        assert emu.call("selective_scan_forward_cuda", "MfScanParams", y=y, states=st,
                        **common, **{**sizes, **bad}) == 1, bad
    n = scratch_floats(emu, "selective_scan_backward_scratch_floats_cuda", **sizes)
    g = [empty(1, 4, 2), empty(1, 4, 2), empty(1, 4, 2), empty(1, 4, 2),
         np.zeros((2, 2), np.float32), np.zeros(2, np.float32)]
    assert emu.call("selective_scan_backward_cuda", "MfScanParams", dx=g[0], ddelta=g[1],
                    dBm=g[2], dCm=g[3], dA=g[4], dD=g[5], dy=y, states_in=st,
                    scratch=empty(n), scratch_floats=n - 1, **common, **sizes) == 1
