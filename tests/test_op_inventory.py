"""Every op of the C core has all its pieces (docs/how-to/add-an-op.md): a float64 reference in
mapformer.reference, the same function on the NumPy backend, a declaration in its family's
header (csrc/include/mapformer/ops/<family>.h, included by params.h) taking the parameter
struct declared there, its reference in the family's module (mapformer/reference/<family>.py),
a test file that calls the C op and its reference, and a CUDA kernel, wrapper and test (or a
place in NO_CUDA_KERNEL)."""
import importlib.util
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from mapformer import _C, backend
from mapformer import reference as ref
from mapformer.signatures import signatures

ROOT = Path(__file__).resolve().parents[1]
# _C's functions that are not ops: the kernel-set and build information, the output pool,
# the signatures
NOT_OPS = {"kernels", "cpu_level", "kernel_sets", "set_kernels", "info", "release_pool",
           "subnormals", "set_subnormals", "signatures"}
OPS = sorted(signatures())


def test_the_inventory_is_not_empty():
    assert len(OPS) >= 30 and "attention_forward" in OPS and "adamw_step" in OPS


def test_every_function_of_the_module_is_an_op_with_a_table_or_a_module_function():
    functions = {name for name, fn in inspect.getmembers(_C, callable)
                 if not name.startswith("_")}
    assert functions - NOT_OPS == set(OPS)
    assert NOT_OPS <= functions


@pytest.mark.parametrize("op", OPS)
def test_op_has_a_reference_and_a_numpy_backend_entry(op):
    assert callable(getattr(ref, op, None)), f"mapformer.reference has no {op}"
    assert callable(getattr(backend.NUMPY, op, None)), f"backend.NUMPY has no {op}"
    assert "dtype" in inspect.signature(getattr(ref, op)).parameters, \
        f"reference.{op} takes no dtype"


INCLUDE = ROOT / "csrc/include/mapformer"
FAMILY_HEADERS = sorted((INCLUDE / "ops").glob("*.h"))


def test_params_h_includes_every_family_header_and_each_family_has_its_c_file():
    included = re.findall(r'^#include "mapformer/ops/(\w+)\.h"$',
                          (INCLUDE / "params.h").read_text(), flags=re.M)
    assert sorted(included) == [h.stem for h in FAMILY_HEADERS] and len(included) >= 25
    for header in FAMILY_HEADERS:
        assert (ROOT / "csrc/ops" / f"{header.stem}.c").exists(), header.name


@pytest.mark.parametrize("op", OPS)
def test_op_is_declared_with_its_params_struct(op):
    declared = [h for h in FAMILY_HEADERS
                if re.search(rf"\bint\s+{op}\s*\(", h.read_text())]
    assert len(declared) == 1, f"{op} is declared in {[h.name for h in declared]}, not in one " \
        "family header"
    header = declared[0].read_text()
    structs = set(re.findall(r"\}\s*(Mf\w+Params);", header))
    match = re.search(rf"\bint\s+{op}\s*\(\s*const\s+(Mf\w+Params)\s*\*\s*\w+\s*\)", header)
    assert match, f"{declared[0].name} declares no `int {op}(const Mf...Params *p)`"
    assert match.group(1) in structs, \
        f"{op} takes {match.group(1)}, not declared in {declared[0].name}"


@pytest.mark.parametrize("op", OPS)
def test_op_is_tested_against_its_reference(op):
    calls_c = re.compile(rf"_C\.{op}\b|\bC\.{op}\b")
    calls_ref = re.compile(rf"ref\.{op}\b")
    files = [p for p in (ROOT / "tests").glob("test_*.py")
             if calls_c.search(p.read_text()) and calls_ref.search(p.read_text())]
    assert files, f"no tests/test_*.py calls both _C.{op} and ref.{op}"


def test_each_reference_lives_in_its_familys_module():
    """reference.<op> is defined in mapformer/reference/<family>.py, the family whose header
    declares the op (the package mirrors csrc/ops/)."""
    for op in OPS:
        declared = [h.stem for h in FAMILY_HEADERS if re.search(rf"\bint\s+{op}\s*\(",
                                                               h.read_text())]
        assert getattr(ref, op).__module__ == f"mapformer.reference.{declared[0]}", op


# the families with no CUDA kernel yet (a model using them stops with MissingKernel on the
# CUDA backend); a new family without one must be added here, knowingly. relative: written
# on a machine without a GPU (the emulation could test a kernel, a device could not)
NO_CUDA_KERNEL = {"nc_general_forward", "nc_general_backward", "relative_forward",
                  "relative_backward"}


def _cuda_kernels():
    spec = importlib.util.spec_from_file_location("gen_pages", ROOT / "docs" / "gen_pages.py")
    gen_pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_pages)
    return gen_pages.cuda_kernels()


def test_every_op_has_a_cuda_kernel_wrapper_and_test_or_is_listed_without():
    from mapformer import cuda

    kernels = _cuda_kernels()

    class Library:  # the symbols of a CUDA build: <op>_cuda for every kernel
        def __getattr__(self, name):
            if name.endswith("_cuda") and name[:-len("_cuda")] in kernels:
                return lambda *args: 0
            raise AttributeError(name)

    wrappers = set(vars(cuda.ops(Library(), np, params_h=str(INCLUDE / "params.h"))))
    assert set(cuda.SCRATCH) | set(cuda.CHECKS) | set(cuda.PINS) <= set(kernels)
    cuda_tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_cuda_*.py"))
    assert set(kernels) <= set(OPS), sorted(set(kernels) - set(OPS))
    assert wrappers == set(kernels), (sorted(wrappers ^ set(kernels)))
    assert set(OPS) - set(kernels) == NO_CUDA_KERNEL
    for op in kernels:
        family = backend.family_of(op)
        assert re.search(rf"\b{family}", cuda_tests), f"no tests/test_cuda_*.py names {op}"
