"""The documentation's generated pages (docs/gen_pages.py) are current: each committed page
equals what its template gives now from the run records, the binding tables, the CUDA sources,
the command line's parser and the benchmarks' JSON, so that a new record, op or flag cannot
leave the site stale; and every record in results/records is shown by some page's table."""
import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gen_pages", ROOT / "docs" / "gen_pages.py")
gen_pages = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen_pages)

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("c++") is None,
                              reason="the op table reads the bindings through the C preprocessor")


@pytest.fixture(scope="module")
def generated():
    return gen_pages.pages()


@needs_cc
def test_every_generated_page_is_committed_and_current(generated, tmp_path):
    pages, _ = generated
    assert {"reproduction/mapformer.md", "reproduction/tdb.md", "reproduction/ape.md",
            "reproduction/gridpe.md", "reference/ops.md", "reference/cli.md",
            "performance/gpu-h100.md", "performance/cpu-epyc-zen4.md"} <= set(pages)
    for name, text in pages.items():  # regenerated into a temporary tree, compared there
        fresh = tmp_path / name
        fresh.parent.mkdir(parents=True, exist_ok=True)
        fresh.write_text(text)
        committed = ROOT / "docs" / name
        assert committed.exists(), f"docs/{name} is missing: run python docs/gen_pages.py"
        assert committed.read_text() == fresh.read_text(), \
            f"docs/{name} is stale against its sources: run python docs/gen_pages.py"


@needs_cc
def test_every_record_is_on_a_page(generated):
    _, shown = generated
    missing = sorted(set(gen_pages.every_record()) - shown)
    assert not missing, (f"{len(missing)} records are in no page's table (add a "
                         f"'<!-- gen: table ... -->' line to a template): {missing[:5]}")


def test_the_cpu_train_step_page_shows_each_kernel_sets_ratios():
    """The per-kernel-set table holds each step's time and its two ratios as the JSON has
    them, and the ratios are the step over its bounds."""
    import json

    path = "results/bench/epyc-zen4/train_step_paper.json"
    data = json.loads((ROOT / path).read_text())
    text = gen_pages.render_train_step([path], set())
    for name, entry in data["kernel_sets"].items():
        for model, r in entry["models"].items():
            assert r["over_fma"] == pytest.approx(r["ms_per_step"] / r["fma_bound_ms"], abs=0.01)
            assert r["over_product"] == pytest.approx(
                r["ms_per_step"] / r["product_bound_ms"], abs=0.01)
            assert (f"| {name} | {model} | {r['ms_per_step']:.1f} | {r['gflop']:.1f} | "
                    f"{r['fma_bound_ms']:,.1f} | **{r['over_fma']:.2f}** |") in text
    assert data["provenance"]["commit"][:7] in text


def test_every_benchmark_file_is_on_a_page():
    """Each benchmark JSON under results/bench/ is named by some template's directive: a
    measurement no page renders is a figure no reader sees."""
    directives = {line for t in gen_pages.TEMPLATES.rglob("*.md")
                  for line in gen_pages.DIRECTIVE.findall(t.read_text())}
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "results" / "bench").rglob(
        "*.json"))
    assert files
    missing = [f for f in files if not any(f in d.split() for d in directives)]
    assert not missing, f"benchmark files no page renders: {missing}"


def test_op_bench_directive_renders_every_row_and_the_command():
    """The timing table has a row per op of the families asked for, with its C time and its
    NumPy ratio as the JSON has them, and the command that produced the file."""
    import json

    path = "results/bench/epyc-zen4/ops.json"
    data = json.loads((ROOT / path).read_text())
    text = gen_pages.render_op_bench([path, "--families", "scan,groups"], set())
    rows = [r for r in data["results"] if r["family"] in ("scan", "groups")]
    assert rows and data["command"] in text and data["provenance"]["commit"][:7] in text
    for r in rows:
        line = next(line for line in text.splitlines() if line.startswith(f"| `{r['name']}` |"))
        assert f" {r['c_ms']:,.2f} |" in line
        if "speedup" in r:
            assert f" {r['speedup']:.2f} |" in line
    assert not any(f"| `{r['name']}` |" in text for r in data["results"]
                   if r["family"] not in ("scan", "groups"))


def test_the_reproduce_guide_lists_every_table_of_every_paper():
    """docs/how-to/reproduce.md's table of specs names each paper's every table, so a new spec
    cannot be missing from the guide."""
    from mapformer import reproduce

    rows = {line.split("|")[1].strip().strip("`"): line for line in
            (ROOT / "docs" / "how-to" / "reproduce.md").read_text().splitlines()
            if line.startswith("| `")}
    for paper in ("mapformer", "ape", "gridpe", "tdb"):
        missing = [n for n in reproduce.table_names(paper) if f"`{n}`" not in rows[paper]]
        assert not missing, f"docs/how-to/reproduce.md does not list {paper}'s {missing}"


def test_predicted_by_lag_directive_renders_the_predictions():
    """The directive's cells are predicted_by_lag's values over the presets, beside the
    paper's figures, and its share rows are lag_shares' first bucket."""
    from mapformer import reproduce
    from mapformer.experiments import RecordStore
    from mapformer.reproduce.mapformer import lag_shares, predicted_by_lag
    from mapformer.tasks import navigation

    text = gen_pages.render_predicted_by_lag(
        ["mapformer", "2", "--records", "results/records/mapformer", "--rows", "RoPE (1L)"],
        set())
    table = reproduce.table("mapformer", "2")
    preset = navigation.preset("iid", dims=2)
    want = predicted_by_lag(table, RecordStore(ROOT / "results/records/mapformer"), 3,
                            {("2D", "iid"): preset}, rows=["RoPE (1L)"])[("2D", "RoPE (1L)",
                                                                          "iid")]
    row = next(line for line in text.splitlines() if line.startswith("| RoPE (1L)"))
    assert row.split(" | ")[4] == f"{want:.2f} [0.33]"  # 2D iid, the paper's 0.33
    shares = next(line for line in text.splitlines() if "the paper's presets" in line)
    assert shares.split(" | ")[4] == f"{lag_shares(preset)[0]:.2f}"


def test_a_stale_page_is_named(tmp_path, monkeypatch):
    """The check compares text: a page edited by hand (or a record added) is reported."""
    template = tmp_path / "_templates" / "x.md"
    template.parent.mkdir()
    template.write_text("# x\n\n<!-- gen: file results/gpu_h100/tests.txt -->\n")
    monkeypatch.setattr(gen_pages, "TEMPLATES", tmp_path / "_templates")
    monkeypatch.setattr(gen_pages, "DOCS", tmp_path)
    assert gen_pages.stale() == ["x.md"]
    assert gen_pages.main([]) == 0 and gen_pages.stale() == []
    (tmp_path / "x.md").write_text((tmp_path / "x.md").read_text() + "edited\n")
    assert gen_pages.stale() == ["x.md"] and gen_pages.main(["--check"]) == 1


def test_subnormals_directive_renders_every_row_and_step():
    """bench_subnormals.py's table: a line per op row and per checkpoint's step, with the
    kept and flushed times and their ratio as the JSON has them, and the command."""
    import json
    path = "results/bench/xeon-spr/subnormals.json"
    data = json.loads((ROOT / path).read_text())
    text = gen_pages.render_subnormals([path], set())
    lines = [line for line in text.splitlines() if line.startswith("| ") and "ms" not in line]
    assert len(lines) == len(data["rows"]) + len(data["steps"])  # the header has "ms"
    for r in data["rows"] + data["steps"]:
        assert f"{r['keep_ms']:,.2f} | {r['flush_ms']:,.2f} | {r['ratio']:.2f} |" in text
    assert data["command"] in text and data["provenance"]["cpu"] in text
