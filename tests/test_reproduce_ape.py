"""APE's tables as experiment specs (mapformer.reproduce.ape): every row builds the run the
old harness (benchmarks/reproduce_ape.py) built, a few rows train through run_all at a few
training sequences with the paper's figures beside perplexity, and the records converted
from that harness (results/records/ape-legacy) render the numbers its JSON files held."""
import subprocess
import sys
from pathlib import Path

import pytest

from mapformer import reproduce
from mapformer.experiments import RecordStore, run_all
from mapformer.reproduce import ape

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "results" / "records" / "ape-legacy"


def options(run):
    return run.model["options"]


@pytest.mark.parametrize("name", sorted(ape.TABLES))  # the specs; views are tested alone
def test_every_row_builds_its_run(name):
    scales = sorted(ape.TABLES[name]["scales"])
    for scale in scales:
        table = reproduce.table("ape", name, scale)
        runs = table.runs(2)
        assert len(runs) == len(table.parts) * len(table.rows) * 2
        assert len({r.id for r in runs}) == len(runs)  # no two rows the same run
        at = ape.TABLES[name]["scales"][scale]
        for run in runs:
            assert run.train["sequences"] == at.steps * at.batch_size
            assert run.train["eval_sequences"] == at.eval_sequences
            assert (run.model["d_model"], run.model["n_layers"]) == (at.d_model, at.n_layers)
            assert run.model["mixer"] == "attention"
            tree = run.train["task"] in ape.TREE_TASKS
            assert sorted(run.evals) == (["dev", "iid"] if tree else ["dev", "iid", "ood_long"])
            assert set(table.columns) <= set(run.evals)


def test_rows_configure_what_the_paper_names():
    a = reproduce.table("ape", "a")
    b = reproduce.table("ape", "b")
    assert a.parts == ("copy", "repeat", "reverse") and a.columns == ("iid", "ood_long")
    assert b.parts[:2] == ("tree_copy breadth", "tree_copy depth") and len(b.parts) == 8
    assert b.columns == ("iid", "dev")
    assert (a.statistic, a.reference_metrics, a.metrics) == (
        "ci95", ("perplexity",), ("perplexity", "sequence_accuracy"))
    run = a.make_run("reverse", "rope_tuned", 1)
    assert run.model["positional"] == "rope" and options(run)["rope_trainable"] is True
    assert options(run)["attn_mask"] == "causal" and run.seed == 1
    assert (run.train["mean_length"], run.train["sequences"]) == (32, 128_000)
    run = a.make_run("copy", "ape_seq_decay", 0)
    assert run.model["positional"] == "ape_seq" and options(run)["ape_decay"] == 0.98
    run = a.make_run("copy", "ape_seq_no_init", 0)
    assert options(run)["ape_no_init"] is True
    run = a.make_run("copy", "ape_seq_no_init_decay", 0)
    assert (options(run)["ape_no_init"], options(run)["ape_decay"]) == (True, 0.98)
    run = b.make_run("tree_copy depth", "ape_tree_no_init_decay", 0)
    assert (options(run)["ape_no_init"], options(run)["ape_decay"]) == (True, 0.98)
    assert run.model["positional"] == "ape_tree"
    assert options(a.make_run("repeat", "none_prefix", 0))["attn_mask"] == "prefix"
    assert a.make_run("repeat", "learned_abs", 0).model["positional"] == "learned_abs"
    for row in b.rows:  # the tree tasks are prefix LMs
        run = b.make_run("tree_rotate depth", row, 2)
        assert options(run)["attn_mask"] == "prefix"
        assert (run.train["tree_depth"], run.train["tree_order"]) == (5, "depth")
        assert (run.train["sequences"], run.train["warmup_steps"]) == (28_800, 11)
    run = b.make_run("tree_c3 breadth", "ape_tree_decay", 0)
    assert run.model["positional"] == "ape_tree" and options(run)["ape_decay"] == 0.98
    assert options(b.make_run("tree_ops depth", "ape_tree_no_init", 0))["ape_no_init"] is True
    paper = reproduce.table("ape", "a", "paper").make_run("copy", "rope", 0)
    assert (paper.model["d_model"], paper.model["n_heads"], paper.model["n_layers"]) == (
        512, 8, 4)
    assert (paper.model["dropout"], paper.train["sequences"]) == (0.1, 37_500 * 64)
    assert paper.train["eval_sequences"] == 2000 and paper.train["mean_length"] == 100
    tiny = reproduce.table("ape", "masks", "tiny")
    assert tiny.parts == ("copy", "reverse")
    assert tiny.rows == ("rope", "rope_prefix", "ape_seq", "ape_seq_prefix")
    run = tiny.make_run("copy", "rope_prefix", 0)
    assert options(run)["attn_mask"] == "prefix"
    assert (run.train["sequences"], run.train["eval_sequences"]) == (25_600, 128)
    # the Relative column's two readings: Shaw et al.'s (nothing clipped) and the APE code's
    shaw, code = (options(a.make_run("reverse", r, 0)) for r in ("relative", "relative_ape_code"))
    assert (shaw["rel_reading"], shaw["rel_window"]) == ("shaw", 88)  # the task's seq_len
    assert (code["rel_reading"], code["rel_window"]) == ("ape_code", 32)  # the mean length
    tree = options(b.make_run("tree_c3 depth", "relative_ape_code", 0))
    assert (tree["rel_window"], tree["attn_mask"]) == (5, "prefix")  # the mean depth
    sq = b.make_run("tree_c3 depth", "tree_sq", 0)  # Tree-SQ: the deepest node's 7 steps
    assert (sq.model["positional"], options(sq)["tree_sq_depth"]) == ("tree_sq", 7)
    assert b.reference["tree_c3 depth"]["tree_sq"] == ((2.29, 0.24), None)
    assert "tree_sq" in b.contest[2] and "tree_sq" not in a.rows
    for table in (a, b):
        part = table.parts[0]
        assert table.reference[part]["relative"] == table.reference[part][
            "relative_ape_code"] and table.reference[part]["relative"] is not None
    # masks at cpu are table (a)'s runs, the same records
    assert reproduce.table("ape", "masks").make_run("reverse", "ape_seq", 2).id == \
        a.make_run("reverse", "ape_seq", 2).id


def test_paper_figures_and_overrides():
    a = reproduce.table("ape", "a")
    assert a.reference["reverse"]["sinusoidal"] == ((3.92, 0.99), None)
    assert a.reference["repeat"]["rope_prefix"] == ((1.08, 0.12), None)  # its causal row's
    assert "none" not in a.reference["copy"]  # the paper has no such column
    b = reproduce.table("ape", "b")
    assert b.reference["tree_c3 depth"]["ape_seq"] == ((1.83, 0.02), None)  # "APE seq"
    assert b.reference["tree_c3 depth"]["ape_tree"] == ((1.00, 0.00), None)
    assert b.reference["tree_rotate depth"]["rope_tuned"] == ((2.60, 0.11), None)
    small = reproduce.table("ape", "b", sequences=8, eval_sequences=4)
    run = small.make_run("tree_copy depth", "ape_tree", 0)
    assert (run.train["sequences"], run.train["eval_sequences"]) == (8, 4)
    assert "every run trains on 8 sequences instead" in small.note
    assert "overridden" not in b.note
    with pytest.raises(ValueError, match="not 'c'"):
        reproduce.table("ape", "c")
    with pytest.raises(ValueError, match="has scales"):
        reproduce.table("ape", "b", scale="tiny")
    for bad in (0, -1):  # 0 is not "the scale's" (the old script's `or` took it so)
        with pytest.raises(ValueError, match="sequences must be a positive integer"):
            reproduce.table("ape", "a", sequences=bad)
        with pytest.raises(ValueError, match="eval_sequences must be a positive integer"):
            reproduce.table("ape", "a", eval_sequences=bad)


def test_a_few_rows_train_and_render_beside_the_paper(tmp_path):
    store = RecordStore(tmp_path)
    a = reproduce.table("ape", "a", sequences=8, eval_sequences=4)
    b = reproduce.table("ape", "b", sequences=8, eval_sequences=4)
    runs = (a.runs(1, rows=["sinusoidal", "rope_prefix"])
            + [b.make_run("tree_c3 depth", row, 0) for row in ("ape_tree", "ape_seq")])
    assert run_all(runs, store, progress=False) == {"held": 0, "ran": 8, "failed": []}
    for run in runs:
        record = store.get(run.id)
        assert record["steps"] == 1 and record["provenance"]["commit"]
        for column in run.evals:
            metrics = record["metrics"][column]
            assert metrics["perplexity"] >= 1.0 and 0.0 <= metrics["sequence_accuracy"] <= 1
            assert metrics["sequences"] == 4
    assert run_all(runs, store, progress=False)["held"] == 8  # a rerun runs nothing
    text = a.markdown(store, seeds=1)
    cells = text.split("| sinusoidal | ")[1].split("\n")[0].rstrip(" |").split(" | ")
    assert len(cells) == 6 and all("(n=1)" in c for c in cells)
    assert cells[4].endswith("[3.92 ± 0.99]")  # reverse iid: the paper's figure
    assert "[" not in cells[5]  # ood_long: the paper has none
    assert "[1.09 ± 0.02]" in text.split("| rope_prefix | ")[1].split("\n")[0]
    assert "| rope | - | - |" in text  # a row not run
    accuracy = a.markdown(store, seeds=1, metric="sequence_accuracy")
    assert "[" not in accuracy.split("| sinusoidal | ")[1].split("\n")[0]
    text = b.markdown(store, seeds=1)
    assert "[1.00 ± 0.00]" in text.split("| ape_tree | ")[1].split("\n")[0]
    assert "[1.83 ± 0.02]" in text.split("| ape_seq | ")[1].split("\n")[0]


def test_legacy_records_render_what_the_old_files_held():
    """results/records/ape-legacy: the 154 runs of benchmarks/reproduce_ape.py (54 of table
    (a), 96 of (b), 4 of the tiny mask comparison), every one today's spec run; the cells
    are the old script's (its format_table, computed from its JSON files before they were
    removed) at their 256 evaluation sequences (today's cpu scale scores 2000)."""
    store = RecordStore(LEGACY)
    assert len(store.ids()) == 154
    assert not reproduce.table("ape", "a").records(store, seeds=3)
    a = reproduce.table("ape", "a", eval_sequences=256)
    b = reproduce.table("ape", "b", eval_sequences=256)
    tiny = reproduce.table("ape", "masks", "tiny")
    for table, n in ((a, 54), (b, 96), (tiny, 4)):
        found = table.records(store, seeds=3)
        assert len(found) == n
        assert all(r["provenance"]["commit"] == "unknown" for r in found.values())
    text = a.markdown(store, seeds=3)
    row = text.split("| sinusoidal | ")[1].split("\n")[0]
    assert row.startswith("1.03 ± 0.04 (n=3)§ [1.01 ± 0.00] | 663.92 ± 1386.02 (n=3)§ |")
    assert "1.05 ± 0.05 (n=3)§ [3.92 ± 0.99]" in row
    assert "1.86 ± 0.54 (n=3)§ [1.09 ± 0.02]" in text.split("| rope_prefix | ")[1]
    assert "| ape_seq_decay | - |" in text and "§ records of unknown provenance" in text
    accuracy = a.markdown(store, seeds=3, metric="sequence_accuracy")
    assert accuracy.split("| ape_seq | ")[1].startswith("0.96 ± 0.09 (n=3)§ | 0.00 ± 0.00")
    text = b.markdown(store, seeds=3)
    row = text.split("| ape_tree | ")[1].split("\n")[0].split(" | ")
    assert row[2] == "1.00 ± 0.00 (n=3)§ [1.00 ± 0.00]"  # tree_copy depth iid
    assert row[14] == "2.25 ± 0.07 (n=3)§ [1.83 ± 0.02]"  # tree_ops depth iid
    assert row[15].startswith("2.21 ± 0.06 (n=3)§")  # tree_ops depth dev
    text = tiny.markdown(store, seeds=1)
    assert "| rope | 1.02 (n=1)§ [1.00 ± 0.00] | 299.63 (n=1)§ | 2.73 (n=1)§" in text
    assert "| rope_prefix | 1.02 (n=1)§ [1.00 ± 0.00] | 49.68 (n=1)§ | 4.08 (n=1)§" in text


def test_reproduce_command_renders_the_legacy_records():
    command = [sys.executable, "-m", "mapformer", "reproduce", "ape", "a", "--render-only",
               "--records", str(LEGACY), "--eval-sequences", "256"]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "**APE table (a), sequence transduction** (perplexity;" in out
    assert "**APE table (a), sequence transduction** (sequence_accuracy;" in out
    assert "9.16 ± 0.34 (n=3)§" in out  # reverse, none


def test_plateau_view_reads_when_the_training_loss_leaves_the_plateau():
    """escape_step: the first logged step whose batch loss is below 0.1; a run that never
    gets there counts as not escaped and adds no step; a record without a log adds neither."""
    log = [{"step": 50 * (i + 1), "loss": loss} for i, loss in enumerate([2.9, 0.8, 0.09, 0.2])]
    assert ape.escape_step({"log": log}) == 150
    record = {"log": log, "metrics": {"iid": {"perplexity": 1.01}}}
    assert ape.derive_plateau(record) == {
        "train": {"escape_ksteps": 0.15, "escaped": 1.0, "perplexity": 1.01}}
    stuck = {"log": log[:2], "metrics": {"iid": {"perplexity": 1.6}}}
    assert ape.derive_plateau(stuck)["train"]["escape_ksteps"] is None
    assert ape.derive_plateau(stuck)["train"]["escaped"] == 0.0
    legacy = {"metrics": {"iid": {"perplexity": 1.6}}}
    assert ape.derive_plateau(legacy)["train"]["escaped"] is None
    view, a = reproduce.table("ape", "a-plateau"), reproduce.table("ape", "a")
    assert view.make_run("reverse", "ape_seq", 0).id == a.make_run("reverse", "ape_seq", 0).id
    assert (view.columns, view.metrics) == (("train",), ("escape_ksteps", "escaped",
                                                          "perplexity"))
