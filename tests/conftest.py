"""Shared test helpers: tolerances as data, comparison, finite differences, random inputs,
the bad arguments every binding must refuse, leak checks, child processes."""
import os
import platform
import re
import subprocess
import sys

import numpy as np
import pytest

import mapformer
from mapformer import _C

# (rtol, atol) of a float32 C op against the float64 reference. Every slack beyond "default"
# says why it is needed.
TOLERANCES = {
    # elementwise ops: a few float32 ulps
    "default": (1e-5, 1e-6),
    # sums in float32 (dot products, sgemm, layernorm, attention over T keys, cumulative
    # angles over T steps): the error scales with sqrt(length) * eps32 * sum |terms|, not with
    # |result|, so cancelling sums need the absolute slack
    "reduction": (2e-4, 2e-5),
    # gradients that sum products over both T and D (attention dq/dk, weight gradients over
    # N = B*T rows): one more long reduction than "reduction"
    "gradient": (1e-3, 1e-4),
}


def assert_close(actual, expected, kind="default", name="value"):
    """Assert |actual - expected| <= atol + rtol * |expected| elementwise, with a message that
    gives the worst element."""
    rtol, atol = TOLERANCES[kind]
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    bound = atol + rtol * np.abs(expected)
    if not np.all(err <= bound):
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(
            f"{name} ({kind}: rtol={rtol}, atol={atol}): worst at {i}: got {actual[i]!r}, "
            f"expected {expected[i]!r}, |err| {err[i]:.3g} > bound {bound[i]:.3g}; "
            f"max |err| {err.max():.3g}"
        )


def assert_float32_accurate(actual, reference, baseline, name="value", magnitude=None,
                            factor=2.0):
    """FlashAttention's criterion, a tolerance that comes from the problem, not from one CPU:
    the largest error of ``actual`` (a float32 result of the C core) against ``reference``
    (float64) is at most ``factor`` times the largest error of ``baseline`` (the same math
    done in float32 NumPy, e.g. with :func:`matmul32`) against it, plus a floor of 8 float32
    ulps of the largest |reference| or, when given, of the largest ``magnitude``: the size of
    the terms rounded on the way to each result (a result that cancels to about zero, such as
    the query gradient of a query with one key, keeps the rounding of its terms, which float32
    NumPy may happen to cancel exactly). The error of float32 arithmetic grows with the
    magnitudes involved (long sums, large logits), and the bound grows with it."""
    actual = np.asarray(actual, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    baseline = np.asarray(baseline, dtype=np.float64)
    assert actual.shape == reference.shape == baseline.shape, \
        f"{name}: shapes {actual.shape}, {reference.shape}, {baseline.shape}"
    err = np.abs(actual - reference)
    base = np.abs(baseline - reference).max()
    size = np.abs(reference).max()
    if magnitude is not None:
        size = max(size, np.abs(np.asarray(magnitude, dtype=np.float64)).max())
    floor = 8 * np.finfo(np.float32).eps * size
    bound = factor * base + floor
    if not err.max() <= bound:
        i = np.unravel_index(np.argmax(err), err.shape)
        raise AssertionError(
            f"{name}: max |err| {err.max():.3g} at {i} (got {actual[i]!r}, expected "
            f"{reference[i]!r}) > {factor} x float32 NumPy's {base:.3g} + floor {floor:.3g}")


def kernel_fuses_multiply_add(kernel):
    """Whether kernel set ``kernel`` rounds a * b + c once (mapformer/simd.h's VFMA): every set
    but 'portable' on x86-64, compiled for the SSE2 baseline, which has no fused multiply-add
    ('blas' is OpenBLAS's sgemm, which fuses where the CPU can, as NumPy's does)."""
    return not (kernel == "portable" and platform.machine().lower() in ("x86_64", "amd64"))


def matmul32(a, b, fused=True):
    """a @ b of float32 arrays (matrices on the last two axes) in float32: NumPy's (BLAS,
    fused multiply-adds where the CPU has them) or, with fused=False, every product rounded
    before it is added, in order over the inner axis, as a kernel without fused multiply-adds
    computes it."""
    if fused:
        return a @ b
    out = np.zeros(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]),
                   np.float32)
    for i in range(a.shape[-1]):
        out += a[..., :, i:i + 1] * b[..., i:i + 1, :]
    return out


def numerical_grad(f, x, eps=1e-6):
    """Central finite differences of the scalar float64 function f at x (modified in place and
    restored): returns df/dx with x's shape."""
    grad = np.zeros_like(x, dtype=np.float64)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return grad


def assert_param_gradients(model, loss, params, rtol=1e-5, atol=1e-9, least=1e-6):
    """Run ``loss()`` and ``model.backward()``, then check each parameter's gradient against
    central finite differences of ``loss`` (float64 models) and that it is not all ~0
    (max |grad| > ``least``)."""
    loss()
    model.backward()
    for param in params:
        grad = param.grad.copy()
        np.testing.assert_allclose(grad, numerical_grad(loss, param.value), rtol=rtol,
                                   atol=atol, err_msg=param.name)
        assert np.abs(grad).max() > least, param.name


def assert_sampled_param_grads(model, loss, names, rng, count=5, eps=1e-6):
    """`count` random entries of each named parameter of `model` (its .grad filled by a
    backward of the float64 scalar `loss()`): the gradient against central differences."""
    for name in names:
        param = model.params.params[name]
        flat, grad = param.value.reshape(-1), param.grad.reshape(-1)
        for i in rng.choice(flat.size, count, replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = loss()
            flat[i] = old - eps
            down = loss()
            flat[i] = old
            assert np.isclose(grad[i], (up - down) / (2 * eps), rtol=1e-5, atol=1e-8), (name, i)


@pytest.fixture(params=_C.kernel_sets())
def kernel(request):
    """Run a test of an op with hand-written kernels (attention, conjunctive attention, linear,
    MLP) on every kernel set this CPU runs (mapformer._C.kernel_sets(): 'avx512' where the CPU
    has it, 'avx2', 'portable' and the OpenBLAS path 'blas'), restoring the active set after."""
    before = _C.kernels()
    _C.set_kernels(request.param)
    yield request.param
    _C.set_kernels(before)


@pytest.fixture(autouse=True, scope="session")
def run_checkpoints(tmp_path_factory):
    """Runs whose kind checkpoints (the OOD diagnosis, TDB's table) keep their checkpoints in
    a temporary directory (subprocesses inherit it), not in runs/ of the working directory."""
    os.environ["MAPFORMER_RUNS"] = str(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def randn(rng, *shape, scale=1.0):
    """A float32 C-contiguous array of standard normals times scale."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def subprocess_env(threads):
    """Environment for a child Python with OMP_NUM_THREADS=threads that imports this same
    build of mapformer (the installed one, or the source tree with an in-place build)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(mapformer.__file__)))
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": path}


# The head of a script that calls the attention op's C entry through ctypes, past the
# binding: MfAttentionParams as a ctypes.Structure (``Params``), ``lib`` with
# attention_forward and its scratch query typed, ``ptr`` (an array's float pointer)
ATTENTION_ENTRY = """
import ctypes
import numpy as np
from mapformer import _C

F = ctypes.POINTER(ctypes.c_float)
I = ctypes.POINTER(ctypes.c_int32)


class Params(ctypes.Structure):  # MfAttentionParams
    _fields_ = [(name, F) for name in ("out", "lse", "dq", "dk", "dv", "q", "k", "v", "dout",
                                        "o", "lse_in")] + \\
               [(name, ctypes.c_int64) for name in "BTHD"] + \\
               [("scale", ctypes.c_float), ("mask", ctypes.c_int), ("prefix", I),
                ("scratch", F), ("scratch_floats", ctypes.c_int64), ("pos_ids", I),
                ("pair_factor", F), ("npos", ctypes.c_int64)]


lib = ctypes.CDLL(_C.__file__)
lib.attention_forward.argtypes = [ctypes.POINTER(Params)]
lib.attention_forward_scratch_floats.argtypes = [ctypes.POINTER(Params)]
lib.attention_forward_scratch_floats.restype = ctypes.c_int64
ptr = lambda a: a.ctypes.data_as(F)  # noqa: E731
"""


def copies(*arrays):
    return [a.copy() for a in arrays]


def assert_unchanged(before, after):
    """The inputs (``after``) still equal the copies taken before the call (``before``)."""
    for i, (b, a) in enumerate(zip(before, after)):
        assert np.array_equal(b, a, equal_nan=True), f"input {i} was modified"


def raises_naming(exc, name):
    """pytest.raises for an error of type ``exc`` whose message starts with ``name``."""
    return pytest.raises(exc, match=rf"^{re.escape(name)}\b")


def bad_versions(x):
    """The versions of a good float32 array ``x`` (2 or more axes, the last longer than 1)
    that every binding must refuse with an error naming the argument: [(value, exception)]:
    a float64 copy, a nested list and None (TypeError); one axis too many, one too few, an empty
    last axis, Fortran order and a strided view (ValueError)."""
    return [(x.astype(np.float64), TypeError),
            (x.tolist(), TypeError),
            (None, TypeError),
            (x[None], ValueError),
            (x[0], ValueError),
            (np.zeros(x.shape[:-1] + (0,), np.float32), ValueError),
            (np.asfortranarray(x), ValueError),
            (np.repeat(x, 2, axis=-1)[..., ::2], ValueError)]


def assert_refuses_bad_versions(call, name, x, none_ok=False):
    """``call(value)`` passes ``value`` as the argument ``name`` (good array ``x``): every
    one of :func:`bad_versions` must raise its exception, naming ``name`` (but None where
    ``none_ok``: the argument takes it)."""
    for value, exc in bad_versions(x):
        if value is None and none_ok:
            continue
        with raises_naming(exc, name):
            call(value)


def assert_array_argument_checked(call, name, x, sizes=True, none_ok=False):
    """``call(value)`` passes ``value`` as the argument ``name`` (good array ``x``): every one
    of :func:`bad_versions` must raise its exception naming ``name`` (None not, where
    ``none_ok``), and with ``sizes`` so must an array one longer on any one axis (ValueError;
    not for the argument that fixes the sizes the others are checked against)."""
    assert_refuses_bad_versions(call, name, x, none_ok)
    for axis in range(x.ndim if sizes else 0):
        shape = list(x.shape)
        shape[axis] += 1
        with raises_naming(ValueError, name):
            call(np.zeros(shape, np.float32))


BAD_SCALES = [(float("nan"), ValueError), (float("inf"), ValueError),
              (-float("inf"), ValueError), (1e39, ValueError),  # not finite in float32
              ("0.5", TypeError), ([0.5], TypeError), (1j, TypeError)]


def assert_scale_checked(call):
    """``call(scale)`` runs an attention op with that scale: every one of BAD_SCALES must
    raise its exception naming ``scale``; NumPy scalars and ints are numbers."""
    for scale, exc in BAD_SCALES:
        with raises_naming(exc, "scale"):
            call(scale)
    assert np.array_equal(call(np.float32(0.25))[0], call(0.25)[0])
    assert np.array_equal(call(1)[0], call(1.0)[0])


def expect_error(fn, *args, **kwargs):
    """fn(*args, **kwargs) must raise TypeError or ValueError, which is swallowed (no
    pytest.raises: its traceback objects would keep references to the arguments, which the
    leak checks count)."""
    try:
        fn(*args, **kwargs)
    except (TypeError, ValueError):
        return
    raise AssertionError("no error raised")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def assert_no_leaks(calls, arrays, rounds=1000, rss_budget=16 << 20):
    """After 100 warm-up rounds of ``calls()``, ``rounds`` more grow resident memory by less
    than ``rss_budget`` bytes and leave the reference count of every object in ``arrays``
    as it was."""
    counts = [sys.getrefcount(a) for a in arrays]
    for _ in range(100):
        calls()
    start = rss_bytes()
    for _ in range(rounds):
        calls()
    assert rss_bytes() - start < rss_budget
    assert [sys.getrefcount(a) for a in arrays] == counts


def assert_same_bits_for_thread_counts(tmp_path, script, threads=(1, 2)):
    """The Python source ``script``, which saves its outputs with ``np.savez(sys.argv[1],
    ...)``, run once per OMP_NUM_THREADS in ``threads``: every output is bitwise the same for
    every thread count."""
    path = tmp_path / "run.py"
    path.write_text(script)
    runs = []
    for n in threads:
        out = tmp_path / f"threads{n}.npz"
        subprocess.run([sys.executable, str(path), str(out)], env=subprocess_env(n),
                       check=True)
        runs.append(np.load(out))
    first, *others = runs
    assert first.files
    for other in others:
        for name in first.files:
            assert np.array_equal(first[name], other[name]), name


# ---- float32 matrix products against the float64 reference --------------------------------
U32 = 2.0**-24  # float32's unit roundoff


def gamma(n):
    """Higham's gamma_n = n u / (1 - n u): a float32 sum of n terms (each a rounded or fused
    product), in any order, is within gamma_n * (the sum of the terms' magnitudes) of the
    exact sum."""
    return n * U32 / (1 - n * U32)


def assert_within(got, expected, bound, name):
    """|got - expected| <= bound elementwise (float64), naming the worst element."""
    got = np.asarray(got, np.float64)
    expected = np.asarray(expected, np.float64)
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
    err = np.abs(got - expected)
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    if not np.all(err <= bound):
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"{name}: worst at {i}: got {got[i]!r}, expected {expected[i]!r}, "
                             f"|err| {err[i]:.3g} > bound {bound[i]:.3g}")


def assert_product_close(got, expected, magnitude, length, np32, name):
    """A float32 result of sums of `length` products (plus a start value) against the float64
    reference `expected`, with the bounds that follow from the problem:
      - elementwise, the rounding-error bound of such sums: |err| <= gamma(length + 2) *
        magnitude, `magnitude` the sum of the terms' magnitudes (|a| @ |b| + |start|, in
        float64); it holds for any summation order, fused or not, and a wrong term, index or
        tail breaks it;
      - over arrays of at least 1024 elements, whose largest error is a stable statistic:
        the largest error at most twice that of the same math in float32 NumPy (`np32`, its
        own OpenBLAS) plus 4 ulps of the largest |expected|."""
    assert_within(got, expected, gamma(length + 2) * magnitude, name)
    err = np.abs(np.asarray(got, np.float64) - expected).max()
    if np.size(expected) >= 1024:
        np_err = np.abs(np.asarray(np32, np.float64) - expected).max()
        limit = 2 * np_err + 4 * U32 * np.abs(expected).max()
        assert err <= limit, (f"{name}: max |err| {err:.3g} > 2 x float32 NumPy's "
                              f"{np_err:.3g} + 4 ulps")
