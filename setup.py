"""Build of the C core `mapformer._C`.

CBLAS comes from the scipy-openblas32 wheel (a build and run dependency; its symbols carry the
prefix ``scipy_``), or from a system OpenBLAS when ``MAPFORMER_BLAS=system`` is set. OpenMP
comes from the compiler (gcc: libgomp).
"""
import glob
import os

import numpy
from setuptools import Extension, setup


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


blas_inc, blas_libdirs, blas_libs, blas_macros, blas_link = blas_config()

extension = Extension(
    "mapformer._C",
    sources=sorted(glob.glob("csrc/ops/*.c")) + sorted(glob.glob("csrc/python/*.c")),
    include_dirs=["csrc/include", numpy.get_include(), *blas_inc],
    library_dirs=blas_libdirs,
    libraries=blas_libs,
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION"), *blas_macros],
    # -fno-math-errno lets sqrtf vectorise; it changes no result (unlike -ffast-math).
    extra_compile_args=["-std=c11", "-O3", "-fopenmp", "-fno-math-errno", "-Wall", "-Wextra"],
    extra_link_args=["-fopenmp", *blas_link],
    depends=sorted(glob.glob("csrc/include/mapformer/*.h")) + sorted(glob.glob("csrc/python/*.h")),
)

setup(ext_modules=[extension])
