/* Binding of csrc/ops/linear.c: linear_forward, linear_backward. */
#include "common.h"

/* The op's scratch: a temporary float32 array from the output pool (the caller releases it;
 * NULL with an exception set on failure, or with *scratch NULL for no scratch), its data
 * aligned up to 64 bytes in *scratch, *floats of it. */
static PyArrayObject *scratch_array(int64_t want, float **scratch, int64_t *floats) {
    *scratch = NULL;
    *floats = 0;
    if (want <= 0) return NULL;
    const int64_t dims[1] = {want + 16};
    PyArrayObject *a = mf_empty_f32(1, dims);
    if (a == NULL) return NULL;
    const uintptr_t data = (uintptr_t)PyArray_DATA(a);
    *scratch = (float *)((data + 63) / 64 * 64);
    *floats = want + 16 - (int64_t)(((data + 63) / 64 * 64 - data) / sizeof(float));
    return a;
}

static PyObject *py_linear_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"x", "weight", "bias", NULL};
    PyObject *x_obj, *weight_obj, *bias_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:linear_forward", kwlist, &x_obj,
                                     &weight_obj, &bias_obj))
        return NULL;
    int64_t xd[2] = {-1, -1};
    PyArrayObject *x = mf_array(x_obj, "x", MF_F32, 2, xd, "(N, Cin)");
    if (x == NULL) return NULL;
    int64_t wd[2] = {-1, xd[1]};
    PyArrayObject *weight = mf_array(weight_obj, "weight", MF_F32, 2, wd, "(Cout, Cin)");
    if (weight == NULL) return NULL;
    int64_t bd[1] = {wd[0]};
    PyArrayObject *bias = mf_optional_array(bias_obj, "bias", MF_F32, 1, bd, "(Cout,)");
    if (bias == NULL && PyErr_Occurred()) return NULL;
    const int64_t N = xd[0], Cin = xd[1], Cout = wd[0];
    int64_t yd[2] = {N, Cout};
    PyArrayObject *y = mf_empty_f32(2, yd);
    if (y == NULL) return NULL;
    MfLinearParams p = {.y = (float *)PyArray_DATA(y),
                        .x = (const float *)PyArray_DATA(x),
                        .weight = (const float *)PyArray_DATA(weight),
                        .bias = bias != NULL ? (const float *)PyArray_DATA(bias) : NULL,
                        .N = N, .Cin = Cin, .Cout = Cout};
    PyArrayObject *scratch = scratch_array(linear_forward_scratch_floats(&p), &p.scratch,
                                           &p.scratch_floats);
    if (scratch == NULL && PyErr_Occurred()) {
        Py_DECREF(y);
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = linear_forward(&p);
    Py_END_ALLOW_THREADS;
    Py_XDECREF(scratch);
    if (status != MF_OK) {
        Py_DECREF(y);
        return mf_raise_status(status, "linear_forward");
    }
    return (PyObject *)y;
}

static PyObject *py_linear_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dy", "x", "weight", "dweight", "dbias", "dx", NULL};
    PyObject *dy_obj, *x_obj, *weight_obj, *dweight_obj, *dbias_obj = Py_None, *dx_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|OO:linear_backward", kwlist, &dy_obj,
                                     &x_obj, &weight_obj, &dweight_obj, &dbias_obj, &dx_obj))
        return NULL;
    PyArrayObject *dx = NULL; /* the result: a new reference, released on failure */
    int64_t dyd[2] = {-1, -1};
    PyArrayObject *dy = mf_array(dy_obj, "dy", MF_F32, 2, dyd, "(N, Cout)");
    if (dy == NULL) goto fail;
    const int64_t N = dyd[0], Cout = dyd[1];
    int64_t xd[2] = {N, -1};
    PyArrayObject *x = mf_array(x_obj, "x", MF_F32, 2, xd, "(N, Cin)");
    if (x == NULL) goto fail;
    const int64_t Cin = xd[1];
    int64_t wd[2] = {Cout, Cin};
    PyArrayObject *weight = mf_array(weight_obj, "weight", MF_F32, 2, wd, "(Cout, Cin)");
    if (weight == NULL) goto fail;
    int64_t dwd[2] = {Cout, Cin};
    PyArrayObject *dweight =
        mf_output_array(dweight_obj, "dweight", MF_F32, 2, dwd, "(Cout, Cin)");
    if (dweight == NULL) goto fail;
    PyArrayObject *dbias = NULL;
    if (dbias_obj != Py_None) {
        int64_t dbd[1] = {Cout};
        dbias = mf_output_array(dbias_obj, "dbias", MF_F32, 1, dbd, "(Cout,)");
        if (dbias == NULL) goto fail;
    }
    const int accumulate = dx_obj != Py_None;
    if (accumulate) {
        int64_t dxd[2] = {N, Cin};
        PyArrayObject *given = mf_output_array(dx_obj, "dx", MF_F32, 2, dxd, "(N, Cin)");
        if (given == NULL) goto fail;
        Py_INCREF(given);
        dx = given;
    } else {
        int64_t dxd[2] = {N, Cin};
        dx = mf_empty_f32(2, dxd);
        if (dx == NULL) goto fail;
    }
    /* dx is written first, then dweight (reading dy, x), then dbias (reading dy) */
    if (mf_check_disjoint(dx, "dx", dy, "dy") < 0 || mf_check_disjoint(dx, "dx", x, "x") < 0 ||
        mf_check_disjoint(dx, "dx", weight, "weight") < 0 ||
        mf_check_disjoint(dx, "dx", dweight, "dweight") < 0 ||
        mf_check_disjoint(dx, "dx", dbias, "dbias") < 0 ||
        mf_check_disjoint(dweight, "dweight", dy, "dy") < 0 ||
        mf_check_disjoint(dweight, "dweight", x, "x") < 0 ||
        mf_check_disjoint(dweight, "dweight", weight, "weight") < 0 ||
        mf_check_disjoint(dbias, "dbias", dweight, "dweight") < 0 ||
        mf_check_disjoint(dbias, "dbias", dy, "dy") < 0)
        goto fail;
    MfLinearParams p = {.dx = (float *)PyArray_DATA(dx),
                        .dweight = (float *)PyArray_DATA(dweight),
                        .dbias = dbias != NULL ? (float *)PyArray_DATA(dbias) : NULL,
                        .dy = (const float *)PyArray_DATA(dy),
                        .x = (const float *)PyArray_DATA(x),
                        .weight = (const float *)PyArray_DATA(weight),
                        .N = N, .Cin = Cin, .Cout = Cout, .accumulate_dx = accumulate};
    PyArrayObject *scratch = scratch_array(linear_backward_scratch_floats(&p), &p.scratch,
                                           &p.scratch_floats);
    if (scratch == NULL && PyErr_Occurred()) goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = linear_backward(&p);
    Py_END_ALLOW_THREADS;
    Py_XDECREF(scratch);
    if (status != MF_OK) {
        mf_raise_status(status, "linear_backward");
        goto fail;
    }
    return (PyObject *)dx;
fail:
    Py_XDECREF(dx);
    return NULL;
}

PyMethodDef mf_linear_methods[] = {
    {"linear_forward", (PyCFunction)(void (*)(void))py_linear_forward,
     METH_VARARGS | METH_KEYWORDS,
     "linear_forward(x, weight, bias=None) -> y\n\n"
     "x float32 (N, Cin), weight float32 (Cout, Cin), bias float32 (Cout,) or None\n"
     "-> y float32 (N, Cout) = x @ weight.T + bias."},
    {"linear_backward", (PyCFunction)(void (*)(void))py_linear_backward,
     METH_VARARGS | METH_KEYWORDS,
     "linear_backward(dy, x, weight, dweight, dbias=None, dx=None) -> dx\n\n"
     "dy float32 (N, Cout), x float32 (N, Cin), weight float32 (Cout, Cin).\n"
     "Parameter gradients are accumulated in place: dweight (Cout, Cin) += dy.T @ x and,\n"
     "when given, dbias (Cout,) += dy.sum(0).\n"
     "dx None: returns a new dx float32 (N, Cin) = dy @ weight; dx given (N, Cin): dx += dy @\n"
     "weight in place and dx itself is returned. Outputs must not share memory with inputs."},
    {NULL, NULL, 0, NULL}};
