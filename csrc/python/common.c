#include "common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void describe_shape(PyArrayObject *a, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < PyArray_NDIM(a) && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld",
                                 (long long)PyArray_DIM(a, i));
    if (used < size) snprintf(buf + used, size - used, PyArray_NDIM(a) == 1 ? ",)" : ")");
}

PyArrayObject *mf_array(PyObject *obj, const char *name, int typenum, int ndim, int64_t *dims,
                        const char *shape) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy array of shape %s, got %s", name, shape,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (PyArray_TYPE(a) != typenum) {
        PyArray_Descr *want = PyArray_DescrFromType(typenum);
        PyErr_Format(PyExc_TypeError, "%s must have dtype %S, got %S", name, (PyObject *)want,
                     (PyObject *)PyArray_DESCR(a));
        Py_XDECREF(want);
        return NULL;
    }
    char got[160];
    describe_shape(a, got, sizeof got);
    if (PyArray_NDIM(a) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must have shape %s (%d axes), got shape %s", name,
                     shape, ndim, got);
        return NULL;
    }
    for (int i = 0; i < ndim; i++) {
        int64_t n = (int64_t)PyArray_DIM(a, i);
        if (n < 1) {
            PyErr_Format(PyExc_ValueError, "%s must have shape %s with no empty axis, got %s",
                         name, shape, got);
            return NULL;
        }
        if (dims[i] >= 0 && dims[i] != n) {
            PyErr_Format(PyExc_ValueError,
                         "%s must have shape %s; axis %d is %lld but must be %lld to match the "
                         "other arguments (got shape %s)",
                         name, shape, i, (long long)n, (long long)dims[i], got);
            return NULL;
        }
    }
    if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)) {
        PyErr_Format(PyExc_ValueError,
                     "%s must be C-contiguous and aligned (use np.ascontiguousarray), shape %s",
                     name, shape);
        return NULL;
    }
    for (int i = 0; i < ndim; i++) dims[i] = (int64_t)PyArray_DIM(a, i);
    return a;
}

PyArrayObject *mf_output_array(PyObject *obj, const char *name, int typenum, int ndim,
                               int64_t *dims, const char *shape) {
    PyArrayObject *a = mf_array(obj, name, typenum, ndim, dims, shape);
    if (a != NULL && !PyArray_ISWRITEABLE(a)) {
        PyErr_Format(PyExc_ValueError, "%s is written in place and must be writeable", name);
        return NULL;
    }
    return a;
}

PyArrayObject *mf_optional_array(PyObject *obj, const char *name, int typenum, int ndim,
                                 int64_t *dims, const char *shape) {
    if (obj == NULL || obj == Py_None) return NULL;
    return mf_array(obj, name, typenum, ndim, dims, shape);
}

int mf_check_ids(const int32_t *ids, int64_t n, int64_t V, const char *name) {
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            PyErr_Format(PyExc_ValueError, "%s[%lld] = %d is out of range [0, %lld)", name,
                         (long long)i, (int)ids[i], (long long)V);
            return -1;
        }
    }
    return 0;
}

int mf_check_finite(double x, const char *name, int positive_only) {
    if (isfinite(x) && (!positive_only || x > 0)) return 0;
    PyObject *value = PyFloat_FromDouble(x);
    if (value == NULL) return -1;
    PyErr_Format(PyExc_ValueError, "%s must be a finite%s number, got %R", name,
                 positive_only ? " positive" : "", value);
    Py_DECREF(value);
    return -1;
}

PyObject *mf_raise_status(int status, const char *op) {
    if (!PyErr_Occurred()) {
        PyObject *type = status == MF_ENOMEM ? PyExc_MemoryError : PyExc_ValueError;
        PyErr_Format(type, "%s failed: %s (status %d)", op, mf_status_string(status), status);
    }
    return NULL;
}

PyArrayObject *mf_empty_f32(int ndim, const int64_t *dims) {
    npy_intp shape[NPY_MAXDIMS];
    for (int i = 0; i < ndim; i++) shape[i] = (npy_intp)dims[i];
    return (PyArrayObject *)PyArray_EMPTY(ndim, shape, NPY_FLOAT32, 0);
}
