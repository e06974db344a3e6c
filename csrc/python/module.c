/* The extension module mapformer._C: merges the method table of every op family. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL MAPFORMER_ARRAY_API
#include <numpy/arrayobject.h>

#include <stdlib.h>

#include "common.h"
#include "mapformer/blas.h"
#include "mapformer/cpu.h"

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

static PyMethodDef kernel_methods[] = {
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
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef mapformer_module = {
    PyModuleDef_HEAD_INIT, "mapformer._C",
    "mapformer's C core: forward and backward of every op on float32 NumPy arrays.\n"
    "Every function checks its arguments and raises TypeError/ValueError naming the bad one;\n"
    "the GIL is released while a kernel runs. See mapformer/reference.py for the math.",
    -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void) {
    import_array();
    mf_blas_single_thread();
    mf_cpu_level(); /* detected once, here, with the GIL held */
    const char *forced = getenv("MAPFORMER_KERNELS");
    if (forced != NULL && forced[0] != '\0' &&
        set_kernels_by_name(forced, "the environment variable MAPFORMER_KERNELS") < 0) {
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
    PyMethodDef *tables[] = {kernel_methods,          mf_embedding_methods,    mf_linear_methods,
                             mf_layernorm_methods,    mf_elementwise_methods,
                             mf_mlp_methods,          mf_attention_methods,
                             mf_rotary_methods,       mf_softmax_xent_methods,
                             mf_optim_methods,        mf_cope_methods,
                             mf_tape_methods,         mf_conj_attention_methods};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        if (PyModule_AddFunctions(m, tables[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
