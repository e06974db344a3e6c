/* Binding of csrc/ops/nc_general.c (MapEM-NC for any block size b and K generators). */
#include "bind.h"

#define N(f) offsetof(MfNcGeneralParams, f)
static const MfSize ncg_sizes[] = {{"B", N(B), "B"}, {"T", N(T), "T"}, {"H", N(H), "H"},
                                   {"D", N(D), "D"}, {"NB", N(NB), "NB"}, {"K", N(K), "K"},
                                   {"b", N(b), "b"}, {0}};

/* 2 <= b <= 16, D = NB b, K >= 1 */
static int ncg_check_sizes(MfCall *c, void *params) {
    const MfNcGeneralParams *p = params;
    if (p->b < 2 || p->b > 16) {
        PyErr_Format(PyExc_ValueError, "gen has block size b = %lld (%s's last two axes): "
                     "nc_general needs 2 <= b <= 16", (long long)p->b, mf_size_from(c, "b"));
        return -1;
    }
    if (p->D != p->NB * p->b) {
        PyErr_Format(PyExc_ValueError, "start has head dim D = %lld, but theta and gen give "
                     "NB = %lld blocks of b = %lld: D must be NB b", (long long)p->D,
                     (long long)p->NB, (long long)p->b);
        return -1;
    }
    if (p->K < 1) {
        PyErr_Format(PyExc_ValueError, "theta and gen need K >= 1 generators, got K = %lld",
                     (long long)p->K);
        return -1;
    }
    return 0;
}

static const MfArg ncg_forward_args[] = {
    {"start", 3, MF_IN, 0, "H D", MF_FIELD(N, start)},
    {"theta", 1, MF_IN, 0, "B T H NB K", MF_FIELD(N, theta)},
    {"gen", 2, MF_IN, 0, "H NB K b b", MF_FIELD(N, gen)},
    {"p", 0, MF_OUT, 0, "B T H D", MF_FIELD(N, p)},
    {0}};
static const MfOp ncg_forward_op = {"nc_general_forward", ncg_forward_args, ncg_sizes,
                                    sizeof(MfNcGeneralParams),
                                    .run = MF_OP(nc_general_forward), .check = ncg_check_sizes};

static const MfArg ncg_backward_args[] = {
    {"start", 4, MF_IN, 0, "H D", MF_FIELD(N, start)},
    {"dp", 1, MF_IN, 0, "B T H D", MF_FIELD(N, dp)},
    {"theta", 2, MF_IN, 0, "B T H NB K", MF_FIELD(N, theta)},
    {"gen", 3, MF_IN, 0, "H NB K b b", MF_FIELD(N, gen)},
    {"dgen", 5, MF_INOUT, 0, "H NB K b b", MF_FIELD(N, dgen)},
    {"dstart", 6, MF_INOUT, 0, "H D", MF_FIELD(N, dstart)},
    {"dtheta", 0, MF_OUT, 0, "B T H NB K", MF_FIELD(N, dtheta)},
    {0}};
static const MfOp ncg_backward_op = {"nc_general_backward", ncg_backward_args, ncg_sizes,
                                     sizeof(MfNcGeneralParams),
                                     .run = MF_OP(nc_general_backward),
                                     .scratch = MF_SCRATCH(nc_general_backward_scratch_floats),
                                     MF_SCRATCH_FIELDS(MfNcGeneralParams),
                                     .check = ncg_check_sizes};

MF_DEFINE(nc_general_forward, ncg_forward_op)
MF_DEFINE(nc_general_backward, ncg_backward_op)

PyMethodDef mf_nc_general_methods[] = {
    MF_METHOD(nc_general_forward,
     "nc_general_forward(theta, gen, start) -> p\n\n"
     "theta float32 (B, T, H, NB, K), gen float32 (H, NB, K, b, b) the generators S_i,\n"
     "start float32 (H, D), D = NB b, 2 <= b <= 16 -> p float32 (B, T, H, D): per block\n"
     "p_t = exp(X_t) p_{t-1}, p_0 = start, X_t = sum_i theta_t,i S_i (exp by scaling and\n"
     "squaring of a degree-12 Taylor polynomial, in double)."),
    MF_METHOD(nc_general_backward,
     "nc_general_backward(dp, theta, gen, start, dgen, dstart) -> dtheta\n\n"
     "Gradients of nc_general_forward: dtheta float32 (B, T, H, NB, K) returned; dgen\n"
     "(H, NB, K, b, b) and dstart (H, D) accumulated in place (+=)."),
    {NULL, NULL, 0, NULL}};
