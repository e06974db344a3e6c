/* Binding of csrc/ops/layernorm.c. */
#include "common.h" /* Python.h first */

#include <math.h>

static PyObject *py_layernorm_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"x", "weight", "bias", "eps", NULL};
    PyObject *x_obj, *weight_obj, *bias_obj;
    double eps = 1e-5;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|d:layernorm_forward", kwlist, &x_obj,
                                     &weight_obj, &bias_obj, &eps))
        return NULL;
    int64_t xd[2] = {-1, -1};
    PyArrayObject *x = mf_array(x_obj, "x", MF_F32, 2, xd, "(N, C)");
    if (x == NULL) return NULL;
    const int64_t N = xd[0], C = xd[1];
    int64_t wd[1] = {C}, bd[1] = {C};
    PyArrayObject *weight = mf_array(weight_obj, "weight", MF_F32, 1, wd, "(C,)");
    if (weight == NULL) return NULL;
    PyArrayObject *bias = mf_array(bias_obj, "bias", MF_F32, 1, bd, "(C,)");
    if (bias == NULL) return NULL;
    if (mf_check_finite(eps, "eps", 1) < 0) return NULL;
    const float eps32 = (float)eps;
    if (!(eps32 > 0.0f) || isinf(eps32)) {
        PyErr_Format(PyExc_ValueError, "eps must be a positive float32 (about 1.4e-45 to 3.4e38)");
        return NULL;
    }
    PyArrayObject *y = NULL, *mean = NULL, *rstd = NULL;
    int64_t yd[2] = {N, C}, nd[1] = {N};
    y = mf_empty_f32(2, yd);
    if (y == NULL) goto fail;
    mean = mf_empty_f32(1, nd);
    if (mean == NULL) goto fail;
    rstd = mf_empty_f32(1, nd);
    if (rstd == NULL) goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = layernorm_forward((float *)PyArray_DATA(y), (float *)PyArray_DATA(mean),
                               (float *)PyArray_DATA(rstd), (const float *)PyArray_DATA(x),
                               (const float *)PyArray_DATA(weight),
                               (const float *)PyArray_DATA(bias), N, C, eps32);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "layernorm_forward");
        goto fail;
    }
    return Py_BuildValue("(NNN)", (PyObject *)y, (PyObject *)mean, (PyObject *)rstd);
fail:
    Py_XDECREF(y);
    Py_XDECREF(mean);
    Py_XDECREF(rstd);
    return NULL;
}

static PyObject *py_layernorm_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dy", "x", "mean", "rstd", "weight", "dweight", "dbias", "dx", NULL};
    PyObject *dy_obj, *x_obj, *mean_obj, *rstd_obj, *weight_obj, *dweight_obj, *dbias_obj;
    PyObject *dx_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO|O:layernorm_backward", kwlist,
                                     &dy_obj, &x_obj, &mean_obj, &rstd_obj, &weight_obj,
                                     &dweight_obj, &dbias_obj, &dx_obj))
        return NULL;
    PyArrayObject *dx = NULL; /* the result: a new reference, released on failure */
    int64_t dyd[2] = {-1, -1};
    PyArrayObject *dy = mf_array(dy_obj, "dy", MF_F32, 2, dyd, "(N, C)");
    if (dy == NULL) goto fail;
    const int64_t N = dyd[0], C = dyd[1];
    int64_t xd[2] = {N, C}, md[1] = {N}, rd[1] = {N}, wd[1] = {C}, dwd[1] = {C}, dbd[1] = {C};
    PyArrayObject *x = mf_array(x_obj, "x", MF_F32, 2, xd, "(N, C)");
    if (x == NULL) goto fail;
    PyArrayObject *mean = mf_array(mean_obj, "mean", MF_F32, 1, md, "(N,)");
    if (mean == NULL) goto fail;
    PyArrayObject *rstd = mf_array(rstd_obj, "rstd", MF_F32, 1, rd, "(N,)");
    if (rstd == NULL) goto fail;
    PyArrayObject *weight = mf_array(weight_obj, "weight", MF_F32, 1, wd, "(C,)");
    if (weight == NULL) goto fail;
    PyArrayObject *dweight = mf_output_array(dweight_obj, "dweight", MF_F32, 1, dwd, "(C,)");
    if (dweight == NULL) goto fail;
    PyArrayObject *dbias = mf_output_array(dbias_obj, "dbias", MF_F32, 1, dbd, "(C,)");
    if (dbias == NULL) goto fail;
    const int accumulate = dx_obj != Py_None;
    int64_t dxd[2] = {N, C};
    if (accumulate) {
        PyArrayObject *given = mf_output_array(dx_obj, "dx", MF_F32, 2, dxd, "(N, C)");
        if (given == NULL) goto fail;
        Py_INCREF(given);
        dx = given;
    } else {
        dx = mf_empty_f32(2, dxd);
        if (dx == NULL) goto fail;
    }
    PyArrayObject *inputs[] = {dy, x, mean, rstd, weight};
    const char *input_names[] = {"dy", "x", "mean", "rstd", "weight"};
    for (int i = 0; i < 5; i++) {
        if (mf_check_disjoint(dx, "dx", inputs[i], input_names[i]) < 0 ||
            mf_check_disjoint(dweight, "dweight", inputs[i], input_names[i]) < 0 ||
            mf_check_disjoint(dbias, "dbias", inputs[i], input_names[i]) < 0)
            goto fail;
    }
    if (mf_check_disjoint(dx, "dx", dweight, "dweight") < 0 ||
        mf_check_disjoint(dx, "dx", dbias, "dbias") < 0 ||
        mf_check_disjoint(dbias, "dbias", dweight, "dweight") < 0)
        goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = layernorm_backward(
        (float *)PyArray_DATA(dx), (float *)PyArray_DATA(dweight), (float *)PyArray_DATA(dbias),
        (const float *)PyArray_DATA(dy), (const float *)PyArray_DATA(x),
        (const float *)PyArray_DATA(mean), (const float *)PyArray_DATA(rstd),
        (const float *)PyArray_DATA(weight), N, C, accumulate);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "layernorm_backward");
        goto fail;
    }
    return (PyObject *)dx;
fail:
    Py_XDECREF(dx);
    return NULL;
}

PyMethodDef mf_layernorm_methods[] = {
    {"layernorm_forward", (PyCFunction)(void (*)(void))py_layernorm_forward,
     METH_VARARGS | METH_KEYWORDS,
     "layernorm_forward(x, weight, bias, eps=1e-5) -> (y, mean, rstd)\n\n"
     "x float32 (N, C), weight float32 (C,), bias float32 (C,), eps finite > 0\n"
     "-> y float32 (N, C) = (x - mean) * rstd * weight + bias, mean float32 (N,),\n"
     "rstd float32 (N,) = 1 / sqrt(var + eps) (biased variance); keep mean, rstd for backward."},
    {"layernorm_backward", (PyCFunction)(void (*)(void))py_layernorm_backward,
     METH_VARARGS | METH_KEYWORDS,
     "layernorm_backward(dy, x, mean, rstd, weight, dweight, dbias, dx=None) -> dx\n\n"
     "dy, x float32 (N, C), mean, rstd float32 (N,) from layernorm_forward, weight (C,).\n"
     "Parameter gradients are accumulated in place: dweight (C,) += sum_n dy * xhat,\n"
     "dbias (C,) += sum_n dy.\n"
     "dx None: returns a new dx float32 (N, C); dx given (N, C): accumulated into (+=) and\n"
     "returned. Outputs must not share memory with inputs or each other."},
    {NULL, NULL, 0, NULL}};
