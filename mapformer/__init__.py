"""mapformer: sequence models that learn cognitive maps, on a C core.

The C extension ``mapformer._C`` computes every op's forward and backward; NumPy holds the
arrays. ``scipy_openblas32`` is imported first: it loads the OpenBLAS the extension links to.
"""
import scipy_openblas32  # noqa: F401  (loads libscipy_openblas before _C needs it)

try:
    from . import _C
except ModuleNotFoundError as exc:  # only when the build is missing
    raise ImportError(
        "mapformer's C extension is not built. Install the package with `pip install .` "
        "from the repository root (it compiles csrc/ with OpenMP and OpenBLAS)."
    ) from exc
except ImportError:  # the core refused its environment (MAPFORMER_KERNELS, MAPFORMER_POOL_MB):
    pass  # each import of mapformer._C raises it again, so `python -m mapformer` reports it

__version__ = "0.1.0"
