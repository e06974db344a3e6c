/* The extension module mapformer._C: merges the method table of every op family. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define PY_ARRAY_UNIQUE_SYMBOL MAPFORMER_ARRAY_API
#include <numpy/arrayobject.h>

#include "common.h"
#include "mapformer/blas.h"

static struct PyModuleDef mapformer_module = {
    PyModuleDef_HEAD_INIT, "mapformer._C",
    "mapformer's C core: forward and backward of every op on float32 NumPy arrays.\n"
    "Every function checks its arguments and raises TypeError/ValueError naming the bad one;\n"
    "the GIL is released while a kernel runs. See mapformer/reference.py for the math.",
    -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void) {
    import_array();
    mf_blas_single_thread();
    PyObject *m = PyModule_Create(&mapformer_module);
    if (m == NULL) return NULL;
    PyMethodDef *tables[] = {mf_embedding_methods,    mf_linear_methods,
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
