"""Reliability of the binding (issue 13): what a hostile caller gives is refused with an
exception naming the argument, never read wrongly: non-native byte order, a mode string with an
embedded NUL, numbers beyond int64 or any float (ValueError, not OverflowError); and the output
pool holds only blocks whose size is reused."""
import numpy as np
import pytest

from conftest import randn, raises_naming
from mapformer import _C


@pytest.mark.parametrize("call, name", [
    (lambda x: _C.gelu_forward(x), "x"),
    (lambda x: _C.layernorm_forward(x.reshape(1, 3), np.ones(3, np.float32),
                                    np.zeros(3, np.float32)), "x"),
    (lambda x: _C.layernorm_forward(np.ones((1, 3), np.float32), x, np.zeros(3, np.float32)),
     "weight"),
])
def test_non_native_byte_order_is_refused(call, name):
    x = np.array([1.0, 2.0, 3.0], ">f4")  # big-endian: read as native it would be ~1e-41
    with raises_naming(ValueError, name) as info:
        call(x)
    assert "byte order" in str(info.value)


def test_non_native_int_ids_are_refused():
    tokens = np.array([0, 1, 2], ">i4")
    with raises_naming(ValueError, "tokens"):
        _C.embedding_forward(tokens, np.ones((4, 2), np.float32))


def _conj(rng):
    x = randn(rng, 1, 3, 1, 16)
    return [x, x.copy(), x.copy(), x.copy(), x.copy()]


@pytest.mark.parametrize("mode", ["score_product\0junk", "score_product\0", "sum\0"])
def test_mode_with_an_embedded_nul_is_refused(rng, mode):
    with raises_naming(ValueError, "mode"):
        _C.conj_attention_forward(*_conj(rng), mode=mode)
    out, _ = _C.conj_attention_forward(*_conj(rng), mode=mode.split("\0")[0])
    assert np.isfinite(out).all()


@pytest.mark.parametrize("value", [2**2000, -(2**2000)])
def test_float_argument_beyond_any_float_is_a_value_error(rng, value):
    with raises_naming(ValueError, "scale"):
        _C.conj_attention_forward(*_conj(rng), scale=value)


@pytest.mark.parametrize("step", [2**63, 2**2000, -(2**70)])
def test_int_argument_beyond_int64_is_a_value_error(step):
    p = np.ones(4, np.float32)
    with raises_naming(ValueError, "step"):
        _C.adamw_step(p, p.copy(), p.copy(), p.copy(), np.ones(4, bool), lr=1e-3, step=step)


def test_pool_keeps_only_reused_sizes():
    """150 large outputs of distinct sizes leave nothing in the pool (it kept 633 MB of them
    before); a size asked for again is kept, within the cap."""
    held = _C.info()["pool"]["held_bytes"]
    for k in range(150):
        out = _C.gelu_forward(np.ones((1 << 18) + 4096 + 16 * k, np.float32))  # > 1 MB each
        del out
    assert _C.info()["pool"]["held_bytes"] <= held
    for _ in range(3):
        out = _C.gelu_forward(np.ones((1 << 18) + 99 * 16, np.float32))
        del out
    pool = _C.info()["pool"]
    assert pool["held_bytes"] >= ((1 << 18) + 99 * 16) * 4
    assert pool["held_bytes"] <= pool["limit_bytes"]


@pytest.mark.parametrize("bad", [-1e-3, np.nan, np.inf])
def test_adamw_refuses_a_second_moment_that_is_not_finite_and_non_negative(bad):
    """Found by tests/fuzz_ops.py: a negative v made its parameter NaN, silently."""
    p = np.ones(5, np.float32)
    v = np.full(5, 0.5, np.float32)
    v[3] = bad
    params = p.copy()
    with pytest.raises(ValueError, match=r"^v\[3\] = .* must be finite and >= 0"):
        _C.adamw_step(params, p.copy(), p.copy(), v, np.ones(5, bool), lr=1e-3, step=1)
    assert (params == 1).all()  # nothing written
