#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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

int mf_check_disjoint(PyArrayObject *out, const char *out_name, PyArrayObject *in,
                      const char *in_name) {
    if (out == NULL || in == NULL) return 0;
    const char *o = PyArray_BYTES(out), *i = PyArray_BYTES(in);
    if (o < i + PyArray_NBYTES(in) && i < o + PyArray_NBYTES(out)) {
        PyErr_Format(PyExc_ValueError, "%s must not share memory with %s", out_name, in_name);
        return -1;
    }
    return 0;
}

int mf_head_dim_and_scale(int64_t D, const char *arrays, PyObject *scale_obj, float *scale) {
    if (D % 2 != 0 || D < 16 || D > 128) {
        PyErr_Format(PyExc_ValueError,
                     "head dim D (the last axis of %s) must be even and in [16, 128], got %lld",
                     arrays, (long long)D);
        return -1;
    }
    double s = 1.0 / sqrt((double)D);
    if (scale_obj != NULL && scale_obj != Py_None) {
        s = PyFloat_AsDouble(scale_obj);
        if (s == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* say which argument */
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "scale must be a real number or None, got %s",
                             Py_TYPE(scale_obj)->tp_name);
            }
            return -1;
        }
    }
    if (mf_check_finite(s, "scale", 0) < 0) return -1;
    *scale = (float)s;
    if (!isfinite(*scale)) {
        PyErr_SetString(PyExc_ValueError, "scale must fit in float32 (|scale| < 3.4e38)");
        return -1;
    }
    return 0;
}

PyObject *mf_raise_status(int status, const char *op) {
    if (!PyErr_Occurred()) {
        PyObject *type = status == MF_ENOMEM ? PyExc_MemoryError : PyExc_ValueError;
        PyErr_Format(type, "%s failed: %s (status %d)", op, mf_status_string(status), status);
    }
    return NULL;
}

/* ---- output buffer pool ----------------------------------------------------------------
 * Large op outputs are recycled. Each lives in a 64-byte-aligned block whose header records
 * its size; the array's base object is a capsule that, when the last view of the array dies,
 * puts the block back on a free list instead of freeing it. A training loop allocates the
 * same shapes every step, so after the first step no output pays the kernel's page faulting
 * and zeroing (measured: ~4 ms per 16 MB). The pool holds at most MAPFORMER_POOL_MB
 * (environment, default 1024) of free blocks; it is only touched with the GIL held. */
#define MF_POOL_SLOTS 128
#define MF_POOL_MIN_BYTES ((size_t)1 << 20) /* smaller outputs use NumPy's allocator */
#define MF_BLOCK_HEADER 64

static void *pool_blocks[MF_POOL_SLOTS];
static int pool_count = 0;
static size_t pool_bytes = 0;
static size_t pool_limit = (size_t)-1; /* read from the environment on first use */

static size_t block_size(void *block) { return *(size_t *)block; }

static void pool_release(PyObject *capsule) {
    void *block = PyCapsule_GetPointer(capsule, "mapformer.buffer");
    size_t size = block_size(block);
    if (pool_count < MF_POOL_SLOTS && pool_bytes + size <= pool_limit) {
        pool_blocks[pool_count++] = block;
        pool_bytes += size;
    } else {
        free(block);
    }
}

static void *pool_acquire(size_t size) {
    if (pool_limit == (size_t)-1) {
        const char *env = getenv("MAPFORMER_POOL_MB");
        pool_limit = (size_t)(env ? strtoull(env, NULL, 10) : 1024) << 20;
    }
    for (int i = pool_count - 1; i >= 0; i--) {
        if (block_size(pool_blocks[i]) == size) {
            void *block = pool_blocks[i];
            pool_blocks[i] = pool_blocks[--pool_count];
            pool_bytes -= size;
            return block;
        }
    }
    void *block = aligned_alloc(MF_BLOCK_HEADER, MF_BLOCK_HEADER + size);
    if (block != NULL) *(size_t *)block = size;
    return block;
}

PyArrayObject *mf_empty_f32(int ndim, const int64_t *dims) {
    npy_intp shape[NPY_MAXDIMS];
    size_t size = sizeof(float);
    for (int i = 0; i < ndim; i++) {
        shape[i] = (npy_intp)dims[i];
        size *= (size_t)dims[i];
    }
    if (size < MF_POOL_MIN_BYTES)
        return (PyArrayObject *)PyArray_EMPTY(ndim, shape, NPY_FLOAT32, 0);
    size = (size + MF_BLOCK_HEADER - 1) / MF_BLOCK_HEADER * MF_BLOCK_HEADER;
    void *block = pool_acquire(size);
    if (block == NULL) return (PyArrayObject *)PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(block, "mapformer.buffer", pool_release);
    if (capsule == NULL) {
        free(block);
        return NULL;
    }
    PyObject *array = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(NPY_FLOAT32),
                                           ndim, shape, NULL, (char *)block + MF_BLOCK_HEADER,
                                           NPY_ARRAY_CARRAY, NULL);
    if (array == NULL) {
        Py_DECREF(capsule); /* gives the block back to the pool */
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)array, capsule) < 0) { /* steals capsule */
        Py_DECREF(array);
        return NULL;
    }
    return (PyArrayObject *)array;
}
