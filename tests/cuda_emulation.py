"""The CUDA kernels (cuda/*.cu) run on the CPU: compiled by the host C++ compiler against
cuda/emulate/ (CUDA's execution model: blocks one after another, a block's threads as
concurrent OpenMP threads, __syncthreads as their barrier; cuda/common.cuh) into one shared
library, loaded with ctypes. The kernels' public functions take the same parameter structs
as the C ops; their ctypes twins are read from csrc/include/mapformer/params.h itself
(mapformer.cuda.parse_params).

The library is built once per source state into build/cuda_emulation/<hash>/ (CXX, default
g++): later runs reuse it."""
import ctypes
import glob
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mapformer.cuda import parse_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARAMS_H = os.path.join(ROOT, "csrc", "include", "mapformer", "params.h")
CONCURRENT, SERIAL_FORWARD, SERIAL_REVERSE = 0, 1, 2
SCHEDULES = {"concurrent": CONCURRENT, "serial_forward": SERIAL_FORWARD,
             "serial_reverse": SERIAL_REVERSE}
CXXFLAGS = ["-std=c++17", "-O2", "-fopenmp", "-fPIC", "-ffp-contract=off", "-fno-math-errno",
            "-Wall", "-Wextra", "-Werror", "-x", "c++"]


def sources():
    """The kernel files, the emulation's runtime and the emulator's own test kernels."""
    return (sorted(glob.glob(os.path.join(ROOT, "cuda", "*.cu")))
            + [os.path.join(ROOT, "cuda", "emulate", "runtime.cpp")]
            + sorted(glob.glob(os.path.join(ROOT, "tests", "cuda", "*.cu"))))


def _headers():
    return (sorted(glob.glob(os.path.join(ROOT, "cuda", "*.cuh")))
            + sorted(glob.glob(os.path.join(ROOT, "cuda", "emulate", "*.h")))
            + sorted(glob.glob(os.path.join(ROOT, "csrc", "include", "mapformer", "*.h"))))


def build():
    """Compile (or reuse) the emulation library; return its path."""
    cxx = os.environ.get("CXX", "g++")
    digest = hashlib.sha256(cxx.encode())
    for path in sources() + _headers():
        digest.update(path.encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    out = os.path.join(ROOT, "build", "cuda_emulation", digest.hexdigest()[:16])
    lib = os.path.join(out, "libmapformer_cuda_emulation.so")
    if os.path.exists(lib):
        return lib
    os.makedirs(out, exist_ok=True)
    include = ["-I" + os.path.join(ROOT, "csrc", "include"), "-I" + os.path.join(ROOT, "cuda")]

    def run(command):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}\n{done.stderr}")

    def compile_one(src):
        obj = os.path.join(out, os.path.basename(src) + ".o")
        run([cxx, *CXXFLAGS, *include, "-c", src, "-o", obj])
        return obj

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources()))
    tmp = lib + f".{os.getpid()}.tmp"
    run([cxx, "-shared", "-fopenmp", *objects, "-o", tmp])
    os.replace(tmp, lib)
    return lib


class Emulation:
    """The loaded library: ``call(function, struct_name, **fields)`` fills the struct (NumPy
    arrays become pointers to their data; they must be C-contiguous and of the right dtype,
    which the caller ensures) and returns the function's status; ``schedule(name)`` sets the
    block schedule (concurrent, serial_forward, serial_reverse)."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.structs = parse_params(PARAMS_H)
        self.lib.mf_emu_set_schedule.argtypes = [ctypes.c_int]
        self.lib.mf_emu_set_schedule.restype = ctypes.c_int

    def schedule(self, name):
        assert self.lib.mf_emu_set_schedule(SCHEDULES[name]) >= 0

    def call(self, function, struct_name, **fields):
        params = self.structs[struct_name]()
        for key, value in fields.items():
            assert hasattr(params, key), f"{struct_name} has no field {key}"
            if isinstance(value, np.ndarray):
                assert value.flags.c_contiguous, key
                value = value.ctypes.data
            setattr(params, key, value)
        fn = getattr(self.lib, function)
        fn.argtypes = [ctypes.POINTER(self.structs[struct_name]), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        return fn(ctypes.byref(params), None)
