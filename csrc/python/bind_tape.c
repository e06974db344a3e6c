/* Binding of csrc/ops/tape.c (the TAPE baseline): complex-state rotary and the content-gated
 * head mix of the positional state. */
#include "common.h"

#define HEAD_SHAPE "(B, T, H, D)"
#define GATE_SHAPE "(B, T, H)"
#define W_SHAPE "(H, H)"

/* Check a (B, T, H, D) array and require D even (the state holds D/2 complex numbers);
 * fills dims. */
static PyArrayObject *head_array(PyObject *obj, const char *name, int64_t *dims) {
    PyArrayObject *a = mf_array(obj, name, MF_F32, 4, dims, HEAD_SHAPE);
    if (a != NULL && dims[3] % 2 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s has head dim D = %lld: the head dim D must be even (pairs are complex "
                     "numbers)",
                     name, (long long)dims[3]);
        return NULL;
    }
    return a;
}

static PyObject *py_tape_rotate_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"q", "k", "e", NULL};
    PyObject *q_obj, *k_obj, *e_obj, *result = NULL;
    PyArrayObject *q, *k, *e, *q_out = NULL, *k_out = NULL;
    int64_t qd[4] = {-1, -1, -1, -1};
    int status;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:tape_rotate_forward", kwlist, &q_obj,
                                     &k_obj, &e_obj))
        return NULL;
    if ((q = head_array(q_obj, "q", qd)) == NULL) goto done;
    if ((k = mf_array(k_obj, "k", MF_F32, 4, qd, HEAD_SHAPE)) == NULL) goto done;
    if ((e = mf_array(e_obj, "e", MF_F32, 4, qd, HEAD_SHAPE)) == NULL) goto done;
    if ((q_out = mf_empty_f32(4, qd)) == NULL || (k_out = mf_empty_f32(4, qd)) == NULL) goto done;
    Py_BEGIN_ALLOW_THREADS;
    status = tape_rotate_forward((float *)PyArray_DATA(q_out), (float *)PyArray_DATA(k_out),
                                 (const float *)PyArray_DATA(q), (const float *)PyArray_DATA(k),
                                 (const float *)PyArray_DATA(e), qd[0], qd[1], qd[2], qd[3]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "tape_rotate_forward");
        goto done;
    }
    result = PyTuple_Pack(2, (PyObject *)q_out, (PyObject *)k_out);
done:
    Py_XDECREF(q_out);
    Py_XDECREF(k_out);
    return result;
}

static PyObject *py_tape_rotate_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dq_out", "dk_out", "q", "k", "e", NULL};
    PyObject *dq_out_obj, *dk_out_obj, *q_obj, *k_obj, *e_obj, *result = NULL;
    PyArrayObject *dq_out, *dk_out, *q, *k, *e, *dq = NULL, *dk = NULL, *de = NULL;
    int64_t qd[4] = {-1, -1, -1, -1};
    int status;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:tape_rotate_backward", kwlist,
                                     &dq_out_obj, &dk_out_obj, &q_obj, &k_obj, &e_obj))
        return NULL;
    if ((dq_out = head_array(dq_out_obj, "dq_out", qd)) == NULL) goto done;
    if ((dk_out = mf_array(dk_out_obj, "dk_out", MF_F32, 4, qd, HEAD_SHAPE)) == NULL) goto done;
    if ((q = mf_array(q_obj, "q", MF_F32, 4, qd, HEAD_SHAPE)) == NULL) goto done;
    if ((k = mf_array(k_obj, "k", MF_F32, 4, qd, HEAD_SHAPE)) == NULL) goto done;
    if ((e = mf_array(e_obj, "e", MF_F32, 4, qd, HEAD_SHAPE)) == NULL) goto done;
    if ((dq = mf_empty_f32(4, qd)) == NULL || (dk = mf_empty_f32(4, qd)) == NULL ||
        (de = mf_empty_f32(4, qd)) == NULL)
        goto done;
    Py_BEGIN_ALLOW_THREADS;
    status = tape_rotate_backward(
        (float *)PyArray_DATA(dq), (float *)PyArray_DATA(dk), (float *)PyArray_DATA(de),
        (const float *)PyArray_DATA(dq_out), (const float *)PyArray_DATA(dk_out),
        (const float *)PyArray_DATA(q), (const float *)PyArray_DATA(k),
        (const float *)PyArray_DATA(e), qd[0], qd[1], qd[2], qd[3]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "tape_rotate_backward");
        goto done;
    }
    result = PyTuple_Pack(3, (PyObject *)dq, (PyObject *)dk, (PyObject *)de);
done:
    Py_XDECREF(dq);
    Py_XDECREF(dk);
    Py_XDECREF(de);
    return result;
}

static PyObject *py_tape_mix_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"e_att", "gate_logits", "w", NULL};
    PyObject *e_att_obj, *gate_obj, *w_obj;
    PyArrayObject *e_att, *gate, *w, *e_new = NULL;
    int64_t ed[4] = {-1, -1, -1, -1};
    int status;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:tape_mix_forward", kwlist, &e_att_obj,
                                     &gate_obj, &w_obj))
        return NULL;
    if ((e_att = head_array(e_att_obj, "e_att", ed)) == NULL) goto fail;
    int64_t gd[3] = {ed[0], ed[1], ed[2]}, wd[2] = {ed[2], ed[2]};
    if ((gate = mf_array(gate_obj, "gate_logits", MF_F32, 3, gd, GATE_SHAPE)) == NULL) goto fail;
    if ((w = mf_array(w_obj, "w", MF_F32, 2, wd, W_SHAPE)) == NULL) goto fail;
    if ((e_new = mf_empty_f32(4, ed)) == NULL) goto fail;
    Py_BEGIN_ALLOW_THREADS;
    status = tape_mix_forward((float *)PyArray_DATA(e_new), (const float *)PyArray_DATA(e_att),
                              (const float *)PyArray_DATA(gate), (const float *)PyArray_DATA(w),
                              ed[0], ed[1], ed[2], ed[3]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "tape_mix_forward");
        goto fail;
    }
    return (PyObject *)e_new;
fail:
    Py_XDECREF(e_new);
    return NULL;
}

static PyObject *py_tape_mix_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"de_new", "e_att", "gate_logits", "w", "dw", NULL};
    PyObject *de_new_obj, *e_att_obj, *gate_obj, *w_obj, *dw_obj, *result = NULL;
    PyArrayObject *de_new, *e_att, *gate, *w, *dw, *de_att = NULL, *dgate = NULL;
    int64_t ed[4] = {-1, -1, -1, -1};
    int status;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:tape_mix_backward", kwlist,
                                     &de_new_obj, &e_att_obj, &gate_obj, &w_obj, &dw_obj))
        return NULL;
    if ((de_new = head_array(de_new_obj, "de_new", ed)) == NULL) goto done;
    if ((e_att = mf_array(e_att_obj, "e_att", MF_F32, 4, ed, HEAD_SHAPE)) == NULL) goto done;
    int64_t gd[3] = {ed[0], ed[1], ed[2]}, wd[2] = {ed[2], ed[2]};
    if ((gate = mf_array(gate_obj, "gate_logits", MF_F32, 3, gd, GATE_SHAPE)) == NULL) goto done;
    if ((w = mf_array(w_obj, "w", MF_F32, 2, wd, W_SHAPE)) == NULL) goto done;
    if ((dw = mf_output_array(dw_obj, "dw", MF_F32, 2, wd, W_SHAPE)) == NULL) goto done;
    if ((de_att = mf_empty_f32(4, ed)) == NULL || (dgate = mf_empty_f32(3, gd)) == NULL)
        goto done;
    Py_BEGIN_ALLOW_THREADS;
    status = tape_mix_backward(
        (float *)PyArray_DATA(de_att), (float *)PyArray_DATA(dgate), (float *)PyArray_DATA(dw),
        (const float *)PyArray_DATA(de_new), (const float *)PyArray_DATA(e_att),
        (const float *)PyArray_DATA(gate), (const float *)PyArray_DATA(w), ed[0], ed[1], ed[2],
        ed[3]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "tape_mix_backward");
        goto done;
    }
    result = PyTuple_Pack(2, (PyObject *)de_att, (PyObject *)dgate);
done:
    Py_XDECREF(de_att);
    Py_XDECREF(dgate);
    return result;
}

PyMethodDef mf_tape_methods[] = {
    {"tape_rotate_forward", (PyCFunction)(void (*)(void))py_tape_rotate_forward,
     METH_VARARGS | METH_KEYWORDS,
     "tape_rotate_forward(q, k, e) -> (q_out, k_out)\n\n"
     "q, k, e float32 (B, T, H, D) with D even -> q_out, k_out float32 (B, T, H, D): each pair\n"
     "(x[2k], x[2k+1]) multiplied as a complex number by the TAPE state e[2k] + i e[2k+1]:\n"
     "(x0 e0 - x1 e1, x0 e1 + x1 e0). With e = (cos, sin) this is rotary_forward."},
    {"tape_rotate_backward", (PyCFunction)(void (*)(void))py_tape_rotate_backward,
     METH_VARARGS | METH_KEYWORDS,
     "tape_rotate_backward(dq_out, dk_out, q, k, e) -> (dq, dk, de)\n\n"
     "dq_out, dk_out, q, k, e float32 (B, T, H, D) -> dq, dk, de float32 (B, T, H, D), per\n"
     "complex pair: dq = conj(e) dq_out, dk = conj(e) dk_out,\n"
     "de = conj(q) dq_out + conj(k) dk_out."},
    {"tape_mix_forward", (PyCFunction)(void (*)(void))py_tape_mix_forward,
     METH_VARARGS | METH_KEYWORDS,
     "tape_mix_forward(e_att, gate_logits, w) -> e_new\n\n"
     "e_att float32 (B, T, H, D) with D even, gate_logits float32 (B, T, H), w float32 (H, H)\n"
     "-> e_new float32 (B, T, H, D) = e_att[b, t, h] + sigmoid(gate_logits[b, t, h])\n"
     "* sum_h' w[h, h'] e_att[b, t, h'] (the content-gated head mix of the TAPE state)."},
    {"tape_mix_backward", (PyCFunction)(void (*)(void))py_tape_mix_backward,
     METH_VARARGS | METH_KEYWORDS,
     "tape_mix_backward(de_new, e_att, gate_logits, w, dw) -> (de_att, dgate_logits)\n\n"
     "de_new, e_att float32 (B, T, H, D), gate_logits float32 (B, T, H), w float32 (H, H) ->\n"
     "de_att float32 (B, T, H, D), dgate_logits float32 (B, T, H). dw float32 (H, H) is\n"
     "accumulated in place: dw[h, h'] += sum_{b, t} g[b, t, h] de_new[b, t, h] . e_att[b, t, h'],\n"
     "g = sigmoid(gate_logits); the sum is bit-identical for any number of threads."},
    {NULL, NULL, 0, NULL}};
