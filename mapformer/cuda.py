"""The CUDA kernels (cuda/*.cu) as ops with the C backend's signatures, on device arrays.

``setup.py`` builds the kernels with ``MAPFORMER_CUDA=on`` (nvcc, sm_80 and sm_90) into
``mapformer/libmapformer_cuda.so``, a plain shared library whose functions take the C ops'
parameter structs (``csrc/include/mapformer/params.h`` and the family headers it includes,
written next to the library by the build as one file) plus a stream. :func:`ops` wraps them
for an array module ``xp``: CuPy on a GPU (pointers from ``a.data.ptr``, CuPy's current
stream), or NumPy with the library compiled for the CPU emulation of CUDA's model
(tests/cuda_emulation.py), which is how the wrappers are tested on machines without a GPU.

Every op whose kernel the library has (``<op>_cuda``) is an op of :func:`ops`, interpreted
from the op's table (``mapformer._C.signatures()``: the C binding's argument rows, so the
shapes, dtypes, defaults and ranges are checked as the C ops check them, in the C binding's
words); what a table cannot say (an id range on a device array, a default scale, a kernel's
scratch) are the small hooks CHECKS, PINS and SCRATCH. ``mapformer.backend.get("cuda")``
builds the model-level backend on them, or says what is missing.
"""
import ctypes
import math
import os
import re
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(HERE, "libmapformer_cuda.so")
PARAMS_H = [os.path.join(HERE, "params.h"),
            os.path.join(os.path.dirname(HERE), "csrc", "include", "mapformer", "params.h")]
HOW_TO_BUILD = ("build the CUDA kernels and install CuPy: MAPFORMER_CUDA=on pip install "
                "'.[cuda]' (needs the CUDA Toolkit's nvcc; cupy-cuda13x, or '.[cuda12]' for a "
                "CUDA 12 toolkit and driver)")

_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "int64_t": ctypes.c_int64,
           "int32_t": ctypes.c_int32, "int": ctypes.c_int}


def read_params(path):
    """params.h's text with the family headers it includes (``#include "mapformer/ops/X.h"``,
    found in ``ops/`` beside it) put in their place; a CUDA build's copy has them in place
    already."""
    here = os.path.dirname(path)
    with open(path) as f:
        text = f.read()

    def family(match):
        with open(os.path.join(here, "ops", match.group(1) + ".h")) as header:
            return header.read()
    return re.sub(r'^#include "mapformer/ops/(\w+)\.h"$', family, text, flags=re.M)


def parse_params(path):
    """{name: ctypes.Structure} for every ``typedef struct {...} Mf*Params;`` of params.h and
    its family headers (pointers become void pointers): the layout is the headers' own, never
    a copy of it."""
    text = re.sub(r"/\*.*?\*/", "", read_params(path), flags=re.S)
    structs = {}
    for body, name in re.findall(r"typedef struct \{(.*?)\}\s*(\w+);", text, flags=re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            base, rest = re.sub(r"\bconst\b", "", decl).split(None, 1)
            for item in (i.strip() for i in rest.split(",")):
                fields.append((item.lstrip("*").strip(),
                               ctypes.c_void_p if item.startswith("*") else _CTYPES[base]))
        structs[name] = type(name, (ctypes.Structure,), {"_fields_": fields})
    return structs


def load():
    """(library, cupy): the nvcc-built library and CuPy with a GPU; RuntimeError saying how to
    get them when any is missing."""
    if not os.path.exists(LIBRARY):
        raise RuntimeError(f"mapformer was built without CUDA ({LIBRARY} is missing): "
                           + HOW_TO_BUILD)
    try:
        import cupy
    except ImportError:
        raise RuntimeError("the CUDA backend needs CuPy, which is not installed: "
                           + HOW_TO_BUILD) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        raise RuntimeError(f"no usable CUDA device ({error})") from None
    if count < 1:
        raise RuntimeError("no CUDA device found")
    gemm = os.environ.get("MAPFORMER_CUDA_GEMM", "cublas")
    if gemm not in ("cublas", "tiled"):
        raise RuntimeError(f"MAPFORMER_CUDA_GEMM must be cublas or tiled, got {gemm!r}")
    try:  # CuPy loads its cuBLAS, which cuda/blas.cu then finds by soname for the products
        cupy.cuda.device.get_cublas_handle()
    except Exception:  # noqa: BLE001 (CuPy without cuBLAS: the products run on the kernels' tiles)
        pass
    return ctypes.CDLL(LIBRARY), cupy


def products(lib):
    """'cublas' or 'tiled': the path of the kernels' matrix products in ``lib`` (cuda/blas.cu:
    cuBLAS when it could be loaded and MAPFORMER_CUDA_GEMM is not 'tiled'; the tiles of
    cuda/gemm.cuh otherwise, and always under the CPU emulation)."""
    lib.mf_blas_library.restype = ctypes.c_int
    return ("tiled", "cublas")[lib.mf_blas_library()]


def describe():
    """One line for ``python -m mapformer info``: the GPU the CUDA backend would run on and
    the path of its products, or why it cannot run here."""
    try:
        lib, cupy = load()
    except (RuntimeError, OSError) as error:
        return f"unavailable: {error}"
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    return (f"{name} (CuPy {cupy.__version__}), matrix products on {products(lib)} "
            "(MAPFORMER_CUDA_GEMM=tiled for the kernels' own)")


def _pointer(a):
    if a is None:
        return None
    data = a.data
    return data.ptr if hasattr(data, "ptr") else a.ctypes.data


def declared_structs(path):
    """{op: its params struct's name} as the family headers declare them (``int
    op(const MfXParams *p);``)."""
    return dict(re.findall(r"\bint (\w+)\(const (Mf\w+Params) \*p\);", read_params(path)))


def _dims_text(dims):
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


class _Letters:
    """The sizes of one call by letter, each fixed by the first array (in table order) that has
    it, as the C binding's checker (csrc/python/bind.c) fixes them: a later array must match,
    and the error, the C binding's own, names it, the axis and the shape in letters."""

    def __init__(self):
        self.size, self.source, self.pinned = {}, {}, set()
        self.ellipsis = self.ellipsis_from = None

    def pin(self, letter, value, source, by_hook=True):
        self.size[letter], self.source[letter] = int(value), source
        if by_hook:
            self.pinned.add(letter)

    def want_text(self, arg):
        if arg.letters == ("...",):
            return "(...)"
        tokens = []
        for token in arg.letters:
            letter, half = (token[:-2], True) if token.endswith("/2") else (token, False)
            tokens.append(str(self.size[letter] // 2 if half else self.size[letter])
                          if letter in self.pinned else token)
        return _dims_text(tokens)

    def error(self, arg, shape, detail):
        return ValueError(f"{arg.name} must have shape {self.want_text(arg)}{detail}, got shape "
                          f"{_dims_text(shape)}")

    def match(self, arg, shape):
        want, any_shape = arg.letters, arg.letters == ("...",)
        if (len(shape) < 1) if any_shape else (len(shape) != len(want)):
            raise self.error(arg, shape, " with ndim >= 1" if any_shape
                             else f" ({len(want)} axes)")
        if any(d < 1 for d in shape):
            raise self.error(arg, shape, " with no empty axis")
        if any_shape:
            if self.ellipsis is None:
                self.ellipsis, self.ellipsis_from = tuple(shape), arg.name
            elif tuple(shape) != self.ellipsis:
                raise self.error(arg, shape, f" equal to {self.ellipsis_from}'s, "
                                             f"{_dims_text(self.ellipsis)}")
            return
        for axis, (token, got) in enumerate(zip(want, shape)):
            letter, half = (token[:-2], True) if token.endswith("/2") else (token, False)
            if letter not in self.size:  # "D/2" first: D is twice the axis
                self.pin(letter, 2 * got if half else got, arg.name, by_hook=False)
                continue
            value = self.size[letter] // 2 if half else self.size[letter]
            if got != value:
                raise self.error(arg, shape, f"; axis {axis} ({token}) is {got} but must be "
                                             f"{value}: {letter} = {self.size[letter]} from "
                                             f"{self.source[letter]}")

    def shape(self, arg):
        if arg.letters == ("...",):
            return self.ellipsis
        return tuple(self.size[t[:-2]] // 2 if t.endswith("/2") else self.size[t]
                     for t in arg.letters)

    def value(self, letter):
        if letter == "...":
            return int(np.prod(self.ellipsis))
        return self.size[letter]


def _scalar(arg, value):
    """A scalar row's struct value: a float in its range, an int >= its least value, or a
    choice's index; ValueError / TypeError naming the argument."""
    if arg.kind == "choice":
        if not isinstance(value, str) or value not in arg.choices:
            raise ValueError(f"{arg.name} must be one of {', '.join(map(repr, arg.choices))}, "
                             f"got {value!r}")
        return arg.choices.index(value)
    if arg.kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{arg.name} must be an int >= {arg.low}, got {value!r}")
        if value < arg.low:
            raise ValueError(f"{arg.name} must be an int >= {arg.low}, got {value}")
        return int(value)
    if value is None and arg.accepts_none:
        return None  # the op's default, filled by its hook
    if isinstance(value, (complex, np.complexfloating)) or not isinstance(
            value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{arg.name} must be a real number, got {type(value).__name__}")
    x = float(value)
    low_ok = x > arg.low if arg.low_open else x >= arg.low
    high_ok = x < arg.high if arg.high_open else x <= arg.high
    if not (low_ok and high_ok and not math.isnan(x)):
        raise ValueError(f"{arg.name} must be in {'(' if arg.low_open else '['}{arg.low:g}, "
                         f"{arg.high:g}{')' if arg.high_open else ']'}, got {value!r}")
    return x


# ---- what the tables cannot say: per-op checks, pins and scratch (the C binding's hooks) ----

def _default_scale(fields, letters):
    if fields.get("scale") is None:
        fields["scale"] = 1.0 / math.sqrt(letters.value("D"))


def _ids_in(ids, low, high, message):
    """ValueError ``message`` unless every id is in [low, high) (the kernels cannot check a
    device array before they run)."""
    if ids.size and (int(ids.min()) < low or int(ids.max()) >= high):
        raise ValueError(message)


def _masked(xp, fields, letters, values):
    """the attention ops' mask and prefix (MF_MASK_PREFIX = 2: the prefix required; otherwise
    refused), the prefix's range checked"""
    prefix, B, T = fields.get("prefix"), letters.value("B"), letters.value("T")
    if fields["mask"] == 2 and prefix is None:
        raise ValueError("prefix (int32 (B,), the prefix lengths) is required with "
                         "mask='prefix'")
    if fields["mask"] != 2 and prefix is not None:
        raise ValueError(f"prefix is read only with mask='prefix', got mask={values['mask']!r}")
    if prefix is not None:
        _ids_in(prefix, 0, T + 1, f"prefix must be (B,) = ({B},) int32 in [0, T = {T}]")


def _pair_factor(xp, fields, letters):
    """attention's per-pair logit factor: pos_ids and pair_factor both or neither, N in [1,
    4096], the factors finite and the ids in [0, N)"""
    ids, factor = fields.get("pos_ids"), fields.get("pair_factor")
    if (ids is None) != (factor is None):
        raise ValueError(f"{'pos_ids' if ids is None else 'pair_factor'} is required with "
                         f"{'pair_factor' if ids is None else 'pos_ids'} (a per-pair logit "
                         "factor takes both)")
    if factor is None:
        return
    N = letters.value("N")
    if not 1 <= N <= 4096:
        raise ValueError(f"pair_factor must be (N, N) with N in [1, 4096], got N = {N}")
    if not bool(xp.isfinite(factor).all()):
        raise ValueError("pair_factor must be finite (it would reach the backward's masked "
                         "pairs as 0 * inf)")
    _ids_in(ids, 0, N, f"pos_ids must be (B, T) int32 in [0, N = {N})")
    fields["npos"] = N


def _attention(xp, fields, letters, values):
    _masked(xp, fields, letters, values)
    _pair_factor(xp, fields, letters)
    _default_scale(fields, letters)


def _conj_attention(xp, fields, letters, values):
    _masked(xp, fields, letters, values)
    _default_scale(fields, letters)


def _attention_decode(xp, fields, letters, values):
    _default_scale(fields, letters)
    if fields["Tk"] == 0:  # keys omitted: all of k's positions
        fields["Tk"] = letters.value("T")


def _scan(xp, fields, letters, values):
    """the scans (the C binding's scan_check): the complex scans' state floats S = 2K; at most
    256 state floats per channel; the chunk count NC = ceil(T / min(chunk, T)) of states,
    pinned for the forward's new ones, checked for the backward's; chunk clamped to T; and
    delta_bias's gradient with delta_bias and only then"""
    T, chunk = letters.value("T"), fields["chunk"]
    cx = "S" in letters.size
    if cx:
        fields["K"] = letters.value("S") // 2
    K = fields["K"]
    if (2 * K if cx else K) > 256:
        raise ValueError(f"A has K = {K} states: at most {128 if cx else 256}"
                         + (" complex states (2K <= 256 floats)" if cx else ""))
    NC = -(-T // min(chunk, T))
    if "NC" not in letters.size:
        letters.pin("NC", NC, "chunk")
    elif letters.size["NC"] != NC:
        raise ValueError(f"states has {letters.size['NC']} chunks on axis 1, but T = {T} and "
                         f"chunk = {chunk} give {NC}")
    fields["chunk"] = min(chunk, T)
    if "ddelta_bias" in values and (values["delta_bias"] is None) != (
            values["ddelta_bias"] is None):
        raise ValueError("ddelta_bias is required with delta_bias (its gradient is "
                         "accumulated there)" if values["delta_bias"] is not None else
                         "ddelta_bias is given without delta_bias")


def _conv_backward(xp, fields, letters, values):
    if (values["bias"] is None) == (values["activation"] == "silu"):
        raise ValueError("bias is required with activation='silu', and read only then")


def _ape_index(xp, fields, letters, values):
    P = letters.value("P")
    _ids_in(fields["index"], 0, P, f"index entries must be in [0, P = {P})")


def _vq_indices(xp, fields, letters, values):
    K = letters.value("K")
    _ids_in(fields["indices_in"], 0, K, f"vq_backward: indices must be ids in [0, {K})")


CHECKS = {"attention_forward": _attention, "attention_backward": _attention,
          "conj_attention_forward": _conj_attention, "conj_attention_backward": _conj_attention,
          "cope_forward": lambda xp, f, l, v: _default_scale(f, l),
          "cope_backward": lambda xp, f, l, v: _default_scale(f, l),
          "attention_decode_forward": _attention_decode,
          **{f"{s}_{d}": _scan for s in ("selective_scan", "complex_scan")
             for d in ("forward", "backward")},
          "causal_conv1d_backward": _conv_backward, "ape_apply_forward": _ape_index,
          "ape_apply_backward": _ape_index, "vq_backward": _vq_indices}
# letters a hook fixes before the arrays are matched (the C binding's prepare hooks): the
# conjunctive attention's lse planes by its mode
PINS = {f"conj_attention_{d}": lambda letters, values: letters.pin(
    "M", 2 if values["mode"] == "softmax_product" else 1, "mode") for d in ("forward", "backward")}


# the CUDA kernels' scratch in floats by the call's letters (the CPU ops' own differ); an op
# missing here takes none. "lib:<fn>": the library's own size function of the params.
SCRATCH = {
    "attention_backward": lambda L: L.value("B") * L.value("H") * L.value("T"),
    "conj_attention_backward": lambda L: L.value("B") * L.value("H") * L.value("T"),
    "mlp_forward": lambda L: L.value("N") * L.value("F"),
    "mlp_backward": lambda L: 2 * L.value("N") * L.value("F"),
    "lstm_backward": lambda L: (L.value("B") * L.value("T") * 5 * L.value("H")
                                + 2 * L.value("B") * L.value("H")),
    "vq_forward": lambda L: L.value("M") * L.value("K") + L.value("N") * L.value("K"),
    "path_integration_backward": lambda L: 2 * L.value("B") * L.value("H") * L.value("NB"),
    "cope_forward": "lib:cope_forward_cuda_scratch_floats",
    "cope_backward": "lib:cope_backward_cuda_scratch_floats",
    "selective_scan_backward": "lib:selective_scan_backward_scratch_floats_cuda",
    "complex_scan_backward": "lib:complex_scan_backward_scratch_floats_cuda",
}


def ops(lib, xp, stream=lambda: None, params_h=None):
    """SimpleNamespace of every op whose kernel ``lib`` has (``<op>_cuda``), each with the C
    op's signature (mapformer._C's docstrings) and its table's checks (``_C.signatures()``:
    mapformer.signatures; the kernels index every array by the sizes the letters fix),
    running ``lib``'s kernels on arrays of ``xp`` on the stream handle ``stream()`` returns
    (an int or None). Arrays read are made C-contiguous float32 (int32 ids, uint8 masks);
    arrays written in place must be float32, C-contiguous and of their shape; an op's error
    status raises ValueError naming the op. params_h: the params.h that ``lib`` was compiled
    with (default: the copy a CUDA build installs beside this module, else the source
    tree's)."""
    from .signatures import signatures

    path = params_h or next((p for p in PARAMS_H if os.path.exists(p)), None)
    if path is None:
        raise RuntimeError(f"mapformer.cuda: no params.h beside the package or in a source "
                           f"tree (a CUDA build installs one): {HOW_TO_BUILD}")
    structs, struct_of = parse_params(path), declared_structs(path)
    dtypes = {"float32": xp.float32, "int32": xp.int32, "bool": xp.uint8}

    def call(function, struct, fields):
        params = structs[struct]()
        for key, value in fields.items():
            if xp is not np and isinstance(value, np.ndarray):
                raise TypeError(f"{function}: {key} is a NumPy array, a host pointer to the "
                                f"kernel: pass {xp.__name__} arrays")
            setattr(params, key, _pointer(value) if hasattr(value, "shape") else value)
        fn = getattr(lib, function)
        fn.argtypes = [ctypes.POINTER(structs[struct]), ctypes.c_void_p]
        fn.restype = ctypes.c_int
        status = fn(ctypes.byref(params), stream())
        if status != 0:
            raise ValueError(f"{function}: status {status} (1: bad sizes or scalars, "
                             "3: an id out of range, 4: CUDA refused the launch)")

    def scratch_floats(op, struct, letters, fields):
        how = SCRATCH[op]
        if not isinstance(how, str):
            return int(how(letters))
        size = getattr(lib, how[len("lib:"):])
        size.argtypes, size.restype = [ctypes.POINTER(structs[struct])], ctypes.c_int64
        params = structs[struct](**{k: v for k, v in fields.items()
                                    if not hasattr(v, "shape") and v is not None})
        return int(size(ctypes.byref(params)))

    def device_array(arg, value):
        """``value`` as a C-contiguous array of the row's dtype; ids must be integers that fit
        int32 (TypeError / ValueError naming the argument: a cast would wrap 2**32 + 3 to 3)"""
        raw = xp.asarray(value)
        if arg.dtype == "float32" and raw.dtype.kind != "f":
            raise TypeError(f"{arg.name} must be a float array (float32), got {raw.dtype}")
        if arg.dtype == "int32" and raw.dtype != xp.int32:
            if raw.dtype.kind not in "iu":
                raise TypeError(f"{arg.name} must hold integers (int32), got {raw.dtype}")
            if raw.size and (int(raw.min()) < -2**31 or int(raw.max()) >= 2**31):
                raise ValueError(f"{arg.name} holds ids outside int32's range")
        return xp.ascontiguousarray(raw, dtype=dtypes[arg.dtype])

    def kernel_op(sig):
        struct, function = struct_of[sig.name], f"{sig.name}_cuda"

        def op(*args, **kwargs):
            values = sig.bind(args, kwargs)
            positional = [a.name for a in sig.parameters if not a.kwonly]
            given = set(positional[:len(args)]) | set(kwargs)
            letters, fields, outs = _Letters(), {}, {}
            for a in sig.args:  # an omitted one takes its default unchecked, as in the binding
                if a.kind in ("float", "int", "choice"):
                    fields[a.field] = (_scalar(a, values[a.name]) if a.name in given else
                                       a.choices.index(a.default) if a.kind == "choice" else
                                       a.default)
            if sig.name in PINS:
                PINS[sig.name](letters, values)
            for a in sig.args:
                if not a.is_array or a.kind == "out" or values.get(a.name) is None:
                    if a.is_array and a.pos and a.kind != "out_or_into":
                        fields[a.field] = None
                    continue
                value = values[a.name]
                if a.kind in ("inout", "out_or_into"):  # written in place: as given
                    if not hasattr(value, "shape") or value.dtype != xp.float32:
                        raise TypeError(f"{a.name} must be a float32 array (written in "
                                        f"place), got {getattr(value, 'dtype', type(value))}")
                    if not value.flags.c_contiguous:
                        raise ValueError(f"{a.name} must be C-contiguous (written in place)")
                    array = value
                else:
                    array = device_array(a, value)
                letters.match(a, tuple(array.shape))
                fields[a.field] = array
                if a.kind == "out_or_into":
                    fields[a.given], outs[a.name] = 1, array
            for letter, field in sig.sizes.items():
                fields[field] = letters.value(letter)
            if sig.name in CHECKS:
                CHECKS[sig.name](xp, fields, letters, values)
            for a in sig.args:
                if a.kind == "result":
                    fields[a.field] = outs[a.name] = xp.zeros(1, xp.float64)
                elif a.kind in ("out", "out_or_into") and a.name not in outs:
                    if a.when is not None and fields.get(a.when) is None:
                        fields[a.field], outs[a.name] = None, None
                        continue
                    fields[a.field] = outs[a.name] = xp.empty(letters.shape(a),
                                                              dtypes[a.dtype])
            if sig.name in SCRATCH:
                n = scratch_floats(sig.name, struct, letters, fields)
                fields["scratch"], fields["scratch_floats"] = xp.empty(max(n, 1), xp.float32), n
            call(function, struct, fields)
            result = [float(outs[name][0]) if sig.arg(name).kind == "result" else outs[name]
                      for name in sig.returned]
            return None if not result else result[0] if len(result) == 1 else tuple(result)

        op.__name__ = sig.name
        op.__doc__ = f"{sig.text()}\n\nThe CUDA kernel {function} on {xp.__name__} arrays."
        return op

    return SimpleNamespace(**{name: kernel_op(sig) for name, sig in signatures().items()
                              if hasattr(lib, f"{name}_cuda")})


def gpu_ops():
    """:func:`ops` on the GPU (CuPy arrays, CuPy's current stream); RuntimeError saying how to
    get a CUDA build when there is none."""
    lib, cupy = load()
    return ops(lib, cupy, lambda: cupy.cuda.get_current_stream().ptr)
