"""tree_sq (Shiv and Quirk's tree positional encoding): the path stacks, the code against its
formula, the gradient of its parameters against finite differences, the C backend against
NumPy, and its errors."""
import numpy as np
import pytest

from mapformer.models import ModelConfig, Transformer
from mapformer.schemes.tree_sq import path_onehot


def model(backend="numpy", depth=4, d_model=32, scale=0.5):
    config = ModelConfig(vocab_size=11, d_model=d_model, n_heads=2, n_layers=2,
                         positional="tree_sq",
                         options={"tree_sq_depth": depth, "tree_sq_scale": scale})
    return Transformer(config, seed=0, backend=backend)


def inputs(seed=0, B=3, T=9, top=64):
    rng = np.random.default_rng(seed)
    tokens, targets = rng.integers(0, 11, (B, T)), rng.integers(0, 11, (B, T))
    heaps = rng.integers(0, top, (B, T, 1)).astype(np.int32)
    heaps[0, :4, 0] = [0, 1, 5, 12]
    return tokens, targets, np.ones((B, T), bool), heaps


def test_path_stacks_read_the_heap_numbers_most_recent_step_first():
    # 5 = 0b101: left then right; 12 = 0b1100: right, left, left; 0 and the root: no step
    stacks = path_onehot([0, 1, 2, 3, 5, 12, 12], 3)
    assert stacks.tolist() == [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0],
                               [0, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0], [1, 0, 1, 0, 0, 1],
                               [1, 0, 1, 0, 0, 1]]
    assert path_onehot([12], 2).tolist() == [[1, 0, 1, 0]]  # the oldest step dropped


def test_code_is_the_papers_formula():
    """Entry 2 s + b of copy j: s-th most recent step, branch b, weight w_j^s sqrt((1 - w_j^2)
    C / 2) times the scale; components past L m are 0."""
    m = model(d_model=36)  # L = 8 entries of m = 4 components: 4 left over
    tokens, _, _, heaps = inputs()
    scheme = m.blocks[0].mixer.scheme
    scheme.coordinates = heaps
    code = np.asarray(scheme.code(3, 9))
    w = np.tanh(np.asarray(scheme.p.value, np.float64))
    h = 12  # heaps[0, 3]: steps s = 0, 1, 2 on branches 0, 0, 1
    want = np.zeros(36)
    for s, b in ((0, 0), (1, 0), (2, 1)):
        entry = 2 * s + b
        want[entry * 4:(entry + 1) * 4] = 0.5 * w ** s * np.sqrt((1 - w ** 2) * 36 / 2)
    assert heaps[0, 3, 0] == h
    np.testing.assert_allclose(code[0, 3], want, rtol=1e-12)
    assert not code[0, :2].any() and not code[..., 32:].any()


def test_parameter_gradient_against_finite_differences():
    m = model()
    tokens, targets, mask, heaps = inputs()
    p = m.params.params["blocks.0.mixer.scheme.p"]
    m.loss(tokens, targets, mask, heaps)
    m.backward()
    analytic = np.array(p.grad)
    numeric = np.zeros_like(analytic)
    for j in range(p.value.size):
        old = p.value[j]
        p.value[j] = old + 1e-6
        up = m.loss(tokens, targets, mask, heaps)
        p.value[j] = old - 1e-6
        down = m.loss(tokens, targets, mask, heaps)
        p.value[j] = old
        numeric[j] = (up - down) / 2e-6
    assert np.abs(numeric).max() > 1e-3
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-9)
    assert [n for n in m.params.params if n.endswith("scheme.p")] == ["blocks.0.mixer.scheme.p"]


def test_c_backend_matches_numpy():
    tokens, targets, mask, heaps = inputs(1)
    losses, grads = [], []
    for backend in ("numpy", "c"):
        m = model(backend)
        losses.append(m.loss(tokens, targets, mask, heaps))
        m.backward()
        grads.append({n: np.array(p.grad, np.float64) for n, p in m.params.params.items()})
    assert abs(losses[0] - losses[1]) < 1e-5 * abs(losses[0])
    for name, g in grads[0].items():
        np.testing.assert_allclose(grads[1][name], g, rtol=0, atol=1e-4 * np.abs(g).max() + 1e-9,
                                   err_msg=name)


def test_errors_name_what_is_missing():
    tokens, targets, mask, _ = inputs()
    with pytest.raises(ValueError, match="tree_sq' needs the tokens' heap numbers"):
        model().loss(tokens, targets, mask)
    with pytest.raises(ValueError, match="d_model must be at least 2 tree_sq_depth"):
        model(depth=20, d_model=32)
