"""Attention's optional per-pair logit factor (issue 12: APE's distance decay for ape_grid and
ape_tree): pos_ids (B, T) int32 and pair_factor (N, N) float32 make the logits
f_ij scale q_i . k_j, f_ij = pair_factor[pos_ids[b, i], pos_ids[b, j]], before the mask.
The float64 reference against a row-by-row oracle and finite differences; the C op, forward
and backward, against the reference on every kernel set (conftest's `kernel`), every mask and
awkward sizes; oracles: a table of ones is the plain op bit for bit, and gamma^|i - j| on
pos_ids = arange(T) is ape_seq's separable decay (ape_decay op); the tree and grid distances
on hand-computed cases; the same bits on 1 and 2 threads; and the argument checks (errors
naming the argument)."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import (ATTENTION_ENTRY, assert_same_bits_for_thread_counts, numerical_grad, randn,
                      raises_naming, subprocess_env)
from mapformer import _C
from mapformer import reference as ref
from mapformer.schemes.ape import decay_factor

MASKS = ["causal", "none", "prefix"]


def mask_args(mask, B, T, rng):
    return dict(mask=mask, prefix=(rng.integers(0, T + 1, B).astype(np.int32)
                                   if mask == "prefix" else None))


def factor_args(rng, B, T, N):
    """Random ids in [0, N) and a table of factors in [0.2, 1.3] (not symmetric)."""
    return dict(pos_ids=rng.integers(0, N, (B, T)).astype(np.int32),
                pair_factor=rng.uniform(0.2, 1.3, (N, N)).astype(np.float32))


# ---- the reference ---------------------------------------------------------------------------

def test_reference_matches_loops(rng):
    B, T, H, D = 2, 6, 2, 5
    q, k, v = (rng.standard_normal((B, T, H, D)) for _ in range(3))
    f = factor_args(rng, B, T, 4)
    out, lse = ref.attention_forward(q, k, v, 0.6, mask="prefix", prefix=np.array([0, 4]),
                                     **f)
    P = [0, 4]
    for b in range(B):
        for h in range(H):
            for i in range(T):
                n = max(i, P[b] - 1) + 1
                fij = f["pair_factor"][f["pos_ids"][b, i], f["pos_ids"][b, :n]].astype(float)
                z = 0.6 * fij * (k[b, :n, h] @ q[b, i, h])
                e = np.exp(z - z.max())
                np.testing.assert_allclose(out[b, i, h], e @ v[b, :n, h] / e.sum(), rtol=1e-12)
                np.testing.assert_allclose(lse[b, h, i], z.max() + np.log(e.sum()), rtol=1e-12)


@pytest.mark.parametrize("mask", MASKS)
def test_reference_backward_matches_finite_differences(rng, mask):
    B, T, H, D = 2, 6, 2, 3
    m = dict(mask=mask, prefix=np.array([2, 5]) if mask == "prefix" else None)
    f = factor_args(rng, B, T, 5)
    q, k, v, dout = (rng.standard_normal((B, T, H, D)) for _ in range(4))
    grads = ref.attention_backward(dout, q, k, v, 0.7, **m, **f)
    for g, x in zip(grads, (q, k, v)):
        num = numerical_grad(
            lambda: float((ref.attention_forward(q, k, v, 0.7, **m, **f)[0] * dout).sum()), x)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


def test_tree_distance_by_hand():
    """Heap numbers: root 1, children 2h, 2h + 1."""
    cases = [(1, 1, 0), (1, 2, 1), (1, 3, 1), (2, 3, 2), (4, 5, 2), (4, 6, 4), (4, 3, 3),
             (8, 1, 3), (9, 5, 3), (8, 15, 6), (7, 7, 0), (12, 13, 2), (12, 6, 1)]
    a, b, d = (np.array(x) for x in zip(*cases))
    np.testing.assert_array_equal(ref.tree_distance(a, b), d)
    np.testing.assert_array_equal(ref.tree_distance(b, a), d)
    with pytest.raises(ValueError, match="heap numbers"):
        ref.tree_distance(0, 1)


def test_grid_distance_by_hand():
    x = np.array([[0, 0], [0, 0], [0, 0], [1, 1], [0, 0], [2, 5], [0, 0]])
    y = np.array([[0, 0], [3, 4], [1, 1], [2, 2], [2, 2], [5, 1], [0, 7]])
    np.testing.assert_array_equal(ref.grid_distance(x, y), [0, 5, 1, 1, 2, 5, 7])
    np.testing.assert_array_equal(ref.grid_distance([[0], [3]], [[5], [1]]), [5, 2])
    big = np.array([[0, 0]]), np.array([[46340, 46341]])  # floor(sqrt) near float rounding
    assert ref.grid_distance(*big)[0] == int(np.floor(np.sqrt(46340 ** 2 + 46341 ** 2)))


def test_decay_factor_numbers_positions():
    """decay_factor's ids index a table of gamma^d between the batch's distinct positions,
    the same positions the same id (a (1, T, A) index broadcast to every sequence)."""
    index = np.array([[[0, 0], [1, 0], [0, 0], [3, 4]], [[3, 4], [2, 2], [2, 2], [1, 0]]])
    ids, table = decay_factor(index, 2, ref.grid_distance, 0.5)
    assert ids.dtype == np.int32 and table.dtype == np.float32 and ids.shape == (2, 4)
    d = ref.grid_distance(index.reshape(-1, 1, 2), index.reshape(1, -1, 2))
    np.testing.assert_array_equal(table[ids.reshape(-1)[:, None], ids.reshape(-1)[None, :]],
                                  (0.5 ** d).astype(np.float32))
    assert table.shape == (4, 4)  # (0, 0), (1, 0), (3, 4), (2, 2)
    ids, table = decay_factor(np.arange(6).reshape(1, 6, 1), 3, ref.grid_distance, 0.9)
    assert ids.shape == (3, 6) and (ids == ids[0]).all() and table.shape == (6, 6)


# ---- the C op against the reference ----------------------------------------------------------

def check(q, k, v, dout, m, f, scale=None):
    """C forward and backward against the float64 reference: the results within a few float32
    roundings of the sums' magnitudes; inputs unchanged."""
    before = [a.copy() for a in (q, k, v, dout, f["pos_ids"], f["pair_factor"])]
    out, lse = _C.attention_forward(q, k, v, scale, **m, **f)
    grads = _C.attention_backward(dout, q, k, v, out, lse, scale, **m, **f)
    want = (*ref.attention_forward(q, k, v, scale, **m, **f),
            *ref.attention_backward(dout, q, k, v, scale, **m, **f))
    for got, w, name in zip((out, lse, *grads), want, ("out", "lse", "dq", "dk", "dv")):
        assert got.dtype == np.float32 and got.shape == w.shape, name
        np.testing.assert_allclose(got, w, rtol=0, atol=2e-5 * (1 + np.abs(w).max()),
                                   err_msg=name)
    for a, a0 in zip((q, k, v, dout, f["pos_ids"], f["pair_factor"]), before):
        assert np.array_equal(a, a0)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("B,T,H,D,N", [(2, 1, 1, 16, 1), (3, 7, 2, 64, 5), (2, 97, 3, 18, 13),
                                       (2, 130, 2, 32, 130), (1, 257, 1, 128, 40)])
def test_matches_reference(rng, kernel, mask, B, T, H, D, N):
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    check(q, k, v, dout, mask_args(mask, B, T, rng), factor_args(rng, B, T, N))


@pytest.mark.parametrize("mask", MASKS)
def test_table_of_ones_is_the_plain_op(rng, kernel, mask):
    """A factor of 1 multiplies exactly: the same bits as no table."""
    B, T, H, D = 2, 75, 2, 24
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    m = mask_args(mask, B, T, rng)
    f = dict(pos_ids=rng.integers(0, 3, (B, T)).astype(np.int32),
             pair_factor=np.ones((3, 3), np.float32))
    out, lse = _C.attention_forward(q, k, v, **m)
    outf, lsef = _C.attention_forward(q, k, v, **m, **f)
    assert np.array_equal(out, outf) and np.array_equal(lse, lsef)
    for a, b in zip(_C.attention_backward(dout, q, k, v, out, lse, **m),
                    _C.attention_backward(dout, q, k, v, out, lse, **m, **f)):
        assert np.array_equal(a, b)


def test_sequence_table_is_ape_seqs_separable_decay(rng, kernel):
    """gamma^|i - j| on pos_ids = arange(T), causal: the logits of ape_decay's scaled q and k
    (gamma^(i - c) q_i . gamma^(c - j) k_j), so the same outputs and gradients."""
    B, T, H, D, gamma = 2, 70, 2, 32, 0.9
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    i = np.arange(T)
    f = dict(pos_ids=np.tile(i.astype(np.int32), (B, 1)),
             pair_factor=ref.decay_table(np.abs(i[:, None] - i[None, :]), gamma))
    out, lse = _C.attention_forward(q, k, v, **f)
    grads = _C.attention_backward(dout, q, k, v, out, lse, **f)
    qs, ks = _C.ape_decay_forward(q, k, gamma)
    out2, lse2 = _C.attention_forward(qs, ks, v)
    dqs, dks, dv2 = _C.attention_backward(dout, qs, ks, v, out2, lse2)
    dq2, dk2 = _C.ape_decay_backward(dqs, dks, gamma)
    for a, b, name in zip((out, lse, *grads), (out2, lse2, dq2, dk2, dv2),
                          ("out", "lse", "dq", "dk", "dv")):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * (1 + np.abs(b).max()),
                                   err_msg=name)
    # and the reference, exactly
    r1 = ref.attention_forward(q, k, v, **f)[0]
    r2 = ref.attention_forward(*ref.ape_decay_forward(q, k, float(np.float32(gamma))), v)[0]
    np.testing.assert_allclose(r1, r2, rtol=0, atol=1e-5)


def test_same_bits_for_any_thread_count(tmp_path):
    assert_same_bits_for_thread_counts(tmp_path, """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(5)
q, k, v, dout = (rng.standard_normal((3, 130, 2, 40)).astype(np.float32) for _ in range(4))
f = dict(pos_ids=rng.integers(0, 17, (3, 130)).astype(np.int32),
         pair_factor=rng.uniform(0.3, 1.0, (17, 17)).astype(np.float32))
masks = {"causal": None, "none": None, "prefix": np.array([0, 45, 130], np.int32)}
results = {}
for kset in _C.kernel_sets():
    _C.set_kernels(kset)
    for mask, prefix in masks.items():
        out, lse = _C.attention_forward(q, k, v, mask=mask, prefix=prefix, **f)
        grads = _C.attention_backward(dout, q, k, v, out, lse, mask=mask, prefix=prefix, **f)
        for i, x in enumerate((out, lse, *grads)):
            results[f"{kset}_{mask}_{i}"] = x
np.savez(sys.argv[1], **results)
""")


# ---- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["forward", "backward"])
def test_bad_factor_arguments_name_the_argument(rng, op):
    B, T = 2, 9
    q, k, v, dout = (randn(rng, B, T, 1, 16) for _ in range(4))
    out, lse = _C.attention_forward(q, k, v)
    call = ((lambda **f: _C.attention_forward(q, k, v, **f)) if op == "forward" else
            (lambda **f: _C.attention_backward(dout, q, k, v, out, lse, **f)))
    ids = np.zeros((B, T), np.int32)
    table = np.ones((4, 4), np.float32)
    call(pos_ids=ids, pair_factor=table)
    with raises_naming(ValueError, "pos_ids"):
        call(pair_factor=table)
    with raises_naming(ValueError, "pair_factor"):
        call(pos_ids=ids)
    for bad in (-1, 4, 2**31 - 1):
        wrong = ids.copy()
        wrong[1, 5] = bad
        with raises_naming(ValueError, "pos_ids"):
            call(pos_ids=wrong, pair_factor=table)
    for bad, exc in ((ids.astype(np.int64), TypeError), (ids.astype(np.float32), TypeError),
                     (ids[:, :-1], ValueError), (ids[None], ValueError),
                     (np.zeros((B, 2 * T), np.int32)[:, ::2], ValueError)):
        with raises_naming(exc, "pos_ids"):
            call(pos_ids=bad, pair_factor=table)
    for bad, exc in ((table.astype(np.float64), TypeError), (np.ones((4, 5), np.float32),
                                                             ValueError),
                     (np.ones(4, np.float32), ValueError),
                     (np.ones((4, 8), np.float32)[:, ::2], ValueError),
                     (np.ones((4097, 4097), np.float32), ValueError)):
        with raises_naming(exc, "pair_factor"):
            call(pos_ids=ids, pair_factor=bad)
    for value in (np.inf, np.nan):  # masked pairs' zeros times inf would be NaN in dq, dk
        wrong = table.copy()
        wrong[0, 3] = value
        with raises_naming(ValueError, "pair_factor"):
            call(pos_ids=ids, pair_factor=wrong)
    with pytest.raises(TypeError):
        _C.attention_forward(q, k, v, None, "causal", None, ids, table)  # keyword-only


def test_reference_checks_factor_arguments():
    q = np.zeros((1, 3, 1, 2))
    with pytest.raises(ValueError, match="pair_factor"):
        ref.attention_forward(q, q, q, pos_ids=np.zeros((1, 3), int))
    with pytest.raises(ValueError, match="pos_ids"):
        ref.attention_forward(q, q, q, pos_ids=np.full((1, 3), 2), pair_factor=np.ones((2, 2)))
    for ids in (np.zeros((1, 1), int), np.zeros((1, 3)), np.zeros((2, 3), int)):
        with pytest.raises(ValueError, match="pos_ids"):  # broadcast, float or batch mismatch
            ref.attention_forward(q, q, q, pos_ids=ids, pair_factor=np.ones((2, 2)))
    with pytest.raises(ValueError, match="pair_factor"):
        ref.attention_forward(q, q, q, pos_ids=np.zeros((1, 3), int),
                              pair_factor=np.array([[1.0, np.inf], [1.0, 1.0]]))


def test_c_entry_checks_the_factor(tmp_path):
    """The C entry itself (through ctypes, past the binding): one of pos_ids and pair_factor
    alone, npos outside [1, 4096], a non-finite factor or an output over the ids is MF_EINVAL,
    an id outside [0, npos) MF_EINDEX (3: the binding names pos_ids), and nothing is written;
    good arguments give the binding's bits."""
    script = tmp_path / "entry.py"
    script.write_text(ATTENTION_ENTRY + """rng = np.random.default_rng(3)
B, T, H, D, N = 2, 70, 1, 16, 6
q, k, v = (rng.standard_normal((B, T, H, D)).astype(np.float32) for _ in range(3))
ids = rng.integers(0, N, (B, T)).astype(np.int32)
table = rng.uniform(0.5, 1.0, (N, N)).astype(np.float32)
want, want_lse = _C.attention_forward(q, k, v, pos_ids=ids, pair_factor=table)
out, lse = np.empty((B, T, H, D), np.float32), np.empty((B, H, T), np.float32)
p = Params(B=B, T=T, H=H, D=D, scale=1 / np.sqrt(D), q=ptr(q), k=ptr(k), v=ptr(v),
           pos_ids=ids.ctypes.data_as(I), pair_factor=ptr(table), npos=N, out=ptr(out),
           lse=ptr(lse))
n = lib.attention_forward_scratch_floats(ctypes.byref(p))
assert n > 0
buf = np.empty(n + 32, np.float32)
p.scratch, p.scratch_floats = ptr(buf[(-buf.ctypes.data // 4) % 16:]), n
bad_ids = ids.copy()
bad_ids[1, 3] = N
inf_table = table.copy()
inf_table[2, 4] = np.inf
for i, t, npos, status in ((ids, table, N, 0), (ids, None, N, 1), (None, table, N, 1),
                           (ids, table, 0, 1), (ids, table, 4097, 1), (bad_ids, table, N, 3),
                           (ids, inf_table, N, 1)):
    out, lse = np.full((B, T, H, D), 7.0, np.float32), np.full((B, H, T), 7.0, np.float32)
    p.out, p.lse, p.npos = ptr(out), ptr(lse), npos
    p.pos_ids = i.ctypes.data_as(I) if i is not None else None
    p.pair_factor = ptr(t) if t is not None else None
    assert lib.attention_forward(ctypes.byref(p)) == status, (npos, status)
    if status == 0:
        assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    else:
        assert np.all(out == 7.0) and np.all(lse == 7.0)
# the ids inside the output: the kernels would rewrite them while gathering by them
out, lse = np.zeros((B, T, H, D), np.float32), np.full((B, H, T), 7.0, np.float32)
p.out, p.lse, p.npos, p.pair_factor = ptr(out), ptr(lse), N, ptr(table)
p.pos_ids = out.ctypes.data_as(I)
assert lib.attention_forward(ctypes.byref(p)) == 1
assert np.all(out == 0.0) and np.all(lse == 7.0)
print("ok")
""")
    out = subprocess.run([sys.executable, str(script)], env=subprocess_env(1), check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == "ok"
