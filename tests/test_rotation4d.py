"""4D-rotation navigation (mapformer/tasks/rotation4d.py): the group is what it claims, the
batches follow the Cayley table with navigation's token/target/mask conventions, and the CLI
trains on it."""
import json
from pathlib import Path

import numpy as np
import pytest

from mapformer.tasks import rotation4d
from mapformer.train import TrainConfig, task_module


def as_index(elements):
    return {m.tobytes(): k for k, m in enumerate(elements)}


@pytest.mark.parametrize("planes, order, abelian", [
    ("12,23", 24, False), ("12,23,34", 192, False), ("12,34", 16, True), ("12", 4, True)])
def test_group_closure_order_and_commutativity(planes, order, abelian):
    elements, cayley = rotation4d.group(planes)
    assert len(elements) == order and cayley.shape == (order, 2 * len(planes.split(",")))
    index = as_index(elements)
    assert len(index) == order  # distinct
    assert (elements[0] == np.eye(4)).all()
    for m in elements:  # every element is a signed permutation with determinant +1
        assert (m.T @ m == np.eye(4)).all() and round(np.linalg.det(m)) == 1
    # closure under products of any two elements, and inverses
    products = np.einsum("aij,bjk->abik", elements, elements).reshape(-1, 4, 4)
    assert all(p.tobytes() in index for p in products)
    assert all(m.T.copy().tobytes() in index for m in elements)
    # the Cayley table is left multiplication by the action matrices
    gens = rotation4d.generators(planes)
    for a, g in enumerate(gens):
        assert all(index[(g @ elements[e]).tobytes()] == cayley[e, a] for e in range(order))
        assert (g @ gens[a ^ 1] == np.eye(4)).all()  # action 2m+1 undoes action 2m
    assert (np.sort(cayley, axis=0) == np.arange(order)[:, None]).all()  # permutations
    commute = all((g @ h == h @ g).all() for g in gens for h in gens)
    assert commute == abelian


def test_plane_rotation_is_a_quarter_turn():
    r = rotation4d.plane_rotation(1, 2)
    assert (r @ np.eye(4)[1] == np.eye(4)[2]).all() and (r @ np.eye(4)[2] == -np.eye(4)[1]).all()
    assert (np.linalg.matrix_power(r, 4) == np.eye(4)).all()
    assert not (np.linalg.matrix_power(r, 2) == np.eye(4)).all()


def test_batch_follows_the_cayley_table_and_marks_revisits():
    config = rotation4d.Rotation4DConfig(steps=20, p_empty=0.3, n_objects=5)
    batch = rotation4d.generate(config, 7, 3)
    _, cayley = rotation4d.group(config.planes)
    tokens, elems = batch.tokens, batch.positions[..., 0]
    actions, obs = tokens[:, 0::2], tokens[:, 1::2]
    assert actions.max() < 4 and actions.min() >= 0
    assert ((obs >= 4) & (obs <= config.blank_id)).all()
    assert (cayley[elems[:, :-1], actions[:, 1:]] == elems[:, 1:]).all()
    assert (batch.targets[:, :-1] == tokens[:, 1:]).all()
    assert (batch.targets[:, -1] == config.blank_id).all()
    for b in range(7):
        seen = {}
        for t in range(config.steps):
            e = elems[b, t]
            assert batch.mask[b, 2 * t] == (e in seen)
            if e in seen:  # the same element shows the same content
                assert obs[b, t] == seen[e]
            seen[e] = obs[b, t]
    assert not batch.mask[:, 1::2].any()
    assert batch.mask.any()  # 20 steps on 24 elements revisit
    again = rotation4d.generate(config, 7, 3)
    assert (again.tokens == tokens).all()


def test_bad_configs_name_the_field():
    for planes in ("13,31", "15", "1,2", "11", 12):
        with pytest.raises(ValueError, match="planes"):
            rotation4d.Rotation4DConfig(planes=planes)
    with pytest.raises(ValueError, match="p_empty"):
        rotation4d.Rotation4DConfig(p_empty=1.5)
    with pytest.raises(ValueError, match="steps"):
        rotation4d.Rotation4DConfig(steps=0)
    with pytest.raises(ValueError, match="grid_size"):
        TrainConfig(task="rotation4d", grid_size=8)


def test_train_config_presets_and_ood_sets():
    config = TrainConfig(task="rotation4d", planes="12,34", steps=10, n_objects=3)
    sets = config.eval_tasks()
    assert sets["iid"] == rotation4d.Rotation4DConfig(steps=10, planes="12,34", n_objects=3)
    assert sets["ood_sparse"].steps == 20 and sets["ood_sparse"].p_empty == 0.5
    assert sets["ood_dense"].steps == 5 and sets["ood_dense"].p_empty == 0.2
    assert task_module(sets["iid"]) is rotation4d
    assert TrainConfig(task="rotation4d").task_config().vocab_size == 4 + 16 + 1
    assert TrainConfig(task="rotation4d", planes="12,23,34").task_config().order == 192


def test_cli_trains_a_tiny_model_on_rotation4d(tmp_path, capsys):
    from mapformer.__main__ import main
    main(["train", "--task", "rotation4d", "--steps", "8", "--n-objects", "3",
          "--sequences", "16", "--batch-size", "8", "--eval-sequences", "4", "--d-model",
          "16", "--n-heads", "1", "--positional", "mapwm", "--no-progress", "--json",
          "--out", str(tmp_path)])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["steps"] == 2
    for name in ("iid", "ood_dense", "ood_sparse"):
        assert 0.0 <= result["eval"][name]["accuracy"] <= 1.0
        assert result["eval"][name]["positions"] > 0


def test_fig7_specs_run_at_tiny_scale_and_plot_from_their_records(tmp_path):
    """Fig. 7b-d's runs keep their evaluations through training (eval_every 1: steps 1 and
    2 of 2, the last being the final evaluation); a rerun with a second seed runs only that
    seed; the table's cells are the seeds' mean ± std; both panels plot from the records."""
    from mapformer import reproduce
    from mapformer.experiments import RecordStore, run_all
    from mapformer.reproduce.mapformer_fig7 import FIG7BD
    store = RecordStore(tmp_path / "records")
    bd = reproduce.table("mapformer", "fig7bd", "tiny", eval_sequences=4)
    assert run_all(bd.runs(1), store, progress=False)["ran"] == 4
    for run in bd.runs(1):
        record = store.get(run.id)
        assert [e["step"] for e in record["evals"]] == [1] and record["steps"] == 2
        assert 0 <= record["metrics"]["ood_sparse"]["accuracy"] <= 1
        assert run.train["task"] == "rotation4d" and run.model["d_model"] == 32
    assert run_all(bd.runs(2), store, progress=False) == {"held": 4, "ran": 4, "failed": []}
    a0, a1 = (store.get(r.id)["metrics"]["iid"]["accuracy"] for r in bd.runs(2)[:2])
    line = next(x for x in bd.markdown(store, 2).splitlines() if x.startswith(f"| {bd.rows[0]} |"))
    assert f"{(a0 + a1) / 2:.3f} ± {abs(a0 - a1) / 2:.3f} (n=2)" in line
    assert bd.rows == tuple(FIG7BD)
    bd.plot(bd, store, 2, tmp_path / "bd.png")
    a = reproduce.table("mapformer", "fig7a", "tiny", eval_sequences=4)
    assert a.parts == ("d_model 32",) and run_all(a.runs(1), store, progress=False)["ran"] == 4
    a.plot(a, store, 1, tmp_path / "a.png")
    for name in ("a.png", "bd.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fig7_legacy_records_keep_the_old_tables_numbers():
    """The converted records of the old script's results/fig7_cpu.json render its tables."""
    from mapformer import reproduce
    from mapformer.experiments import RecordStore
    store = RecordStore(Path(__file__).resolve().parents[1] / "results" / "records"
                        / "mapformer-legacy")
    text = reproduce.table("mapformer", "fig7a").markdown(store, 3)
    assert "| MapEM-NC | 0.554 ± 0.033 (n=3)§ | 0.855 ± 0.060 (n=3)§ | 0.917 ± 0.080 (n=3)§ |" \
        in text
    text = reproduce.table("mapformer", "fig7bd").markdown(store, 3)
    assert "| MapEM-NC-NL | 0.980 ± 0.020 (n=3)§ | 0.921 ± 0.059 (n=3)§ |" in text