/* Binding of csrc/ops/attention.c: causal softmax attention, forward and backward. */
#include "common.h" /* Python.h first */

#include <math.h>

#define QKV_SHAPE "(B, T, H, D)"
#define LSE_SHAPE "(B, H, T)"

/* p->scratch: `floats` floats, 64-byte aligned, in a temporary float32 array (the output
 * pool's) returned as *owner; -1 with MemoryError. */
static int attach_scratch(float **scratch, int64_t *scratch_floats, int64_t floats,
                          PyArrayObject **owner) {
    const int64_t dims[1] = {floats + 16};
    *owner = mf_empty_f32(1, dims);
    if (*owner == NULL) return -1;
    const uintptr_t at = (uintptr_t)PyArray_DATA(*owner);
    *scratch = (float *)((at + 63) / 64 * 64);
    *scratch_floats = floats;
    return 0;
}

static PyObject *py_attention_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"q", "k", "v", "scale", NULL};
    PyObject *q_obj, *k_obj, *v_obj, *scale_obj = Py_None;
    PyArrayObject *out = NULL, *lse = NULL, *scratch = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O:attention_forward", kwlist, &q_obj,
                                     &k_obj, &v_obj, &scale_obj))
        return NULL;
    int64_t qd[4] = {-1, -1, -1, -1};
    PyArrayObject *q = mf_array(q_obj, "q", MF_F32, 4, qd, QKV_SHAPE);
    if (q == NULL) goto fail;
    int64_t kd[4] = {qd[0], qd[1], qd[2], qd[3]}, vd[4] = {qd[0], qd[1], qd[2], qd[3]};
    PyArrayObject *k = mf_array(k_obj, "k", MF_F32, 4, kd, QKV_SHAPE);
    if (k == NULL) goto fail;
    PyArrayObject *v = mf_array(v_obj, "v", MF_F32, 4, vd, QKV_SHAPE);
    if (v == NULL) goto fail;
    const int64_t B = qd[0], T = qd[1], H = qd[2], D = qd[3];
    float scale;
    if (mf_head_dim_and_scale(D, "q, k, v", scale_obj, &scale) < 0) goto fail;

    int64_t ld[3] = {B, H, T};
    if ((out = mf_empty_f32(4, qd)) == NULL || (lse = mf_empty_f32(3, ld)) == NULL) goto fail;
    MfAttentionParams p = {.out = (float *)PyArray_DATA(out), .lse = (float *)PyArray_DATA(lse),
                           .q = (const float *)PyArray_DATA(q),
                           .k = (const float *)PyArray_DATA(k),
                           .v = (const float *)PyArray_DATA(v),
                           .B = B, .T = T, .H = H, .D = D, .scale = scale};
    if (attach_scratch(&p.scratch, &p.scratch_floats, attention_forward_scratch_floats(&p),
                       &scratch) < 0)
        goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = attention_forward(&p);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "attention_forward");
        goto fail;
    }
    result = PyTuple_Pack(2, (PyObject *)out, (PyObject *)lse);
fail:
    Py_XDECREF(scratch);
    Py_XDECREF(out);
    Py_XDECREF(lse);
    return result;
}

static PyObject *py_attention_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dout", "q", "k", "v", "out", "lse", "scale", NULL};
    PyObject *dout_obj, *q_obj, *k_obj, *v_obj, *out_obj, *lse_obj, *scale_obj = Py_None;
    PyArrayObject *dq = NULL, *dk = NULL, *dv = NULL, *scratch = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|O:attention_backward", kwlist,
                                     &dout_obj, &q_obj, &k_obj, &v_obj, &out_obj, &lse_obj,
                                     &scale_obj))
        return NULL;
    int64_t qd[4] = {-1, -1, -1, -1};
    PyArrayObject *q = mf_array(q_obj, "q", MF_F32, 4, qd, QKV_SHAPE);
    if (q == NULL) goto fail;
    int64_t dd[4], kd[4], vd[4], od[4];
    for (int i = 0; i < 4; i++) dd[i] = kd[i] = vd[i] = od[i] = qd[i];
    PyArrayObject *dout = mf_array(dout_obj, "dout", MF_F32, 4, dd, QKV_SHAPE);
    if (dout == NULL) goto fail;
    PyArrayObject *k = mf_array(k_obj, "k", MF_F32, 4, kd, QKV_SHAPE);
    if (k == NULL) goto fail;
    PyArrayObject *v = mf_array(v_obj, "v", MF_F32, 4, vd, QKV_SHAPE);
    if (v == NULL) goto fail;
    PyArrayObject *out = mf_array(out_obj, "out", MF_F32, 4, od, QKV_SHAPE);
    if (out == NULL) goto fail;
    const int64_t B = qd[0], T = qd[1], H = qd[2], D = qd[3];
    int64_t ld[3] = {B, H, T};
    PyArrayObject *lse = mf_array(lse_obj, "lse", MF_F32, 3, ld, LSE_SHAPE);
    if (lse == NULL) goto fail;
    float scale;
    if (mf_head_dim_and_scale(D, "q, k, v", scale_obj, &scale) < 0) goto fail;

    if ((dq = mf_empty_f32(4, qd)) == NULL || (dk = mf_empty_f32(4, qd)) == NULL ||
        (dv = mf_empty_f32(4, qd)) == NULL)
        goto fail;
    MfAttentionParams p = {.dq = (float *)PyArray_DATA(dq), .dk = (float *)PyArray_DATA(dk),
                           .dv = (float *)PyArray_DATA(dv),
                           .dout = (const float *)PyArray_DATA(dout),
                           .q = (const float *)PyArray_DATA(q),
                           .k = (const float *)PyArray_DATA(k),
                           .v = (const float *)PyArray_DATA(v),
                           .o = (const float *)PyArray_DATA(out),
                           .lse_in = (const float *)PyArray_DATA(lse),
                           .B = B, .T = T, .H = H, .D = D, .scale = scale};
    if (attach_scratch(&p.scratch, &p.scratch_floats, attention_backward_scratch_floats(&p),
                       &scratch) < 0)
        goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = attention_backward(&p);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "attention_backward");
        goto fail;
    }
    result = PyTuple_Pack(3, (PyObject *)dq, (PyObject *)dk, (PyObject *)dv);
fail:
    Py_XDECREF(scratch);
    Py_XDECREF(dq);
    Py_XDECREF(dk);
    Py_XDECREF(dv);
    return result;
}

PyMethodDef mf_attention_methods[] = {
    {"attention_forward", (PyCFunction)(void (*)(void))py_attention_forward,
     METH_VARARGS | METH_KEYWORDS,
     "attention_forward(q, k, v, scale=None) -> (out, lse)\n\n"
     "Causal softmax attention: out[b, i, h] = sum_{j <= i} softmax_j(scale q_i . k_j) v_j.\n"
     "q, k, v: float32 C-contiguous (B, T, H, D), head dim D even in [16, 128].\n"
     "scale: float, default 1/sqrt(D).\n"
     "Returns out float32 (B, T, H, D) and lse float32 (B, H, T), the log-sum-exp of each\n"
     "query's scaled scores: the only thing attention_backward needs besides out."},
    {"attention_backward", (PyCFunction)(void (*)(void))py_attention_backward,
     METH_VARARGS | METH_KEYWORDS,
     "attention_backward(dout, q, k, v, out, lse, scale=None) -> (dq, dk, dv)\n\n"
     "Gradients of causal attention given dout, the gradient of out.\n"
     "dout, q, k, v, out: float32 C-contiguous (B, T, H, D); lse: float32 (B, H, T) from\n"
     "attention_forward with the same scale (default 1/sqrt(D)).\n"
     "Returns new float32 arrays dq, dk, dv (B, T, H, D)."},
    {NULL, NULL, 0, NULL}};
