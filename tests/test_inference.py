"""The inference path: a forward that keeps no activations (Transformer.forward(keep=False),
mapformer.nn.Keeping) gives the training forward's logits and loss bit for bit, for every
mixer and every positional scheme it takes (the guides' plug-ins, registered from outside the
package, included), and leaves no array on its layers, not even an earlier kept forward's;
keep=("delta",) leaves only the path integrator's Delta; backward() after it is refused."""
import itertools

import numpy as np
import pytest
from test_extending import toy_mixer_registered, toy_registered

from mapformer.mixers import MIXERS
from mapformer.models import ModelConfig, Transformer, components, options_of
from mapformer.nn import layer_objects
from mapformer.schemes import SCHEMES
from mapformer.tasks import navigation
from mapformer.train import evaluate

TASK = navigation.NavigationConfig(dims=2, steps=12, grid_size=8)
PAIRS = [(m, s) for m, s in itertools.product(sorted(MIXERS.entries), sorted(SCHEMES.entries))
         if SCHEMES.get(s).kind in MIXERS.get(m).accepts]
NEEDS = {"cope": {"cope_positions": 2 * TASK.steps},  # options a scheme has no default for
         "relative": {"rel_window": 5}}  # fewer than the walk's tokens: offsets clipped


def model_and_inputs(mixer, positional, bottleneck="none", sequences=3, **more):
    batch = navigation.generate(TASK, sequences, 0)
    coordinates = navigation.token_coordinates(batch)
    if positional in ("ape_tree", "tree_sq"):  # heap numbers of nodes of a binary tree
        coordinates = np.broadcast_to(np.arange(1, batch.tokens.shape[1] + 1)[None, :, None],
                                      batch.tokens.shape + (1,))
    options = dict(NEEDS.get(positional, {}), **more)
    if "coord_dims" in options_of(mixer, positional, bottleneck):
        options["coord_dims"] = 1 if positional == "ape_tree" else 2  # the walk's 2D cells
    config = ModelConfig(vocab_size=TASK.vocab_size, d_model=32, n_heads=2, n_layers=2,
                         mixer=mixer, positional=positional, bottleneck=bottleneck, dropout=0.1,
                         options=options)
    model = Transformer(config, seed=3)
    model.train(False)
    return model, (batch.tokens, batch.targets, batch.mask, coordinates)


def held(model):
    """{(layer object, attribute): array} of every array on the model's layers but the
    coordinates the model hands its schemes before the layers run and views of the
    parameters (a Linear's weight as its forward last used it)."""
    return {(id(obj), name): value for layer in model.layers() for obj in layer_objects(layer)
            for name, value in vars(obj).items()
            if isinstance(value, np.ndarray) and name != "coordinates"
            and not np.shares_memory(value, model.params.data)}


@pytest.mark.parametrize("mixer,positional", PAIRS)
def test_no_kept_activations_same_logits_nothing_left(mixer, positional):
    check_no_kept_activations(mixer, positional)


@pytest.mark.parametrize("registered, mixer, positional",
                         [(toy_mixer_registered, "toy_shift", "none"),
                          (toy_registered, "attention", "toy")])
def test_plug_ins_from_outside_the_package_keep_nothing(registered, mixer, positional):
    """The guides' plug-ins (tests/toy_mixer.py, tests/toy_scheme.py), registered from outside
    mapformer, are walked and cleared like the package's own layers."""
    with registered():
        check_no_kept_activations(mixer, positional)


def check_no_kept_activations(mixer, positional):
    """Same logits and loss; a fresh model's forward without kept activations adds no array
    to its layers; after a kept forward on 3 sequences (and its backward), such a forward on
    5 sequences leaves no array of the 3 sequences' (caches of a length may stay)."""
    model, inputs = model_and_inputs(mixer, positional)
    fresh = held(model)
    loss_free = model.loss(*inputs, keep=False)
    free = model.ops.to_numpy(model.logits).copy()
    assert held(model).keys() == fresh.keys()
    loss_kept = model.loss(*inputs)
    assert len(held(model)) > len(fresh) + 5  # a training forward keeps its activations
    np.testing.assert_array_equal(free, model.ops.to_numpy(model.logits))
    assert loss_free == loss_kept
    model.backward()  # the kept forward's backward runs
    _, five = model_and_inputs(mixer, positional, sequences=5)
    model.loss(*five, keep=False)
    rows = {3, 3 * five[0].shape[1]}  # the kept forward's sequences and token rows
    left = {name for (_, name), value in held(model).items() if value.shape[:1] and
            value.shape[0] in rows}
    assert not left, f"arrays of the kept forward left: {sorted(left)}"
    model.loss(*inputs, keep=False)
    np.testing.assert_array_equal(free, model.ops.to_numpy(model.logits))
    with pytest.raises(RuntimeError, match="kept its activations"):
        model.backward()


def test_keep_delta_keeps_delta_alone_and_evaluate_leaves_the_traces():
    """keep=("delta",): every block's scheme keeps its Delta (equal to a training forward's),
    nothing else. evaluate() keeps everything, so what its last forward leaves (a trainable
    scheme's derived weights, the traces) can be read after it, as after a training step."""
    model, inputs = model_and_inputs("attention", "mapwm")
    fresh = held(model)
    model.loss(*inputs, keep=("delta",))
    added = {key for key in held(model).keys() - fresh.keys()}
    schemes = {id(block.mixer.scheme): block.mixer.scheme for block in model.blocks}
    assert {(i, "delta") for i in schemes} == added
    deltas = [block.mixer.scheme.delta.copy() for block in model.blocks]
    model.loss(*inputs)
    for block, delta in zip(model.blocks, deltas):
        np.testing.assert_array_equal(block.mixer.scheme.delta, delta)
    results = evaluate(model, {"iid": TASK}, sequences=4, batch_size=2)
    assert results["iid"]["delta_abs_by_token"][0] is not None
    assert held(model).keys() - fresh.keys() > added  # the last forward's activations


def test_vq_bottleneck_loss_and_counts_and_bad_keep():
    """The VQ's auxiliary loss is part of the loss (the same with and without kept
    activations), and its forward count goes on (its dead-code restarts count forwards)."""
    model, inputs = model_and_inputs("attention", "rope", "vq", vq_restart_dead=2)
    vq = model.blocks[-1].bottleneck
    loss_free = model.loss(*inputs, keep=False)
    free = model.ops.to_numpy(model.logits).copy()
    assert vq.loss > 0
    loss_kept = model.loss(*inputs)
    np.testing.assert_array_equal(free, model.ops.to_numpy(model.logits))
    assert loss_free == loss_kept
    model.train(True)
    before = vq.forwards
    model.loss(*inputs, keep=False)
    assert vq.forwards == before + 1
    for bad in ("none", ["delta"], ("delta", 1), 0):
        with pytest.raises(TypeError, match="keep"):
            model.forward(inputs[0], keep=bad)
    with pytest.raises(ValueError, match="keep names traces .*'dleta'"):
        model.forward(inputs[0], keep=("dleta",))


def test_backward_before_any_loss_and_after_decode_is_refused():
    model, inputs = model_and_inputs("attention", "rope")
    with pytest.raises(RuntimeError, match="kept its activations"):
        model.backward()
    model.loss(*inputs)
    model.decode(inputs[0][:, :4])
    with pytest.raises(RuntimeError, match="kept its activations"):
        model.backward()


def test_every_pair_is_covered():
    """PAIRS is every (mixer, scheme) the registries accept (components agrees)."""
    for mixer, positional in itertools.product(sorted(MIXERS.entries), sorted(SCHEMES.entries)):
        try:
            components(mixer, positional)
        except ValueError:
            assert (mixer, positional) not in PAIRS
        else:
            assert (mixer, positional) in PAIRS
