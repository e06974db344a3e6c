"""Relative-position attention (Shaw et al. 2018): the float64 reference against finite
differences and against plain attention, the C op against the reference under every mask,
its bits on 1 and 2 threads, and its argument checks."""
import numpy as np
import pytest

from conftest import (BAD_SCALES, assert_close, assert_refuses_bad_versions,
                      assert_same_bits_for_thread_counts, assert_scale_checked, numerical_grad,
                      randn, raises_naming)
from mapformer import _C
from mapformer import reference as ref

# (B, T, H, D, R2, mask): T = 1, 7, 33, 97 (not a multiple of the 64-row block or of 16 lanes)
# and 130 once; R2 = 1 (one offset: the relative logit is the same for every key), R2 < T
# (clipped offsets on both sides) and R2 > 2T - 1 (rows no offset reaches); every mask.
CONFIGS = [
    (1, 1, 1, 16, 3, "causal"),
    (2, 7, 3, 16, 1, "causal"),
    (1, 33, 2, 32, 9, "causal"),
    (2, 97, 1, 64, 33, "none"),
    (3, 33, 2, 16, 5, "prefix"),
    (2, 97, 3, 16, 201, "prefix"),
    (1, 130, 2, 32, 41, "none"),
]


def relative_inputs(rng, B, T, H, D, R2, mask):
    """q, k, v (B, T, H, D), dout; rel_k, rel_v (R2, D) with the relative logits of order 1;
    prefix lengths (with mask 'prefix': 0, T and values between)."""
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    rel_k, rel_v = randn(rng, R2, D), randn(rng, R2, D)
    prefix = None
    if mask == "prefix":
        prefix = rng.integers(0, T + 1, B).astype(np.int32)
        prefix[0] = T // 2
        prefix[-1] = T if B > 2 else prefix[-1]
    return q, k, v, dout, rel_k, rel_v, prefix


def c_grads(dout, q, k, v, rel_k, rel_v, out, lse, **kw):
    """The C backward with fresh (zero) embedding gradients: (dq, dk, dv, drel_k, drel_v)."""
    drel_k = np.zeros_like(rel_k)
    drel_v = None if rel_v is None else np.zeros_like(rel_v)
    dq, dk, dv = _C.relative_backward(dout, q, k, v, rel_k, out, lse, drel_k, rel_v, drel_v,
                                      **kw)
    return dq, dk, dv, drel_k, drel_v


# ---- the reference ------------------------------------------------------------------------
def test_offsets_clip_at_R():
    c = ref.relative_offsets(6, 5)  # R = 2
    assert c[3].tolist() == [0, 0, 1, 2, 3, 4] and c[0].tolist() == [2, 3, 4, 4, 4, 4]
    assert (ref.relative_offsets(4, 1) == 0).all()


@pytest.mark.parametrize("mask,with_v,rel_scale", [("causal", True, None), ("none", False, 1.0),
                                                   ("prefix", True, 0.3)])
def test_reference_gradients(rng, mask, with_v, rel_scale):
    """Central finite differences of sum(out * W) on every input, clipped offsets included
    (T = 7, R2 = 5)."""
    B, T, H, D, R2 = 2, 7, 2, 4, 5
    q, k, v = (rng.standard_normal((B, T, H, D)) for _ in range(3))
    rel_k, rel_v = rng.standard_normal((R2, D)), rng.standard_normal((R2, D))
    rel_v = rel_v if with_v else None
    prefix = np.array([3, 7], np.int32) if mask == "prefix" else None
    W = rng.standard_normal((B, T, H, D))
    kw = dict(scale=0.7, rel_scale=rel_scale, mask=mask, prefix=prefix)

    def loss():
        return (ref.relative_forward(q, k, v, rel_k, rel_v, **kw)[0] * W).sum()

    grads = ref.relative_backward(W, q, k, v, rel_k, rel_v, **kw)
    checked = (("q", q), ("k", k), ("v", v), ("rel_k", rel_k)) + (
        (("rel_v", rel_v),) if with_v else ())
    for (name, x), analytic in zip(checked, grads):
        numeric = numerical_grad(loss, x)
        assert np.abs(numeric).max() > 1e-2, f"{name}: gradient vanishes"
        err = np.abs(analytic - numeric)
        assert np.all(err <= 1e-8 + 1e-6 * np.abs(numeric)), f"{name}: max |err| {err.max():.3g}"
    assert (grads[4] is None) == (not with_v)


def test_reference_is_attention_without_embeddings(rng):
    """rel_k = 0 and no rel_v: plain attention under the same mask; a constant rel_v adds
    itself to every output (the probabilities sum to 1)."""
    B, T, H, D = 2, 9, 2, 8
    q, k, v, dout = (rng.standard_normal((B, T, H, D)) for _ in range(4))
    prefix = np.array([4, 0], np.int32)
    zero = np.zeros((7, D))
    out, lse = ref.relative_forward(q, k, v, zero, mask="prefix", prefix=prefix)
    out_a, lse_a = ref.attention_forward(q, k, v, mask="prefix", prefix=prefix)
    np.testing.assert_allclose(out, out_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse_a, rtol=1e-12, atol=1e-12)
    grads = ref.relative_backward(dout, q, k, v, zero, mask="prefix", prefix=prefix)
    for g, g_a in zip(grads[:3], ref.attention_backward(dout, q, k, v, mask="prefix",
                                                        prefix=prefix)):
        np.testing.assert_allclose(g, g_a, rtol=1e-10, atol=1e-12)
    row = rng.standard_normal(D)
    shifted, _ = ref.relative_forward(q, k, v, zero, np.tile(row, (7, 1)))
    np.testing.assert_allclose(shifted, ref.attention_forward(q, k, v)[0] + row, atol=1e-12)


# ---- the C op against the reference -------------------------------------------------------
@pytest.mark.parametrize("with_v", [True, False])
@pytest.mark.parametrize("B,T,H,D,R2,mask", CONFIGS)
def test_forward_and_backward(rng, B, T, H, D, R2, mask, with_v):
    q, k, v, dout, rel_k, rel_v, prefix = relative_inputs(rng, B, T, H, D, R2, mask)
    rel_v = rel_v if with_v else None
    kw = dict(mask=mask, prefix=prefix)
    inputs = [x for x in (q, k, v, dout, rel_k, rel_v, prefix) if x is not None]
    before = [x.copy() for x in inputs]
    out, lse = _C.relative_forward(q, k, v, rel_k, rel_v, **kw)
    assert out.dtype == np.float32 and out.shape == (B, T, H, D) and lse.shape == (B, H, T)
    out_r, lse_r = ref.relative_forward(q, k, v, rel_k, rel_v, **kw)
    assert_close(out, out_r, "reduction", "out")
    assert_close(lse, lse_r, "reduction", "lse")
    prefill_k, prefill_v = randn(rng, R2, D), randn(rng, R2, D)
    drel_k, drel_v = prefill_k.copy(), prefill_v.copy() if with_v else None
    dq, dk, dv = _C.relative_backward(dout, q, k, v, rel_k, out, lse, drel_k, rel_v, drel_v,
                                      **kw)
    dq_r, dk_r, dv_r, drel_k_r, drel_v_r = ref.relative_backward(dout, q, k, v, rel_k, rel_v,
                                                                 **kw)
    assert_close(dq, dq_r, "gradient", "dq")
    assert_close(dk, dk_r, "gradient", "dk")
    assert_close(dv, dv_r, "gradient", "dv")
    # R2 = 1: every key meets rel_k[0], whose gradient is a sum of the softmax's gradients
    # (0 in exact arithmetic): only its rounding is left, at the scale of the other terms
    if R2 > 1:
        assert_close(drel_k - prefill_k, drel_k_r, "gradient", "drel_k (accumulated)")
    else:
        assert np.abs(drel_k - prefill_k).max() < 1e-4 * np.abs(dq_r).max() * B * T
    if with_v:
        assert_close(drel_v - prefill_v, drel_v_r, "gradient", "drel_v (accumulated)")
    if R2 > 2 * T - 1:  # offsets past +-(T-1) are never met: their rows keep their values
        far = (R2 - 1) // 2 - (T - 1)
        assert np.array_equal(drel_k[:far], prefill_k[:far])
        assert np.array_equal(drel_k[-far:], prefill_k[-far:])
    for x, x0 in zip(inputs, before):
        assert np.array_equal(x, x0)


def test_scales_and_shaw_against_the_ape_codes_reading(rng):
    """rel_scale defaults to scale (Shaw et al.); rel_scale=1 without rel_v is the APE
    code's Relative baseline; both against the reference, and the two differ."""
    q, k, v, dout, rel_k, rel_v, _ = relative_inputs(rng, 2, 40, 2, 16, 11, "causal")
    shaw, _ = _C.relative_forward(q, k, v, rel_k, rel_v, scale=0.2)
    explicit, _ = _C.relative_forward(q, k, v, rel_k, rel_v, 0.2, 0.2)
    assert np.array_equal(shaw, explicit)
    ape_code, lse = _C.relative_forward(q, k, v, rel_k, rel_scale=1.0)
    assert_close(ape_code, ref.relative_forward(q, k, v, rel_k, rel_scale=1.0)[0], "reduction",
                 "out (rel_scale 1)")
    assert not np.allclose(shaw, ape_code)
    grads = c_grads(dout, q, k, v, rel_k, None, ape_code, lse, rel_scale=1.0)
    for name, g, g_r in zip(("dq", "dk", "dv", "drel_k"), grads,
                            ref.relative_backward(dout, q, k, v, rel_k, rel_scale=1.0)):
        assert_close(g, g_r, "gradient", name)


def test_backward_accumulates_and_is_deterministic(rng):
    q, k, v, dout, rel_k, rel_v, _ = relative_inputs(rng, 2, 97, 3, 16, 21, "causal")
    out, lse = _C.relative_forward(q, k, v, rel_k, rel_v)
    first = c_grads(dout, q, k, v, rel_k, rel_v, out, lse)
    second = c_grads(dout, q, k, v, rel_k, rel_v, out, lse)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)
    drel_k, drel_v = first[3].copy(), first[4].copy()
    _C.relative_backward(dout, q, k, v, rel_k, out, lse, drel_k, rel_v, drel_v)  # adds again
    assert_close(drel_k, 2.0 * first[3], "default", "drel_k after two calls")
    assert_close(drel_v, 2.0 * first[4], "default", "drel_v after two calls")


def test_same_bits_for_any_thread_count(tmp_path):
    """Forward and backward give the same bits on 1 and 2 OpenMP threads: a task per head
    writes its own rows, and the embeddings' gradients are the tasks' parts summed in task
    order."""
    assert_same_bits_for_thread_counts(tmp_path, """
import sys
import numpy as np
from mapformer import _C
rng = np.random.default_rng(7)
q, k, v, dout = (rng.standard_normal((3, 130, 2, 32)).astype(np.float32) for _ in range(4))
rel_k, rel_v = (rng.standard_normal((17, 32)).astype(np.float32) for _ in range(2))
prefix = np.array([0, 70, 130], np.int32)
out, lse = _C.relative_forward(q, k, v, rel_k, rel_v, mask="prefix", prefix=prefix)
drel_k, drel_v = np.zeros_like(rel_k), np.zeros_like(rel_v)
dq, dk, dv = _C.relative_backward(dout, q, k, v, rel_k, out, lse, drel_k, rel_v, drel_v,
                                  mask="prefix", prefix=prefix)
np.savez(sys.argv[1], out=out, lse=lse, dq=dq, dk=dk, dv=dv, drel_k=drel_k, drel_v=drel_v)
""")


def test_nan_stays_in_its_head(rng):
    q, k, v, dout, rel_k, rel_v, _ = relative_inputs(rng, 1, 33, 2, 16, 7, "causal")
    q[0, 5, 1, 3] = np.nan
    out, lse = _C.relative_forward(q, k, v, rel_k, rel_v)
    assert np.isnan(out[0, 5, 1]).all() and np.isfinite(out[:, :, 0]).all()
    dq = c_grads(dout, q, k, v, rel_k, rel_v, out, lse)[0]
    assert np.isfinite(dq[:, :, 0]).all()


# ---- argument checks -----------------------------------------------------------------------
def good_args(rng, B=2, T=5, H=3, D=16, R2=3):
    q, k, v, dout, rel_k, rel_v, _ = relative_inputs(rng, B, T, H, D, R2, "causal")
    out, lse = _C.relative_forward(q, k, v, rel_k, rel_v)
    return dict(dout=dout, q=q, k=k, v=v, rel_k=rel_k, rel_v=rel_v, out=out, lse=lse,
                drel_k=np.zeros_like(rel_k), drel_v=np.zeros_like(rel_v))


FWD = ("q", "k", "v", "rel_k", "rel_v")
BWD = ("dout", "q", "k", "v", "rel_k", "out", "lse", "drel_k", "rel_v", "drel_v")


def call(which, args):
    """relative_forward or relative_backward by keyword with the arguments it takes."""
    names = (FWD if which == "forward" else BWD) + ("scale", "rel_scale", "mask", "prefix")
    fn = _C.relative_forward if which == "forward" else _C.relative_backward
    return fn(**{n: args[n] for n in names if n in args})


@pytest.mark.parametrize("which,name", [("forward", n) for n in FWD] +
                         [("backward", n) for n in BWD])
def test_bad_arrays(rng, which, name):
    """Every message starts with the bad argument's name."""
    args = good_args(rng)

    def call_with(value):
        return call(which, {**args, name: value})

    # None: rel_v and drel_v take it (backward: both or neither, the next test's)
    assert_refuses_bad_versions(call_with, name, args[name], none_ok=name in ("rel_v", "drel_v"))
    if name != "q":  # q fixes B, T, H, D: a q of another size is reported on the others
        with raises_naming(ValueError, name):
            call_with(np.ascontiguousarray(args[name][..., :-1]))
    call(which, args)  # the good arguments still work


def test_even_offsets_head_dims_and_pairs_are_refused(rng):
    args = good_args(rng)
    for which in ("forward", "backward"):
        with raises_naming(ValueError, "rel_k"):
            call(which, {**args, "rel_k": randn(rng, 4, 16), "rel_v": randn(rng, 4, 16),
                         "drel_k": np.zeros((4, 16), np.float32),
                         "drel_v": np.zeros((4, 16), np.float32)})
        with raises_naming(ValueError, "rel_k"):
            call(which, {**args, "rel_k": randn(rng, 4, 16), "rel_v": None, "drel_v": None,
                         "drel_k": np.zeros((4, 16), np.float32)})
    with pytest.raises(ValueError, match="^drel_v is required with rel_v"):
        call("backward", {**args, "drel_v": None})
    with pytest.raises(ValueError, match="^rel_v is required with drel_v"):
        call("backward", {**args, "rel_v": None})
    B, T, H = 1, 4, 2
    for D in (15, 8, 130):
        bad = dict(q=randn(rng, B, T, H, D), k=randn(rng, B, T, H, D), v=randn(rng, B, T, H, D),
                   rel_k=randn(rng, 3, D))
        with pytest.raises(ValueError, match="head dim"):
            call("forward", bad)


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_bad_scales(rng, which):
    args = good_args(rng)
    assert_scale_checked(lambda value: call(which, {**args, "scale": value}))
    for value, exc in BAD_SCALES:
        with raises_naming(exc, "rel_scale"):
            call(which, {**args, "rel_scale": value})


def test_masks_are_checked(rng):
    args = good_args(rng)
    with pytest.raises(ValueError, match="prefix"):
        call("forward", {**args, "mask": "prefix"})
    with pytest.raises(ValueError, match="prefix"):
        call("forward", {**args, "prefix": np.zeros(2, np.int32)})
    with raises_naming(ValueError, "prefix"):
        call("forward", {**args, "mask": "prefix", "prefix": np.array([0, 6], np.int32)})
    with raises_naming(ValueError, "mask"):
        call("forward", {**args, "mask": "sideways"})


# ---- the scheme ---------------------------------------------------------------------------
def relative_model(reading, backend, window=3, mask="prefix"):
    from mapformer.models import ModelConfig, Transformer
    config = ModelConfig(vocab_size=11, d_model=32, n_heads=2, n_layers=2, positional="relative",
                         options={"rel_window": window, "rel_reading": reading,
                                  "attn_mask": mask})
    model = Transformer(config, seed=0, backend=backend)
    rng = np.random.default_rng(1)
    for name, p in model.params.params.items():
        if ".rel_" in name:  # embeddings of order 1, so the offsets move the logits
            p.value[...] = rng.standard_normal(p.value.shape).astype(p.value.dtype)
    return model


@pytest.mark.parametrize("reading", ["shaw", "ape_code"])
def test_scheme_c_backend_matches_numpy(reading):
    """A two-layer prefix LM on the relative scheme: loss and gradients on the C backend
    against the float64 NumPy backend; the ape_code reading has no value embeddings."""
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 11, (3, 13)), rng.integers(0, 11, (3, 13))
    prefix = np.array([5, 0, 13], np.int32)
    losses, grads = [], []
    for backend in ("numpy", "c"):
        model = relative_model(reading, backend)
        losses.append(model.loss(tokens, targets, np.ones(tokens.shape, bool), None, prefix))
        model.backward()
        grads.append({n: np.array(p.grad, np.float64) for n, p in model.params.params.items()})
    names = [n for n in grads[0] if ".rel_" in n]
    assert names == (["blocks.0.mixer.scheme.rel_k", "blocks.0.mixer.scheme.rel_v",
                      "blocks.1.mixer.scheme.rel_k", "blocks.1.mixer.scheme.rel_v"]
                     if reading == "shaw" else
                     ["blocks.0.mixer.scheme.rel_k", "blocks.1.mixer.scheme.rel_k"])
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0])
    for name, g in grads[0].items():
        np.testing.assert_allclose(grads[1][name], g, rtol=0, atol=2e-4 * np.abs(g).max() + 1e-9,
                                   err_msg=name)
    assert all(np.abs(grads[0][n]).max() > 1e-4 for n in names)

