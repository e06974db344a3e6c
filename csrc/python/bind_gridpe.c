/* Binding of csrc/ops/gridpe.c (GridPE's complex form). */
#include "bind.h"

#define G(f) offsetof(MfGridpeParams, f)
static const MfSize sizes[] = {{"B", G(B), "B"}, {"T", G(T), "T"}, {"H", G(H), "H"},
                               {"W", G(W), "W"}, {"TB", G(TB), "TB"}, {0}};

/* theta's TB = 1 (broadcast over b) or B; the backward's dy of an even last axis W = 2E (the
 * forward's y is made so) */
static int check(MfCall *c, void *params) {
    (void)c;
    const MfGridpeParams *p = params;
    if (p->W % 2 != 0) {
        PyErr_Format(PyExc_ValueError, "dy must have an even last axis (2E: a cos and a sin "
                     "per angle), got %lld", (long long)p->W);
        return -1;
    }
    if (p->TB == 1 || p->TB == p->B) return 0;
    PyErr_Format(PyExc_ValueError,
                 "theta must have shape (TB, T, H, W/2) with TB = 1 or TB = B = %lld, got "
                 "TB = %lld",
                 (long long)p->B, (long long)p->TB);
    return -1;
}

static const MfArg forward_args[] = {
    {"x", 1, MF_IN, 0, "B T H W/2", MF_FIELD(G, x)},
    {"theta", 2, MF_IN, 0, "TB T H W/2", MF_FIELD(G, theta)},
    {"y", 0, MF_OUT, 0, "B T H W", MF_FIELD(G, y)},
    {0}};
static const MfOp forward = {"gridpe_complex_forward", forward_args, sizes,
                             sizeof(MfGridpeParams), .run = MF_OP(gridpe_complex_forward),
                             .check = check};

static const MfArg backward_args[] = {
    {"dy", 1, MF_IN, 0, "B T H W", MF_FIELD(G, dy)},
    {"theta", 2, MF_IN, 0, "TB T H W/2", MF_FIELD(G, theta)},
    {"dx", 0, MF_OUT, 0, "B T H W/2", MF_FIELD(G, dx)},
    {0}};
static const MfOp backward = {"gridpe_complex_backward", backward_args, sizes,
                              sizeof(MfGridpeParams), .run = MF_OP(gridpe_complex_backward),
                              .check = check};

MF_DEFINE(gridpe_complex_forward, forward)
MF_DEFINE(gridpe_complex_backward, backward)

PyMethodDef mf_gridpe_methods[] = {
    MF_METHOD(gridpe_complex_forward,
     "gridpe_complex_forward(x, theta) -> y\n\n"
     "x float32 (B, T, H, E), theta float32 (TB, T, H, E) with TB = 1 (broadcast over b)\n"
     "or B -> y float32 (B, T, H, 2E): y[..., 2d] = x[..., d] cos theta[..., d],\n"
     "y[..., 2d + 1] = x[..., d] sin theta[..., d] (GridPE's complex form: y_m . y'_n =\n"
     "sum_d x_d x'_d cos(theta_d(m) - theta_d(n)))."),
    MF_METHOD(gridpe_complex_backward,
     "gridpe_complex_backward(dy, theta) -> dx\n\n"
     "dy float32 (B, T, H, 2E), theta float32 (TB, T, H, E) -> dx float32 (B, T, H, E) =\n"
     "cos theta dy[..., 2d] + sin theta dy[..., 2d + 1] (theta is fixed: no gradient)."),
    {NULL, NULL, 0, NULL}};
