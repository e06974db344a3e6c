/* Binding of csrc/ops/gelu.c and csrc/ops/residual.c: elementwise ops on arrays of any
 * ndim >= 1; every array of one call has the first array's shape. */
#include "common.h"

/* Check `obj` as the first array of a call: its own ndim (at least 1), any shape. Fills
 * dims[NPY_MAXDIMS] and *ndim; returns a borrowed reference or NULL with an exception. */
static PyArrayObject *first_array(PyObject *obj, const char *name, int *ndim, int64_t *dims,
                                  int writeable) {
    int nd = PyArray_Check(obj) ? PyArray_NDIM((PyArrayObject *)obj) : 1;
    if (nd < 1) nd = 1; /* a 0-d array then fails the ndim check with a clear message */
    for (int i = 0; i < nd; i++) dims[i] = -1;
    *ndim = nd;
    return writeable ? mf_output_array(obj, name, MF_F32, nd, dims, "(...) with ndim >= 1")
                     : mf_array(obj, name, MF_F32, nd, dims, "(...) with ndim >= 1");
}

/* Check `obj` against the shape of the first array (ndim, dims). */
static PyArrayObject *same_shape(PyObject *obj, const char *name, int ndim, const int64_t *dims,
                                 const char *first_name) {
    int64_t d[NPY_MAXDIMS];
    for (int i = 0; i < ndim; i++) d[i] = dims[i];
    char shape[64];
    PyOS_snprintf(shape, sizeof shape, "equal to %s's shape", first_name);
    return mf_array(obj, name, MF_F32, ndim, d, shape);
}

static int64_t numel(int ndim, const int64_t *dims) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= dims[i];
    return n;
}

static PyObject *py_gelu_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"x", NULL};
    PyObject *x_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:gelu_forward", kwlist, &x_obj))
        return NULL;
    int ndim;
    int64_t dims[NPY_MAXDIMS];
    PyArrayObject *x = first_array(x_obj, "x", &ndim, dims, 0);
    if (x == NULL) return NULL;
    PyArrayObject *y = mf_empty_f32(ndim, dims);
    if (y == NULL) return NULL;
    const int64_t n = numel(ndim, dims);
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = gelu_forward((float *)PyArray_DATA(y), (const float *)PyArray_DATA(x), n);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(y);
        return mf_raise_status(status, "gelu_forward");
    }
    return (PyObject *)y;
}

static PyObject *py_gelu_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dy", "x", NULL};
    PyObject *dy_obj, *x_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:gelu_backward", kwlist, &dy_obj, &x_obj))
        return NULL;
    int ndim;
    int64_t dims[NPY_MAXDIMS];
    PyArrayObject *dy = first_array(dy_obj, "dy", &ndim, dims, 0);
    if (dy == NULL) return NULL;
    PyArrayObject *x = same_shape(x_obj, "x", ndim, dims, "dy");
    if (x == NULL) return NULL;
    PyArrayObject *dx = mf_empty_f32(ndim, dims);
    if (dx == NULL) return NULL;
    const int64_t n = numel(ndim, dims);
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = gelu_backward((float *)PyArray_DATA(dx), (const float *)PyArray_DATA(dy),
                           (const float *)PyArray_DATA(x), n);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(dx);
        return mf_raise_status(status, "gelu_backward");
    }
    return (PyObject *)dx;
}

static PyObject *py_residual_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"a", "b", NULL};
    PyObject *a_obj, *b_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:residual_forward", kwlist, &a_obj, &b_obj))
        return NULL;
    int ndim;
    int64_t dims[NPY_MAXDIMS];
    PyArrayObject *a = first_array(a_obj, "a", &ndim, dims, 0);
    if (a == NULL) return NULL;
    PyArrayObject *b = same_shape(b_obj, "b", ndim, dims, "a");
    if (b == NULL) return NULL;
    PyArrayObject *out = mf_empty_f32(ndim, dims);
    if (out == NULL) return NULL;
    const int64_t n = numel(ndim, dims);
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = residual_forward((float *)PyArray_DATA(out), (const float *)PyArray_DATA(a),
                              (const float *)PyArray_DATA(b), n);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(out);
        return mf_raise_status(status, "residual_forward");
    }
    return (PyObject *)out;
}

static PyObject *py_residual_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dx", "dout", NULL};
    PyObject *dx_obj, *dout_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:residual_backward", kwlist, &dx_obj,
                                     &dout_obj))
        return NULL;
    int ndim;
    int64_t dims[NPY_MAXDIMS];
    PyArrayObject *dx = first_array(dx_obj, "dx", &ndim, dims, 1);
    if (dx == NULL) return NULL;
    PyArrayObject *dout = same_shape(dout_obj, "dout", ndim, dims, "dx");
    if (dout == NULL) return NULL;
    if (mf_check_disjoint(dx, "dx", dout, "dout") < 0) return NULL;
    const int64_t n = numel(ndim, dims);
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = residual_backward((float *)PyArray_DATA(dx), (const float *)PyArray_DATA(dout), n);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) return mf_raise_status(status, "residual_backward");
    Py_RETURN_NONE;
}

PyMethodDef mf_elementwise_methods[] = {
    {"gelu_forward", (PyCFunction)(void (*)(void))py_gelu_forward, METH_VARARGS | METH_KEYWORDS,
     "gelu_forward(x) -> y\n\n"
     "x float32 (...), any ndim >= 1 -> y float32 (...) = 0.5 x (1 + tanh(sqrt(2/pi) (x +\n"
     "0.044715 x^3))) (the tanh approximation)."},
    {"gelu_backward", (PyCFunction)(void (*)(void))py_gelu_backward,
     METH_VARARGS | METH_KEYWORDS,
     "gelu_backward(dy, x) -> dx\n\n"
     "dy, x float32 (...) of one shape -> dx float32 (...) = dy * gelu'(x)."},
    {"residual_forward", (PyCFunction)(void (*)(void))py_residual_forward,
     METH_VARARGS | METH_KEYWORDS,
     "residual_forward(a, b) -> out\n\n"
     "a, b float32 (...) of one shape -> out float32 (...) = a + b."},
    {"residual_backward", (PyCFunction)(void (*)(void))py_residual_backward,
     METH_VARARGS | METH_KEYWORDS,
     "residual_backward(dx, dout) -> None\n\n"
     "dx, dout float32 (...) of one shape: dx += dout in place (the residual stream's\n"
     "gradient reaching a branch input). dx must not share memory with dout."},
    {NULL, NULL, 0, NULL}};
