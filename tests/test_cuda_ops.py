"""The CUDA kernels (cuda/<family>.cu) executed on the CPU under the emulation of CUDA's model
(tests/cuda_emulation.py, cuda/common.cuh) against the float64 reference, forward and
backward, on awkward sizes (1, odd, prime; sizes that leave partial blocks), with the C ops'
tolerances (conftest.TOLERANCES). Each case runs under the three block schedules: the
concurrent one (real threads) is compared with the reference, and the two serial orders must
give the same bits (a race between barriers would make them differ; embedding's backward,
which adds with atomics, is compared with a tolerance instead)."""
import os

import numpy as np
import pytest

from conftest import assert_close, randn
from cuda_emulation import Device, kernels
from mapformer import cuda
from mapformer import reference as ref

SCHEDULES = ("concurrent", "serial_forward", "serial_reverse")


@pytest.fixture(scope="module")
def emu():
    e = kernels()
    yield e
    e.schedule("concurrent")


def run(emu, function, struct, make, outputs, exact=True):
    """Call ``function`` under every schedule on fresh arrays from ``make()`` (a dict of the
    struct's fields); return the concurrent run's ``outputs`` (field names), after checking
    that the serial runs gave the same bits (or, with exact=False, the same values to the
    "reduction" tolerance)."""
    results = {}
    for schedule in SCHEDULES:
        emu.schedule(schedule)
        fields = make()
        assert emu.call(function, struct, **fields) == 0, (function, schedule)
        results[schedule] = [fields[k].copy() for k in outputs]
    emu.schedule("concurrent")
    for schedule in SCHEDULES[1:]:
        for name, a, b in zip(outputs, results["concurrent"], results[schedule]):
            if exact:
                assert np.array_equal(a, b, equal_nan=True), f"{function} {name}: {schedule}"
            else:
                assert_close(b, a, "reduction", f"{function} {name} {schedule}")
    return results["concurrent"]


def test_products_path(emu):
    """The path of the matrix products (cuda/blas.cu, gemm.cuh): the tiles under the emulation,
    which this file's product tests then check; on a GPU cuBLAS, unless MAPFORMER_CUDA_GEMM=tiled
    asks for the tiles there (.ci/gpu_check runs the product tests both ways)."""
    gpu = isinstance(emu, Device) and os.environ.get("MAPFORMER_CUDA_GEMM") != "tiled"
    assert cuda.products(emu.lib) == ("cublas" if gpu else "tiled")


def empty(*shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype)


ELEMENTWISE = [1, 7, 255, 257, 3001]


@pytest.mark.parametrize("n", ELEMENTWISE)
@pytest.mark.parametrize("exact", [0, 1])
def test_gelu(emu, rng, n, exact):
    x, dy = randn(rng, n, scale=3.0), randn(rng, n)
    approximate = "none" if exact else "tanh"
    (y,) = run(emu, "gelu_forward_cuda", "MfGeluParams",
               lambda: dict(y=empty(n), x=x, n=n, exact=exact), ["y"])
    assert_close(y, ref.gelu_forward(x, approximate=approximate), "default", "y")
    (dx,) = run(emu, "gelu_backward_cuda", "MfGeluParams",
                lambda: dict(dx=empty(n), dy=dy, x=x, n=n, exact=exact), ["dx"])
    assert_close(dx, ref.gelu_backward(dy, x, approximate=approximate), "default", "dx")


def test_gelu_tails(emu):
    """Large |x|: no NaN from exp overflow (the tanh form's 1 - s taken without cancelling)."""
    x = np.array([-200.0, -30.0, -9.5, 0.0, 9.5, 30.0, 200.0], np.float32)
    dy = np.ones_like(x)
    for exact in (0, 1):
        approximate = "none" if exact else "tanh"
        y, dx = empty(7), empty(7)
        assert emu.call("gelu_forward_cuda", "MfGeluParams", y=y, x=x, n=7, exact=exact) == 0
        assert emu.call("gelu_backward_cuda", "MfGeluParams", dx=dx, dy=dy, x=x, n=7,
                        exact=exact) == 0
        assert_close(y, ref.gelu_forward(x, approximate=approximate), "default", "y")
        assert_close(dx, ref.gelu_backward(dy, x, approximate=approximate), "default", "dx")


@pytest.mark.parametrize("n", ELEMENTWISE)
@pytest.mark.parametrize("op", ["silu", "softplus"])
def test_activation(emu, rng, n, op):
    x, dy = randn(rng, n, scale=8.0), randn(rng, n)
    x[0] = 25.0  # past softplus's threshold
    (y,) = run(emu, f"{op}_forward_cuda", "MfActivationParams",
               lambda: dict(y=empty(n), x=x, n=n), ["y"])
    assert_close(y, getattr(ref, f"{op}_forward")(x), "default", "y")
    (dx,) = run(emu, f"{op}_backward_cuda", "MfActivationParams",
                lambda: dict(dx=empty(n), dy=dy, x=x, n=n), ["dx"])
    assert_close(dx, getattr(ref, f"{op}_backward")(dy, x), "default", "dx")


@pytest.mark.parametrize("n", ELEMENTWISE)
def test_silu_gate(emu, rng, n):
    y, z, dout = randn(rng, n, scale=3.0), randn(rng, n, scale=8.0), randn(rng, n)
    (out,) = run(emu, "silu_gate_forward_cuda", "MfSiluGateParams",
                 lambda: dict(out=empty(n), y=y, z=z, n=n), ["out"])
    assert_close(out, ref.silu_gate_forward(y, z), "default", "out")
    dy, dz = run(emu, "silu_gate_backward_cuda", "MfSiluGateParams",
                 lambda: dict(dy=empty(n), dz=empty(n), dout=dout, y=y, z=z, n=n), ["dy", "dz"])
    rdy, rdz = ref.silu_gate_backward(dout, y, z)
    assert_close(dy, rdy, "default", "dy")
    assert_close(dz, rdz, "default", "dz")


@pytest.mark.parametrize("n", [1, 255, 3001])
def test_adamw(emu, rng, n):
    params, grads = randn(rng, n), randn(rng, n)
    m, v = randn(rng, n, scale=0.1), np.abs(randn(rng, n, scale=0.1))
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    hp = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for step in (1, 2, 10):
        new = run(emu, "adamw_step_cuda", "MfAdamwParams",
                  lambda: dict(params=params.copy(), m=m.copy(), v=v.copy(), grads=grads,
                               decay_mask=mask, n=n, step=step, **hp), ["params", "m", "v"])
        want = ref.adamw_step(params, grads, m, v, mask.astype(bool), step=step, **hp)
        for got, exp, name in zip(new, want, ("params", "m", "v")):
            assert_close(got, exp, "default", name)
    bad = dict(params=params, m=m, v=v, grads=grads, decay_mask=mask, n=n, step=0, **hp)
    assert emu.call("adamw_step_cuda", "MfAdamwParams", **bad) == 1  # MF_EINVAL


@pytest.mark.parametrize("n", ELEMENTWISE)
def test_ema(emu, rng, n):
    target, source = randn(rng, n), randn(rng, n, scale=3.0)
    (got,) = run(emu, "ema_update_cuda", "MfEmaParams",
                 lambda: dict(target=target.copy(), source=source, n=n, decay=0.99), ["target"])
    assert_close(got, ref.ema_update(target, source, 0.99), "default", "target")
    for decay in (1.0, -0.5, np.nan):
        assert emu.call("ema_update_cuda", "MfEmaParams", target=target.copy(), source=source,
                        n=n, decay=decay) == 1  # MF_EINVAL


@pytest.mark.parametrize("N,D", [(1, 1), (3, 3), (7, 17), (4, 129), (2, 1000)])
def test_l2_normalize(emu, rng, N, D):
    x, dy = randn(rng, N, D, scale=2.0), randn(rng, N, D)
    x[N // 2] = 0.0  # a zero row: y = 0, norm = sqrt(eps)
    y, norm = run(emu, "l2_normalize_forward_cuda", "MfL2NormalizeParams",
                  lambda: dict(y=empty(N, D), norm=empty(N), x=x, N=N, D=D, eps=1e-12),
                  ["y", "norm"])
    ry, rnorm = ref.l2_normalize_forward(x)
    assert_close(y, ry, "default", "y")
    assert_close(norm, rnorm, "default", "norm")
    (dx,) = run(emu, "l2_normalize_backward_cuda", "MfL2NormalizeParams",
                lambda: dict(dx=empty(N, D), dy=dy, y_in=y, norm_in=norm, N=N, D=D), ["dx"])
    # dy - y (y . dy) may cancel: compared on the scale of its terms, |dy| / norm
    scale = np.abs(dy).max(-1, keepdims=True) / norm[:, None]
    assert_close(dx / scale, ref.l2_normalize_backward(dy, y, norm) / scale, "reduction", "dx")
    assert emu.call("l2_normalize_forward_cuda", "MfL2NormalizeParams", y=empty(N, D),
                    norm=empty(N), x=x, N=N, D=D, eps=0.0) == 1  # MF_EINVAL


# (67, 33): more rows than the column sums' 32 lanes, and a second, partial column block
@pytest.mark.parametrize("N,C", [(1, 1), (3, 7), (5, 128), (4, 130), (2, 1000), (67, 33)])
def test_layernorm(emu, rng, N, C):
    x = randn(rng, N, C, scale=2.0) + 1.5
    w, b, dy = randn(rng, C), randn(rng, C), randn(rng, N, C)
    y, mean, rstd = run(emu, "layernorm_forward_cuda", "MfLayernormParams",
                        lambda: dict(y=empty(N, C), mean=empty(N), rstd=empty(N), x=x, weight=w,
                                     bias=b, N=N, C=C, eps=1e-5), ["y", "mean", "rstd"])
    ry, rmean, rrstd = ref.layernorm_forward(x, w, b)
    assert_close(y, ry, "reduction", "y")
    assert_close(mean, rmean, "reduction", "mean")
    assert_close(rstd, rrstd, "reduction", "rstd")
    rdx, rdw, rdb = ref.layernorm_backward(dy, x, mean, rstd, w)
    dw0, db0, dx0 = randn(rng, C), randn(rng, C), randn(rng, N, C)
    for accumulate in (0, 1):
        dx, dw, db = run(emu, "layernorm_backward_cuda", "MfLayernormParams",
                         lambda: dict(dx=dx0.copy(), dweight=dw0.copy(), dbias=db0.copy(),
                                      dy=dy, x=x, mean_in=mean, rstd_in=rstd, weight=w,
                                      N=N, C=C, accumulate_dx=accumulate),
                         ["dx", "dweight", "dbias"])
        assert_close(dx, rdx + (dx0 if accumulate else 0), "reduction", "dx")
        assert_close(dw, dw0 + rdw, "gradient", "dweight")
        assert_close(db, db0 + rdb, "gradient", "dbias")


def angle_close(actual, expected, name="theta"):
    """Angles equal modulo 2 pi (as tests/test_rotary.py compares them)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert_close(expected + ref.wrap_angle(actual - expected), expected, "default", name)


ROPE_SIZES = [(1, 1, 1, 2), (2, 7, 3, 16), (3, 13, 1, 6), (2, 5, 2, 130)]


@pytest.mark.parametrize("B,T,H,D", ROPE_SIZES)
def test_path_integration(emu, rng, B, T, H, D):
    NB = D // 2
    delta, dtheta = randn(rng, B, T, H, NB, scale=3.0), randn(rng, B, T, H, NB)
    omega = (2 * np.pi * rng.uniform(0.01, 1.2, (H, NB))).astype(np.float32)
    (theta,) = run(emu, "path_integration_forward_cuda", "MfPathIntegrationParams",
                   lambda: dict(theta=empty(B, T, H, NB), delta=delta, omega=omega, B=B, T=T,
                                H=H, NB=NB), ["theta"])
    angle_close(theta, ref.path_integration_forward(delta, omega))
    assert np.all(np.abs(theta) <= np.float32(np.pi))
    rdd, rdom = ref.path_integration_backward(dtheta, delta, omega)
    domega0 = randn(rng, H, NB)
    floats = emu.lib.path_integration_backward_cuda_scratch_floats
    scratch = empty(2 * B * H * NB + 2)  # one spare double: the op must use only its part
    ddelta, domega, tail = run(
        emu, "path_integration_backward_cuda", "MfPathIntegrationParams",
        lambda: dict(ddelta=empty(B, T, H, NB), domega=domega0.copy(), dtheta=dtheta,
                     delta=delta, omega=omega, B=B, T=T, H=H, NB=NB, scratch=scratch,
                     scratch_floats=2 * B * H * NB), ["ddelta", "domega", "scratch"])
    assert_close(ddelta, rdd, "default", "ddelta")
    assert_close(domega, domega0 + rdom, "default", "domega")
    assert np.all(np.isnan(tail[-2:]))
    assert floats is not None
    too_little = dict(ddelta=empty(B, T, H, NB), domega=domega0.copy(), dtheta=dtheta,
                      delta=delta, omega=omega, B=B, T=T, H=H, NB=NB, scratch=scratch,
                      scratch_floats=2 * B * H * NB - 1)
    assert emu.call("path_integration_backward_cuda", "MfPathIntegrationParams",
                    **too_little) == 1


@pytest.mark.parametrize("B,T,H,D", ROPE_SIZES)
@pytest.mark.parametrize("tb", ["one", "B"])
def test_rotary(emu, rng, B, T, H, D, tb):
    TB = 1 if tb == "one" else B
    q, k = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    theta = rng.uniform(-40, 40, (TB, T, H, D // 2)).astype(np.float32)
    dq_out, dk_out = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    sizes = dict(B=B, T=T, H=H, D=D, TB=TB)
    q_out, k_out = run(emu, "rotary_forward_cuda", "MfRotaryParams",
                       lambda: dict(q_out=empty(B, T, H, D), k_out=empty(B, T, H, D), q=q, k=k,
                                    theta=theta, **sizes), ["q_out", "k_out"])
    rq, rk = ref.rotary_forward(q, k, theta)
    assert_close(q_out, rq, "default", "q_out")
    assert_close(k_out, rk, "default", "k_out")
    dq, dk, dtheta = run(emu, "rotary_backward_cuda", "MfRotaryParams",
                         lambda: dict(dq=empty(B, T, H, D), dk=empty(B, T, H, D),
                                      dtheta=empty(TB, T, H, D // 2), dq_out=dq_out,
                                      dk_out=dk_out, q=q, k=k, theta=theta, **sizes),
                         ["dq", "dk", "dtheta"])
    rdq, rdk, rdtheta = ref.rotary_backward(dq_out, dk_out, q, k, theta)
    assert_close(dq, rdq, "default", "dq")
    assert_close(dk, rdk, "default", "dk")
    # as in tests/test_rotary.py: cancelling products summed over q, k (and b): absolute error
    assert_close(dtheta, rdtheta, "reduction", "dtheta")


@pytest.mark.parametrize("N,V,C", [(1, 1, 1), (9, 5, 3), (300, 7, 33), (17, 100, 260)])
def test_embedding(emu, rng, N, V, C):
    tokens = rng.integers(0, V, N).astype(np.int32)
    weight, dout = randn(rng, V, C), randn(rng, N, C)
    (out,) = run(emu, "embedding_forward_cuda", "MfEmbeddingParams",
                 lambda: dict(out=empty(N, C), tokens=tokens, weight=weight, N=N, V=V, C=C),
                 ["out"])
    assert np.array_equal(out, weight[tokens])
    dweight0 = randn(rng, V, C)
    (dweight,) = run(emu, "embedding_backward_cuda", "MfEmbeddingParams",
                     lambda: dict(dweight=dweight0.copy(), dout=dout, tokens=tokens, N=N, V=V,
                                  C=C), ["dweight"], exact=False)
    assert_close(dweight, dweight0 + ref.embedding_backward(dout, tokens, V), "reduction",
                 "dweight")


def test_embedding_bad_token_rows(emu, rng):
    """An id outside [0, V): a zero row forward, nothing added backward (documented)."""
    tokens = np.array([0, 5, -1, 2], np.int32)
    weight, dout = randn(rng, 3, 4), randn(rng, 4, 4)
    out = empty(4, 4)
    assert emu.call("embedding_forward_cuda", "MfEmbeddingParams", out=out, tokens=tokens,
                    weight=weight, N=4, V=3, C=4) == 0
    assert np.array_equal(out, np.stack([weight[0], np.zeros(4), np.zeros(4), weight[2]]))
    dweight = np.zeros((3, 4), np.float32)
    assert emu.call("embedding_backward_cuda", "MfEmbeddingParams", dweight=dweight, dout=dout,
                    tokens=tokens, N=4, V=3, C=4) == 0
    assert np.array_equal(dweight, np.stack([dout[0], np.zeros(4), dout[3]]))


@pytest.mark.parametrize("N,V", [(1, 1), (7, 5), (3, 257), (5, 1000)])
def test_softmax_xent(emu, rng, N, V):
    logits = randn(rng, N, V, scale=4.0)
    targets = rng.integers(0, V, N).astype(np.int32)
    mask = (rng.random(N) < 0.7).astype(np.float32)
    mask[0] = 1.0
    losses, loss = run(emu, "softmax_xent_forward_cuda", "MfSoftmaxXentParams",
                       lambda: dict(losses=empty(N), loss=np.full(1, np.nan), logits=logits,
                                    targets=targets, mask=mask, N=N, V=V), ["losses", "loss"])
    rlosses, rloss = ref.softmax_xent_forward(logits, targets, mask)
    assert_close(losses, rlosses, "reduction", "losses")
    assert_close(loss[0], rloss, "reduction", "loss")
    scale = 1.0 / mask.sum()
    (dlogits,) = run(emu, "softmax_xent_backward_cuda", "MfSoftmaxXentParams",
                     lambda: dict(dlogits=empty(N, V), logits=logits, targets=targets,
                                  mask=mask, N=N, V=V, scale=scale), ["dlogits"])
    assert_close(dlogits, ref.softmax_xent_backward(logits, targets, mask, scale), "default",
                 "dlogits")


def test_softmax_xent_empty_mask(emu, rng):
    logits, targets = randn(rng, 3, 4), np.array([0, 1, 3], np.int32)
    losses, loss = empty(3), np.full(1, np.nan)
    assert emu.call("softmax_xent_forward_cuda", "MfSoftmaxXentParams", losses=losses,
                    loss=loss, logits=logits, targets=targets, mask=np.zeros(3, np.float32),
                    N=3, V=4) == 0
    assert loss[0] == 0.0
    assert_close(losses, ref.softmax_xent_forward(logits, targets, np.ones(3))[0], "reduction",
                 "losses")


@pytest.mark.parametrize("function,struct", [
    ("gelu_forward_cuda", "MfGeluParams"), ("silu_forward_cuda", "MfActivationParams"),
    ("silu_gate_backward_cuda", "MfSiluGateParams"),
    ("layernorm_forward_cuda", "MfLayernormParams"), ("rotary_forward_cuda", "MfRotaryParams"),
    ("path_integration_forward_cuda", "MfPathIntegrationParams"),
    ("embedding_forward_cuda", "MfEmbeddingParams"),
    ("softmax_xent_forward_cuda", "MfSoftmaxXentParams")])
def test_empty_sizes_refused(emu, function, struct):
    """Sizes of zero: MF_EINVAL before any launch (every pointer NULL: nothing is read)."""
    assert emu.call(function, struct) == 1


# T past one query tile (64 rows) and several key tiles (32 rows), partial last tiles; D at
# both ends of [16, 128]
ATTENTION_SIZES = [(1, 1, 1, 16), (2, 37, 3, 16), (1, 70, 2, 18), (1, 9, 1, 128)]


@pytest.mark.parametrize("B,T,H,D", ATTENTION_SIZES)
def test_attention(emu, rng, B, T, H, D):
    q, k, v = (randn(rng, B, T, H, D) for _ in range(3))
    dout = randn(rng, B, T, H, D)
    scale = 1.0 / np.sqrt(D)
    sizes = dict(B=B, T=T, H=H, D=D, scale=scale)
    out, lse = run(emu, "attention_forward_cuda", "MfAttentionParams",
                   lambda: dict(out=empty(B, T, H, D), lse=empty(B, H, T), q=q, k=k, v=v,
                                **sizes), ["out", "lse"])
    rout, rlse = ref.attention_forward(q, k, v, scale)
    # sums over up to T keys of D-long products (conftest: "reduction")
    assert_close(out, rout, "reduction", "out")
    assert_close(lse, rlse, "reduction", "lse")
    floats = B * H * T
    assert emu.lib.attention_backward_cuda_scratch_floats is not None
    dq, dk, dv = run(emu, "attention_backward_cuda", "MfAttentionParams",
                     lambda: dict(dq=empty(B, T, H, D), dk=empty(B, T, H, D),
                                  dv=empty(B, T, H, D), q=q, k=k, v=v, dout=dout, o=out,
                                  lse_in=lse, scratch=empty(floats), scratch_floats=floats,
                                  **sizes), ["dq", "dk", "dv"])
    rdq, rdk, rdv = ref.attention_backward(dout, q, k, v, scale)
    # products summed over both T and D (conftest: "gradient")
    assert_close(dq, rdq, "gradient", "dq")
    assert_close(dk, rdk, "gradient", "dk")
    assert_close(dv, rdv, "gradient", "dv")


def test_attention_refuses_bad_sizes(emu, rng):
    q = randn(rng, 1, 4, 1, 16)
    for D in (14, 15, 130):
        assert emu.call("attention_forward_cuda", "MfAttentionParams", out=q, lse=q, q=q, k=q,
                        v=q, B=1, T=4, H=1, D=D, scale=0.25) == 1
    base = dict(dq=q, dk=q, dv=q, q=q, k=q, v=q, dout=q, o=q, lse_in=q, B=1, T=4, H=1, D=16,
                scale=0.25, scratch=q)
    assert emu.call("attention_backward_cuda", "MfAttentionParams", scratch_floats=3,
                    **base) == 1
    for mask in (2, 3):  # prefix without its array; no such mask
        # (the masks themselves: test_cuda_attention_family.py)
        assert emu.call("attention_forward_cuda", "MfAttentionParams", out=q, lse=q, q=q, k=q,
                        v=q, B=1, T=4, H=1, D=16, scale=0.25, mask=mask) == 1
        assert emu.call("attention_backward_cuda", "MfAttentionParams", scratch_floats=64,
                        mask=mask, **base) == 1


# partial 32 x 32 tiles on every side, K shorter and longer than a tile
@pytest.mark.parametrize("N,Cin,Cout", [(1, 1, 1), (7, 33, 5), (37, 40, 65), (3, 100, 32)])
@pytest.mark.parametrize("has_bias", [True, False])
def test_linear(emu, rng, N, Cin, Cout, has_bias):
    x, w, dy = randn(rng, N, Cin), randn(rng, Cout, Cin), randn(rng, N, Cout)
    b = randn(rng, Cout) if has_bias else None
    (y,) = run(emu, "linear_forward_cuda", "MfLinearParams",
               lambda: dict(y=empty(N, Cout), x=x, weight=w, bias=b, N=N, Cin=Cin, Cout=Cout),
               ["y"])
    # dot products of length Cin (conftest: "reduction")
    assert_close(y, ref.linear_forward(x, w, b), "reduction", "y")
    rdx, rdw, rdb = ref.linear_backward(dy, x, w, has_bias)
    dx0, dw0, db0 = randn(rng, N, Cin), randn(rng, Cout, Cin), randn(rng, Cout)
    for accumulate in (0, 1):
        fields = lambda: dict(dx=dx0.copy(), dweight=dw0.copy(),  # noqa: E731
                              dbias=db0.copy() if has_bias else None, dy=dy, x=x, weight=w,
                              N=N, Cin=Cin, Cout=Cout, accumulate_dx=accumulate)
        outputs = ["dx", "dweight"] + (["dbias"] if has_bias else [])
        got = run(emu, "linear_backward_cuda", "MfLinearParams", fields, outputs)
        assert_close(got[0], rdx + (dx0 if accumulate else 0), "reduction", "dx")
        # sums over the N rows (conftest: "gradient")
        assert_close(got[1], dw0 + rdw, "gradient", "dweight")
        if has_bias:
            assert_close(got[2], db0 + rdb, "gradient", "dbias")


@pytest.mark.parametrize("N,C,F", [(1, 1, 1), (5, 33, 70), (37, 16, 64)])
@pytest.mark.parametrize("exact", [0, 1])
def test_mlp(emu, rng, N, C, F, exact):
    approximate = "none" if exact else "tanh"
    x, dy = randn(rng, N, C), randn(rng, N, C)
    w_fc, b_fc, w_proj, b_proj = randn(rng, F, C), randn(rng, F), randn(rng, C, F), randn(rng, C)
    weights = dict(w_fc=w_fc, b_fc=b_fc, w_proj=w_proj, b_proj=b_proj, N=N, C=C, F=F,
                   exact=exact)
    assert emu.lib.mlp_forward_cuda_scratch_floats is not None
    y, h = run(emu, "mlp_forward_cuda", "MfMlpParams",
               lambda: dict(y=empty(N, C), h=empty(N, F), x=x, scratch=empty(N * F),
                            scratch_floats=N * F, **weights), ["y", "h"])
    ry, rh = ref.mlp_forward(x, w_fc, b_fc, w_proj, b_proj, approximate=approximate)
    assert_close(h, rh, "reduction", "h")
    # two products in a row: the second sums F terms carrying the first's rounding
    assert_close(y, ry, "gradient", "y")
    grads0 = dict(dw_fc=randn(rng, F, C), db_fc=randn(rng, F), dw_proj=randn(rng, C, F),
                  db_proj=randn(rng, C))
    got = run(emu, "mlp_backward_cuda", "MfMlpParams",
              lambda: dict(dx=empty(N, C), dy=dy, h_in=h, x=x, scratch=empty(2 * N * F),
                           scratch_floats=2 * N * F,
                           **{k: v.copy() for k, v in grads0.items()}, **weights),
              ["dx", "dw_fc", "db_fc", "dw_proj", "db_proj"])
    want = ref.mlp_backward(dy, x, h, w_fc, w_proj, approximate=approximate)
    assert_close(got[0], want[0], "gradient", "dx")
    for g, w, name in zip(got[1:], want[1:], ("dw_fc", "db_fc", "dw_proj", "db_proj")):
        assert_close(g, grads0[name] + w, "gradient", name)
    short = dict(dx=empty(N, C), dy=dy, h_in=h, x=x, scratch=empty(2 * N * F),
                 scratch_floats=2 * N * F - 1, **grads0, **weights)
    assert emu.call("mlp_backward_cuda", "MfMlpParams", **short) == 1


@pytest.mark.parametrize("n", [1, 257, 3001])
def test_residual(emu, rng, n):
    a, b, dx0, dout = (randn(rng, n) for _ in range(4))
    (out,) = run(emu, "residual_forward_cuda", "MfResidualParams",
                 lambda: dict(out=empty(n), a=a, b=b, n=n), ["out"])
    assert np.array_equal(out, a + b)  # one float32 add: exact
    (dx,) = run(emu, "residual_backward_cuda", "MfResidualParams",
                lambda: dict(dx=dx0.copy(), dout=dout, n=n), ["dx"])
    assert np.array_equal(dx, dx0 + dout)
    assert_close(dx, dx0 + ref.residual_backward(dout)[0], "default", "dx")


@pytest.mark.parametrize("n", [1, 1023, 5000])
def test_grad_norm(emu, rng, n):
    x = randn(rng, n, scale=0.5)
    (norm,) = run(emu, "global_norm_cuda", "MfGradNormParams",
                  lambda: dict(norm=np.full(1, np.nan), x=x, n=n), ["norm"])
    # squares summed in double: a float32 result's accuracy
    assert_close(norm[0], ref.global_norm(x), "default", "norm")
    for max_norm in (1e-3, 1e30, np.inf):
        grads, got = run(emu, "clip_grad_norm_cuda", "MfGradNormParams",
                         lambda: dict(norm=np.full(1, np.nan), grads=x.copy(), n=n,
                                      max_norm=max_norm), ["grads", "norm"])
        want, want_norm = ref.clip_grad_norm(x, max_norm)
        assert_close(got[0], want_norm, "default", "norm")
        assert_close(grads, want, "default", "grads")
    bad = x.copy()
    bad[0] = np.inf
    norm = np.zeros(1)
    assert emu.call("clip_grad_norm_cuda", "MfGradNormParams", norm=norm, grads=bad, n=n,
                    max_norm=1.0) == 0
    assert norm[0] == np.inf and np.array_equal(bad[1:], x[1:])  # not scaled
    assert emu.call("clip_grad_norm_cuda", "MfGradNormParams", norm=norm, grads=bad, n=n,
                    max_norm=0.0) == 1


@pytest.mark.parametrize("B,T,H,D", [(1, 1, 1, 2), (2, 7, 3, 16), (1, 13, 2, 130)])
def test_tape_rotate(emu, rng, B, T, H, D):
    q, k, e, dq_out, dk_out = (randn(rng, B, T, H, D) for _ in range(5))
    sizes = dict(B=B, T=T, H=H, D=D)
    q_out, k_out = run(emu, "tape_rotate_forward_cuda", "MfTapeRotateParams",
                       lambda: dict(q_out=empty(B, T, H, D), k_out=empty(B, T, H, D), q=q, k=k,
                                    e=e, **sizes), ["q_out", "k_out"])
    rq, rk = ref.tape_rotate_forward(q, k, e)
    assert_close(q_out, rq, "default", "q_out")
    assert_close(k_out, rk, "default", "k_out")
    got = run(emu, "tape_rotate_backward_cuda", "MfTapeRotateParams",
              lambda: dict(dq=empty(B, T, H, D), dk=empty(B, T, H, D), de=empty(B, T, H, D),
                           dq_out=dq_out, dk_out=dk_out, q=q, k=k, e=e, **sizes),
              ["dq", "dk", "de"])
    want = ref.tape_rotate_backward(dq_out, dk_out, q, k, e)
    assert_close(got[0], want[0], "default", "dq")
    assert_close(got[1], want[1], "default", "dk")
    # de sums q's and k's cancelling products: an absolute error (as dtheta's)
    assert_close(got[2], want[2], "reduction", "de")


@pytest.mark.parametrize("B,T,H,D", [(1, 1, 1, 1), (2, 9, 3, 5), (1, 40, 2, 16)])
def test_ape_decay(emu, rng, B, T, H, D):
    q, k = randn(rng, B, T, H, D), randn(rng, B, T, H, D)
    gamma = 0.9
    sizes = dict(B=B, T=T, H=H, D=D, gamma=gamma)
    for direction, fields, outs in (
            ("forward", lambda: dict(q_out=empty(B, T, H, D), k_out=empty(B, T, H, D), q=q,
                                     k=k, **sizes), ["q_out", "k_out"]),
            ("backward", lambda: dict(dq=empty(B, T, H, D), dk=empty(B, T, H, D), dq_out=q,
                                      dk_out=k, **sizes), ["dq", "dk"])):
        got = run(emu, f"ape_decay_{direction}_cuda", "MfApeDecayParams", fields, outs)
        want = getattr(ref, f"ape_decay_{direction}")(q, k, gamma)
        assert_close(got[0], want[0], "default", outs[0])
        assert_close(got[1], want[1], "default", outs[1])
    too_steep = dict(q_out=empty(1, 200, 1, 1), k_out=empty(1, 200, 1, 1), q=empty(1, 200, 1, 1),
                     k=empty(1, 200, 1, 1), B=1, T=200, H=1, D=1, gamma=0.5)
    assert emu.call("ape_decay_forward_cuda", "MfApeDecayParams", **too_steep) == 1


@pytest.mark.parametrize("B,T,E,W", [(1, 1, 1, 1), (2, 9, 5, 4), (1, 3, 33, 4), (2, 40, 7, 3)])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv1d(emu, rng, B, T, E, W, activation):
    x, dy = randn(rng, B, T, E), randn(rng, B, T, E)
    w, b = randn(rng, E, W), randn(rng, E)
    sizes = dict(B=B, T=T, E=E, W=W, silu=int(activation == "silu"))
    (y,) = run(emu, "causal_conv1d_forward_cuda", "MfConv1dParams",
               lambda: dict(y=empty(B, T, E), x=x, weight=w, bias=b, **sizes), ["y"])
    assert_close(y, ref.causal_conv1d_forward(x, w, b, activation=activation), "reduction", "y")
    dw0, db0 = randn(rng, E, W), randn(rng, E)
    bias = dict(bias=b) if activation == "silu" else {}
    dx, dw, db = run(emu, "causal_conv1d_backward_cuda", "MfConv1dParams",
                     lambda: dict(dx=empty(B, T, E), dweight=dw0.copy(), dbias=db0.copy(),
                                  dy=dy, x=x, weight=w, **bias, **sizes),
                     ["dx", "dweight", "dbias"])
    rdx, rdw, rdb = ref.causal_conv1d_backward(dy, x, w, activation=activation, **bias)
    assert_close(dx, rdx, "reduction", "dx")
    assert_close(dw, dw0 + rdw, "gradient", "dweight")
    assert_close(db, db0 + rdb, "gradient", "dbias")
