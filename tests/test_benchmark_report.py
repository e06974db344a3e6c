"""benchmarks/report.py: a benchmark's --json file holds its figures, the command that produced
them and the provenance of the checkout it measured (not of an installed copy), which the
performance pages render."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_benchmark_writes_its_figures_command_and_provenance(tmp_path):
    out = tmp_path / "factor.json"
    command = ["benchmarks/bench_attention_factor.py", "--batch", "1", "--seq", "8",
               "--heads", "1", "--head-dim", "16", "--repeats", "1", "--rounds", "1",
               "--kernel-sets", "portable", "--json", str(out)]
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert printed == {k: v for k, v in data.items() if k not in ("command", "provenance")}
    assert data["command"] == "python " + " ".join(command)
    assert [r["name"] for r in data["results"]] == [
        "attention_forward[portable] with the pair factor",
        "attention_backward[portable] with the pair factor"]
    for r in data["results"]:
        assert r["sizes"] == {"B": 1, "T": 8, "H": 1, "D": 16}
        # one call each: a scheduling hiccup can make one time large and their ratio round to
        # 0.00 (seen: 0.005 against 12.701 ms beside a full test run), so only its sign
        assert r["c_ms"] > 0 and r["plain_ms"] > 0 and r["factor_over_plain"] >= 0
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    assert data["provenance"]["commit"] == head  # the checkout's mapformer, not site-packages
