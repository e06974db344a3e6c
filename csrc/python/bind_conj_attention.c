/* Binding of csrc/ops/conj_attention.c: MapEM's conjunctive attention, forward and backward. */
#include "common.h" /* Python.h first */

#include <math.h>
#include <string.h>

#define QKV_SHAPE "(B, T, H, D)"

static const char *const mode_names[] = {"score_product", "softmax_product", "sum"};

/* mode (a str; absent -> score_product) to an MfConjMode; -1 with TypeError (not a str) or
 * ValueError (unknown name), both naming the argument. */
static int parse_mode(PyObject *mode_obj) {
    if (mode_obj == NULL) return MF_CONJ_SCORE_PRODUCT;
    if (!PyUnicode_Check(mode_obj)) {
        PyErr_Format(PyExc_TypeError,
                     "mode must be a str, one of 'score_product', 'softmax_product', 'sum'; "
                     "got %s",
                     Py_TYPE(mode_obj)->tp_name);
        return -1;
    }
    const char *name = PyUnicode_AsUTF8(mode_obj);
    if (name == NULL) return -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(name, mode_names[i]) == 0) return i;
    PyErr_Format(PyExc_ValueError,
                 "mode must be one of 'score_product', 'softmax_product', 'sum', got %R",
                 mode_obj);
    return -1;
}

/* Check qx first (it fixes B, T, H, D into dims), then each of the other arrays against it. */
static int check_qkv(PyObject *const objs[], const char *const names[], int n,
                     PyArrayObject *arrays[], int64_t dims[4]) {
    for (int i = 0; i < n; i++) {
        int64_t d[4] = {dims[0], dims[1], dims[2], dims[3]};
        arrays[i] = mf_array(objs[i], names[i], MF_F32, 4, d, QKV_SHAPE);
        if (arrays[i] == NULL) return -1;
        for (int j = 0; j < 4; j++) dims[j] = d[j];
    }
    return 0;
}

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

#define F(a) ((float *)PyArray_DATA(a))
#define CF(a) ((const float *)PyArray_DATA(a))

static PyObject *py_conj_attention_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"qx", "kx", "qp", "kp", "v", "mode", "scale", NULL};
    PyObject *obj[5], *mode_obj = NULL, *scale_obj = Py_None;
    PyArrayObject *out = NULL, *lse = NULL, *scratch = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|OO:conj_attention_forward", kwlist,
                                     &obj[0], &obj[1], &obj[2], &obj[3], &obj[4], &mode_obj,
                                     &scale_obj))
        return NULL;
    static const char *const names[] = {"qx", "kx", "qp", "kp", "v"};
    PyArrayObject *a[5];
    int64_t dims[4] = {-1, -1, -1, -1};
    if (check_qkv(obj, names, 5, a, dims) < 0) goto fail;
    const int64_t B = dims[0], T = dims[1], H = dims[2], D = dims[3];
    const int mode = parse_mode(mode_obj);
    if (mode < 0) goto fail;
    float scale;
    if (mf_head_dim_and_scale(D, "qx, kx, qp, kp, v", scale_obj, &scale) < 0) goto fail;

    const int64_t ldims[4] = {mode == MF_CONJ_SOFTMAX_PRODUCT ? 2 : 1, B, H, T};
    out = mf_empty_f32(4, dims);
    if (out == NULL) goto fail;
    lse = mf_empty_f32(4, ldims);
    if (lse == NULL) goto fail;
    MfConjAttentionParams p = {.out = F(out), .lse = F(lse), .qx = CF(a[0]), .kx = CF(a[1]),
                               .qp = CF(a[2]), .kp = CF(a[3]), .v = CF(a[4]), .B = B, .T = T,
                               .H = H, .D = D, .scale = scale, .mode = mode};
    if (attach_scratch(&p.scratch, &p.scratch_floats, conj_attention_forward_scratch_floats(&p),
                       &scratch) < 0)
        goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = conj_attention_forward(&p);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "conj_attention_forward");
        goto fail;
    }
    result = PyTuple_Pack(2, (PyObject *)out, (PyObject *)lse);
fail:
    Py_XDECREF(scratch);
    Py_XDECREF(out);
    Py_XDECREF(lse);
    return result;
}

static PyObject *py_conj_attention_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dout", "qx", "kx", "qp", "kp", "v", "out", "lse",
                             "mode", "scale", NULL};
    PyObject *dout_obj, *qx_obj, *kx_obj, *qp_obj, *kp_obj, *v_obj, *out_obj, *lse_obj;
    PyObject *mode_obj = NULL, *scale_obj = Py_None;
    PyArrayObject *g[5] = {NULL, NULL, NULL, NULL, NULL}; /* dqx, dkx, dqp, dkp, dv */
    PyArrayObject *scratch = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOO|OO:conj_attention_backward",
                                     kwlist, &dout_obj, &qx_obj, &kx_obj, &qp_obj, &kp_obj,
                                     &v_obj, &out_obj, &lse_obj, &mode_obj, &scale_obj))
        return NULL;
    /* qx first: it fixes the shape the other arrays must match */
    PyObject *const obj[7] = {qx_obj, dout_obj, kx_obj, qp_obj, kp_obj, v_obj, out_obj};
    static const char *const names[] = {"qx", "dout", "kx", "qp", "kp", "v", "out"};
    PyArrayObject *a[7]; /* qx, dout, kx, qp, kp, v, out */
    int64_t dims[4] = {-1, -1, -1, -1};
    if (check_qkv(obj, names, 7, a, dims) < 0) goto fail;
    const int64_t B = dims[0], T = dims[1], H = dims[2], D = dims[3];
    const int mode = parse_mode(mode_obj);
    if (mode < 0) goto fail;
    const int M = mode == MF_CONJ_SOFTMAX_PRODUCT ? 2 : 1;
    int64_t ldims[4] = {M, B, H, T};
    PyArrayObject *lse = mf_array(lse_obj, "lse", MF_F32, 4, ldims,
                                  M == 2 ? "(2, B, H, T) for mode 'softmax_product'"
                                         : "(1, B, H, T) for this mode");
    if (lse == NULL) goto fail;
    float scale;
    if (mf_head_dim_and_scale(D, "qx, kx, qp, kp, v", scale_obj, &scale) < 0) goto fail;

    for (int i = 0; i < 5; i++) {
        g[i] = mf_empty_f32(4, dims);
        if (g[i] == NULL) goto fail;
    }
    MfConjAttentionParams p = {.dqx = F(g[0]), .dkx = F(g[1]), .dqp = F(g[2]), .dkp = F(g[3]),
                               .dv = F(g[4]), .dout = CF(a[1]), .qx = CF(a[0]), .kx = CF(a[2]),
                               .qp = CF(a[3]), .kp = CF(a[4]), .v = CF(a[5]), .o = CF(a[6]),
                               .lse_in = CF(lse), .B = B, .T = T, .H = H, .D = D,
                               .scale = scale, .mode = mode};
    if (attach_scratch(&p.scratch, &p.scratch_floats, conj_attention_backward_scratch_floats(&p),
                       &scratch) < 0)
        goto fail;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = conj_attention_backward(&p);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "conj_attention_backward");
        goto fail;
    }
    result = PyTuple_Pack(5, (PyObject *)g[0], (PyObject *)g[1], (PyObject *)g[2],
                          (PyObject *)g[3], (PyObject *)g[4]);
fail:
    Py_XDECREF(scratch);
    for (int i = 0; i < 5; i++) Py_XDECREF(g[i]);
    return result;
}

PyMethodDef mf_conj_attention_methods[] = {
    {"conj_attention_forward", (PyCFunction)(void (*)(void))py_conj_attention_forward,
     METH_VARARGS | METH_KEYWORDS,
     "conj_attention_forward(qx, kx, qp, kp, v, mode='score_product', scale=None) -> (out, lse)\n"
     "\n"
     "MapEM's conjunctive attention, causal. With content scores sX = qx kx^T and positional\n"
     "scores sP = qp kp^T (per batch and head, keys j <= query i):\n"
     "  'score_product'   A = softmax_j(scale sX * sP)\n"
     "  'softmax_product' A = softmax_j(scale sX) * softmax_j(scale sP) (rows sum to < 1)\n"
     "  'sum'             A = softmax_j(scale (sX + sP))\n"
     "and out[b, i, h] = sum_j A_ij v_j.\n"
     "qx, kx, qp, kp, v: float32 C-contiguous (B, T, H, D), head dim D even in [16, 128].\n"
     "scale: float, default 1/sqrt(D).\n"
     "Returns out float32 (B, T, H, D) and lse float32 (M, B, H, T): the log-sum-exp of each\n"
     "query's scaled scores (M = 1), or for 'softmax_product' those of sX then sP (M = 2);\n"
     "the only thing conj_attention_backward needs besides out."},
    {"conj_attention_backward", (PyCFunction)(void (*)(void))py_conj_attention_backward,
     METH_VARARGS | METH_KEYWORDS,
     "conj_attention_backward(dout, qx, kx, qp, kp, v, out, lse, mode='score_product',\n"
     "                        scale=None) -> (dqx, dkx, dqp, dkp, dv)\n"
     "\n"
     "Gradients of conjunctive attention given dout, the gradient of out.\n"
     "dout, qx, kx, qp, kp, v, out: float32 C-contiguous (B, T, H, D); lse: float32\n"
     "(M, B, H, T) from conj_attention_forward with the same mode and scale (M = 2 for\n"
     "'softmax_product', else 1).\n"
     "Returns new float32 arrays dqx, dkx, dqp, dkp, dv (B, T, H, D)."},
    {NULL, NULL, 0, NULL}};
