"""mapformer.cuda's ops (the Python side of the CUDA backend): the same calls as the C
backend's, checked on the CPU by running them with NumPy arrays on the emulation build of the
kernels (tests/cuda_emulation.py) against mapformer._C; on a GPU (CuPy and a CUDA build) the
same calls on CuPy arrays — the only tests this suite skips, when there is no GPU. And the
message that says how to get a CUDA build."""
import numpy as np
import pytest

from conftest import assert_close, randn
from cuda_emulation import kernels
from mapformer import _C, backend, cuda


@pytest.fixture(scope="module")
def emulated():
    return kernels().ops()


def gpu():
    """(ops, cupy) on the GPU, or skip: no CUDA build, CuPy or device here."""
    try:
        lib, cupy = cuda.load()
    except RuntimeError as error:
        pytest.skip(f"no GPU: {error}")
    return cuda.ops(lib, cupy, lambda: cupy.cuda.get_current_stream().ptr), cupy


def compare_with_c(ops, rng, to_device, to_host):
    """Every op of ``ops`` against mapformer._C on the same small inputs."""
    B, T, H, D, V, C = 2, 9, 3, 16, 11, 24
    x, dy = randn(rng, 5, 7, scale=3.0), randn(rng, 5, 7)
    dev = to_device
    for approximate in ("tanh", "none"):
        assert_close(to_host(ops.gelu_forward(dev(x), approximate=approximate)),
                     _C.gelu_forward(x, approximate=approximate), "default", "gelu")
        assert_close(to_host(ops.gelu_backward(dev(dy), dev(x), approximate=approximate)),
                     _C.gelu_backward(dy, x, approximate=approximate), "default", "dgelu")
    for name in ("silu", "softplus"):
        assert_close(to_host(getattr(ops, f"{name}_forward")(dev(x))),
                     getattr(_C, f"{name}_forward")(x), "default", name)
        assert_close(to_host(getattr(ops, f"{name}_backward")(dev(dy), dev(x))),
                     getattr(_C, f"{name}_backward")(dy, x), "default", f"d{name}")
    assert_close(to_host(ops.silu_gate_forward(dev(dy), dev(x))), _C.silu_gate_forward(dy, x),
                 "default", "silu_gate")
    for a, e in zip(ops.silu_gate_backward(dev(x), dev(dy), dev(x)),
                    _C.silu_gate_backward(x, dy, x)):
        assert_close(to_host(a), e, "default", "silu_gate backward")
    xs, w, b, g = randn(rng, 6, C), randn(rng, C), randn(rng, C), randn(rng, 6, C)
    got, want = ops.layernorm_forward(dev(xs), dev(w), dev(b)), _C.layernorm_forward(xs, w, b)
    for a, e in zip(got, want):
        assert_close(to_host(a), e, "reduction", "layernorm")
    dw, db, dw_c, db_c = dev(np.ones(C, np.float32)), dev(np.ones(C, np.float32)), \
        np.ones(C, np.float32), np.ones(C, np.float32)
    dx = ops.layernorm_backward(dev(g), dev(xs), got[1], got[2], dev(w), dw, db)
    dx_c = _C.layernorm_backward(g, xs, want[1], want[2], w, dw_c, db_c)
    for a, e in ((dx, dx_c), (dw, dw_c), (db, db_c)):
        assert_close(to_host(a), e, "gradient", "layernorm backward")
    q, k, dq_out, dk_out = (randn(rng, B, T, H, D) for _ in range(4))
    delta, omega = randn(rng, B, T, H, D // 2), randn(rng, H, D // 2)
    theta = ops.path_integration_forward(dev(delta), dev(omega))
    theta_c = _C.path_integration_forward(delta, omega)
    assert_close(to_host(theta), theta_c, "default", "theta")
    domega, domega_c = dev(np.zeros((H, D // 2), np.float32)), np.zeros((H, D // 2), np.float32)
    ddelta = ops.path_integration_backward(dev(dq_out[..., ::2].copy()), dev(delta),
                                           dev(omega), domega)
    ddelta_c = _C.path_integration_backward(dq_out[..., ::2].copy(), delta, omega, domega_c)
    assert_close(to_host(ddelta), ddelta_c, "default", "ddelta")
    assert_close(to_host(domega), domega_c, "default", "domega")
    for a, e in zip(ops.rotary_forward(dev(q), dev(k), theta),
                    _C.rotary_forward(q, k, theta_c)):
        assert_close(to_host(a), e, "default", "rotary")
    for a, e in zip(ops.rotary_backward(dev(dq_out), dev(dk_out), dev(q), dev(k), theta),
                    _C.rotary_backward(dq_out, dk_out, q, k, theta_c)):
        assert_close(to_host(a), e, "reduction", "rotary backward")
    tokens, weight, dout = rng.integers(0, V, 7).astype(np.int32), randn(rng, V, C), \
        randn(rng, 7, C)
    assert np.array_equal(to_host(ops.embedding_forward(dev(tokens), dev(weight))),
                          _C.embedding_forward(tokens, weight))
    dwe, dwe_c = dev(np.zeros((V, C), np.float32)), np.zeros((V, C), np.float32)
    ops.embedding_backward(dwe, dev(dout), dev(tokens))
    _C.embedding_backward(dwe_c, dout, tokens)
    assert_close(to_host(dwe), dwe_c, "reduction", "dweight")
    logits, mask = randn(rng, 7, V, scale=3.0), (rng.random(7) < 0.6).astype(np.float32)
    losses, loss = ops.softmax_xent_forward(dev(logits), dev(tokens), dev(mask))
    losses_c, loss_c = _C.softmax_xent_forward(logits, tokens, mask)
    assert_close(to_host(losses), losses_c, "reduction", "losses")
    assert_close(loss, loss_c, "reduction", "loss")
    assert_close(to_host(ops.softmax_xent_backward(dev(logits), dev(tokens), dev(mask), 0.5)),
                 _C.softmax_xent_backward(logits, tokens, mask, 0.5), "default", "dlogits")
    p, grads, m, v = randn(rng, 50), randn(rng, 50), np.zeros(50, np.float32), \
        np.zeros(50, np.float32)
    decay = rng.random(50) < 0.5
    state = [dev(a.copy()) for a in (p, m, v)]
    ops.adamw_step(*state[:1], dev(grads), *state[1:], dev(decay), lr=0.01, step=3,
                   weight_decay=0.1)
    _C.adamw_step(p, grads, m, v, decay, lr=0.01, step=3, weight_decay=0.1)
    for a, e in zip(state, (p, m, v)):
        assert_close(to_host(a), e, "default", "adamw")
    wl, bl, gl = randn(rng, 5, C), randn(rng, 5), randn(rng, 6, 5)
    assert_close(to_host(ops.linear_forward(dev(xs), dev(wl), dev(bl))),
                 _C.linear_forward(xs, wl, bl), "reduction", "linear")
    dwl, dbl, dwl_c, dbl_c = dev(np.zeros((5, C), np.float32)), dev(np.zeros(5, np.float32)), \
        np.zeros((5, C), np.float32), np.zeros(5, np.float32)
    assert_close(to_host(ops.linear_backward(dev(gl), dev(xs), dev(wl), dwl, dbl)),
                 _C.linear_backward(gl, xs, wl, dwl_c, dbl_c), "reduction", "linear dx")
    assert_close(to_host(dwl), dwl_c, "gradient", "linear dweight")
    assert_close(to_host(dbl), dbl_c, "gradient", "linear dbias")
    w_fc, b_fc, w_proj, b_proj = randn(rng, 40, C), randn(rng, 40), randn(rng, C, 40), \
        randn(rng, C)
    (y, h), (y_c, h_c) = (ops.mlp_forward(dev(xs), dev(w_fc), dev(b_fc), dev(w_proj),
                                          dev(b_proj)),
                          _C.mlp_forward(xs, w_fc, b_fc, w_proj, b_proj))
    assert_close(to_host(y), y_c, "gradient", "mlp y")
    assert_close(to_host(h), h_c, "reduction", "mlp h")
    grads = [np.zeros(a.shape, np.float32) for a in (w_fc, b_fc, w_proj, b_proj)]
    grads_dev = [dev(a.copy()) for a in grads]
    dx = ops.mlp_backward(dev(g), dev(xs), h, dev(w_fc), dev(w_proj), *grads_dev)
    dx_c = _C.mlp_backward(g, xs, h_c, w_fc, w_proj, *grads)
    for a, e in zip([dx] + grads_dev, [dx_c] + grads):
        assert_close(to_host(a), e, "gradient", "mlp backward")
    assert np.array_equal(to_host(ops.residual_forward(dev(x), dev(dy))),
                          _C.residual_forward(x, dy))
    acc, acc_c = dev(x.copy()), x.copy()
    ops.residual_backward(acc, dev(dy))
    _C.residual_backward(acc_c, dy)
    assert np.array_equal(to_host(acc), acc_c)
    gn = randn(rng, 300)
    assert_close(ops.global_norm(dev(gn)), _C.global_norm(gn), "default", "norm")
    clipped, clipped_c = dev(gn.copy()), gn.copy()
    assert_close(ops.clip_grad_norm(clipped, 0.5), _C.clip_grad_norm(clipped_c, 0.5), "default",
                 "clip norm")
    assert_close(to_host(clipped), clipped_c, "default", "clipped")
    e = randn(rng, B, T, H, D)
    for a, w in zip(ops.tape_rotate_forward(dev(q), dev(k), dev(e)),
                    _C.tape_rotate_forward(q, k, e)):
        assert_close(to_host(a), w, "default", "tape_rotate")
    for a, w in zip(ops.tape_rotate_backward(dev(dq_out), dev(dk_out), dev(q), dev(k), dev(e)),
                    _C.tape_rotate_backward(dq_out, dk_out, q, k, e)):
        assert_close(to_host(a), w, "reduction", "tape_rotate backward")
    for direction in ("forward", "backward"):
        for a, w in zip(getattr(ops, f"ape_decay_{direction}")(dev(q), dev(k), 0.9),
                        getattr(_C, f"ape_decay_{direction}")(q, k, 0.9)):
            assert_close(to_host(a), w, "default", f"ape_decay_{direction}")
    xc, wc, bc, gc = randn(rng, B, T, C), randn(rng, C, 4), randn(rng, C), randn(rng, B, T, C)
    assert_close(to_host(ops.causal_conv1d_forward(dev(xc), dev(wc), dev(bc))),
                 _C.causal_conv1d_forward(xc, wc, bc), "reduction", "conv1d")
    dwc, dbc = dev(np.zeros((C, 4), np.float32)), dev(np.zeros(C, np.float32))
    dwc_c, dbc_c = np.zeros((C, 4), np.float32), np.zeros(C, np.float32)
    assert_close(to_host(ops.causal_conv1d_backward(dev(gc), dev(xc), dev(wc), dwc, dbc)),
                 _C.causal_conv1d_backward(gc, xc, wc, dwc_c, dbc_c), "reduction", "conv1d dx")
    assert_close(to_host(dwc), dwc_c, "gradient", "conv1d dweight")
    assert_close(to_host(dbc), dbc_c, "gradient", "conv1d dbias")
    assert_close(to_host(ops.causal_conv1d_forward(dev(xc), dev(wc), dev(bc),
                                                  activation="silu")),
                 _C.causal_conv1d_forward(xc, wc, bc, activation="silu"), "reduction",
                 "conv1d silu")
    assert_close(to_host(ops.causal_conv1d_backward(dev(gc), dev(xc), dev(wc), dwc, dbc,
                                                   bias=dev(bc), activation="silu")),
                 _C.causal_conv1d_backward(gc, xc, wc, dwc_c, dbc_c, bias=bc,
                                           activation="silu"), "reduction", "conv1d silu dx")
    assert_close(to_host(dwc), dwc_c, "gradient", "conv1d silu dweight")
    assert_close(to_host(dbc), dbc_c, "gradient", "conv1d silu dbias")
    with pytest.raises(ValueError, match="bias"):
        ops.causal_conv1d_backward(dev(gc), dev(xc), dev(wc), dwc, dbc, activation="silu")
    vv = randn(rng, B, T, H, D)
    out, lse = ops.attention_forward(dev(q), dev(k), dev(vv))
    out_c, lse_c = _C.attention_forward(q, k, vv)
    assert_close(to_host(out), out_c, "reduction", "out")
    assert_close(to_host(lse), lse_c, "reduction", "lse")
    for a, e in zip(ops.attention_backward(dev(dq_out), dev(q), dev(k), dev(vv), out, lse),
                    _C.attention_backward(dq_out, q, k, vv, out_c, lse_c)):
        assert_close(to_host(a), e, "gradient", "attention backward")


def test_emulated_ops_match_the_c_backend(emulated, rng):
    compare_with_c(emulated, rng, lambda a: a, np.asarray)


def test_op_errors_name_the_op(emulated):
    with pytest.raises(ValueError, match="^attention_forward_cuda: status 1"):
        emulated.attention_forward(*(np.zeros((1, 2, 1, 8), np.float32),) * 3)  # D < 16
    with pytest.raises(ValueError, match="approximate"):
        emulated.gelu_forward(np.zeros(3, np.float32), approximate="erf")


def test_ops_refuse_bad_shapes_with_the_c_bindings_messages(emulated):
    """The kernels index every array by sizes taken from others: the wrappers check each
    array's shape from the op's table (mapformer.signatures), as the C binding does, and say
    so in the C binding's own words."""
    y, short = np.zeros(6, np.float32), np.zeros(5, np.float32)
    q, q8 = np.zeros((1, 4, 2, 16), np.float32), np.zeros((1, 4, 2, 8), np.float32)
    calls = [("silu_gate_forward", (y, short)), ("silu_gate_backward", (short, y, y)),
             ("silu_gate_backward", (y, y, short)), ("gelu_backward", (short, y)),
             ("silu_backward", (y, short)), ("softplus_backward", (short, y)),
             ("attention_forward", (q, q, q8)), ("attention_forward", (q, q[0], q)),
             ("layernorm_forward", (np.zeros((3, 4), np.float32), np.zeros(4, np.float32),
                                    np.zeros(5, np.float32))),
             ("gelu_forward", (np.zeros((0, 3), np.float32),))]
    for name, args in calls:
        with pytest.raises(ValueError) as c_error:
            getattr(_C, name)(*args)
        with pytest.raises(ValueError) as cuda_error:
            getattr(emulated, name)(*args)
        assert str(cuda_error.value) == str(c_error.value), name


def test_gpu_ops_match_the_c_backend(rng):
    ops, cupy = gpu()
    compare_with_c(ops, rng, cupy.asarray, cupy.asnumpy)


def test_cuda_backend_says_how_to_get_it():
    """backend.get('cuda'): how to build when unavailable; with a GPU build, the CUDA backend
    (CuPy arrays)."""
    try:
        ops = backend.get("cuda")
    except RuntimeError as error:
        assert any(text in str(error) for text in ("MAPFORMER_CUDA=on", "no usable CUDA device",
                                                   "no CUDA device")), error
    else:
        assert ops.name == "cuda" and ops.xp.__name__ == "cupy"
    assert "MAPFORMER_CUDA=on pip install '.[cuda]'" in cuda.HOW_TO_BUILD


def test_missing_params_h_says_how_to_build(monkeypatch):
    monkeypatch.setattr(cuda, "PARAMS_H", ["/nonexistent/params.h"])
    with pytest.raises(RuntimeError, match="MAPFORMER_CUDA=on"):
        cuda.ops(None, np)
