"""Learning test: on a small 2D navigation task MapWM learns to recall (>= 0.9) where RoPE,
whose angles ignore the actions, stays near the always-blank floor.

RoPE does rise above the floor: revisits right after a reversal (a step and its inverse)
are two tokens back in the sequence whatever the map, and a fixed-position model can learn
those. Its ceiling from that alone is well below MapWM's, which is what is asserted."""
from mapformer.models import ModelConfig
from mapformer.train import TrainConfig, train

TASK = dict(dims=2, steps=64, grid_size=16, p_empty=0.5, n_objects=16)


def run(model, sequences):
    train_config = TrainConfig(**TASK, sequences=sequences, batch_size=64, eval_sequences=256,
                               seed=0)
    # for_task: MapWM's omega_grid is the task's grid side, 16
    model_config = ModelConfig.for_task(model, train_config.task_config(), d_model=64,
                                        n_heads=2)
    return train(model_config, train_config, progress=False, log=lambda *a: None)["eval"]


def test_mapwm_learns_navigation_rope_does_not():
    mapwm = run("mapwm", 600 * 64)
    rope = run("rope", 300 * 64)
    iid, floor = mapwm["iid"]["accuracy"], mapwm["iid"]["floor"]
    assert 0.4 < floor < 0.6
    assert iid >= 0.9, mapwm
    assert mapwm["ood_dense"]["accuracy"] >= 0.9, mapwm
    assert rope["iid"]["accuracy"] <= floor + 0.2, rope
    assert iid - rope["iid"]["accuracy"] >= 0.25
