"""Incremental decoding (Transformer.decode, the mixers' decode, DecodeCache): decoding a
sequence block by block gives forward's logits on the whole sequence, for the attention mixer
with rope and without positions and for the LSTM, on both backends: float64 (the NumPy
reference ops) to rounding, float32 (the C ops: the attention_decode op on the cached keys
against the tiled attention) within 1e-5 (1 + max |logit|), about 100 float32 ulps of logits
of size 1 after two layers. Schemes and mixers without a decoding path refuse it."""
import numpy as np
import pytest

from mapformer.models import ModelConfig, Transformer

BLOCKS = (5, 1, 2, 7, 1, 7)  # 23 tokens: a context, single tokens, pairs, longer blocks
TOL = {"numpy": 1e-12, "c": 1e-5}


def model(mixer="attention", positional="rope", backend="c", seed=1, bottleneck="none",
          **options):
    m = Transformer(ModelConfig(vocab_size=9, d_model=32, n_heads=2, n_layers=2, mlp_ratio=2,
                                mixer=mixer, positional=positional, bottleneck=bottleneck,
                                options=options),
                    seed=seed, backend=backend)
    m.params.data *= 4  # logits of size ~1 that depend on the context
    m.train(False)
    return m


def decoded(m, tokens, blocks=BLOCKS, cache=None):
    """The logits of tokens decoded in ``blocks`` after ``cache``, and the final cache."""
    out, start = [], 0
    for n in blocks:
        logits, cache = m.decode(tokens[:, start:start + n], cache)
        out.append(m.ops.to_numpy(logits))
        start += n
    return np.concatenate(out, 1), cache


def assert_rows_match(got, full, backend):
    bound = TOL[backend] * (1 + np.abs(full).max())
    assert got.shape == full.shape and np.abs(got - full).max() <= bound, \
        (np.abs(got - full).max(), bound)


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("mixer,positional,options", [
    ("attention", "rope", {}), ("attention", "none", {}), ("lstm", "none", {}),
    ("attention", "rope", {"attn_scale": 1.5, "attn_log_scale": 6}),
    ("attention", "rope", {"rope_trainable": True, "attn_log_scale": 6,
                           "attn_log_clamp": False})])
def test_decoding_in_blocks_is_the_forward(backend, mixer, positional, options):
    m = model(mixer, positional, backend, **options)
    tokens = np.random.default_rng(0).integers(0, 9, (3, 23))
    full = m.ops.to_numpy(m.forward(tokens))
    got, cache = decoded(m, tokens)
    assert cache.length == 23 and len(cache.layers) == 2
    assert_rows_match(got, full, backend)
    assert np.abs(full - full.mean(-1, keepdims=True)).max() > 0.1  # not a trivial model


@pytest.mark.parametrize("mixer,positional", [("attention", "rope"), ("lstm", "none")])
def test_a_selected_cache_continues_its_rows(mixer, positional):
    """select(rows, length): rows (repeated, reordered) and a prefix of positions of a
    cache continue as forward on those rows' prefix followed by the new tokens."""
    m = model(mixer, positional)
    rng = np.random.default_rng(2)
    tokens, more = rng.integers(0, 9, (3, 17)), rng.integers(0, 9, (4, 5))
    _, cache = m.decode(tokens)
    rows, length = np.array([2, 0, 2, 1]), 11
    logits, grown = m.decode(more, cache.select(rows, length))
    full = m.ops.to_numpy(m.forward(np.concatenate([tokens[rows, :length], more], 1)))
    assert grown.length == length + 5
    assert_rows_match(m.ops.to_numpy(logits), full[:, length:], "c")
    with pytest.raises(ValueError, match="length"):
        cache.select(rows, 18)
    with pytest.raises(ValueError, match="sequences"):
        m.decode(more, cache)  # 4 sequences on a cache of 3


@pytest.mark.parametrize("mixer,positional,what,options", [
    ("attention", "mapwm", "mapwm", {}), ("conjunctive", "mapem", "conjunctive", {}),
    ("attention", "cope", "cope", {"cope_positions": 8}),
    ("attention", "sinusoidal", "sinusoidal", {}),
    ("attention", "rope", "vq", {"bottleneck": "vq", "vq_codes": 4}),
    ("attention", "rope", "attn_mask", {"attn_mask": "prefix", "attn_prefix": 2})])
def test_schemes_without_a_decoding_path_refuse(mixer, positional, what, options):
    """MapWM's angles integrate the actions of the whole history, the conjunctive mixer and
    CoPE have no decoding path, an additive code none at an offset, a VQ bottleneck none
    (its forward has side effects): NotImplementedError naming it (the first block of a
    sequence may still run where it can)."""
    m = model(mixer, positional, **options)
    tokens = np.random.default_rng(3).integers(0, 9, (2, 6))
    with pytest.raises(NotImplementedError, match=what):
        _, cache = m.decode(tokens[:, :3])
        m.decode(tokens[:, 3:], cache)


@pytest.mark.parametrize("mixer,positional", [("attention", "rope"), ("lstm", "none")])
def test_a_cache_stays_valid_whatever_is_decoded_from_it(mixer, positional):
    """Decoding writes new positions into the cache's arrays in place; a second decode from
    the same cache (a branch) copies them first: both branches, and their continuations,
    are forward's rows of their own sequences."""
    m = model(mixer, positional)
    rng = np.random.default_rng(4)
    prefix, one, two, more = (rng.integers(0, 9, (2, n)) for n in (6, 3, 4, 2))
    _, cache = m.decode(prefix)
    cache = cache.select(np.arange(2), room=20)  # room to write in place
    first, after_one = m.decode(one, cache)
    second, after_two = m.decode(two, cache)
    third, _ = m.decode(more, after_one)
    fourth, _ = m.decode(more, after_two)
    for got, seq, n in ((first, [prefix, one], 3), (second, [prefix, two], 4),
                        (third, [prefix, one, more], 2), (fourth, [prefix, two, more], 2)):
        full = m.ops.to_numpy(m.forward(np.concatenate(seq, 1)))
        assert_rows_match(m.ops.to_numpy(got), full[:, -n:], "c")
