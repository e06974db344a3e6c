"""The attention mixer's ``attn_mask`` option (issue 12): causal, none and prefix (a prefix LM,
the prefix given per sequence by the task or fixed by ``attn_prefix``) in whole models, on the
C and NumPy backends; the transduction tasks' prefix (source and separator) and that no target
token is visible before it is predicted."""
import numpy as np
import pytest

from mapformer.models import ModelConfig, Transformer
from mapformer.tasks import transduction
from mapformer.train import TrainConfig, batch_prefix, evaluate, train

TASK = transduction.preset("iid", operation="reverse", mean_length=9)


def model(mask, positional="rope", backend="c", layers=2, preset="rope", **options):
    if preset != "rope":
        options.update(d_model=32, n_heads=2, n_layers=layers)
        config = ModelConfig.preset(preset, TASK.vocab_size, attn_mask=mask, **options)
    else:
        config = ModelConfig.preset("rope", TASK.vocab_size, d_model=32, n_heads=2,
                                    n_layers=layers, positional=positional, attn_mask=mask,
                                    **options)
    return Transformer(config, seed=3, backend=backend)


@pytest.mark.parametrize("positional", ["rope", "ape_seq", "none", "mapem_os", "mapem_s"])
@pytest.mark.parametrize("mask", ["none", "prefix"])
def test_c_and_numpy_backends_agree(mask, positional):
    """Loss and every gradient of a 2-layer model under the mask, C (float32) against the
    float64 reference ops: the attention mixer with three schemes, the conjunctive one
    (MapEM-os, MapEM-s)."""
    batch = transduction.generate(TASK, 4, 0)
    prefix = transduction.attention_prefix(batch)
    preset = positional if positional.startswith("mapem") else "rope"
    got = []
    for backend in ("c", "numpy"):
        m = model(mask, positional, backend, preset=preset)
        loss = m.loss(batch.tokens, batch.targets, batch.mask, None, prefix)
        m.backward()
        got.append((loss, np.array(m.params.grad, dtype=np.float64)))
    (l32, g32), (l64, g64) = got
    assert abs(l32 - l64) < 1e-5 * abs(l64)
    np.testing.assert_allclose(g32, g64, rtol=2e-3, atol=2e-4 * np.abs(g64).max())


def test_masks_change_the_model_and_prefix_defaults():
    """none differs from causal; the task's prefix (B,) equals attn_prefix when the same for
    every row; a prefix of 0 is causal; the prefix changes the target logits from the second
    layer on only (the first layer's keys do not depend on the mask)."""
    batch = transduction.generate(TASK, 5, 1)
    B, T = batch.tokens.shape

    def logits(mask, prefix=None, layers=2, **options):
        return model(mask, layers=layers, **options).forward(batch.tokens, None, prefix)

    causal = logits("causal")
    assert not np.allclose(logits("none"), causal)
    np.testing.assert_array_equal(logits("prefix", np.zeros(B, int)), causal)
    np.testing.assert_array_equal(logits("prefix", np.full(B, 6)),
                                  logits("prefix", None, attn_prefix=6))
    np.testing.assert_array_equal(logits("prefix", np.full(B, T)), logits("none"))
    prefix = transduction.attention_prefix(batch)
    one = logits("prefix", prefix, layers=1)
    np.testing.assert_array_equal(one[batch.mask], logits("causal", layers=1)[batch.mask])
    assert not np.allclose(logits("prefix", prefix)[batch.mask], causal[batch.mask])


def test_prefix_lm_sees_no_target_token_early():
    """Under the prefix mask with the task's prefix (source + separator), the logits of the
    target columns up to c do not change when the target tokens after c change: no target is
    visible before it is predicted; a source token changed changes every target column."""
    batch = transduction.generate(TASK, 3, 2)
    prefix = transduction.attention_prefix(batch)
    assert np.array_equal(prefix, batch.lengths + 1)
    m = model("prefix")
    before = m.forward(batch.tokens, None, prefix).copy()
    n = int(batch.lengths[0])
    c = n + 3  # a target column of row 0
    tokens = batch.tokens.copy()
    tokens[0, c + 1:] = (tokens[0, c + 1:] + 1) % TASK.n_symbols
    after = m.forward(tokens, None, prefix)
    np.testing.assert_array_equal(after[0, :c + 1], before[0, :c + 1])
    tokens = batch.tokens.copy()
    tokens[0, n - 1] = (tokens[0, n - 1] + 1) % TASK.n_symbols  # the last source token
    after = m.forward(tokens, None, prefix)
    assert not np.allclose(after[0, 0], before[0, 0])  # the first column sees it now


def test_schemes_running_their_own_attention_refuse_other_masks():
    with pytest.raises(ValueError, match="attn_mask 'none' is not supported by positional "
                                         "scheme 'cope'"):
        model("none", "cope", cope_positions=8)
    model("causal", "ape_seq", ape_decay=0.98)
    with pytest.raises(ValueError, match="attn_mask must be one of"):
        model("bidirectional")
    with pytest.raises(ValueError, match="attn_prefix must be"):
        model("prefix", attn_prefix=-1)
    with pytest.raises(ValueError, match=r"prefix must have shape \(2,\)"):
        model("prefix").forward(np.zeros((2, 5), np.int32), None, np.zeros(3, int))


def test_training_and_evaluation_pass_the_task_prefix():
    """train() and evaluate() hand the transduction batches' prefix to the model: a prefix-LM
    run trains, and its evaluation equals one done by hand with the prefix."""
    config = TrainConfig(task="reverse", mean_length=6, sequences=64, batch_size=16,
                         eval_sequences=16, eval_batch_size=16, log_every=1)
    m = ModelConfig.for_task("rope", config.task_config(), d_model=32, n_heads=2, n_layers=2,
                             attn_mask="prefix")
    result = train(m, config, progress=False, log=lambda *a: None)
    assert np.isfinite(result["loss"])
    task = config.task_config()
    sets = {"iid": task}
    got = evaluate(result["model"], sets, sequences=16, batch_size=16)["iid"]["loss"]
    batch = transduction.eval_set(task, 16, batch_size=16)[0]
    assert batch_prefix(transduction, batch) is not None
    want = result["model"].loss(batch.tokens, batch.targets, batch.mask, None,
                                transduction.attention_prefix(batch))
    assert got == pytest.approx(want, rel=1e-6)
    causal = result["model"].loss(batch.tokens, batch.targets, batch.mask)
    assert causal != pytest.approx(want, rel=1e-6)
