"""Every op of the C core has all its pieces (docs/how-to/add-an-op.md): a float64 reference in
mapformer/reference.py, the same function on the NumPy backend, a declaration in
csrc/include/mapformer/mapformer.h taking its family's parameter struct from params.h, and a
test file that calls the C op and its reference."""
import inspect
import re
from pathlib import Path

import pytest

from mapformer import _C, backend
from mapformer import reference as ref

ROOT = Path(__file__).resolve().parents[1]
# _C's functions that are not ops: the kernel-set and build information, the output pool
NOT_OPS = {"kernels", "cpu_level", "kernel_sets", "set_kernels", "info", "release_pool",
           "subnormals", "set_subnormals"}
OPS = sorted(name for name, fn in inspect.getmembers(_C, callable)
             if not name.startswith("_") and name not in NOT_OPS)


def test_the_inventory_is_not_empty():
    assert len(OPS) >= 30 and "attention_forward" in OPS and "adamw_step" in OPS


@pytest.mark.parametrize("op", OPS)
def test_op_has_a_reference_and_a_numpy_backend_entry(op):
    assert callable(getattr(ref, op, None)), f"mapformer/reference.py has no {op}"
    assert callable(getattr(backend.NUMPY, op, None)), f"backend.NUMPY has no {op}"
    assert "dtype" in inspect.signature(getattr(ref, op)).parameters, \
        f"reference.{op} takes no dtype"


@pytest.mark.parametrize("op", OPS)
def test_op_is_declared_with_its_params_struct(op):
    header = (ROOT / "csrc/include/mapformer/mapformer.h").read_text()
    structs = set(re.findall(r"\}\s*(Mf\w+Params);",
                             (ROOT / "csrc/include/mapformer/params.h").read_text()))
    match = re.search(rf"\bint\s+{op}\s*\(\s*const\s+(Mf\w+Params)\s*\*\s*\w+\s*\)", header)
    assert match, f"mapformer.h declares no `int {op}(const Mf...Params *p)`"
    assert match.group(1) in structs, f"{op} takes {match.group(1)}, not in params.h"


@pytest.mark.parametrize("op", OPS)
def test_op_is_tested_against_its_reference(op):
    calls_c = re.compile(rf"_C\.{op}\b|\bC\.{op}\b")
    calls_ref = re.compile(rf"ref\.{op}\b")
    files = [p for p in (ROOT / "tests").glob("test_*.py")
             if calls_c.search(p.read_text()) and calls_ref.search(p.read_text())]
    assert files, f"no tests/test_*.py calls both _C.{op} and ref.{op}"
