"""The float64 reference's own backward against central finite differences.

Every check uses loss = sum(out * W) with random W, so every output element carries weight,
and compares the reference's gradient with numerical_grad of that loss in float64."""
import math

import numpy as np
import pytest

from conftest import numerical_grad
from mapformer import reference as ref

# Central differences with eps = 1e-6 in float64: truncation ~eps^2, rounding ~1e-16/eps.
RTOL, ATOL = 1e-6, 1e-8


def assert_grad(analytic, numeric, name):
    analytic, numeric = np.asarray(analytic, np.float64), np.asarray(numeric, np.float64)
    assert analytic.shape == numeric.shape, f"{name}: {analytic.shape} != {numeric.shape}"
    err = np.abs(analytic - numeric)
    bound = ATOL + RTOL * np.abs(numeric)
    assert np.all(err <= bound), (
        f"{name}: max |err| {err.max():.3g} at "
        f"{np.unravel_index(np.argmax(err - bound), err.shape)}"
    )
    assert np.abs(numeric).max() > 1e-3, f"{name}: gradient vanishes, the check proves nothing"


def check(loss, wrt, analytic):
    """wrt: {name: float64 array that loss() reads}; analytic: {name: gradient}."""
    for name, x in wrt.items():
        assert_grad(analytic[name], numerical_grad(loss, x), name)


def r64(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def test_embedding(rng):
    V, C, N = 5, 3, 8
    tokens = np.array([0, 3, 3, 1, 4, 3, 0, 2])
    weight, W = r64(rng, V, C), r64(rng, N, C)
    check(lambda: (ref.embedding_forward(tokens, weight) * W).sum(), {"weight": weight},
          {"weight": ref.embedding_backward(W, tokens, V)})


@pytest.mark.parametrize("has_bias", [True, False])
def test_linear(rng, has_bias):
    N, Cin, Cout = 4, 5, 3
    x, weight, bias, W = r64(rng, N, Cin), r64(rng, Cout, Cin), r64(rng, Cout), r64(rng, N, Cout)
    b = bias if has_bias else None
    dx, dw, db = ref.linear_backward(W, x, weight, has_bias=has_bias)
    wrt, grads = {"x": x, "weight": weight}, {"x": dx, "weight": dw}
    if has_bias:
        wrt["bias"], grads["bias"] = bias, db
    else:
        assert db is None
    check(lambda: (ref.linear_forward(x, weight, b) * W).sum(), wrt, grads)


def test_layernorm(rng):
    N, C = 4, 7
    x, weight, bias, W = r64(rng, N, C, scale=2.0) + 1.0, r64(rng, C), r64(rng, C), r64(rng, N, C)
    _, mean, rstd = ref.layernorm_forward(x, weight, bias)
    dx, dw, db = ref.layernorm_backward(W, x, mean, rstd, weight)
    check(lambda: (ref.layernorm_forward(x, weight, bias)[0] * W).sum(),
          {"x": x, "weight": weight, "bias": bias}, {"x": dx, "weight": dw, "bias": db})


def test_gelu(rng):
    x, W = r64(rng, 3, 11, scale=2.0), r64(rng, 3, 11)
    check(lambda: (ref.gelu_forward(x) * W).sum(), {"x": x}, {"x": ref.gelu_backward(W, x)})


def test_mlp(rng):
    N, C, F = 3, 4, 6
    x, w_fc, b_fc = r64(rng, N, C), r64(rng, F, C), r64(rng, F)
    w_proj, b_proj, W = r64(rng, C, F), r64(rng, C), r64(rng, N, C)
    _, h = ref.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)
    assert np.array_equal(h, ref.linear_forward(x, w_fc, b_fc))
    dx, dw_fc, db_fc, dw_proj, db_proj = ref.mlp_backward(W, x, h, w_fc, w_proj)
    check(lambda: (ref.mlp_forward(x, w_fc, b_fc, w_proj, b_proj)[0] * W).sum(),
          {"x": x, "w_fc": w_fc, "b_fc": b_fc, "w_proj": w_proj, "b_proj": b_proj},
          {"x": dx, "w_fc": dw_fc, "b_fc": db_fc, "w_proj": dw_proj, "b_proj": db_proj})


def test_residual(rng):
    a, b, W = r64(rng, 4, 3), r64(rng, 4, 3), r64(rng, 4, 3)
    da, db = ref.residual_backward(W)
    check(lambda: (ref.residual_forward(a, b) * W).sum(), {"a": a, "b": b}, {"a": da, "b": db})


@pytest.mark.parametrize("scale", [None, 0.7])
def test_attention(rng, scale):
    B, T, H, D = 2, 5, 2, 4
    q, k, v, W = (r64(rng, B, T, H, D) for _ in range(4))
    dq, dk, dv = ref.attention_backward(W, q, k, v, scale)
    check(lambda: (ref.attention_forward(q, k, v, scale)[0] * W).sum(),
          {"q": q, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv})


def test_attention_is_causal(rng):
    B, T, H, D = 1, 5, 1, 4
    q, k, v = (r64(rng, B, T, H, D) for _ in range(3))
    out, _ = ref.attention_forward(q, k, v)
    v2 = v.copy()
    v2[:, -1] += 10.0  # the last key/value is visible only to the last query
    out2, _ = ref.attention_forward(q, k, v2)
    assert np.array_equal(out[:, :-1], out2[:, :-1]) and not np.allclose(out[:, -1], out2[:, -1])


def test_path_integration(rng):
    B, T, H, NB = 2, 6, 2, 3
    delta, omega, W = r64(rng, B, T, H, NB), r64(rng, H, NB), r64(rng, B, T, H, NB)
    ddelta, domega = ref.path_integration_backward(W, delta, omega)
    # wrap=False: the wrap is piecewise the identity minus a constant, so its derivative is 1
    # away from the jumps, which finite differences must not straddle.
    check(lambda: (ref.path_integration_forward(delta, omega, wrap=False) * W).sum(),
          {"delta": delta, "omega": omega}, {"delta": ddelta, "omega": domega})


def test_wrap_angle():
    a = np.array([0.0, np.pi, -np.pi, 3 * np.pi, 7.0, -7.0, 1e4])
    w = ref.wrap_angle(a)
    assert np.all((w >= -np.pi) & (w < np.pi))
    assert np.allclose(np.cos(w), np.cos(a)) and np.allclose(np.sin(w), np.sin(a))
    assert w[1] == -np.pi and w[2] == -np.pi


@pytest.mark.parametrize("tb", ["one", "B"])
def test_rotary(rng, tb):
    B, T, H, D = 2, 3, 2, 6
    TB = 1 if tb == "one" else B
    q, k = r64(rng, B, T, H, D), r64(rng, B, T, H, D)
    theta = rng.uniform(-4, 4, (TB, T, H, D // 2))
    Wq, Wk = r64(rng, B, T, H, D), r64(rng, B, T, H, D)

    def loss():
        q_out, k_out = ref.rotary_forward(q, k, theta)
        return (q_out * Wq).sum() + (k_out * Wk).sum()

    dq, dk, dtheta = ref.rotary_backward(Wq, Wk, q, k, theta)
    assert dtheta.shape == theta.shape
    check(loss, {"q": q, "k": k, "theta": theta}, {"q": dq, "k": dk, "theta": dtheta})


def test_softmax_xent(rng):
    N, V = 6, 5
    logits = r64(rng, N, V, scale=2.0)
    targets = np.array([0, 4, 2, 2, 1, 3])
    mask = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    # the mean loss over unmasked rows: scale = 1 / sum(mask)
    check(lambda: ref.softmax_xent_forward(logits, targets, mask)[1], {"logits": logits},
          {"logits": ref.softmax_xent_backward(logits, targets, mask, 1.0 / mask.sum())})
    # the per-row losses with random weights: the weights act as the mask, scale 1
    W = r64(rng, N)
    check(lambda: (ref.softmax_xent_forward(logits, targets, mask)[0] * W).sum(),
          {"logits": logits}, {"logits": ref.softmax_xent_backward(logits, targets, W, 1.0)})


def test_softmax_xent_values():
    logits = np.array([[0.0, 0.0], [math.log(3.0), 0.0]])
    losses, loss = ref.softmax_xent_forward(logits, np.array([0, 0]), np.array([1.0, 1.0]))
    assert np.allclose(losses, [math.log(2.0), math.log(4.0 / 3.0)])
    assert loss == pytest.approx((math.log(2.0) + math.log(4.0 / 3.0)) / 2)
    assert ref.softmax_xent_forward(logits, np.array([0, 0]), np.zeros(2))[1] == 0.0


def test_adamw_by_hand():
    """lr 0.5, beta1 0.5, beta2 0.75, weight decay 0.1, step 1, so that
    mhat = (0.5 m + 0.5 g) / 0.5 and vhat = (0.75 v + 0.25 g^2) / 0.25 come out round:
      p=1,  g=1,  m=1, v=1, decayed: m'=1,  v'=1,    mhat=2,  vhat=4,  update 2/2 = 1,
                                     p' = 1 - 0.5 (0.1*1 + 1)        = 0.45
      p=-2, g=-2, m=0, v=4, no decay: m'=-1, v'=4,   mhat=-2, vhat=16, update -2/4,
                                     p' = -2 - 0.5 (-0.5)             = -1.75
      p=3,  g=0,  m=2, v=3, decayed: m'=1,  v'=2.25, mhat=2,  vhat=9,  update 2/3,
                                     p' = 3 - 0.5 (0.1*3 + 2/3)      = 2.5166666...
    (eps = 1e-8 moves these by < 1e-8)."""
    p, m, v = ref.adamw_step(
        params=np.array([1.0, -2.0, 3.0]), grads=np.array([1.0, -2.0, 0.0]),
        m=np.array([1.0, 0.0, 2.0]), v=np.array([1.0, 4.0, 3.0]),
        decay_mask=np.array([True, False, True]), lr=0.5, beta1=0.5, beta2=0.75, eps=1e-8,
        weight_decay=0.1, step=1)
    assert np.allclose(m, [1.0, -1.0, 1.0], rtol=0, atol=1e-12)
    assert np.allclose(v, [1.0, 4.0, 2.25], rtol=0, atol=1e-12)
    assert np.allclose(p, [0.45, -1.75, 3.0 - 0.5 * (0.3 + 2.0 / 3.0)], rtol=0, atol=1e-7)


def test_adamw_bias_correction():
    """Step 3 from zero state with a constant gradient: m and v are the gradient times
    (1 - beta^3), so after bias correction the update is g / (|g| + eps) = sign(g)."""
    g = np.array([0.3, -2.0, 5.0])
    p, m, v = np.zeros(3), np.zeros(3), np.zeros(3)
    for step in (1, 2, 3):
        prev = p
        p, m, v = ref.adamw_step(p, g, m, v, np.zeros(3, bool), 1e-2, 0.9, 0.999, 1e-12, 0.5, step)
        assert np.allclose(p - prev, -1e-2 * np.sign(g), rtol=1e-9, atol=0)
    assert np.allclose(m, g * (1 - 0.9**3)) and np.allclose(v, g**2 * (1 - 0.999**3))


def test_global_norm_and_clip():
    assert ref.global_norm(np.array([3.0, 4.0])) == 5.0
    clipped, norm = ref.clip_grad_norm(np.array([3.0, 4.0]), 1.0)
    assert norm == 5.0 and np.allclose(clipped, np.array([3.0, 4.0]) / (5.0 + 1e-6))
    same, _ = ref.clip_grad_norm(np.array([0.3, 0.4]), 1.0)
    assert np.array_equal(same, [0.3, 0.4])


@pytest.mark.parametrize("n_pos", [3, 8])
def test_cope(rng, n_pos):
    """n_pos = 3 clamps the later positions (p up to ~T/2 = 3.5), n_pos = 8 never does. The
    floor/ceil in the interpolation are piecewise constant: with random inputs no position sits
    within eps of an integer, so the central differences see a smooth function."""
    B, T, H, D = 2, 7, 2, 4
    q, k, v, W = (r64(rng, B, T, H, D) for _ in range(4))
    e = r64(rng, H, n_pos, D)
    dq, dk, dv, de = ref.cope_backward(W, q, k, v, e)
    check(lambda: (ref.cope_forward(q, k, v, e)[0] * W).sum(),
          {"q": q, "k": k, "v": v, "e": e}, {"q": dq, "k": dk, "v": dv, "e": de})


def _float32_cases(rng):
    """(name, call taking dtype) for every op of the reference, on float32 inputs."""
    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    B, T, H, D, C, V = 2, 5, 2, 4, 6, 7
    tokens, targets = rng.integers(0, V, 10), rng.integers(0, V, 10)
    q, k, v, dout, e4 = r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D)
    x, w, b, mask = r(10, C), r(V, C), r(V), (rng.random(10) > 0.3).astype(np.float32)
    theta, delta, omega = r(B, T, H, D // 2), r(B, T, H, D // 2), r(H, D // 2)
    h, wfc, wproj = r(10, 3 * C), r(3 * C, C), r(C, 3 * C)
    mean, rstd = x.mean(1), 1 / x.std(1)
    gates, mix, e_pos = r(B, T, H), r(H, H), r(H, 4, D)
    flat, dy, logits = r(20), r(10, V), r(10, V)
    return [
        ("embedding_forward", lambda dt: ref.embedding_forward(tokens, w, dtype=dt)),
        ("embedding_backward", lambda dt: ref.embedding_backward(x, tokens, V, dtype=dt)),
        ("linear_forward", lambda dt: ref.linear_forward(x, w, b, dtype=dt)),
        ("linear_backward", lambda dt: ref.linear_backward(dy, x, w, dtype=dt)),
        ("layernorm_forward", lambda dt: ref.layernorm_forward(x, x[0], x[1], dtype=dt)),
        ("layernorm_backward",
         lambda dt: ref.layernorm_backward(x, x, mean, rstd, x[0], dtype=dt)),
        ("gelu_forward", lambda dt: ref.gelu_forward(x, dtype=dt)),
        ("gelu_backward", lambda dt: ref.gelu_backward(x, x, dtype=dt)),
        ("mlp_forward", lambda dt: ref.mlp_forward(x, wfc, h[0], wproj, x[0], dtype=dt)),
        ("mlp_backward", lambda dt: ref.mlp_backward(x, x, h, wfc, wproj, dtype=dt)),
        ("residual_forward", lambda dt: ref.residual_forward(x, x, dtype=dt)),
        ("attention_forward", lambda dt: ref.attention_forward(q, k, v, dtype=dt)),
        ("attention_backward", lambda dt: ref.attention_backward(dout, q, k, v, dtype=dt)),
        ("path_integration_forward",
         lambda dt: ref.path_integration_forward(delta, omega, dtype=dt)),
        ("path_integration_backward",
         lambda dt: ref.path_integration_backward(theta, delta, omega, dtype=dt)),
        ("rotary_forward", lambda dt: ref.rotary_forward(q, k, theta, dtype=dt)),
        ("rotary_backward", lambda dt: ref.rotary_backward(dout, v, q, k, theta, dtype=dt)),
        ("softmax_xent_forward",
         lambda dt: ref.softmax_xent_forward(logits, targets, mask, dtype=dt)[0]),
        ("softmax_xent_backward",
         lambda dt: ref.softmax_xent_backward(logits, targets, mask, 0.5, dtype=dt)),
        ("adamw_step", lambda dt: ref.adamw_step(flat, flat, flat, flat ** 2, flat > 0, 1e-2,
                                                 0.9, 0.99, 1e-8, 0.1, 3, dtype=dt)),
        ("clip_grad_norm", lambda dt: ref.clip_grad_norm(flat, 1.0, dtype=dt)[0]),
        ("ema_update", lambda dt: ref.ema_update(flat, flat[::-1], 0.99, dtype=dt)),
        ("l2_normalize_forward", lambda dt: ref.l2_normalize_forward(x, dtype=dt)),
        ("l2_normalize_backward",
         lambda dt: ref.l2_normalize_backward(x, x, np.abs(x[:, 0]) + 1, dtype=dt)),
        ("cope_forward", lambda dt: ref.cope_forward(q, k, v, e_pos, dtype=dt)),
        ("cope_backward", lambda dt: ref.cope_backward(dout, q, k, v, e_pos, dtype=dt)),
        ("tape_rotate_forward", lambda dt: ref.tape_rotate_forward(q, k, e4, dtype=dt)),
        ("tape_rotate_backward",
         lambda dt: ref.tape_rotate_backward(dout, v, q, k, e4, dtype=dt)),
        ("tape_mix_forward", lambda dt: ref.tape_mix_forward(e4, gates, mix, dtype=dt)),
        ("tape_mix_backward",
         lambda dt: ref.tape_mix_backward(dout, e4, gates, mix, dtype=dt)),
        *[(f"conj_attention_{d}_{mode}",
           (lambda dt, mode=mode: ref.conj_attention_forward(q, k, v, e4, dout, mode,
                                                             dtype=dt))
           if d == "forward" else
           (lambda dt, mode=mode: ref.conj_attention_backward(dout, q, k, v, e4, dout, mode,
                                                              dtype=dt)))
          for mode in ref.CONJ_MODES for d in ("forward", "backward")],
    ]


def _arrays(result):
    """The array results of a reference call, in order (tuples flattened, None dropped)."""
    items = result if isinstance(result, tuple) else (result,)
    return [a for a in items if isinstance(a, np.ndarray)]


def test_every_op_computes_in_its_dtype(rng):
    """dtype=np.float32 keeps every array result in float32 (the benchmarks' NumPy baseline
    of each C op) and agrees with the float64 oracle to float32 precision."""
    for name, call in _float32_cases(rng):
        got, want = _arrays(call(np.float32)), _arrays(call(np.float64))
        assert got and len(got) == len(want), name
        for g, w in zip(got, want):
            assert g.dtype == np.float32, f"{name}: {g.dtype}"
            assert w.dtype == np.float64, f"{name}: {w.dtype}"
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * (1 + np.abs(w).max()),
                                       err_msg=name)


def test_model_components_do_not_import_the_reference():
    """The schemes, mixers, bottlenecks and tasks take what they share with the float64
    oracle from mapformer.geometry, never from mapformer.reference (the test oracle)."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "mapformer"
    found = []
    for folder in ("schemes", "mixers", "bottlenecks", "tasks"):
        for path in sorted((root / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] + [a.name for a in node.names]
                         if isinstance(node, ast.ImportFrom) else [])
                if any(n.split(".")[-1] == "reference" for n in names):
                    found.append(f"{folder}/{path.name}")
    assert found == []
