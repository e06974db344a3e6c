"""The guides docs/how-to/add-a-scheme.md and add-a-mixer.md, kept honest: a toy scheme
(tests/toy_scheme.py) and a toy mixer (tests/toy_mixer.py), each defined in one module and
shown statement for statement in its guide, register, get their options validated, build,
train a step through the Python API (and the scheme through the command line, its option a
flag), and unregister; and the errors for a scheme its mixer cannot use, an option of another
component, and registrations that would clash."""
import ast
import importlib
import json
import math
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_param_gradients, subprocess_env
from mapformer.mixers import MIXERS
from mapformer.models import ModelConfig, Transformer
from mapformer.registry import Option
from mapformer.schemes import SCHEMES, AngleScheme, register_scheme
from mapformer.tasks import navigation
from mapformer.train import TrainConfig, load_checkpoint, train

TASK = dict(dims=1, steps=6, grid_size=4, n_objects=3)
RATE = "blocks.0.mixer.scheme.rate"
HERE = Path(__file__).resolve().parent
GUIDES = HERE.parent / "docs" / "how-to"

SCALING = {"attn_scale": 1.0, "attn_log_scale": 0, "attn_log_clamp": True,
           "attn_mask": "causal", "attn_prefix": 0}  # defaults


def code_without_docstrings(source):
    """ast.dump of ``source`` with every docstring removed (comments never reach the AST)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            del body[0]
    return ast.dump(tree)


@pytest.mark.parametrize("guide, module", [("add-a-scheme.md", "toy_scheme.py"),
                                           ("add-a-mixer.md", "toy_mixer.py")])
def test_the_guide_shows_the_tested_toy(guide, module):
    """A guide's first Python block is the tested toy module, statement for statement."""
    example = (GUIDES / guide).read_text().split("```python\n")[1].split("```")[0]
    assert code_without_docstrings(example) == code_without_docstrings(
        (HERE / module).read_text())


@contextmanager
def toy_registered():
    """tests/toy_scheme.py imported (which registers ``toy``), then unregistered."""
    sys.modules.pop("toy_scheme", None)
    try:
        yield importlib.import_module("toy_scheme")
    finally:
        SCHEMES.unregister("toy")
        sys.modules.pop("toy_scheme", None)


def test_toy_scheme_trains_a_step_through_the_api():
    with toy_registered() as toy:
        train_config = TrainConfig(**TASK, sequences=8, batch_size=8, eval_sequences=2)
        config = ModelConfig(vocab_size=train_config.task_config().vocab_size, d_model=32,
                             n_heads=2, positional="toy", options={"toy_rate": 0.25})
        assert config.options == {**SCALING, "toy_rate": 0.25, "gelu": "tanh"}
        assert config.label == "attention/toy"
        with pytest.raises(ValueError, match="toy_rate must be a finite number > 0"):
            ModelConfig(vocab_size=8, d_model=32, n_heads=2, positional="toy",
                        options={"toy_rate": -1.0})
        result = train(config, train_config, progress=False, log=lambda *a: None)
        assert result["steps"] == 1 and math.isfinite(result["loss"])
        model = result["model"]
        rate = model.params.params[RATE]
        assert np.all(rate.grad != 0) and np.all(rate.value != 0.25)  # learned in one step
        # the mixer rotates queries and keys by the toy's angles, rate * (t + 1)
        model.forward(np.zeros((1, 12), np.int32))
        mixer = model.blocks[0].mixer
        assert isinstance(mixer.scheme, toy.LearnedRate) and mixer.theta is mixer.scheme.theta
        np.testing.assert_allclose(mixer.theta[0, :, 0, 0],
                                   np.angle(np.exp(1j * rate.value[0, 0] * np.arange(1, 13))),
                                   atol=1e-5)
    assert "toy" not in SCHEMES.entries
    with pytest.raises(ValueError, match="positional must be one of the registered"):
        ModelConfig(vocab_size=8, d_model=32, n_heads=2, positional="toy")


def test_toy_scheme_gradient_matches_finite_differences():
    """Its angles_backward is the gradient of its angles (NumPy backend, float64)."""
    with toy_registered():
        task = navigation.NavigationConfig(**TASK)
        config = ModelConfig(vocab_size=task.vocab_size, d_model=32, n_heads=2,
                             positional="toy")
        model = Transformer(config, seed=1, backend="numpy")
        batch = navigation.generate(task, 2, np.random.default_rng(0))

        def loss():
            return model.loss(batch.tokens, batch.targets, batch.mask)

        rate = model.params.params[RATE]
        assert_param_gradients(model, loss, [rate])
        assert np.abs(rate.grad).min() > 1e-6


def test_toy_scheme_trains_a_step_through_the_cli(tmp_path):
    with toy_registered():
        env = subprocess_env(1)
        env["PYTHONPATH"] += os.pathsep + str(HERE)
        cli = [sys.executable, "-m", "mapformer", "--import", "toy_scheme"]
        usage = subprocess.run(cli + ["train", "-h"], env=env, capture_output=True, text=True,
                               check=True, cwd=tmp_path).stdout
        assert "--toy-rate" in usage and "initial angle per token" in usage
        args = ["train", "--positional", "toy", "--toy-rate", "0.25", "--dims", "1",
                "--steps", "6", "--grid-size", "4", "--n-objects", "3", "--sequences", "8",
                "--batch-size", "8", "--eval-sequences", "2", "--d-model", "32",
                "--n-heads", "2", "--out", str(tmp_path), "--no-progress", "--json"]
        trained = subprocess.run(cli + args, env=env, capture_output=True, text=True,
                                 check=True, cwd=tmp_path)
        result = json.loads(trained.stdout.strip().splitlines()[-1])
        assert result["steps"] == 1 and math.isfinite(result["loss"])
        model = load_checkpoint(tmp_path / "checkpoint.npz")[0]
        assert model.config.positional == "toy"
        assert model.config.options == {**SCALING, "toy_rate": 0.25, "gelu": "tanh"}
        # AdamW moves a parameter without weight decay only where its gradient is non-zero
        assert np.all(model.params.params[RATE].value != 0.25)
        evaluated = subprocess.run(cli + ["eval", str(tmp_path / "checkpoint.npz"), "--json"],
                                   env=env, capture_output=True, text=True, check=True,
                                   cwd=tmp_path)
        assert json.loads(evaluated.stdout)["iid"] == result["eval"]["iid"]
        # a toy option flag without the toy scheme names the flag and its owner
        bad = subprocess.run(cli + ["train", "--toy-rate", "0.25"], env=env,
                             capture_output=True, text=True, cwd=tmp_path)
        assert bad.returncode == 2
        assert ("--toy-rate is an option of positional scheme 'toy', not of positional "
                "scheme 'mapwm'") in bad.stderr


@pytest.mark.parametrize("mixer, positional, message", [
    ("conjunctive", "rope", "mixer 'conjunctive' takes positional schemes of kind 'positions' "
     "(mapem, mapem_b4, mapem_nc, mapem_sln), not 'rope' (kind 'angles')"),
    ("attention", "mapem", "mixer 'attention' takes positional schemes of kind 'none', "
     "'angles' or 'attention' (ape_grid, ape_seq, ape_tree, cope, gridpe, learned_abs, mapwm, "
     "none, relative, rope, rope_axial, sinusoidal, tape, tree_sq), not 'mapem' (kind "
     "'positions')"),
])
def test_a_scheme_the_mixer_cannot_use_names_both(mixer, positional, message):
    with pytest.raises(ValueError) as info:
        ModelConfig(vocab_size=8, d_model=32, n_heads=2, mixer=mixer, positional=positional)
    assert str(info.value) == message


@pytest.mark.parametrize("model, option, message", [
    ("rope", "delta_rank", "delta_rank is an option of positional scheme 'mapem' (and "
     "'mapem_b4', 'mapem_sln', 'mapwm'), not of positional scheme 'rope'"),
    ("mapwm", "mapem_mode", "mapem_mode is an option of mixer 'conjunctive', not of mixer "
     "'attention'"),
    ("mapem_o", "cope_positions", "cope_positions is an option of positional scheme 'cope', "
     "not of positional scheme 'none'"),
    ("mapwm", "alibi_slope", "unknown option alibi_slope: no registered bottleneck, "
     "feed-forward block, mixer or positional scheme declares it"),
])
def test_an_option_of_another_component_names_it_and_its_owner(model, option, message):
    with pytest.raises(ValueError) as info:
        ModelConfig.preset(model, 8, d_model=32, n_heads=2, **{option: 1})
    assert str(info.value) == message


def rate_scheme(name, option):
    """A registrable AngleScheme class called ``name`` declaring ``option``."""
    class Scheme(AngleScheme):
        options = (option,)

        def angles(self, x, batch, steps):
            """Unused: the class is only registered."""

        def angles_backward(self, dtheta, dx):
            """Unused: the class is only registered."""

    Scheme.name = name
    return Scheme


@pytest.mark.parametrize("name, option, message", [
    ("rope", Option("toy_rate", float, 0.5, "a rate"), "positional scheme 'rope' is already "
     "registered"),
    ("toy2", Option("delta_rank", int, 3, "another rank"), "option 'delta_rank' is declared "
     "differently by positional scheme 'mapem'"),
    ("toy2", Option("d_model", int, 3, "a width"), "option 'd_model' is named like a "
     "ModelConfig field"),
])
def test_registrations_that_would_clash_are_refused(name, option, message):
    with pytest.raises(ValueError, match=message):
        register_scheme(rate_scheme(name, option))
    assert SCHEMES.entries["rope"].__name__ == "RoPE" and "toy2" not in SCHEMES.entries


def test_a_shared_option_declaration_is_accepted():
    """Schemes may share an option by sharing its declaration (as mapwm and mapem do)."""
    rank = SCHEMES.entries["mapwm"].options[0]
    register_scheme(rate_scheme("toy2", rank))
    try:
        config = ModelConfig(vocab_size=8, d_model=32, n_heads=2, positional="toy2",
                             options={"delta_rank": 3})
        assert config.options == {**SCALING, "delta_rank": 3, "gelu": "tanh"}
    finally:
        SCHEMES.unregister("toy2")


@contextmanager
def toy_mixer_registered():
    """tests/toy_mixer.py imported (which registers ``toy_shift``), then unregistered."""
    sys.modules.pop("toy_mixer", None)
    try:
        yield importlib.import_module("toy_mixer")
    finally:
        MIXERS.unregister("toy_shift")
        sys.modules.pop("toy_mixer", None)


def test_toy_mixer_trains_a_step_and_shifts():
    with toy_mixer_registered() as toy:
        train_config = TrainConfig(**TASK, sequences=8, batch_size=8, eval_sequences=2)
        config = ModelConfig(vocab_size=train_config.task_config().vocab_size, d_model=32,
                             n_heads=2, mixer="toy_shift", positional="none",
                             options={"toy_shift_by": 2})
        assert config.options == {"toy_shift_by": 2, "gelu": "tanh"}
        assert config.label == "toy_shift/none"
        with pytest.raises(ValueError, match="toy_shift_by must be an integer >= 1"):
            ModelConfig(vocab_size=8, d_model=32, n_heads=2, mixer="toy_shift",
                        positional="none", options={"toy_shift_by": 0})
        with pytest.raises(ValueError, match="mixer 'toy_shift' takes positional schemes of "
                           "kind 'none'"):
            ModelConfig(vocab_size=8, d_model=32, n_heads=2, mixer="toy_shift",
                        positional="rope")
        result = train(config, train_config, progress=False, log=lambda *a: None)
        assert result["steps"] == 1 and math.isfinite(result["loss"])
        model = result["model"]
        model.forward(np.arange(12, dtype=np.int32).reshape(1, 12) % 6)
        mixer = model.blocks[0].mixer
        assert isinstance(mixer, toy.TokenShift)
        assert np.all(mixer.shifted[0, :2] == 0) and np.any(mixer.shifted[0, 2:] != 0)
    assert "toy_shift" not in MIXERS.entries


def test_toy_mixer_gradient_matches_finite_differences():
    """Its backward is the gradient of its forward, into its projection and through dx to
    the parameters before it (NumPy backend, float64)."""
    with toy_mixer_registered():
        task = navigation.NavigationConfig(**TASK)
        config = ModelConfig(vocab_size=task.vocab_size, d_model=32, n_heads=2,
                             mixer="toy_shift", positional="none")
        model = Transformer(config, seed=1, backend="numpy")
        batch = navigation.generate(task, 2, np.random.default_rng(0))

        def loss():
            return model.loss(batch.tokens, batch.targets, batch.mask)

        params = model.params.params
        assert_param_gradients(model, loss, [params["blocks.0.mixer.out.bias"],
                                             params["blocks.0.ln1.weight"]])
