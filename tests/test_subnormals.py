"""The ops' subnormal mode (csrc/ops/subnormals.c): flushed by default, kept on request, in the
ops only (NumPy keeps IEEE arithmetic), on every thread of a parallel op, recorded in a run's
provenance, and read from MAPFORMER_SUBNORMALS when the module loads."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import subprocess_env
from mapformer import _C
from mapformer.experiments.records import provenance

TINY = np.float32(1e-39)  # subnormal: below float32's smallest normal, 1.18e-38


@pytest.fixture
def keep_mode():
    """Restore the process's mode after a test that changes it."""
    before = _C.subnormals()
    yield
    _C.set_subnormals(before)


def test_flush_by_default_and_keep_on_request(keep_mode):
    assert _C.subnormals() == "flush" and _C.info()["subnormals"] == "flush"
    x = np.full((8, 64), TINY, np.float32)
    w = np.eye(64, dtype=np.float32)
    assert not _C.linear_forward(x, w).any()  # read as zero (DAZ), written as zero (FTZ)
    assert TINY * np.float32(1.0) == TINY  # NumPy, after an op on this thread: still IEEE
    _C.set_subnormals("keep")
    assert _C.subnormals() == "keep" and provenance()["subnormals"] == "keep"
    np.testing.assert_array_equal(_C.linear_forward(x, w), x)
    _C.set_subnormals("flush")
    assert provenance()["subnormals"] == "flush"
    with pytest.raises(ValueError, match="mode must be 'flush' or 'keep', got 'fast'"):
        _C.set_subnormals("fast")


def test_every_thread_of_a_parallel_op_flushes(tmp_path):
    """A large elementwise op split over 2 threads: every output flushed in 'flush' (the
    workers take the mode too), every output the subnormal result in 'keep'."""
    script = (
        "import sys\nimport numpy as np\nfrom mapformer import _C\n"
        "a = np.full(1 << 20, 1e-39, np.float32)\n"
        "flushed = _C.residual_forward(a, a)\n"
        "_C.set_subnormals('keep')\n"
        "kept = _C.residual_forward(a, a)\n"
        "_C.set_subnormals('flush')\n"
        "again = _C.residual_forward(a, a)\n"
        "np.savez(sys.argv[1], flushed=flushed, kept=kept, again=again)\n")
    path = tmp_path / "run.py"
    path.write_text(script)
    out = tmp_path / "out.npz"
    subprocess.run([sys.executable, str(path), str(out)], env=subprocess_env(2), check=True)
    found = np.load(out)
    assert not found["flushed"].any() and not found["again"].any()
    np.testing.assert_array_equal(found["kept"], np.float32(2e-39))


def test_the_environment_sets_the_mode_at_load(tmp_path):
    env = {**subprocess_env(1), "MAPFORMER_SUBNORMALS": "keep"}
    out = subprocess.run([sys.executable, "-c", "from mapformer import _C; "
                          "print(_C.subnormals())"], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "keep"
    env["MAPFORMER_SUBNORMALS"] = "sometimes"
    bad = subprocess.run([sys.executable, "-c", "from mapformer import _C"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode != 0
    assert ("the environment variable MAPFORMER_SUBNORMALS must be 'flush' or 'keep', got "
            "'sometimes'") in bad.stderr
