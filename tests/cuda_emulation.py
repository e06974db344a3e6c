"""The CUDA kernels (cuda/*.cu) run on the CPU: compiled by the host C++ compiler against
cuda/emulate/ (CUDA's execution model: blocks one after another, a block's threads as
concurrent OpenMP threads, __syncthreads as their barrier; cuda/common.cuh) into one shared
library, loaded with ctypes. The kernels' public functions take the same parameter structs
as the C ops; their ctypes twins are read from csrc/include/mapformer/params.h itself
(mapformer.cuda.parse_params).

The library is built once per source state into build/cuda_emulation/<hash>/ (CXX, default
g++): later runs reuse it.

With MAPFORMER_CUDA_TESTS=gpu, :func:`kernels` returns :class:`Device` instead: the same
interface over the nvcc-built library on a GPU (a MAPFORMER_CUDA=on build and CuPy), so the
kernel tests (test_cuda_ops, test_cuda_attention_family, test_cuda_scans, test_cuda_vq_lstm,
test_cuda_model, test_cuda_backend) run unchanged on a real device: `.ci/gpu_check`."""
import ctypes
import functools
import glob
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np

from mapformer import cuda
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


def invoke(kernels, function, struct_name, fields, pointer, stream):
    """Fill ``kernels.structs[struct_name]`` from ``fields`` (each NumPy array, C-contiguous,
    as the address ``pointer(key, array)``) and call ``kernels.lib``'s ``function`` on it and
    ``stream``; its status."""
    params = kernels.structs[struct_name]()
    for key, value in fields.items():
        assert hasattr(params, key), f"{struct_name} has no field {key}"
        if isinstance(value, np.ndarray):
            assert value.flags.c_contiguous, key
            value = pointer(key, value)
        setattr(params, key, value)
    fn = getattr(kernels.lib, function)
    fn.argtypes = [ctypes.POINTER(kernels.structs[struct_name]), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn(ctypes.byref(params), stream)


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
        return invoke(self, function, struct_name, fields, lambda key, a: a.ctypes.data, None)

    def ops(self):
        """mapformer.cuda.ops on this library with NumPy arrays."""
        return cuda.ops(self.lib, np, params_h=PARAMS_H)


class Device:
    """The nvcc-built library on the GPU with :class:`Emulation`'s interface. ``call`` copies
    the NumPy arrays among ``fields`` to the device, runs the function on CuPy's current stream,
    waits for it, and copies every array back into the caller's (outputs, and gradients added
    to in place, land where the emulation puts them; an output the kernel never wrote keeps the
    caller's NaN poison). ``schedule`` only checks the name: a GPU has one schedule, so tests
    that compare the three schedules' bits compare three GPU runs, which must agree."""

    def __init__(self):
        self.lib, self.cupy = cuda.load()
        self.structs = parse_params(PARAMS_H)
        # every array its own cudaMalloc (no pool): compute-sanitizer's memcheck then sees
        # each array's own bounds, not a pool chunk's
        self.cupy.cuda.set_allocator(None)

    def schedule(self, name):
        assert name in SCHEDULES, name

    def stream(self):
        return self.cupy.cuda.get_current_stream()

    def call(self, function, struct_name, **fields):
        on_device = {}

        def pointer(key, a):
            on_device[key] = self.cupy.asarray(a)
            return on_device[key].data.ptr
        status = invoke(self, function, struct_name, fields, pointer, self.stream().ptr)
        self.stream().synchronize()
        for key, array in on_device.items():
            if fields[key].flags.writeable:
                fields[key][...] = array.get()
        return status

    def ops(self):
        """mapformer.cuda.ops on CuPy arrays behind NumPy ones: each op's array arguments go to
        the device, its results come back as NumPy arrays, and arguments it changed in place
        (gradient accumulators, optimizer state) are copied back into the caller's arrays."""
        cupy = self.cupy
        gpu = cuda.ops(self.lib, cupy, lambda: self.stream().ptr, params_h=PARAMS_H)

        def to_host(result):
            if isinstance(result, cupy.ndarray):
                return result.get()
            if isinstance(result, (tuple, list)):
                return type(result)(to_host(r) for r in result)
            return result

        def device_copy(a):
            """a on the device with a's strides (a view with positive strides stays a strided
            view, so the wrappers' contiguity checks see what they see on the host; a negative
            stride becomes a contiguous copy)."""
            d = cupy.asarray(a)
            if a.flags.c_contiguous or a.size == 0 or min(a.strides) < 0:
                return d
            extent = sum((n - 1) * s for n, s in zip(a.shape, a.strides)) + a.itemsize
            view = cupy.ndarray(a.shape, a.dtype, cupy.empty(extent, cupy.uint8).data,
                                strides=a.strides)
            view[...] = d
            return view

        def on_host(op):
            @functools.wraps(op)
            def wrapped(*args, **kwargs):
                moved = []

                def to_device(a):
                    if isinstance(a, np.ndarray):
                        moved.append((a, device_copy(a)))
                        return moved[-1][1]
                    if isinstance(a, list):
                        return [to_device(x) for x in a]
                    return a
                result = op(*[to_device(a) for a in args],
                            **{k: to_device(v) for k, v in kwargs.items()})
                result = to_host(result)
                for host, device in moved:
                    if host.flags.writeable:
                        host[...] = device.get()
                return result
            return wrapped
        return SimpleNamespace(**{name: on_host(op) for name, op in vars(gpu).items()})


def kernels():
    """The kernels the CUDA tests run: :class:`Emulation` of a fresh or cached build, or with
    MAPFORMER_CUDA_TESTS=gpu the :class:`Device` (a RuntimeError there when the CUDA build,
    CuPy or the GPU is missing: the run asked for a GPU, so nothing is skipped)."""
    target = os.environ.get("MAPFORMER_CUDA_TESTS", "emulation")
    if target not in ("emulation", "gpu"):
        raise ValueError(f"MAPFORMER_CUDA_TESTS must be emulation or gpu, got {target!r}")
    return Device() if target == "gpu" else Emulation(build())
