"""Shared test helpers: tolerances as data, comparison, finite differences, random inputs,
child processes."""
import os

import numpy as np
import pytest

import mapformer

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
