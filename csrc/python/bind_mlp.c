/* Binding of csrc/ops/mlp.c: mlp_forward, mlp_backward. */
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

static PyObject *py_mlp_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"x", "w_fc", "b_fc", "w_proj", "b_proj", NULL};
    PyObject *x_obj, *w_fc_obj, *b_fc_obj, *w_proj_obj, *b_proj_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:mlp_forward", kwlist, &x_obj,
                                     &w_fc_obj, &b_fc_obj, &w_proj_obj, &b_proj_obj))
        return NULL;
    int64_t xd[2] = {-1, -1};
    PyArrayObject *x = mf_array(x_obj, "x", MF_F32, 2, xd, "(N, C)");
    if (x == NULL) return NULL;
    const int64_t N = xd[0], C = xd[1];
    int64_t wfd[2] = {-1, C};
    PyArrayObject *w_fc = mf_array(w_fc_obj, "w_fc", MF_F32, 2, wfd, "(F, C)");
    if (w_fc == NULL) return NULL;
    const int64_t F = wfd[0];
    int64_t bfd[1] = {F};
    PyArrayObject *b_fc = mf_array(b_fc_obj, "b_fc", MF_F32, 1, bfd, "(F,)");
    if (b_fc == NULL) return NULL;
    int64_t wpd[2] = {C, F};
    PyArrayObject *w_proj = mf_array(w_proj_obj, "w_proj", MF_F32, 2, wpd, "(C, F)");
    if (w_proj == NULL) return NULL;
    int64_t bpd[1] = {C};
    PyArrayObject *b_proj = mf_array(b_proj_obj, "b_proj", MF_F32, 1, bpd, "(C,)");
    if (b_proj == NULL) return NULL;
    PyObject *result = NULL;
    PyArrayObject *y = NULL, *h = NULL;
    int64_t yd[2] = {N, C}, hd[2] = {N, F};
    if ((y = mf_empty_f32(2, yd)) == NULL || (h = mf_empty_f32(2, hd)) == NULL) goto fail;
    MfMlpParams p = {.y = (float *)PyArray_DATA(y), .h = (float *)PyArray_DATA(h),
                     .x = (const float *)PyArray_DATA(x),
                     .w_fc = (const float *)PyArray_DATA(w_fc),
                     .b_fc = (const float *)PyArray_DATA(b_fc),
                     .w_proj = (const float *)PyArray_DATA(w_proj),
                     .b_proj = (const float *)PyArray_DATA(b_proj), .N = N, .C = C, .F = F};
    PyArrayObject *scratch = scratch_array(mlp_forward_scratch_floats(&p), &p.scratch,
                                           &p.scratch_floats);
    if (scratch == NULL && PyErr_Occurred()) goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = mlp_forward(&p);
    Py_END_ALLOW_THREADS;
    Py_XDECREF(scratch);
    if (status != MF_OK) {
        mf_raise_status(status, "mlp_forward");
        goto fail;
    }
    result = PyTuple_Pack(2, (PyObject *)y, (PyObject *)h);
fail:
    Py_XDECREF(y);
    Py_XDECREF(h);
    return result;
}

static PyObject *py_mlp_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dy",    "x",     "h",       "w_fc",    "w_proj",
                             "dw_fc", "db_fc", "dw_proj", "db_proj", NULL};
    PyObject *dy_obj, *x_obj, *h_obj, *w_fc_obj, *w_proj_obj, *dw_fc_obj, *db_fc_obj,
        *dw_proj_obj, *db_proj_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOO:mlp_backward", kwlist, &dy_obj,
                                     &x_obj, &h_obj, &w_fc_obj, &w_proj_obj, &dw_fc_obj,
                                     &db_fc_obj, &dw_proj_obj, &db_proj_obj))
        return NULL;
    int64_t dyd[2] = {-1, -1};
    PyArrayObject *dy = mf_array(dy_obj, "dy", MF_F32, 2, dyd, "(N, C)");
    if (dy == NULL) return NULL;
    const int64_t N = dyd[0], C = dyd[1];
    int64_t xd[2] = {N, C};
    PyArrayObject *x = mf_array(x_obj, "x", MF_F32, 2, xd, "(N, C)");
    if (x == NULL) return NULL;
    int64_t wfd[2] = {-1, C};
    PyArrayObject *w_fc = mf_array(w_fc_obj, "w_fc", MF_F32, 2, wfd, "(F, C)");
    if (w_fc == NULL) return NULL;
    const int64_t F = wfd[0];
    int64_t hd[2] = {N, F}, wpd[2] = {C, F};
    PyArrayObject *h = mf_array(h_obj, "h", MF_F32, 2, hd, "(N, F)");
    if (h == NULL) return NULL;
    PyArrayObject *w_proj = mf_array(w_proj_obj, "w_proj", MF_F32, 2, wpd, "(C, F)");
    if (w_proj == NULL) return NULL;
    int64_t dwfd[2] = {F, C}, dbfd[1] = {F}, dwpd[2] = {C, F}, dbpd[1] = {C};
    PyArrayObject *dw_fc = mf_output_array(dw_fc_obj, "dw_fc", MF_F32, 2, dwfd, "(F, C)");
    if (dw_fc == NULL) return NULL;
    PyArrayObject *db_fc = mf_output_array(db_fc_obj, "db_fc", MF_F32, 1, dbfd, "(F,)");
    if (db_fc == NULL) return NULL;
    PyArrayObject *dw_proj = mf_output_array(dw_proj_obj, "dw_proj", MF_F32, 2, dwpd, "(C, F)");
    if (dw_proj == NULL) return NULL;
    PyArrayObject *db_proj = mf_output_array(db_proj_obj, "db_proj", MF_F32, 1, dbpd, "(C,)");
    if (db_proj == NULL) return NULL;
    /* the four parameter gradients are written after every input has been read for the
     * last time except by their own sgemm: none may share memory with an input or another */
    PyArrayObject *outs[] = {dw_fc, db_fc, dw_proj, db_proj};
    const char *out_names[] = {"dw_fc", "db_fc", "dw_proj", "db_proj"};
    PyArrayObject *ins[] = {dy, x, h, w_fc, w_proj};
    const char *in_names[] = {"dy", "x", "h", "w_fc", "w_proj"};
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 5; j++)
            if (mf_check_disjoint(outs[i], out_names[i], ins[j], in_names[j]) < 0) return NULL;
        for (int j = i + 1; j < 4; j++)
            if (mf_check_disjoint(outs[i], out_names[i], outs[j], out_names[j]) < 0)
                return NULL;
    }
    int64_t dxd[2] = {N, C};
    PyArrayObject *dx = mf_empty_f32(2, dxd);
    if (dx == NULL) return NULL;
    MfMlpParams p = {.dx = (float *)PyArray_DATA(dx), .dw_fc = (float *)PyArray_DATA(dw_fc),
                     .db_fc = (float *)PyArray_DATA(db_fc),
                     .dw_proj = (float *)PyArray_DATA(dw_proj),
                     .db_proj = (float *)PyArray_DATA(db_proj),
                     .dy = (const float *)PyArray_DATA(dy), .h_in = (const float *)PyArray_DATA(h),
                     .x = (const float *)PyArray_DATA(x),
                     .w_fc = (const float *)PyArray_DATA(w_fc),
                     .w_proj = (const float *)PyArray_DATA(w_proj), .N = N, .C = C, .F = F};
    PyArrayObject *scratch = scratch_array(mlp_backward_scratch_floats(&p), &p.scratch,
                                           &p.scratch_floats);
    if (scratch == NULL && PyErr_Occurred()) {
        Py_DECREF(dx);
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = mlp_backward(&p);
    Py_END_ALLOW_THREADS;
    Py_XDECREF(scratch);
    if (status != MF_OK) {
        mf_raise_status(status, "mlp_backward");
        Py_DECREF(dx);
        return NULL;
    }
    return (PyObject *)dx;
}

PyMethodDef mf_mlp_methods[] = {
    {"mlp_forward", (PyCFunction)(void (*)(void))py_mlp_forward, METH_VARARGS | METH_KEYWORDS,
     "mlp_forward(x, w_fc, b_fc, w_proj, b_proj) -> (y, h)\n\n"
     "x float32 (N, C), w_fc (F, C), b_fc (F,), w_proj (C, F), b_proj (C,) ->\n"
     "y (N, C) = gelu(h) @ w_proj.T + b_proj (GELU's tanh approximation), and\n"
     "h (N, F) = x @ w_fc.T + b_fc, which mlp_backward needs."},
    {"mlp_backward", (PyCFunction)(void (*)(void))py_mlp_backward, METH_VARARGS | METH_KEYWORDS,
     "mlp_backward(dy, x, h, w_fc, w_proj, dw_fc, db_fc, dw_proj, db_proj) -> dx\n\n"
     "dy float32 (N, C); x, h, w_fc, w_proj as given to / returned by mlp_forward.\n"
     "Parameter gradients are accumulated in place: dw_fc (F, C), db_fc (F,), dw_proj (C, F),\n"
     "db_proj (C,); they must not share memory with the inputs or with each other.\n"
     "Returns a new dx float32 (N, C)."},
    {NULL, NULL, 0, NULL}};
