/* Binding of csrc/ops/path_integration.c and csrc/ops/rotary.c (the MapWM rotary family). */
#include "common.h"

/* Check q-like (B, T, H, D) and require D even; fills dims. */
static PyArrayObject *head_array(PyObject *obj, const char *name, int64_t *dims) {
    PyArrayObject *a = mf_array(obj, name, MF_F32, 4, dims, "(B, T, H, D)");
    if (a != NULL && dims[3] % 2 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "%s has head dim D = %lld: the head dim D must be even (pairs are rotated)",
                     name, (long long)dims[3]);
        return NULL;
    }
    return a;
}

/* Check theta (TB, T, H, D/2) against q's dims (B, T, H, D); returns TB through *tb. */
static PyArrayObject *theta_array(PyObject *obj, const int64_t *qd, int64_t *tb) {
    int64_t td[4] = {-1, qd[1], qd[2], qd[3] / 2};
    PyArrayObject *a = mf_array(obj, "theta", MF_F32, 4, td, "(TB, T, H, D/2)");
    if (a == NULL) return NULL;
    if (td[0] != 1 && td[0] != qd[0]) {
        PyErr_Format(PyExc_ValueError,
                     "theta must have shape (TB, T, H, D/2) with TB = 1 or TB = B = %lld, got "
                     "TB = %lld",
                     (long long)qd[0], (long long)td[0]);
        return NULL;
    }
    *tb = td[0];
    return a;
}

static PyObject *py_path_integration_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"delta", "omega", NULL};
    PyObject *delta_obj, *omega_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:path_integration_forward", kwlist,
                                     &delta_obj, &omega_obj))
        return NULL;
    int64_t dd[4] = {-1, -1, -1, -1};
    PyArrayObject *delta = mf_array(delta_obj, "delta", MF_F32, 4, dd, "(B, T, H, NB)");
    if (delta == NULL) return NULL;
    int64_t od[2] = {dd[2], dd[3]};
    PyArrayObject *omega = mf_array(omega_obj, "omega", MF_F32, 2, od, "(H, NB)");
    if (omega == NULL) return NULL;
    PyArrayObject *theta = mf_empty_f32(4, dd);
    if (theta == NULL) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = path_integration_forward((float *)PyArray_DATA(theta),
                                      (const float *)PyArray_DATA(delta),
                                      (const float *)PyArray_DATA(omega), dd[0], dd[1], dd[2],
                                      dd[3]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(theta);
        return mf_raise_status(status, "path_integration_forward");
    }
    return (PyObject *)theta;
}

static PyObject *py_path_integration_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dtheta", "delta", "omega", "domega", NULL};
    PyObject *dtheta_obj, *delta_obj, *omega_obj, *domega_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:path_integration_backward", kwlist,
                                     &dtheta_obj, &delta_obj, &omega_obj, &domega_obj))
        return NULL;
    int64_t dd[4] = {-1, -1, -1, -1};
    PyArrayObject *dtheta = mf_array(dtheta_obj, "dtheta", MF_F32, 4, dd, "(B, T, H, NB)");
    if (dtheta == NULL) return NULL;
    PyArrayObject *delta = mf_array(delta_obj, "delta", MF_F32, 4, dd, "(B, T, H, NB)");
    if (delta == NULL) return NULL;
    int64_t od[2] = {dd[2], dd[3]};
    PyArrayObject *omega = mf_array(omega_obj, "omega", MF_F32, 2, od, "(H, NB)");
    if (omega == NULL) return NULL;
    PyArrayObject *domega = mf_output_array(domega_obj, "domega", MF_F32, 2, od, "(H, NB)");
    if (domega == NULL) return NULL;
    PyArrayObject *ddelta = mf_empty_f32(4, dd);
    if (ddelta == NULL) return NULL;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = path_integration_backward(
        (float *)PyArray_DATA(ddelta), (float *)PyArray_DATA(domega),
        (const float *)PyArray_DATA(dtheta), (const float *)PyArray_DATA(delta),
        (const float *)PyArray_DATA(omega), dd[0], dd[1], dd[2], dd[3]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        Py_DECREF(ddelta);
        return mf_raise_status(status, "path_integration_backward");
    }
    return (PyObject *)ddelta;
}

static PyObject *py_rotary_forward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"q", "k", "theta", NULL};
    PyObject *q_obj, *k_obj, *theta_obj, *result = NULL;
    PyArrayObject *q, *k, *theta, *q_out = NULL, *k_out = NULL;
    int64_t qd[4] = {-1, -1, -1, -1}, tb = 1;
    int status;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:rotary_forward", kwlist, &q_obj, &k_obj,
                                     &theta_obj))
        return NULL;
    if ((q = head_array(q_obj, "q", qd)) == NULL) goto done;
    if ((k = mf_array(k_obj, "k", MF_F32, 4, qd, "(B, T, H, D)")) == NULL) goto done;
    if ((theta = theta_array(theta_obj, qd, &tb)) == NULL) goto done;
    if ((q_out = mf_empty_f32(4, qd)) == NULL || (k_out = mf_empty_f32(4, qd)) == NULL) goto done;
    Py_BEGIN_ALLOW_THREADS;
    status = rotary_forward((float *)PyArray_DATA(q_out), (float *)PyArray_DATA(k_out),
                            (const float *)PyArray_DATA(q), (const float *)PyArray_DATA(k),
                            (const float *)PyArray_DATA(theta), qd[0], qd[1], qd[2], qd[3], tb);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "rotary_forward");
        goto done;
    }
    result = PyTuple_Pack(2, (PyObject *)q_out, (PyObject *)k_out);
done:
    Py_XDECREF(q_out);
    Py_XDECREF(k_out);
    return result;
}

static PyObject *py_rotary_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"dq_out", "dk_out", "q", "k", "theta", NULL};
    PyObject *dq_out_obj, *dk_out_obj, *q_obj, *k_obj, *theta_obj, *result = NULL;
    PyArrayObject *dq_out, *dk_out, *q, *k, *theta, *dq = NULL, *dk = NULL, *dtheta = NULL;
    int64_t qd[4] = {-1, -1, -1, -1}, td[4], tb = 1;
    int status;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO:rotary_backward", kwlist, &dq_out_obj,
                                     &dk_out_obj, &q_obj, &k_obj, &theta_obj))
        return NULL;
    if ((dq_out = head_array(dq_out_obj, "dq_out", qd)) == NULL) goto done;
    if ((dk_out = mf_array(dk_out_obj, "dk_out", MF_F32, 4, qd, "(B, T, H, D)")) == NULL)
        goto done;
    if ((q = mf_array(q_obj, "q", MF_F32, 4, qd, "(B, T, H, D)")) == NULL) goto done;
    if ((k = mf_array(k_obj, "k", MF_F32, 4, qd, "(B, T, H, D)")) == NULL) goto done;
    if ((theta = theta_array(theta_obj, qd, &tb)) == NULL) goto done;
    td[0] = tb, td[1] = qd[1], td[2] = qd[2], td[3] = qd[3] / 2;
    if ((dq = mf_empty_f32(4, qd)) == NULL || (dk = mf_empty_f32(4, qd)) == NULL ||
        (dtheta = mf_empty_f32(4, td)) == NULL)
        goto done;
    Py_BEGIN_ALLOW_THREADS;
    status = rotary_backward((float *)PyArray_DATA(dq), (float *)PyArray_DATA(dk),
                             (float *)PyArray_DATA(dtheta), (const float *)PyArray_DATA(dq_out),
                             (const float *)PyArray_DATA(dk_out), (const float *)PyArray_DATA(q),
                             (const float *)PyArray_DATA(k), (const float *)PyArray_DATA(theta),
                             qd[0], qd[1], qd[2], qd[3], tb);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) {
        mf_raise_status(status, "rotary_backward");
        goto done;
    }
    result = PyTuple_Pack(3, (PyObject *)dq, (PyObject *)dk, (PyObject *)dtheta);
done:
    Py_XDECREF(dq);
    Py_XDECREF(dk);
    Py_XDECREF(dtheta);
    return result;
}

PyMethodDef mf_rotary_methods[] = {
    {"path_integration_forward", (PyCFunction)(void (*)(void))py_path_integration_forward,
     METH_VARARGS | METH_KEYWORDS,
     "path_integration_forward(delta, omega) -> theta\n\n"
     "delta float32 (B, T, H, NB), omega float32 (H, NB) -> theta float32 (B, T, H, NB):\n"
     "theta[b, t, h, i] = omega[h, i] * sum_{s <= t} delta[b, s, h, i] (summed in double),\n"
     "reduced to [-pi, pi) before rounding to float32."},
    {"path_integration_backward", (PyCFunction)(void (*)(void))py_path_integration_backward,
     METH_VARARGS | METH_KEYWORDS,
     "path_integration_backward(dtheta, delta, omega, domega) -> ddelta\n\n"
     "dtheta, delta float32 (B, T, H, NB), omega float32 (H, NB) -> ddelta float32\n"
     "(B, T, H, NB) = reverse_cumsum_t(dtheta * omega). domega float32 (H, NB) is accumulated\n"
     "in place: domega += sum_{b, t} dtheta * cumsum_t(delta)."},
    {"rotary_forward", (PyCFunction)(void (*)(void))py_rotary_forward,
     METH_VARARGS | METH_KEYWORDS,
     "rotary_forward(q, k, theta) -> (q_out, k_out)\n\n"
     "q, k float32 (B, T, H, D) with D even, theta float32 (TB, T, H, D/2) with TB = 1\n"
     "(broadcast over b, RoPE) or TB = B -> q_out, k_out float32 (B, T, H, D): each pair\n"
     "(x[2i], x[2i+1]) rotated by theta_i: (x0 cos - x1 sin, x0 sin + x1 cos)."},
    {"rotary_backward", (PyCFunction)(void (*)(void))py_rotary_backward,
     METH_VARARGS | METH_KEYWORDS,
     "rotary_backward(dq_out, dk_out, q, k, theta) -> (dq, dk, dtheta)\n\n"
     "dq_out, dk_out, q, k float32 (B, T, H, D), theta float32 (TB, T, H, D/2) ->\n"
     "dq, dk float32 (B, T, H, D) = R(theta)^T d*_out, dtheta float32 (TB, T, H, D/2) =\n"
     "sum over q and k of (y0 dy1 - y1 dy0), also summed over b when TB = 1."},
    {NULL, NULL, 0, NULL}};
