/* Binding of csrc/ops/l2_normalize.c. */
#include "bind.h"

#define P(f) offsetof(MfL2NormalizeParams, f)
static const MfSize sizes[] = {{"N", P(N), "N"}, {"D", P(D), "D"}, {0}};

static const MfArg forward_args[] = {
    {"x", 1, MF_IN, 0, "N D", MF_FIELD(P, x)},
    {"eps", 2, MF_FLOAT, MF_OPTIONAL, MF_FIELD(P, eps), .lo = 0, .hi = INFINITY,
     .open = MF_LO_OPEN | MF_HI_OPEN, .dflt = 1e-12},
    {"y", 0, MF_OUT, 0, "N D", MF_FIELD(P, y)},
    {"norm", 0, MF_OUT, 0, "N", MF_FIELD(P, norm)},
    {0}};
static const MfOp forward = {"l2_normalize_forward", forward_args, sizes,
                             sizeof(MfL2NormalizeParams), .run = MF_OP(l2_normalize_forward)};

/* norm finite and > 0 (the forward's are at least sqrt(eps)): a zero would make dx infinite */
static int backward_check(MfCall *c, void *params) {
    const MfL2NormalizeParams *p = params;
    (void)c;
    for (int64_t i = 0; i < p->N; i++) {
        if (!(p->norm_in[i] > 0.0f && isfinite(p->norm_in[i]))) {
            char value[32];
            snprintf(value, sizeof value, "%g", (double)p->norm_in[i]);
            PyErr_Format(PyExc_ValueError,
                         "norm[%lld] = %s must be finite and > 0 (l2_normalize_forward's norm)",
                         (long long)i, value);
            return -1;
        }
    }
    return 0;
}

static const MfArg backward_args[] = {
    {"dy", 1, MF_IN, 0, "N D", MF_FIELD(P, dy)},
    {"y", 2, MF_IN, 0, "N D", MF_FIELD(P, y_in)},
    {"norm", 3, MF_IN, 0, "N", MF_FIELD(P, norm_in)},
    {"dx", 0, MF_OUT, 0, "N D", MF_FIELD(P, dx)},
    {0}};
static const MfOp backward = {"l2_normalize_backward", backward_args, sizes,
                              sizeof(MfL2NormalizeParams), .run = MF_OP(l2_normalize_backward),
                              .check = backward_check};

MF_DEFINE(l2_normalize_forward, forward)
MF_DEFINE(l2_normalize_backward, backward)

PyMethodDef mf_l2_normalize_methods[] = {
    MF_METHOD(l2_normalize_forward,
     "l2_normalize_forward(x, eps=1e-12) -> (y, norm)\n\n"
     "x float32 (N, D), eps finite > 0 -> y float32 (N, D) = x / norm, norm float32 (N,) =\n"
     "sqrt(sum_d x**2 + eps) (squares summed in double); keep y, norm for the backward. A zero\n"
     "row gives y = 0. The same bits for any thread count."),
    MF_METHOD(l2_normalize_backward,
     "l2_normalize_backward(dy, y, norm) -> dx\n\n"
     "dy float32 (N, D), y (N, D) and norm (N,) from l2_normalize_forward (norm finite > 0)\n"
     "-> dx float32 (N, D) = (dy - y (y . dy)) / norm, row by row."),
    {NULL, NULL, 0, NULL}};
