/* The extension module mapformer._C: registers every op family's method table (bind.h's one
 * list), and is itself the "kernels" family: the kernel-set functions and info(). */
#define MF_IMPORT_ARRAY
#include "bind.h" /* Python.h first */

#include <stdlib.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/cpu.h"
#include "mapformer/subnormals.h"
#include "mapformer/threads.h"

static PyObject *kernel_set_list(int supported_only) {
    PyObject *list = PyList_New(0);
    for (int k = 0; list != NULL && k < MF_KERNELS_COUNT; k++) {
        if (supported_only && !mf_kernels_supported(k)) continue;
        PyObject *name = PyUnicode_FromString(mf_kernels_name(k));
        if (name == NULL || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *py_kernels(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(mf_kernels_name(mf_kernels()));
}

static PyObject *py_cpu_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(mf_kernels_name(mf_cpu_level()));
}

static PyObject *py_kernel_sets(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return kernel_set_list(1);
}

/* Make the kernel set called `name` active; ValueError naming `kernels` for an unknown set or
 * one this CPU cannot run. */
static int set_kernels_by_name(const char *name, const char *what) {
    const int k = mf_kernels_from_name(name);
    if (k < 0 || mf_set_kernels(k) != MF_OK) {
        PyObject *all = kernel_set_list(0), *ok = kernel_set_list(1);
        if (all != NULL && ok != NULL)
            PyErr_Format(PyExc_ValueError,
                         "%s must name a kernel set this CPU runs: one of %R (of %R), got '%s'",
                         what, ok, all, name);
        Py_XDECREF(all);
        Py_XDECREF(ok);
        return -1;
    }
    return 0;
}

static PyObject *py_set_kernels(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"kernels", NULL};
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s:set_kernels", kwlist, &name)) return NULL;
    if (set_kernels_by_name(name, "kernels") < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_subnormals(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(mf_flush_subnormals() ? "flush" : "keep");
}

/* Set the ops' subnormal mode from its name, "flush" or "keep"; ValueError naming `what`. */
static int set_subnormals_by_name(const char *name, const char *what) {
    const int flush = strcmp(name, "flush") == 0;
    if ((!flush && strcmp(name, "keep") != 0) || mf_set_flush_subnormals(flush) != MF_OK) {
        PyErr_Format(PyExc_ValueError, "%s must be %s, got '%s'", what,
                     mf_subnormals_flushable() ? "'flush' or 'keep'"
                                               : "'keep' (this build cannot flush)", name);
        return -1;
    }
    return 0;
}

static PyObject *py_set_subnormals(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"mode", NULL};
    const char *name;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s:set_subnormals", kwlist, &name))
        return NULL;
    if (set_subnormals_by_name(name, "mode") < 0) return NULL;
    Py_RETURN_NONE;
}

/* floats per vector of each kernel set's SIMD layer (mapformer/simd.h's MF_VW); the OpenBLAS
 * set's own loops are the portable build's */
static const int simd_width[MF_KERNELS_COUNT] = {4, 8, 16, 4};

static PyObject *py_info(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#if defined(__clang__)
    const char *compiler = "clang";
#elif defined(__GNUC__)
    const char *compiler = "gcc";
#else
    const char *compiler = "other";
#endif
    PyObject *widths = PyDict_New(), *sets = kernel_set_list(1), *result = NULL;
    for (int k = 0; widths != NULL && k < MF_KERNELS_COUNT; k++) {
        if (!mf_kernels_supported(k)) continue;
        PyObject *w = PyLong_FromLong(simd_width[k]);
        if (w == NULL || PyDict_SetItemString(widths, mf_kernels_name(k), w) < 0)
            Py_CLEAR(widths);
        Py_XDECREF(w);
    }
    size_t pool_limit, pool_held;
    int pool_blocks;
    mf_pool_stats(&pool_limit, &pool_held, &pool_blocks);
    if (widths != NULL && sets != NULL)
        result = Py_BuildValue(
            "{s:s,s:s,s:O,s:{s:s,s:s,s:i},s:i,s:{s:s,s:s},s:O,s:{s:n,s:n,s:i},s:s}",
            "kernels",
            mf_kernels_name(mf_kernels()), "cpu_level", mf_kernels_name(mf_cpu_level()),
            "kernel_sets", sets, "blas", "library", MF_BLAS_LIBRARY, "config",
            MF_BLAS(openblas_get_config)(), "threads", MF_BLAS(openblas_get_num_threads)(),
            "threads", mf_max_threads(), "compiler", "name", compiler, "version", __VERSION__,
            "simd_width", widths, "pool", "limit_bytes", (Py_ssize_t)pool_limit, "held_bytes",
            (Py_ssize_t)pool_held, "held_blocks", pool_blocks, "subnormals",
            mf_flush_subnormals() ? "flush" : "keep");
    Py_XDECREF(widths);
    Py_XDECREF(sets);
    return result;
}

static PyObject *py_release_pool(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromSize_t(mf_pool_clear());
}

static PyMethodDef *const *family_tables(void);

/* every op's signature: each family's function called with args NULL (bind.h: MF_DEFINE) */
static PyObject *py_signatures(PyObject *self, PyObject *args) {
    (void)args;
    PyObject *all = PyDict_New();
    if (all == NULL) return NULL;
    for (PyMethodDef *const *table = family_tables(); *table != NULL; table++) {
        if (*table == mf_kernels_methods) continue; /* the module's own functions */
        for (const PyMethodDef *m = *table; m->ml_name != NULL; m++) {
            PyObject *sig = ((PyCFunctionWithKeywords)(void (*)(void))m->ml_meth)(self, NULL,
                                                                                NULL);
            if (sig == NULL || PyDict_SetItemString(all, m->ml_name, sig) < 0) {
                Py_XDECREF(sig);
                Py_DECREF(all);
                return NULL;
            }
            Py_DECREF(sig);
        }
    }
    return all;
}

PyMethodDef mf_kernels_methods[] = {
    {"kernels", py_kernels, METH_NOARGS,
     "kernels() -> str\n\nThe active kernel set of the ops with hand-written kernels (linear,\n"
     "MLP, attention, conjunctive attention): 'avx512', 'avx2', 'portable' or 'blas'."},
    {"cpu_level", py_cpu_level, METH_NOARGS,
     "cpu_level() -> str\n\nThe best kernel set this CPU runs ('avx512', 'avx2' or 'portable'),\n"
     "detected once; the default active set."},
    {"kernel_sets", py_kernel_sets, METH_NOARGS,
     "kernel_sets() -> list of str\n\nThe kernel sets this CPU runs, every one of which\n"
     "set_kernels accepts."},
    {"set_kernels", (PyCFunction)(void (*)(void))py_set_kernels, METH_VARARGS | METH_KEYWORDS,
     "set_kernels(kernels)\n\nMake the kernel set named `kernels` active for every later op\n"
     "call (process-wide). MAPFORMER_KERNELS in the environment sets it when the module loads."},
    {"info", py_info, METH_NOARGS,
     "info() -> dict\n\nThe build and the machine as the C core sees them: 'kernels' (the active\n"
     "kernel set), 'cpu_level' (the best one this CPU runs), 'kernel_sets' (those it runs),\n"
     "'blas' ({'library': 'scipy-openblas32' or 'system', 'config': OpenBLAS's build\n"
     "description, 'threads': its own thread count, 1: the core threads with OpenMP only}),\n"
     "'threads' (OpenMP's thread count for the next op), 'compiler' ({'name': 'gcc' or\n"
     "'clang', 'version'}), 'simd_width' (floats per vector of each kernel set this CPU runs)\n"
     "and 'pool' ({'limit_bytes': the output pool's cap, MAPFORMER_POOL_MB, 'held_bytes' and\n"
     "'held_blocks': the free blocks it holds now}) and 'subnormals' (the ops' mode,\n"
     "'flush' or 'keep': subnormals())."},
    {"subnormals", py_subnormals, METH_NOARGS,
     "subnormals() -> str\n\nWhat the ops do with subnormal floats (below FLT_MIN):\n"
     "'flush' (read and written as zero while an op runs: the default, since a CPU that\n"
     "handles them in microcode runs a trained model's steps up to twice as slowly) or\n"
     "'keep' (IEEE). NumPy and the rest of the process are not affected."},
    {"set_subnormals", (PyCFunction)(void (*)(void))py_set_subnormals,
     METH_VARARGS | METH_KEYWORDS,
     "set_subnormals(mode)\n\nSet what the ops do with subnormal floats: 'flush' or 'keep'\n"
     "(process-wide; MAPFORMER_SUBNORMALS in the environment sets it when the module loads).\n"
     "A record's provenance holds the mode its run trained with."},
    {"signatures", py_signatures, METH_NOARGS,
     "signatures() -> dict\n\nEvery op's signature, the binding's own table (the one place an\n"
     "op's arguments are declared): {op: {'name', 'args': [row, ...] in the order the binding\n"
     "checks them, 'sizes': {letter: params field}, 'scratch': bool, 'index_arg'}}. A row:\n"
     "'name', 'pos' (its place in the Python signature from 1; None: not a Python argument),\n"
     "'kind' ('in', 'inout', 'out', 'out_or_into', 'result', 'float', 'int', 'choice'),\n"
     "'written', 'optional', 'accepts_none', 'kwonly', 'shape' (letters, e.g. 'B T H D';\n"
     "arrays), 'dtype' ('float32', 'int32', 'bool'; arrays), 'field' (the params struct's\n"
     "field), 'given' / 'when' (fields an out_or_into / optional out row sets / depends on),\n"
     "'default'; 'low', 'high', 'low_open', 'high_open' (floats), 'low' (ints), 'choices'.\n"
     "mapformer.signatures reads it."},
    {"release_pool", py_release_pool, METH_NOARGS,
     "release_pool() -> int\n\nFree the blocks the output pool holds for reuse (the large op\n"
     "outputs of earlier steps; arrays still alive keep theirs) and return the bytes freed:\n"
     "between models of different shapes in one process (a notebook comparing models, a\n"
     "benchmark), so that the next model's peak memory does not sit on the last one's."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef mapformer_module = {
    PyModuleDef_HEAD_INIT, "mapformer._C",
    "mapformer's C core: forward and backward of every op on float32 NumPy arrays.\n"
    "Every function checks its arguments and raises TypeError/ValueError naming the bad one;\n"
    "the GIL is released while a kernel runs. See mapformer/reference.py for the math.",
    -1, NULL, NULL, NULL, NULL, NULL};

#define MF_FAMILY_TABLE(family) mf_##family##_methods,
static PyMethodDef *const families[] = {MF_FAMILIES(MF_FAMILY_TABLE) NULL};

static PyMethodDef *const *family_tables(void) { return families; }

PyMODINIT_FUNC PyInit__C(void) {
    import_array();
    mf_blas_single_thread();
    mf_cpu_level(); /* detected once, here, with the GIL held */
    const char *forced = getenv("MAPFORMER_KERNELS");
    const char *subnormals = getenv("MAPFORMER_SUBNORMALS");
    if ((forced != NULL && forced[0] != '\0' &&
         set_kernels_by_name(forced, "the environment variable MAPFORMER_KERNELS") < 0) ||
        set_subnormals_by_name(subnormals != NULL && subnormals[0] != '\0'
                                   ? subnormals
                                   : (mf_subnormals_flushable() ? "flush" : "keep"),
                               "the environment variable MAPFORMER_SUBNORMALS") < 0 ||
        mf_pool_read_env() < 0) {
        PyObject *type, *value, *tb; /* re-raised as ImportError, the message kept */
        PyErr_Fetch(&type, &value, &tb);
        PyErr_SetObject(PyExc_ImportError, value);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    PyObject *m = PyModule_Create(&mapformer_module);
    if (m == NULL) return NULL;
    for (size_t i = 0; families[i] != NULL; i++) {
        if (PyModule_AddFunctions(m, families[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
