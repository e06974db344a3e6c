"""ModelConfig: the paper's presets, options validated and completed by the components that
declare them, task defaults, equality and the dict round trip checkpoints rely on."""
import math

import numpy as np
import pytest

from mapformer.models import MODELS, ModelConfig, Transformer, forward_flops
from mapformer.tasks import navigation, selective_copy

# every attention mixer's query-scaling options, at their defaults
SCALING = {"attn_scale": 1.0, "attn_log_scale": 0, "attn_log_clamp": True,
           "attn_mask": "causal", "attn_prefix": 0}
PRESET_PARTS = {  # the preset names the reproduction tables and users know
    "rope": ("attention", "rope", {**SCALING, "rope_base": 10000.0, "rope_trainable": False}),
    "mapwm": ("attention", "mapwm", {**SCALING, "delta_rank": 2, "omega_max": math.pi,
                                     "omega_grid": 64.0}),
    "mapem_os": ("conjunctive", "mapem", {"mapem_mode": "score_product", "mapem_scores": "both",
                                          **SCALING, "delta_rank": 2, "omega_max": math.pi,
                                          "omega_grid": 64.0, "mapem_separate_start": False}),
    "mapem_s": ("conjunctive", "mapem", {"mapem_mode": "score_product",
                                         "mapem_scores": "positional", **SCALING,
                                         "delta_rank": 2, "omega_max": math.pi,
                                         "omega_grid": 64.0, "mapem_separate_start": False}),
    "mapem_o": ("attention", "none", SCALING),
    "cope": ("attention", "cope", {**SCALING, "cope_positions": 7}),
    "tape": ("attention", "tape", {**SCALING, "rope_base": 10000.0}),
    "mamba": ("mamba", "none", {"d_state": 16, "expand": 2, "d_conv": 4, "dt_rank": 0,
                                "zoh": False}),
    "mampa": ("mampa", "none", {"d_state": 16, "expand": 2, "d_conv": 4, "dt_rank": 0,
                                "zoh": False, "mampa_alpha": False, "signed_angle": False,
                                "omega_max": math.pi, "omega_grid": 64.0}),
}


@pytest.mark.parametrize("name", sorted(PRESET_PARTS))
def test_presets(name):
    config = ModelConfig.preset(name, 20, **({"cope_positions": 7} if name == "cope" else {}))
    mixer, positional, options = PRESET_PARTS[name]
    assert (config.mixer, config.positional, config.bottleneck) == (mixer, positional, "none")
    assert config.options == {**options, "gelu": "tanh"} and config.label == name
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert hash(ModelConfig.from_dict(config.to_dict())) == hash(config)
    assert sorted(MODELS) == sorted(PRESET_PARTS)


def test_options_are_completed_so_defaults_compare_equal():
    assert ModelConfig(vocab_size=20) == ModelConfig.preset("mapwm", 20, delta_rank=2)
    assert ModelConfig(vocab_size=20) != ModelConfig.preset("mapwm", 20, delta_rank=3)
    given = {"omega_grid": 8}
    config = ModelConfig(vocab_size=20, options=given)
    assert config.options["omega_grid"] == 8.0 and type(config.options["omega_grid"]) is float
    assert given == {"omega_grid": 8}  # the caller's dict is not changed
    assert ModelConfig(vocab_size=20, options={"delta_rank": np.int64(3)}).options[
        "delta_rank"] == 3


def test_preset_parts_can_be_replaced():
    config = ModelConfig.preset("mapem_s", 20, mixer="attention", positional="rope",
                                rope_base=100.0)
    assert config.options == {**SCALING, "rope_base": 100.0, "rope_trainable": False,
                              "gelu": "tanh"}
    assert config.label == "rope"
    config = ModelConfig.preset("mapwm", 20, positional="tape")
    assert config.label == "tape"
    config = ModelConfig.preset("mapem_os", 20, mapem_mode="sum", mapem_scores="positional")
    assert config.label == "mapem_s"
    assert ModelConfig(vocab_size=20, mixer="conjunctive", positional="mapem").label == "mapem_os"
    with pytest.raises(ValueError, match=r"model must be one of the presets \["):
        ModelConfig.preset("gpt", 20)


@pytest.mark.parametrize("model, options, message", [
    ("mapwm", {"delta_rank": 0}, r"delta_rank must be an integer >= 1, got 0 \(an option of "
     r"positional scheme 'mapwm'\)"),
    ("mapwm", {"delta_rank": 2.0}, "delta_rank must be an integer, got 2.0"),
    ("mapwm", {"delta_rank": True}, "delta_rank must be an integer, got True"),
    ("mapwm", {"omega_max": float("nan")}, "omega_max must be a finite number, got nan"),
    ("mapwm", {"omega_grid": 0.0}, "omega_grid must be a finite number > 0, got 0.0"),
    ("rope", {"rope_base": "10"}, "rope_base must be a finite number, got '10'"),
    ("mapem_os", {"mapem_mode": "product"}, r"mapem_mode must be one of \('score_product', "
     r"'softmax_product', 'sum'\), got 'product' \(an option of mixer 'conjunctive'\)"),
    ("mapem_os", {"mapem_separate_start": 1}, "mapem_separate_start must be true or false"),
    ("cope", {}, "cope_positions is required by positional scheme 'cope'"),
    ("cope", {"cope_positions": 0}, "cope_positions must be an integer >= 1, got 0"),
])
def test_bad_option_values_name_the_option(model, options, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.preset(model, 20, **options)


@pytest.mark.parametrize("fields, message", [
    ({"vocab_size": 0}, "vocab_size must be an integer >= 1"),
    ({"d_model": 33}, r"d_model \(33\) must be divisible by n_heads"),
    ({"d_model": 24, "n_heads": 2}, "head dim d_model / n_heads = 12 must be even and in"),
    ({"dropout": 1.0}, "dropout must be in"),
    ({"layernorm_eps": 0.0}, "layernorm_eps must be a finite positive number"),
    ({"mixer": "s4"}, r"mixer must be one of the registered mixers \['attention', "
     r"'conjunctive', 'lstm', 'mamba', 'mampa'\], got 's4'"),
    ({"mixer": "lstm"}, r"mixer 'lstm' takes positional schemes of kind 'none'"),
    ({"bottleneck": "fsq"}, r"bottleneck must be one of the registered bottlenecks "
     r"\['none', 'vq'\]"),
    ({"options": [("delta_rank", 2)]}, "options must be a dict"),
])
def test_bad_fields_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{"vocab_size": 20, **fields})


def test_for_task_takes_the_tasks_defaults():
    nav = navigation.NavigationConfig(dims=2, steps=10, grid_size=6)
    config = ModelConfig.for_task("mapem_s", nav, d_model=32, n_heads=2)
    assert config.vocab_size == nav.vocab_size and config.options["omega_grid"] == 6.0
    assert ModelConfig.for_task("mapwm", nav, omega_grid=3.0).options["omega_grid"] == 3.0
    assert ModelConfig.for_task("cope", nav).options == {**SCALING, "cope_positions": 20,
                                                         "gelu": "tanh"}
    copy = selective_copy.SelectiveCopyConfig(n_copy=4, n_blanks=5)
    assert ModelConfig.for_task("mapwm", copy).options["omega_grid"] == float(copy.seq_len)
    assert ModelConfig.for_task("rope", copy).options == {**SCALING, "rope_base": 10000.0,
                                                          "rope_trainable": False,
                                                          "gelu": "tanh"}


def test_forward_flops_count_each_components_products():
    """At the paper's scale (B 128, T 256, C 128, 2 heads, V 20): the figures
    benchmarks/bench_train_step.py reported before the components counted their own."""
    nav = navigation.NavigationConfig(dims=2, steps=128, grid_size=64)
    step = {name: 3 * forward_flops(ModelConfig.for_task(name, nav), 128, 256)
            for name in ("rope", "mapwm", "mapem_os", "mapem_s", "mapem_o")}
    assert step == {"rope": 45625638912, "mapwm": 45701136384, "mapem_os": 48922361856,
                    "mapem_s": 39258685440, "mapem_o": 45625638912}


def test_model_parameters_follow_the_components():
    config = ModelConfig.preset("mapem_os", 20, d_model=32, n_heads=2,
                                mapem_separate_start=True)
    names = list(Transformer(config).params.params)
    assert names[3:11] == [f"blocks.0.mixer.{p}.{w}" for p in "qkv" for w in ("weight", "bias")
                           ] + ["blocks.0.mixer.out.weight", "blocks.0.mixer.out.bias"]
    assert names[11:16] == ["blocks.0.mixer.scheme.delta_in.weight",
                            "blocks.0.mixer.scheme.delta_out.weight",
                            "blocks.0.mixer.scheme.omega", "blocks.0.mixer.scheme.start",
                            "blocks.0.mixer.scheme.start_k"]
    mapem_s = Transformer(ModelConfig.preset("mapem_s", 20, d_model=32, n_heads=2))
    assert "blocks.0.mixer.q.weight" not in mapem_s.params.params
