/* Binding of csrc/ops/embedding.c. */
#include "common.h"

static PyObject *py_embedding_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"tokens", "weight", NULL};
    PyObject *tokens_obj, *weight_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:embedding_forward", kwlist, &tokens_obj,
                                     &weight_obj))
        return NULL;
    int64_t nd[1] = {-1}, wd[2] = {-1, -1};
    PyArrayObject *tokens = mf_array(tokens_obj, "tokens", MF_I32, 1, nd, "(N,)");
    if (tokens == NULL) return NULL;
    PyArrayObject *weight = mf_array(weight_obj, "weight", MF_F32, 2, wd, "(V, C)");
    if (weight == NULL) return NULL;
    const int32_t *ids = (const int32_t *)PyArray_DATA(tokens);
    if (mf_check_ids(ids, nd[0], wd[0], "tokens") < 0) return NULL;
    int64_t od[2] = {nd[0], wd[1]};
    PyArrayObject *out = mf_empty_f32(2, od);
    if (out == NULL) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = embedding_forward((float *)PyArray_DATA(out), ids,
                               (const float *)PyArray_DATA(weight), nd[0], wd[0], wd[1]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(out);
        return mf_raise_status(status, "embedding_forward");
    }
    return (PyObject *)out;
}

static PyObject *py_embedding_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dweight", "dout", "tokens", NULL};
    PyObject *dweight_obj, *dout_obj, *tokens_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:embedding_backward", kwlist,
                                     &dweight_obj, &dout_obj, &tokens_obj))
        return NULL;
    int64_t wd[2] = {-1, -1};
    PyArrayObject *dweight = mf_output_array(dweight_obj, "dweight", MF_F32, 2, wd, "(V, C)");
    if (dweight == NULL) return NULL;
    int64_t od[2] = {-1, wd[1]};
    PyArrayObject *dout = mf_array(dout_obj, "dout", MF_F32, 2, od, "(N, C)");
    if (dout == NULL) return NULL;
    int64_t nd[1] = {od[0]};
    PyArrayObject *tokens = mf_array(tokens_obj, "tokens", MF_I32, 1, nd, "(N,)");
    if (tokens == NULL) return NULL;
    const int32_t *ids = (const int32_t *)PyArray_DATA(tokens);
    if (mf_check_ids(ids, nd[0], wd[0], "tokens") < 0) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = embedding_backward((float *)PyArray_DATA(dweight), (const float *)PyArray_DATA(dout),
                                ids, nd[0], wd[0], wd[1]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) return mf_raise_status(status, "embedding_backward");
    Py_RETURN_NONE;
}

PyMethodDef mf_embedding_methods[] = {
    {"embedding_forward", (PyCFunction)(void (*)(void))py_embedding_forward,
     METH_VARARGS | METH_KEYWORDS,
     "embedding_forward(tokens, weight) -> out\n\n"
     "tokens int32 (N,), weight float32 (V, C) -> out float32 (N, C) = weight[tokens]."},
    {"embedding_backward", (PyCFunction)(void (*)(void))py_embedding_backward,
     METH_VARARGS | METH_KEYWORDS,
     "embedding_backward(dweight, dout, tokens) -> None\n\n"
     "dweight float32 (V, C) is accumulated in place: dweight[tokens[n]] += dout[n].\n"
     "dout float32 (N, C), tokens int32 (N,)."},
    {NULL, NULL, 0, NULL}};
