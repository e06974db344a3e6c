/* Binding of csrc/ops/softmax_xent.c. */
#include "common.h"

/* Check logits (N, V), targets (N,) int32 in [0, V), mask (N,) float32. Returns 0 or -1. */
static int check_inputs(PyObject *logits_obj, PyObject *targets_obj, PyObject *mask_obj,
                        PyArrayObject **logits, PyArrayObject **targets, PyArrayObject **mask,
                        int64_t *N, int64_t *V) {
    int64_t ld[2] = {-1, -1};
    *logits = mf_array(logits_obj, "logits", MF_F32, 2, ld, "(N, V)");
    if (*logits == NULL) return -1;
    int64_t td[1] = {ld[0]}, md[1] = {ld[0]};
    *targets = mf_array(targets_obj, "targets", MF_I32, 1, td, "(N,)");
    if (*targets == NULL) return -1;
    *mask = mf_array(mask_obj, "mask", MF_F32, 1, md, "(N,)");
    if (*mask == NULL) return -1;
    if (mf_check_ids((const int32_t *)PyArray_DATA(*targets), ld[0], ld[1], "targets") < 0)
        return -1;
    *N = ld[0];
    *V = ld[1];
    return 0;
}

static PyObject *py_softmax_xent_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"logits", "targets", "mask", NULL};
    PyObject *logits_obj, *targets_obj, *mask_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:softmax_xent_forward", kwlist,
                                     &logits_obj, &targets_obj, &mask_obj))
        return NULL;
    PyArrayObject *logits, *targets, *mask;
    int64_t N, V;
    if (check_inputs(logits_obj, targets_obj, mask_obj, &logits, &targets, &mask, &N, &V) < 0)
        return NULL;
    PyArrayObject *losses = mf_empty_f32(1, &N);
    if (losses == NULL) return NULL;
    double loss = 0.0;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = softmax_xent_forward((float *)PyArray_DATA(losses), &loss,
                                  (const float *)PyArray_DATA(logits),
                                  (const int32_t *)PyArray_DATA(targets),
                                  (const float *)PyArray_DATA(mask), N, V);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(losses);
        return mf_raise_status(status, "softmax_xent_forward");
    }
    return Py_BuildValue("(Nd)", (PyObject *)losses, loss);
}

static PyObject *py_softmax_xent_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"logits", "targets", "mask", "scale", NULL};
    PyObject *logits_obj, *targets_obj, *mask_obj;
    double scale;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOd:softmax_xent_backward", kwlist,
                                     &logits_obj, &targets_obj, &mask_obj, &scale))
        return NULL;
    PyArrayObject *logits, *targets, *mask;
    int64_t N, V;
    if (check_inputs(logits_obj, targets_obj, mask_obj, &logits, &targets, &mask, &N, &V) < 0)
        return NULL;
    if (mf_check_finite(scale, "scale", 0) < 0) return NULL;
    if (mf_check_finite((double)(float)scale, "scale (as float32)", 0) < 0) return NULL;
    int64_t dd[2] = {N, V};
    PyArrayObject *dlogits = mf_empty_f32(2, dd);
    if (dlogits == NULL) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = softmax_xent_backward((float *)PyArray_DATA(dlogits),
                                   (const float *)PyArray_DATA(logits),
                                   (const int32_t *)PyArray_DATA(targets),
                                   (const float *)PyArray_DATA(mask), (float)scale, N, V);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(dlogits);
        return mf_raise_status(status, "softmax_xent_backward");
    }
    return (PyObject *)dlogits;
}

PyMethodDef mf_softmax_xent_methods[] = {
    {"softmax_xent_forward", (PyCFunction)(void (*)(void))py_softmax_xent_forward,
     METH_VARARGS | METH_KEYWORDS,
     "softmax_xent_forward(logits, targets, mask) -> (losses, loss)\n\n"
     "logits float32 (N, V), targets int32 (N,) in [0, V), mask float32 (N,)\n"
     "-> losses float32 (N,) = -log softmax(logits)[n, targets[n]] for every row, and\n"
     "loss (float, summed in double) = sum(mask * losses) / sum(mask), 0.0 when sum(mask) == 0."},
    {"softmax_xent_backward", (PyCFunction)(void (*)(void))py_softmax_xent_backward,
     METH_VARARGS | METH_KEYWORDS,
     "softmax_xent_backward(logits, targets, mask, scale) -> dlogits\n\n"
     "logits float32 (N, V), targets int32 (N,) in [0, V), mask float32 (N,), scale finite\n"
     "-> dlogits float32 (N, V) = scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])).\n"
     "scale = 1 / sum(mask) gives the gradient of the forward's loss."},
    {NULL, NULL, 0, NULL}};
