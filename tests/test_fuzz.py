"""Fuzzing of the binding (issue 13): tests/fuzz_ops.py makes 10,000 seeded malformed calls
across every function of mapformer._C in a child process. Each must raise TypeError or
ValueError naming an argument, or return exactly what the same call on fresh copies returns
(finite for ordinary scalars); a crash of the child fails the test with the call that crashed
and the command that reproduces it."""
import os
import subprocess
import sys

from conftest import subprocess_env
from mapformer import _C

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = int(os.environ.get("MAPFORMER_FUZZ_SEED", "0"))


def test_ten_thousand_malformed_calls(tmp_path):
    log = tmp_path / "calls.txt"
    done = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_ops.py"), "--seed",
                           str(SEED), "--calls", "10000", "--log", str(log)],
                          env=subprocess_env(2), capture_output=True, text=True, cwd=HERE)
    if done.returncode < 0 or done.returncode > 1:  # a signal: the last call logged crashed
        last = log.read_text().splitlines()[-1] if log.exists() else "(no call logged)"
        index = last.split()[0]
        raise AssertionError(f"the fuzzer crashed (status {done.returncode}) at call {last}; "
                             f"reproduce: python tests/fuzz_ops.py --seed {SEED} --only "
                             f"{index}\n{done.stderr[-3000:]}")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    functions = [n for n in dir(_C) if not n.startswith("_") and callable(getattr(_C, n))]
    summary = done.stdout.strip().splitlines()[0]
    assert summary == f"10000 calls over {len(functions)} functions, 0 misbehaved", summary
    assert len(log.read_text().splitlines()) == 10000
