"""The C vq op (TDB's bottleneck) against the float64 reference; the reference against finite
differences and brute force; ties, thread counts and bad input."""
import numpy as np
import pytest

from conftest import (assert_array_argument_checked, assert_close, assert_no_leaks,
                      assert_same_bits_for_thread_counts, expect_error, numerical_grad, randn,
                      raises_naming)
from mapformer import _C, backend
from mapformer import reference as ref

# (N, M, K, D): one of everything, odd and prime sizes, a product of more than one row block
SIZES = [(1, 1, 1, 1), (7, 1, 5, 3), (67, 3, 13, 17), (131, 2, 31, 64)]
EPS32 = float(np.finfo(np.float32).eps)


def make(rng, N, M, K, D):
    return randn(rng, N, M, D), randn(rng, M, K, D)


def exact_dist(z, codebook):
    """(N, M, K) squared distances in float64, directly (no expansion)."""
    z, codebook = z.astype(np.float64), codebook.astype(np.float64)
    return ((z[:, :, None, :] - codebook[None]) ** 2).sum(-1)


def comparison_bound(z, codebook):
    """How far apart two distances can be and still compare either way in float32: the scores
    ||e||^2 - 2 z.e are sums of D products, each rounded, of size at most ||z||^2 + ||e||^2
    (Cauchy-Schwarz); a few ulps of that per row and codebook (N, M, 1)."""
    z2 = (z.astype(np.float64) ** 2).sum(-1)
    e2 = (codebook.astype(np.float64) ** 2).sum(-1).max(-1)
    D = z.shape[-1]
    return (4 * (D + 2) * EPS32 * (z2 + e2[None]))[..., None]


@pytest.mark.parametrize("N,M,K,D", SIZES)
def test_forward(rng, N, M, K, D):
    z, codebook = make(rng, N, M, K, D)
    before = (z.copy(), codebook.copy())
    codes, indices, dist, total = _C.vq_forward(z, codebook)
    assert codes.dtype == np.float32 and codes.shape == (N, M, D)
    assert indices.dtype == np.int32 and indices.shape == (N, M)
    assert dist.dtype == np.float32 and dist.shape == (N, M)
    assert np.array_equal(before[0], z) and np.array_equal(before[1], codebook)
    d = exact_dist(z, codebook)
    best = d.min(-1, keepdims=True)
    chosen = np.take_along_axis(d, indices[..., None].astype(np.int64), -1)
    bound = comparison_bound(z, codebook)
    # the chosen code is a nearest one, to the precision of a float32 comparison ...
    assert np.all(chosen - best <= bound)
    # ... and the reference's wherever the runner-up is further than that
    r_codes, r_indices, r_dist, r_total = ref.vq_forward(z, codebook)
    second = np.sort(d, -1)[..., 1:2] if K > 1 else np.full_like(best, np.inf)
    clear = (second - best > bound)[..., 0]
    assert clear.mean() > 0.9
    assert np.array_equal(indices[clear], r_indices[clear])
    # the codes are copies; the distances are exact for the chosen code
    assert np.array_equal(codes, codebook[np.arange(M)[None], indices])
    assert_close(dist, chosen[..., 0], "default", "dist")
    assert total == pytest.approx(float(dist.astype(np.float64).sum()), rel=1e-12)


def test_reference_is_the_brute_force_argmin(rng):
    z, codebook = (a.astype(np.float64) for a in make(rng, 40, 2, 9, 5))
    codes, indices, dist, total = ref.vq_forward(z, codebook)
    d = exact_dist(z, codebook)
    assert np.array_equal(indices, d.argmin(-1))
    assert np.allclose(dist, d.min(-1), rtol=1e-12, atol=0)
    assert total == pytest.approx(d.min(-1).sum(), rel=1e-12)


def test_ties_take_the_lowest_index(rng):
    N, M, K, D = 6, 2, 7, 9
    z, codebook = make(rng, N, M, K, D)
    codebook[0, [1, 3, 5]] = codebook[0, 3]  # three copies of one code
    codebook[1] = codebook[1, 4]  # every code the same
    z[:, 0] = codebook[0, 3]  # exactly on the copies
    codes, indices, dist, _ = _C.vq_forward(z, codebook)
    assert np.array_equal(indices[:, 0], np.full(N, 1))
    assert np.array_equal(indices[:, 1], np.zeros(N))
    assert np.array_equal(dist[:, 0], np.zeros(N))
    assert np.array_equal(ref.vq_forward(z, codebook)[1], indices)


@pytest.mark.parametrize("N,M,K,D", SIZES)
def test_backward(rng, N, M, K, D):
    z, codebook = make(rng, N, M, K, D)
    _, indices, _, _ = _C.vq_forward(z, codebook)
    if N > 10:
        indices[: N // 2, 0] = 0  # many rows on one code
    dcodes = randn(rng, N, M, D)
    prefill = randn(rng, M, K, D)
    dcodebook = prefill.copy()
    before = (dcodes.copy(), z.copy(), codebook.copy(), indices.copy())
    dz = _C.vq_backward(dcodes, z, codebook, indices, dcodebook, 0.3, 0.075)
    r_dz, r_dcb = ref.vq_backward(dcodes, z, codebook, indices, 0.3, 0.075)
    assert dz.dtype == np.float32 and dz.shape == (N, M, D)
    assert_close(dz, r_dz, "default", "dz")
    # a code's gradient sums up to N float32 differences (in double, rounded once)
    assert_close(dcodebook, prefill + r_dcb, "default", "dcodebook")
    for b, a in zip(before, (dcodes, z, codebook, indices)):
        assert np.array_equal(b, a)
    # += again, never =
    _C.vq_backward(dcodes, z, codebook, indices, dcodebook, 0.3, 0.075)
    assert_close(dcodebook, prefill + 2 * r_dcb, "default", "dcodebook (2 calls)")
    # codes nobody chose get nothing
    unused = np.ones((M, K), bool)
    unused[np.arange(M)[None], indices] = False
    assert np.array_equal(dcodebook[unused], prefill[unused] + 0)


def test_numpy_backend_entry(rng):
    z, codebook = make(rng, 9, 2, 4, 3)
    _, indices, _, _ = ref.vq_forward(z, codebook)
    dcodes = randn(rng, 9, 2, 3)
    dcb = np.zeros((2, 4, 3))
    dz = backend.NUMPY.vq_backward(dcodes, z, codebook, indices, dcb, 0.5, 0.125)
    r_dz, r_dcb = ref.vq_backward(dcodes, z, codebook, indices, 0.5, 0.125)
    assert np.array_equal(dz, r_dz) and np.array_equal(dcb, r_dcb)


def test_reference_gradients_by_finite_differences(rng):
    """The codebook term's gradient reaches only the codebook, the commitment term's only z,
    and the downstream gradient passes to z straight through (codes = z + sg(codes - z))."""
    N, M, K, D = 8, 2, 5, 3
    z, codebook = (a.astype(np.float64) for a in make(rng, N, M, K, D))
    _, indices, _, _ = ref.vq_forward(z, codebook)
    g = rng.standard_normal((N, M, D))
    cbw, cmw = 0.7, 0.175
    rows = np.arange(M)[None]

    def codebook_term():
        return cbw * ((codebook[rows, indices] - z) ** 2).sum()

    dz, dcb = ref.vq_backward(g, z, codebook, indices, cbw, cmw)
    assert np.allclose(numerical_grad(codebook_term, codebook), dcb, rtol=1e-7, atol=1e-8)
    # d/dz of g . (z + sg(codes - z)) is g: the straight-through part, checked through the
    # function with the stop-gradient written out (codes - z held at its value)
    held = codebook[rows, indices] - z

    def with_stop_gradient():
        codes = codebook[rows, indices]
        return (g * (z + held)).sum() + cmw * ((codes - z) ** 2).sum()

    assert np.allclose(numerical_grad(with_stop_gradient, z), dz, rtol=1e-7, atol=1e-8)


def test_same_bits_for_any_thread_count(tmp_path):
    """Large enough that the forward's blocks and the backward's rows and codes are split
    over threads."""
    script = (
        "import sys\nimport numpy as np\nfrom mapformer import _C\n"
        "r = np.random.default_rng(5)\n"
        "f = lambda *s: r.standard_normal(s).astype(np.float32)\n"
        "z, cb = f(1400, 2, 24), f(2, 150, 24)\n"
        "codes, idx, dist, total = _C.vq_forward(z, cb)\n"
        "idx[:300, 1] = 7\n"
        "dcb = np.zeros_like(cb)\n"
        "dz = _C.vq_backward(f(1400, 2, 24), z, cb, idx, dcb, 0.5, 0.125)\n"
        "np.savez(sys.argv[1], codes=codes, idx=idx, dist=dist, total=total, dz=dz, dcb=dcb)\n")
    assert_same_bits_for_thread_counts(tmp_path, script, (1, 2))


def test_forward_bad_inputs(rng):
    z, codebook = make(rng, 5, 2, 4, 3)
    assert_array_argument_checked(lambda v: _C.vq_forward(v, codebook), "z", z, sizes=False)
    # codebook fixes K; z fixes M and D
    assert_array_argument_checked(lambda v: _C.vq_forward(z, v), "codebook", codebook,
                                  sizes=False)
    for shape in ((3, 4, 3), (2, 4, 4)):
        with raises_naming(ValueError, "codebook"):
            _C.vq_forward(z, np.zeros(shape, np.float32))


def test_backward_bad_inputs(rng):
    z, codebook = make(rng, 5, 2, 4, 3)
    _, indices, _, _ = _C.vq_forward(z, codebook)
    dcodes, dcb = randn(rng, 5, 2, 3), np.zeros((2, 4, 3), np.float32)

    def call(dcodes=dcodes, z=z, codebook=codebook, indices=indices, dcodebook=dcb,
             cbw=1.0, cmw=0.25):
        return _C.vq_backward(dcodes, z, codebook, indices, dcodebook, cbw, cmw)

    assert_array_argument_checked(lambda v: call(dcodes=v), "dcodes", dcodes, sizes=False)
    assert_array_argument_checked(lambda v: call(z=v), "z", z)
    assert_array_argument_checked(lambda v: call(codebook=v), "codebook", codebook,
                                  sizes=False)
    assert_array_argument_checked(lambda v: call(dcodebook=v), "dcodebook", dcb)
    with raises_naming(TypeError, "indices"):
        call(indices=indices.astype(np.int64))
    with raises_naming(ValueError, "indices"):
        call(indices=indices[:, :1])
    for bad in (-1, 4, 2**31 - 1):
        wrong = indices.copy()
        wrong[3, 1] = bad
        with pytest.raises(ValueError, match=r"indices\[7\]"):
            call(indices=wrong)
    assert not dcb.any()  # nothing written before the checks
    ro = np.zeros_like(dcb)
    ro.flags.writeable = False
    with raises_naming(ValueError, "dcodebook"):
        call(dcodebook=ro)
    for bad, exc in ((-0.5, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                     ("1", TypeError)):
        with raises_naming(exc, "codebook_weight"):
            call(cbw=bad)
        with raises_naming(exc, "commitment_weight"):
            call(cmw=bad)
    with raises_naming(ValueError, "dcodebook"):  # a gradient sharing memory with an input
        _C.vq_backward(dcodes, z, codebook, indices, codebook, 1.0, 0.25)


def test_no_leaks(rng):
    z, codebook = make(rng, 64, 2, 16, 32)
    _, indices, _, _ = _C.vq_forward(z, codebook)
    bad = indices.copy()
    bad[0, 0] = 99
    dcb = np.zeros_like(codebook)

    def calls():
        _C.vq_forward(z, codebook)
        _C.vq_backward(z, z, codebook, indices, dcb, 1.0, 0.25)
        expect_error(_C.vq_backward, z, z, codebook, bad, dcb, 1.0, 0.25)

    assert_no_leaks(calls, (z, codebook, indices, bad, dcb), rounds=300)
