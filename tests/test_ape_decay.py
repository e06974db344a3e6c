"""APE's distance decay as per-token scales of q and k (the C op ape_decay): against the float64
reference, the logits identity (q_out_i . k_out_j = gamma^(i - j) q_i . k_j), the reference
against finite differences, bad input (arrays, gamma, the scales' range), leaks and thread
counts."""
import numpy as np
import pytest

from conftest import (assert_no_leaks, assert_refuses_bad_versions,
                      assert_same_bits_for_thread_counts, assert_unchanged, assert_within,
                      copies, expect_error, numerical_grad, randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

U32 = 2.0 ** -24

# (B, T, H, D): 1s, odd and prime sizes; the last past the single-thread threshold
SIZES = [(1, 1, 1, 1), (3, 7, 2, 6), (2, 13, 3, 5), (5, 97, 2, 64)]


def scale_bound(T, gamma):
    """The float32 scale rounds (half an ulp) after exp in double, then the product rounds:
    within 2 u (plus the reference's own, far smaller) of |x| gamma^(+-(t - c))."""
    return 2.5 * U32


@pytest.mark.parametrize("B,T,H,D", SIZES)
@pytest.mark.parametrize("gamma", [0.98, 0.5, 1.0, 1.3])
def test_forward_and_backward_match_reference(rng, B, T, H, D, gamma):
    q, k, dq_out, dk_out = (randn(rng, B, T, H, D) for _ in range(4))
    before = copies(q, k, dq_out, dk_out)
    g32 = float(np.float32(gamma))  # the op takes gamma as float32
    for got, expected in ((_C.ape_decay_forward(q, k, gamma),
                           ref.ape_decay_forward(q, k, g32)),
                          (_C.ape_decay_backward(dq_out, dk_out, gamma),
                           ref.ape_decay_backward(dq_out, dk_out, g32))):
        for g, e, name in zip(got, expected, ("q", "k")):
            assert g.dtype == np.float32 and g.shape == q.shape
            assert_within(g, e, scale_bound(T, gamma) * np.abs(e), name)
    assert_unchanged(before, (q, k, dq_out, dk_out))


def test_logits_decay_by_gamma_to_the_distance(rng):
    q, k = randn(rng, 2, 9, 2, 8), randn(rng, 2, 9, 2, 8)
    g32 = float(np.float32(0.9))
    qo, ko = ref.ape_decay_forward(q, k, g32)
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    scores = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k.astype(np.float64))
    expected = scores * g32 ** (i - j)
    np.testing.assert_allclose(np.einsum("bihd,bjhd->bhij", qo, ko), expected, rtol=1e-12)
    cq, ck = (a.astype(np.float64) for a in _C.ape_decay_forward(q, k, 0.9))
    # each product within a few u of the exact one: the score within that of its |terms|
    terms = np.einsum("bihd,bjhd->bhij", np.abs(q), np.abs(k)) * g32 ** (i - j)
    assert_within(np.einsum("bihd,bjhd->bhij", cq, ck), expected, 6 * U32 * terms, "scores")


def test_reference_gradients_match_finite_differences(rng):
    q, k = rng.standard_normal((2, 5, 1, 3)), rng.standard_normal((2, 5, 1, 3))
    cq, ck = rng.standard_normal(q.shape), rng.standard_normal(k.shape)

    def loss():
        qo, ko = ref.ape_decay_forward(q, k, 0.7)
        return (qo * cq).sum() + (ko * ck).sum()

    dq, dk = ref.ape_decay_backward(cq, ck, 0.7)
    np.testing.assert_allclose(dq, numerical_grad(loss, q), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(dk, numerical_grad(loss, k), rtol=1e-7, atol=1e-9)


# ---- bad input ----------------------------------------------------------------------------
def good_args(rng):
    a = [randn(rng, 2, 5, 2, 4) for _ in range(4)]
    return {"ape_decay_forward": dict(q=a[0], k=a[1], gamma=0.98),
            "ape_decay_backward": dict(dq_out=a[2], dk_out=a[3], gamma=0.98)}


@pytest.mark.parametrize("op,arg", [("ape_decay_forward", "q"), ("ape_decay_forward", "k"),
                                    ("ape_decay_backward", "dq_out"),
                                    ("ape_decay_backward", "dk_out")])
def test_bad_arrays(rng, op, arg):
    kwargs = good_args(rng)[op]
    assert_refuses_bad_versions(lambda v: getattr(_C, op)(**{**kwargs, arg: v}), arg,
                                kwargs[arg])
    if arg in ("k", "dk_out"):
        with raises_naming(ValueError, arg):
            getattr(_C, op)(**{**kwargs, arg: randn(rng, 2, 6, 2, 4)})


@pytest.mark.parametrize("op", ["ape_decay_forward", "ape_decay_backward"])
def test_bad_gamma(rng, op):
    kwargs = good_args(rng)[op]
    y = getattr(_C, op)(*kwargs.values())  # positionally
    assert len(y) == 2
    for bad in (0.0, -0.5, float("nan"), float("inf")):
        with raises_naming(ValueError, "gamma"):
            getattr(_C, op)(**{**kwargs, "gamma": bad})
    with raises_naming(TypeError, "gamma"):
        getattr(_C, op)(**{**kwargs, "gamma": "0.98"})
    # T = 5: |ln gamma| 2 <= 40 holds for gamma >= e^-20, fails below
    getattr(_C, op)(**{**kwargs, "gamma": float(np.exp(-19.9))})
    with pytest.raises(ValueError, match=r"^gamma = .* over T = 5 tokens"):
        getattr(_C, op)(**{**kwargs, "gamma": float(np.exp(-20.5))})


def test_no_reference_or_memory_leaks(rng):
    q, k = randn(rng, 2, 5, 2, 4), randn(rng, 2, 5, 2, 4)

    def calls():
        _C.ape_decay_forward(q, k, 0.98)
        _C.ape_decay_backward(q, k, 0.98)
        expect_error(_C.ape_decay_forward, q, k, 0.0)
        expect_error(_C.ape_decay_backward, q, k[:, :4], 0.98)

    assert_no_leaks(calls, (q, k), rounds=300)


def test_results_do_not_depend_on_thread_count(tmp_path):
    assert_same_bits_for_thread_counts(tmp_path, (
        "import sys, numpy as np\n"
        "from mapformer import _C\n"
        "rng = np.random.default_rng(5)\n"
        "q, k = (rng.standard_normal((8, 70, 2, 64)).astype(np.float32) for _ in range(2))\n"
        "np.savez(sys.argv[1], *_C.ape_decay_forward(q, k, 0.98),\n"
        "         *_C.ape_decay_backward(k, q, 0.9))\n"))
