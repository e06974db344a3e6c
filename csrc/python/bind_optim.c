/* Binding of csrc/ops/adamw.c and csrc/ops/grad_norm.c. */
#include "common.h" /* Python.h first */

#include <math.h>

/* A float argument of the optimizer: finite, in [lo, hi) (hi_open) or [lo, hi], and still so
 * once rounded to float32 (the C core's type). Raises ValueError naming it. */
static int check_scalar(double x, const char *name, double lo, double hi, const char *range) {
    float f = (float)x;
    if (isfinite(x) && x >= lo && x < hi && isfinite(f) && (double)f >= lo && (double)f < hi)
        return 0;
    PyObject *value = PyFloat_FromDouble(x);
    if (value == NULL) return -1;
    PyErr_Format(PyExc_ValueError, "%s must be a finite number in %s (as float32), got %R", name,
                 range, value);
    Py_DECREF(value);
    return -1;
}

static PyObject *py_adamw_step(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"params", "grads", "m",  "v",   "decay_mask",   "lr",
                             "step",   "beta1", "beta2", "eps", "weight_decay", NULL};
    PyObject *params_obj, *grads_obj, *m_obj, *v_obj, *mask_obj, *lr_obj = NULL, *step_obj = NULL;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|$OOdddd:adamw_step", kwlist,
                                     &params_obj, &grads_obj, &m_obj, &v_obj, &mask_obj, &lr_obj,
                                     &step_obj, &beta1, &beta2, &eps, &weight_decay))
        return NULL;
    /* lr and step are required keyword-only arguments (the format language has no way to say
     * so: both are parsed as optional objects and checked here) */
    if (lr_obj == NULL || step_obj == NULL) {
        PyErr_Format(PyExc_TypeError, "adamw_step() missing required keyword-only argument '%s'",
                     lr_obj == NULL ? "lr" : "step");
        return NULL;
    }
    int64_t pd[1] = {-1};
    PyArrayObject *params = mf_output_array(params_obj, "params", MF_F32, 1, pd, "(P,)");
    if (params == NULL) return NULL;
    int64_t gd[1] = {pd[0]}, md[1] = {pd[0]}, vd[1] = {pd[0]}, kd[1] = {pd[0]};
    PyArrayObject *grads = mf_array(grads_obj, "grads", MF_F32, 1, gd, "(P,)");
    if (grads == NULL) return NULL;
    PyArrayObject *m = mf_output_array(m_obj, "m", MF_F32, 1, md, "(P,)");
    if (m == NULL) return NULL;
    PyArrayObject *v = mf_output_array(v_obj, "v", MF_F32, 1, vd, "(P,)");
    if (v == NULL) return NULL;
    PyArrayObject *mask = mf_array(mask_obj, "decay_mask", NPY_BOOL, 1, kd, "(P,)");
    if (mask == NULL) return NULL;
    PyArrayObject *arrays[] = {params, grads, m, v, mask};
    const char *names[] = {"params", "grads", "m", "v", "decay_mask"};
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (mf_check_disjoint(arrays[i], names[i], arrays[j], names[j]) < 0) return NULL;
    double lr = PyFloat_AsDouble(lr_obj); /* anything with __float__, as the "d" format */
    if (lr == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "lr must be a real number, got %s",
                         Py_TYPE(lr_obj)->tp_name);
        }
        return NULL;
    }
    /* an integer (int, NumPy integer: anything with __index__), not a bool or a float */
    if (PyBool_Check(step_obj) || !PyIndex_Check(step_obj)) {
        PyErr_Format(PyExc_TypeError, "step must be an int >= 1, got %R", step_obj);
        return NULL;
    }
    PyObject *step_int = PyNumber_Index(step_obj);
    if (step_int == NULL) return NULL;
    long long step = PyLong_AsLongLong(step_int);
    Py_DECREF(step_int);
    if (step == -1 && PyErr_Occurred()) return NULL;
    if (step < 1) {
        PyErr_Format(PyExc_ValueError, "step must be an int >= 1, got %lld", step);
        return NULL;
    }
    if (check_scalar(lr, "lr", 0.0, INFINITY, "[0, inf)") < 0 ||
        check_scalar(beta1, "beta1", 0.0, 1.0, "[0, 1)") < 0 ||
        check_scalar(beta2, "beta2", 0.0, 1.0, "[0, 1)") < 0 ||
        check_scalar(eps, "eps", 0.0, INFINITY, "(0, inf)") < 0 ||
        check_scalar(weight_decay, "weight_decay", 0.0, INFINITY, "[0, inf)") < 0)
        return NULL;
    if (!((float)eps > 0.0f)) {
        PyErr_Format(PyExc_ValueError, "eps must be a finite number in (0, inf) (as float32)");
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = adamw_step((float *)PyArray_DATA(params), (float *)PyArray_DATA(m),
                        (float *)PyArray_DATA(v), (const float *)PyArray_DATA(grads),
                        (const uint8_t *)PyArray_DATA(mask), pd[0], (float)lr, (float)beta1,
                        (float)beta2, (float)eps, (float)weight_decay, (int64_t)step);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) return mf_raise_status(status, "adamw_step");
    Py_RETURN_NONE;
}

static PyObject *py_global_norm(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"x", NULL};
    PyObject *x_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:global_norm", kwlist, &x_obj)) return NULL;
    int64_t xd[1] = {-1};
    PyArrayObject *x = mf_array(x_obj, "x", MF_F32, 1, xd, "(P,)");
    if (x == NULL) return NULL;
    double norm = 0.0;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = global_norm(&norm, (const float *)PyArray_DATA(x), xd[0]);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) return mf_raise_status(status, "global_norm");
    return PyFloat_FromDouble(norm);
}

static PyObject *py_clip_grad_norm(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"grads", "max_norm", NULL};
    PyObject *grads_obj;
    double max_norm;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Od:clip_grad_norm", kwlist, &grads_obj,
                                     &max_norm))
        return NULL;
    int64_t gd[1] = {-1};
    PyArrayObject *grads = mf_output_array(grads_obj, "grads", MF_F32, 1, gd, "(P,)");
    if (grads == NULL) return NULL;
    /* +inf means "never clip"; NaN, 0, negatives, and values that round to 0 in float32 fail */
    if (!(max_norm > 0.0) || !((float)max_norm > 0.0f)) {
        PyObject *value = PyFloat_FromDouble(max_norm);
        if (value == NULL) return NULL;
        PyErr_Format(PyExc_ValueError,
                     "max_norm must be a positive number (float('inf') disables clipping), got %R",
                     value);
        Py_DECREF(value);
        return NULL;
    }
    double norm = 0.0;
    int status;
    Py_BEGIN_ALLOW_THREADS;
    status = clip_grad_norm(&norm, (float *)PyArray_DATA(grads), gd[0], (float)max_norm);
    Py_END_ALLOW_THREADS;
    if (status != MF_OK) return mf_raise_status(status, "clip_grad_norm");
    return PyFloat_FromDouble(norm);
}

PyMethodDef mf_optim_methods[] = {
    {"adamw_step", (PyCFunction)(void (*)(void))py_adamw_step, METH_VARARGS | METH_KEYWORDS,
     "adamw_step(params, grads, m, v, decay_mask, *, lr, step, beta1=0.9, beta2=0.999,\n"
     "           eps=1e-8, weight_decay=0.0) -> None\n\n"
     "One AdamW step (PyTorch's rule, decoupled weight decay) in place on params, m, v.\n"
     "params, grads, m, v float32 (P,), decay_mask bool (P,) (decay only where True), all\n"
     "distinct buffers. lr finite >= 0, beta1 and beta2 in [0, 1), eps finite > 0,\n"
     "weight_decay finite >= 0, step int >= 1 (the 1-based step for bias correction)."},
    {"global_norm", (PyCFunction)(void (*)(void))py_global_norm, METH_VARARGS | METH_KEYWORDS,
     "global_norm(x) -> float\n\n"
     "x float32 (P,) -> sqrt(sum(x**2)), squares summed in double; the same bits for any\n"
     "thread count."},
    {"clip_grad_norm", (PyCFunction)(void (*)(void))py_clip_grad_norm,
     METH_VARARGS | METH_KEYWORDS,
     "clip_grad_norm(grads, max_norm) -> float\n\n"
     "grads float32 (P,), scaled in place by max_norm / (norm + 1e-6) when norm > max_norm.\n"
     "Returns the norm before clipping. max_norm > 0; float('inf') computes the norm and never\n"
     "clips. A non-finite norm (NaN or inf in grads) is returned and grads are left untouched,\n"
     "so the caller can skip the step."},
    {NULL, NULL, 0, NULL}};
