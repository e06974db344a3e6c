"""Attention masks beyond causal (issue 12): 'none' (full attention) and 'prefix' (a prefix LM:
full attention within the first prefix[b] tokens, causal after them) in the tiled attention and
conjunctive attention ops. The float64 reference against a row-by-row oracle and finite
differences; the C ops, forward and backward, against the reference on every kernel set the CPU
runs (conftest's `kernel` fixture), each result within twice the error of the same math in
float32 NumPy (test_attention.check, test_conj_attention.check), on prefixes at and around the
kernels' block edges (16, 32, 64 rows); the special prefixes (0 is causal, T is none); what a
mask hides leaves the output unchanged; the same bits on 1 and 2 threads; and the argument
checks, in the binding (errors naming the argument) and in the C entry (MF_EINVAL)."""
import subprocess
import sys

import numpy as np
import pytest

import test_attention
import test_conj_attention
from conftest import (ATTENTION_ENTRY, assert_same_bits_for_thread_counts, numerical_grad, randn,
                      raises_naming, subprocess_env)
from mapformer import _C
from mapformer import reference as ref

MASKS = ["none", "prefix"]


def prefixes(rng, B, T):
    """B prefix lengths in [0, T]: 0, T and block edges first, then random ones."""
    edges = [0, T, 1, 31, 32, 33, 64, 65, T - 1, T // 2]
    out = [p for p in edges if 0 <= p <= T][:B]
    out += list(rng.integers(0, T + 1, B - len(out)))
    return np.array(out, dtype=np.int32)


def mask_args(rng, mask, B, T):
    return dict(mask=mask, prefix=prefixes(rng, B, T) if mask == "prefix" else None)


# ---- the reference ---------------------------------------------------------------------------

def test_reference_mask_sets():
    """The keys each query sees, written out for T = 4."""
    causal = np.tril(np.ones((4, 4), dtype=bool))
    assert np.array_equal(ref.attention_mask(1, 4)[0, 0], causal)
    assert ref.attention_mask(2, 4, "none").all()
    got = ref.attention_mask(4, 4, "prefix", np.array([0, 1, 3, 4]))[:, 0]
    assert np.array_equal(got[0], causal) and np.array_equal(got[1], causal)
    assert np.array_equal(got[2].astype(int), [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0],
                                               [1, 1, 1, 1]])
    assert got[3].all()


@pytest.mark.parametrize("bad", [dict(mask="full"), dict(mask="prefix"),
                                 dict(mask="causal", prefix=[1, 1]),
                                 dict(mask="prefix", prefix=[0, 5]),
                                 dict(mask="prefix", prefix=[-1, 0])])
def test_reference_rejects_bad_masks(bad):
    with pytest.raises(ValueError, match="mask|prefix"):
        ref.attention_mask(2, 4, **bad)


def test_reference_matches_loops(rng):
    """Each row's softmax over the keys j <= max(i, P_b - 1), written out (an oracle that
    shares no code with the reference)."""
    B, T, H, D = 3, 7, 2, 5
    q, k, v = (rng.standard_normal((B, T, H, D)) for _ in range(3))
    P = np.array([0, 4, 7])
    out, lse = ref.attention_forward(q, k, v, 0.6, mask="prefix", prefix=P)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                n = max(i, P[b] - 1) + 1
                z = 0.6 * k[b, :n, h] @ q[b, i, h]
                e = np.exp(z - z.max())
                np.testing.assert_allclose(out[b, i, h], e @ v[b, :n, h] / e.sum(), rtol=1e-12)
                np.testing.assert_allclose(lse[b, h, i], z.max() + np.log(e.sum()), rtol=1e-12)


@pytest.mark.parametrize("mask", MASKS)
def test_reference_backward_matches_finite_differences(rng, mask):
    """Central differences of L = sum(out * dout), float64, plain and conjunctive attention
    (every mode), two batch rows with different prefixes."""
    B, T, H, D = 2, 6, 2, 3
    m = dict(mask=mask, prefix=np.array([2, 5]) if mask == "prefix" else None)
    q, k, v, dout = (rng.standard_normal((B, T, H, D)) for _ in range(4))
    grads = ref.attention_backward(dout, q, k, v, 0.7, **m)
    for g, x in zip(grads, (q, k, v)):
        num = numerical_grad(
            lambda: float((ref.attention_forward(q, k, v, 0.7, **m)[0] * dout).sum()), x)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)
    x = [rng.standard_normal((B, T, H, D)) for _ in range(5)]
    for mode in ("score_product", "softmax_product", "sum"):
        grads = ref.conj_attention_backward(dout, *x, mode=mode, scale=0.7, **m)
        for g, xi in zip(grads, x):
            num = numerical_grad(lambda: float((ref.conj_attention_forward(
                *x, mode=mode, scale=0.7, **m)[0] * dout).sum()), xi)
            np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8, err_msg=mode)


# ---- the C ops against the reference -------------------------------------------------------


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("B,T,H,D", [(2, 1, 1, 16), (3, 7, 2, 64), (4, 97, 1, 18),
                                     (6, 130, 2, 32), (3, 257, 1, 128), (1, 64, 3, 16)])
def test_attention_matches_reference(rng, kernel, mask, B, T, H, D):
    q, k, v, dout = test_attention.make(rng, B, T, H, D)
    test_attention.check(q, k, v, dout, **mask_args(rng, mask, B, T))


@pytest.mark.parametrize("mode", ["score_product", "softmax_product", "sum"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("B,T,H,D", [(3, 7, 2, 16), (4, 97, 1, 34), (6, 130, 1, 64)])
def test_conj_attention_matches_reference(rng, kernel, mode, mask, B, T, H, D):
    x = test_conj_attention.make(rng, B, T, H, D)
    test_conj_attention.check(mode, *x, **mask_args(rng, mask, B, T))


def test_special_prefixes(rng, kernel):
    """prefix 0 is the causal mask and prefix T is 'none', bit for bit; prefix 1 is causal too
    (the first key is every query's anyway), up to rounding."""
    B, T, H, D = 2, 75, 2, 32
    q, k, v, dout = test_attention.make(rng, B, T, H, D)

    def run(**m):
        out, lse = _C.attention_forward(q, k, v, **m)
        return (out, lse, *_C.attention_backward(dout, q, k, v, out, lse, **m))

    full = np.full(B, T, np.int32)
    for a, b in zip(run(), run(mask="prefix", prefix=np.zeros(B, np.int32))):
        assert np.array_equal(a, b)
    for a, b in zip(run(mask="none"), run(mask="prefix", prefix=full)):
        assert np.array_equal(a, b)
    for a, b in zip(run(), run(mask="prefix", prefix=np.ones(B, np.int32))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(run(), run(mask="none")):
        assert not np.allclose(a, b)


def test_hidden_keys_do_not_matter(rng, kernel):
    """Changing the keys and values a query does not see leaves its output as it was: under
    'prefix', row i's output does not depend on tokens j > max(i, P - 1); under 'none' the first
    row's output does depend on the last token."""
    B, T, H, D = 2, 90, 1, 16
    q, k, v, _ = test_attention.make(rng, B, T, H, D)
    P = np.array([40, 70], np.int32)
    out, _ = _C.attention_forward(q, k, v, mask="prefix", prefix=P)
    k2, v2 = k.copy(), v.copy()
    k2[:, 75:], v2[:, 75:] = 5.0, -3.0
    out2, _ = _C.attention_forward(q, k2, v2, mask="prefix", prefix=P)
    assert np.array_equal(out[:, :75], out2[:, :75])
    assert not np.allclose(out[:, 75:], out2[:, 75:])
    k2, v2 = k.copy(), v.copy()
    k2[0, 50:60], v2[0, 50:60] = 5.0, -3.0  # after row 0's prefix of 40, before 70
    out2, _ = _C.attention_forward(q, k2, v2, mask="prefix", prefix=P)
    assert np.array_equal(out[0, :50], out2[0, :50]) and np.array_equal(out[1], out2[1])
    assert not np.allclose(out[0, 50:], out2[0, 50:])
    v2 = v.copy()
    v2[:, -1] += 1.0
    assert not np.allclose(_C.attention_forward(q, k, v, mask="none")[0][:, 0],
                           _C.attention_forward(q, k, v2, mask="none")[0][:, 0])


def test_same_bits_for_any_thread_count(tmp_path):
    """Both masks on every kernel set, plain and conjunctive attention, forward and backward:
    the same bits on 1 and 2 OpenMP threads."""
    assert_same_bits_for_thread_counts(tmp_path, """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(5)
q, k, v, dout, qp, kp = (rng.standard_normal((3, 130, 2, 40)).astype(np.float32)
                         for _ in range(6))
masks = {"none": None, "prefix": np.array([0, 45, 130], np.int32)}
results = {}
for kset in _C.kernel_sets():
    _C.set_kernels(kset)
    for mask, prefix in masks.items():
        out, lse = _C.attention_forward(q, k, v, mask=mask, prefix=prefix)
        grads = _C.attention_backward(dout, q, k, v, out, lse, mask=mask, prefix=prefix)
        for i, x in enumerate((out, lse, *grads)):
            results[f"{kset}_{mask}_{i}"] = x
        out, lse = _C.conj_attention_forward(q, k, qp, kp, v, "softmax_product", mask=mask,
                                             prefix=prefix)
        grads = _C.conj_attention_backward(dout, q, k, qp, kp, v, out, lse, "softmax_product",
                                           mask=mask, prefix=prefix)
        for i, x in enumerate((out, lse, *grads)):
            results[f"{kset}_{mask}_conj_{i}"] = x
np.savez(sys.argv[1], **results)
""")


# ---- bad input -------------------------------------------------------------------------------

B, T = 2, 9


def calls(rng):
    """(name, call(**mask_kwargs)) for the four ops at (B, T, 1, 16)."""
    q, k, v, dout, qp, kp = (randn(rng, B, T, 1, 16) for _ in range(6))
    out, lse = _C.attention_forward(q, k, v)
    cout, clse = _C.conj_attention_forward(q, k, qp, kp, v)
    return [
        ("attention_forward", lambda **m: _C.attention_forward(q, k, v, **m)),
        ("attention_backward", lambda **m: _C.attention_backward(dout, q, k, v, out, lse, **m)),
        ("conj_attention_forward", lambda **m: _C.conj_attention_forward(q, k, qp, kp, v, **m)),
        ("conj_attention_backward",
         lambda **m: _C.conj_attention_backward(dout, q, k, qp, kp, v, cout, clse, **m)),
    ]


@pytest.mark.parametrize("op", range(4))
def test_bad_mask_and_prefix_name_the_argument(rng, op):
    _, call = calls(rng)[op]
    good = np.array([3, 9], np.int32)
    call(mask="prefix", prefix=good)
    for bad in ("full", "", "causal\0", "PREFIX"):
        with raises_naming(ValueError, "mask"):
            call(mask=bad)
    for bad in (None, 1, b"none"):
        with raises_naming(TypeError, "mask"):
            call(mask=bad)
    with raises_naming(ValueError, "prefix"):
        call(mask="prefix")
    with raises_naming(ValueError, "prefix"):
        call(mask="none", prefix=good)
    for values in ([-1, 3], [3, T + 1], [2**31 - 1, 0]):
        with raises_naming(ValueError, "prefix"):
            call(mask="prefix", prefix=np.array(values, np.int32))
    for bad, exc in ((good.astype(np.int64), TypeError), (good.astype(np.float32), TypeError),
                     ([3, 9], TypeError), (np.array([3, 9, 1], np.int32), ValueError),
                     (good[:, None], ValueError), (np.array([3, 0, 9, 0], np.int32)[::2],
                                                   ValueError)):
        with raises_naming(exc, "prefix"):
            call(mask="prefix", prefix=bad)
    with pytest.raises(TypeError):
        call("none")  # mask and prefix are keyword-only


def test_c_entry_checks_mask_and_prefix(tmp_path):
    """The C entry itself (through ctypes, past the binding): an unknown mask or a NULL prefix
    with MF_MASK_PREFIX is MF_EINVAL, a prefix outside [0, T] MF_EINDEX (3: the binding names
    prefix), and nothing is written; good prefixes give the binding's bits."""
    script = tmp_path / "entry.py"
    script.write_text(ATTENTION_ENTRY + """rng = np.random.default_rng(3)
B, T, H, D = 2, 70, 1, 16
q, k, v = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(3))
good = np.array([0, 50], np.int32)
want, want_lse = _C.attention_forward(q, k, v, mask="prefix", prefix=good)
out, lse = np.empty((B, T, H, D), np.float32), np.empty((B, H, T), np.float32)
p = Params(B=B, T=T, H=H, D=D, scale=1 / np.sqrt(D), q=ptr(q), k=ptr(k), v=ptr(v), mask=2,
           prefix=good.ctypes.data_as(I), out=ptr(out), lse=ptr(lse))
n = lib.attention_forward_scratch_floats(ctypes.byref(p))
assert n > 0
buf = np.empty(n + 32, np.float32)
p.scratch, p.scratch_floats = ptr(buf[(-buf.ctypes.data // 4) % 16:]), n
for mask, prefix, status in ((2, good, 0), (3, good, 1), (-1, good, 1), (2, None, 1),
                             (2, np.array([0, 71], np.int32), 3),
                             (2, np.array([-1, 3], np.int32), 3)):
    out, lse = np.full((B, T, H, D), 7.0, np.float32), np.full((B, H, T), 7.0, np.float32)
    p.out, p.lse, p.mask = ptr(out), ptr(lse), mask
    p.prefix = prefix.ctypes.data_as(I) if prefix is not None else None
    assert lib.attention_forward(ctypes.byref(p)) == status, (mask, prefix)
    if status == 0:
        assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    else:
        assert np.all(out == 7.0) and np.all(lse == 7.0)
print("ok")
""")
    out = subprocess.run([sys.executable, str(script)], env=subprocess_env(1), check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "ok"
