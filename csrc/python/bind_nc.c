/* Binding of csrc/ops/nc.c (MapEM-NC positions). */
#include "bind.h"

#define N(f) offsetof(MfNcParams, f)
static const MfSize nc_sizes[] = {{"B", N(B), "B"}, {"T", N(T), "T"}, {"H", N(H), "H"},
                                  {"D", N(D), "D"}, {"NB", N(NB), "NB"}, {"F", N(F), "F"},
                                  {0}};

/* D a multiple of 4, NB = D / 4, w's axis F 6 (u, v) */
static int nc_check(MfCall *c, void *params) {
    const MfNcParams *p = params;
    if (mf_size(c, "D") % 4) {
        PyErr_Format(PyExc_ValueError, "%s has head dim D = %lld: MapEM-NC needs D a multiple "
                     "of 4 (4x4 blocks)", mf_size_from(c, "D"), (long long)p->D);
        return -1;
    }
    if (p->NB != p->D / 4) {
        PyErr_Format(PyExc_ValueError,
                     "w must have shape (B, T, H, 6, D/4) with D = %lld the start vectors' "
                     "head dim, got NB = %lld", (long long)p->D, (long long)p->NB);
        return -1;
    }
    if (p->F != 6) {
        PyErr_Format(PyExc_ValueError,
                     "w must have shape (B, T, H, 6, NB) ((u, v) per token and block), got "
                     "axis 3 of length %lld", (long long)p->F);
        return -1;
    }
    return 0;
}

static const MfArg nc_forward_args[] = {
    {"start", 2, MF_IN, 0, "H D", MF_FIELD(N, start)},
    {"w", 1, MF_IN, 0, "B T H F NB", MF_FIELD(N, w)},
    {"p", 0, MF_OUT, 0, "B T H D", MF_FIELD(N, p)},
    {0}};
static const MfOp nc_forward_op = {"nc_forward", nc_forward_args, nc_sizes,
                                   sizeof(MfNcParams), .run = MF_OP(nc_forward),
                                   .check = nc_check};

static const MfArg nc_backward_args[] = {
    {"start", 3, MF_IN, 0, "H D", MF_FIELD(N, start)},
    {"dp", 1, MF_IN, 0, "B T H D", MF_FIELD(N, dp)},
    {"w", 2, MF_IN, 0, "B T H F NB", MF_FIELD(N, w)},
    {"dstart", 4, MF_INOUT, 0, "H D", MF_FIELD(N, dstart)},
    {"dw", 0, MF_OUT, 0, "B T H F NB", MF_FIELD(N, dw)},
    {0}};
static const MfOp nc_backward_op = {"nc_backward", nc_backward_args, nc_sizes,
                                    sizeof(MfNcParams), .run = MF_OP(nc_backward),
                                    .scratch = MF_SCRATCH(nc_backward_scratch_floats),
                                    MF_SCRATCH_FIELDS(MfNcParams), .check = nc_check};

MF_DEFINE(nc_forward, nc_forward_op)
MF_DEFINE(nc_backward, nc_backward_op)

PyMethodDef mf_nc_methods[] = {
    MF_METHOD(nc_forward,
     "nc_forward(w, start) -> p\n\n"
     "w float32 (B, T, H, 6, NB) = (u_t, v_t) per token and 4-block, start float32 (H, D),\n"
     "D = 4 NB -> p float32 (B, T, H, D): the ordered product p_t = exp(S_t) ... exp(S_1)\n"
     "start, S_t = L(u_t) + R(v_t), as A_t start C_t with A_t = qexp(u_t) A_{t-1},\n"
     "C_t = C_{t-1} qexp(v_t) (float32, renormalised every step). Feature-major within a\n"
     "head: w[..., f, k] is coordinate f of block k, and p, start hold component f of\n"
     "block k's quaternion at f NB + k."),
    MF_METHOD(nc_backward,
     "nc_backward(dp, w, start, dstart) -> dw\n\n"
     "Gradients of nc_forward: dw float32 (B, T, H, 6, NB) returned; dstart (H, D)\n"
     "accumulated in place (+=)."),
    {NULL, NULL, 0, NULL}};
