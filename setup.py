"""Build of the C core `mapformer._C`.

Sources: csrc/ops/*.c and csrc/ops/portable/*.c (every platform), csrc/ops/x86/*.c (x86-64
only: each file compiled for its instruction set, `*_avx512.c` with -mavx512f -mavx512dq
-mavx512bw -mavx512vl -mavx2 -mfma and `*_avx2.c` with -mavx2 -mfma; which one runs is picked
at run time, mapformer/cpu.h), and csrc/python/*.c (the binding).

CBLAS comes from the scipy-openblas32 wheel (a build and run dependency; its symbols carry the
prefix ``scipy_``), or from a system OpenBLAS when ``MAPFORMER_BLAS=system`` is set. OpenMP
comes from the compiler (gcc: libgomp; clang: libomp). ``CC=clang pip install .`` builds with
clang.

The built extension is also copied into the source tree's ``mapformer/`` (an in-place build on
install), so that ``python -m mapformer`` and ``import mapformer`` run from the repository root,
where the source package shadows the installed one, find it too.

CUDA (``MAPFORMER_CUDA=off|auto|on``, default off): with ``on``, or ``auto`` when nvcc is
found (``NVCC``, else ``nvcc`` on PATH, else ``$CUDA_HOME/bin/nvcc``), cuda/*.cu are compiled by
nvcc for sm_80 and sm_90 and linked (CUDA runtime linked statically: no libcudart needed at run
time, only the driver) into ``mapformer/libmapformer_cuda.so``, a plain shared library that
mapformer/backend.py loads with ctypes; the C extension is unchanged. ``auto`` never fails the
install: without nvcc, or when nvcc fails, it says so and builds the CPU package alone. Off by
default because the CUDA build costs more than the CPU build (.ci/cuda_check times it).
"""
import glob
import json
import os
import platform
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
X86 = platform.machine().lower() in ("x86_64", "amd64")
ISA_FLAGS = {
    "_avx512.c": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma"],
    "_avx2.c": ["-mavx2", "-mfma"],
}
# C11, no warnings; -ffp-contract=off: every a * b + c is two roundings (explicit fused
# multiply-adds only, mapformer/simd.h), whatever the compiler's default; -fno-math-errno lets
# sqrtf vectorise and changes no result (unlike -ffast-math, never used).
COMPILE_ARGS = ["-std=c11", "-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-Wall",
                "-Wextra"]


def blas_config():
    """Return (include_dirs, library_dirs, libraries, define_macros, extra_link_args) for CBLAS."""
    if os.environ.get("MAPFORMER_BLAS", "scipy-openblas32") == "system":
        return [], [], ["openblas"], [], []
    import scipy_openblas32 as sob

    lib_dir = sob.get_lib_dir()
    return (
        [sob.get_include_dir()],
        [lib_dir],
        [sob.get_library()],
        [("MF_BLAS_PREFIX", "scipy_")],
        # Found at run time next to this package (same site-packages); mapformer/__init__.py
        # also imports scipy_openblas32 first, which loads the library by soname.
        ["-Wl,-rpath,$ORIGIN/../scipy_openblas32/lib"],
    )


def isa_flags(source):
    return next((flags for suffix, flags in ISA_FLAGS.items() if source.endswith(suffix)), [])


def up_to_date(obj, source, depends, command):
    """Whether ``obj`` was built by this exact ``command`` (its record, ``obj + ".cmd"``) and is
    newer than ``source`` and every header in ``depends``."""
    record = obj + ".cmd"
    if not (os.path.exists(obj) and os.path.exists(record)):
        return False
    with open(record) as f:
        if f.read() != command:
            return False
    built = os.path.getmtime(obj)
    return all(os.path.getmtime(path) < built for path in [source, *depends])


def compile_in_parallel(compiler):
    """Make ``compiler.compile`` compile its sources on every core (setuptools compiles the
    sources of one extension one after another) and skip an object that is up to date (same
    command, newer than its source and every header), so that editing one .c file recompiles
    that file alone; ``build_ext --force`` recompiles everything."""
    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        command = repr((compiler.compiler_so, cc_args, extra_postargs))

        def one(obj):
            source, suffix = build[obj]
            if not compiler.force and up_to_date(obj, source, depends or [], command):
                return
            compiler._compile(obj, source, suffix, cc_args, extra_postargs, pp_opts)
            with open(obj + ".cmd", "w") as f:
                f.write(command)

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(one, [obj for obj in objects if obj in build]))
        return objects

    compiler.compile = compile


CUDA_ARCHS = ("80", "90")
NVCC_ARGS = ["-std=c++17", "-O3", "--fmad=false", "-Xcompiler", "-fPIC,-Wall,-Wextra",
             "-Icsrc/include", "-Icuda"] + [f"-gencode=arch=compute_{a},code=sm_{a}"
                                             for a in CUDA_ARCHS]


def find_nvcc():
    """The nvcc to use, or None."""
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def build_cuda(out_dir, temp_dir):
    """Compile cuda/*.cu with nvcc into out_dir/libmapformer_cuda.so as MAPFORMER_CUDA asks;
    return the library's path, or None when not built."""
    import subprocess

    mode = os.environ.get("MAPFORMER_CUDA", "off").lower()
    if mode not in ("off", "auto", "on"):
        raise SystemExit(f"MAPFORMER_CUDA must be off, auto or on, got {mode!r}")
    if mode == "off":
        return None
    nvcc = find_nvcc()
    if nvcc is None:
        if mode == "on":
            raise SystemExit("MAPFORMER_CUDA=on but nvcc was not found: install the CUDA "
                             "Toolkit, or set NVCC or CUDA_HOME")
        print("MAPFORMER_CUDA=auto: nvcc not found, building the CPU package only")
        return None
    sources = sorted(glob.glob(os.path.join("cuda", "*.cu")))
    os.makedirs(temp_dir, exist_ok=True)
    objects = [os.path.join(temp_dir, os.path.basename(s) + ".o") for s in sources]
    library = os.path.join(out_dir, "libmapformer_cuda.so")
    try:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(lambda so: subprocess.run([nvcc, *NVCC_ARGS, "-c", so[0], "-o", so[1]],
                                                    check=True), zip(sources, objects)))
        subprocess.run([nvcc, "-shared", "--cudart=static", *objects, "-ldl", "-o", library],
                       check=True)
        # the parameter structs' layout, read by mapformer/cuda.py at run time: params.h with
        # the family headers it includes in their place
        with open(os.path.join(out_dir, "params.h"), "w") as f:
            f.write(flat_params_h())
    except (subprocess.CalledProcessError, OSError) as error:
        if mode == "on":
            raise
        print(f"MAPFORMER_CUDA=auto: the CUDA build failed ({error}); CPU package only")
        return None
    return library


def flat_params_h():
    """csrc/include/mapformer/params.h with the family headers it includes in their place: the
    one file a CUDA build installs beside its library for mapformer/cuda.py to read."""
    include = os.path.join("csrc", "include", "mapformer")

    def family(match):
        with open(os.path.join(include, "ops", match.group(1) + ".h")) as f:
            return f.read()
    with open(os.path.join(include, "params.h")) as f:
        return re.sub(r'^#include "mapformer/ops/(\w+)\.h"$', family, f.read(), flags=re.M)


def source_commit():
    """{"commit", "dirty"} of the checkout being built, None when the source tree is not the
    top of a git checkout (an sdist, a copy). An installed mapformer reports it in every
    record's provenance (mapformer.experiments.records.git_state), having no checkout of its
    own to ask."""
    def git(*args):
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                              timeout=30)
    try:
        top = git("rev-parse", "--show-toplevel")
        head = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if (top.returncode or head.returncode or status.returncode
            or os.path.realpath(top.stdout.strip()) != os.path.realpath(ROOT)):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


class BuildExt(build_ext):
    """Compiles the ISA kernel files with their own flags, links them into the extension, and
    copies the built extension into the source tree; builds the CUDA library when asked. An
    installed build also carries the commit it was built from (mapformer/_build.json)."""

    def run(self):
        super().run()
        out_dir = os.path.join(ROOT if self.inplace else self.build_lib, "mapformer")
        commit = source_commit()
        if not self.inplace and commit is not None:
            with open(os.path.join(out_dir, "_build.json"), "w") as f:
                json.dump(commit, f)
        library = build_cuda(out_dir, os.path.join(self.build_temp, "cuda"))
        if library is not None and not self.inplace:
            for built in (library, os.path.join(out_dir, "params.h")):
                target = os.path.join(ROOT, "mapformer", os.path.basename(built))
                if os.access(os.path.dirname(target), os.W_OK):
                    shutil.copyfile(built, target)

    def build_extension(self, ext):
        compile_in_parallel(self.compiler)
        objects = []
        for flags in ISA_FLAGS.values():
            sources = [s for s in ext.isa_sources if isa_flags(s) is flags]
            objects += self.compiler.compile(
                sources, output_dir=self.build_temp, macros=ext.define_macros,
                include_dirs=ext.include_dirs, debug=self.debug,
                extra_postargs=ext.extra_compile_args + flags, depends=ext.depends)
        ext.extra_objects = objects
        super().build_extension(ext)
        if not self.inplace:
            built = self.get_ext_fullpath(ext.name)
            target = os.path.join(ROOT, *ext.name.split(".")[:-1], os.path.basename(built))
            if os.path.isdir(os.path.dirname(target)) and os.access(os.path.dirname(target),
                                                                    os.W_OK):
                shutil.copyfile(built, target)


blas_inc, blas_libdirs, blas_libs, blas_macros, blas_link = blas_config()

extension = Extension(
    "mapformer._C",
    sources=sorted(glob.glob("csrc/ops/*.c")) + sorted(glob.glob("csrc/ops/portable/*.c"))
    + sorted(glob.glob("csrc/python/*.c")),
    include_dirs=["csrc/include", numpy.get_include(), *blas_inc],
    library_dirs=blas_libdirs,
    libraries=blas_libs,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"), *blas_macros],
    extra_compile_args=COMPILE_ARGS,
    extra_link_args=["-fopenmp", *blas_link],
    depends=sorted(glob.glob("csrc/include/mapformer/*.h"))
    + sorted(glob.glob("csrc/include/mapformer/ops/*.h"))
    + sorted(glob.glob("csrc/ops/kernels/*.h")) + sorted(glob.glob("csrc/python/*.h")),
)
extension.isa_sources = sorted(glob.glob("csrc/ops/x86/*.c")) if X86 else []

setup(ext_modules=[extension], cmdclass={"build_ext": BuildExt})
