/* Binding of csrc/ops/b4.c (MapEM-b4 positions). */
#include "bind.h"

#define S(f) offsetof(MfB4Params, f)
static const MfSize b4_sizes[] = {{"B", S(B), "B"}, {"T", S(T), "T"}, {"H", S(H), "H"},
                                  {"D", S(D), "D"}, {"NB", S(NB), "NB"}, {"F", S(F), "F"},
                                  {0}};

/* D a multiple of 4, NB = D / 4, gen's last axis 6 (u, v) */
static int b4_check(MfCall *c, void *params) {
    const MfB4Params *p = params;
    if (mf_size(c, "D") % 4) {
        PyErr_Format(PyExc_ValueError, "%s has head dim D = %lld: MapEM-b4 needs D a multiple "
                     "of 4 (4x4 blocks)", mf_size_from(c, "D"), (long long)p->D);
        return -1;
    }
    if (p->NB != p->D / 4) {
        PyErr_Format(PyExc_ValueError,
                     "delta must have shape (B, T, H, D/4) with D = %lld the start vectors' "
                     "head dim, got NB = %lld", (long long)p->D, (long long)p->NB);
        return -1;
    }
    if (p->F != 6) {
        PyErr_Format(PyExc_ValueError,
                     "gen must have shape (H, NB, 6) ((u, v) per block), got last axis "
                     "%lld", (long long)p->F);
        return -1;
    }
    return 0;
}

static const MfArg b4_forward_args[] = {
    {"start", 3, MF_IN, 0, "H D", MF_FIELD(S, start)},
    {"delta", 1, MF_IN, 0, "B T H NB", MF_FIELD(S, delta)},
    {"gen", 2, MF_IN, 0, "H NB F", MF_FIELD(S, gen)},
    {"p", 0, MF_OUT, 0, "B T H D", MF_FIELD(S, p)},
    {0}};
static const MfOp b4_forward_op = {"b4_forward", b4_forward_args, b4_sizes,
                                    sizeof(MfB4Params), .run = MF_OP(b4_forward),
                                    .check = b4_check};

static const MfArg b4_backward_args[] = {
    {"start", 4, MF_IN, 0, "H D", MF_FIELD(S, start)},
    {"dp", 1, MF_IN, 0, "B T H D", MF_FIELD(S, dp)},
    {"delta", 2, MF_IN, 0, "B T H NB", MF_FIELD(S, delta)},
    {"gen", 3, MF_IN, 0, "H NB F", MF_FIELD(S, gen)},
    {"dgen", 5, MF_INOUT, 0, "H NB F", MF_FIELD(S, dgen)},
    {"dstart", 6, MF_INOUT, 0, "H D", MF_FIELD(S, dstart)},
    {"ddelta", 0, MF_OUT, 0, "B T H NB", MF_FIELD(S, ddelta)},
    {0}};
static const MfOp b4_backward_op = {"b4_backward", b4_backward_args, b4_sizes,
                                     sizeof(MfB4Params), .run = MF_OP(b4_backward),
                                     .check = b4_check};

MF_DEFINE(b4_forward, b4_forward_op)
MF_DEFINE(b4_backward, b4_backward_op)

PyMethodDef mf_b4_methods[] = {
    MF_METHOD(b4_forward,
     "b4_forward(delta, gen, start) -> p\n\n"
     "delta float32 (B, T, H, NB), gen float32 (H, NB, 6) = (u, v), start float32 (H, D),\n"
     "D = 4 NB -> p float32 (B, T, H, D): per 4-block p[t] = exp(Phi_t S) start =\n"
     "qexp(Phi_t u) start qexp(Phi_t v) (quaternions w, x, y, z), S = L(u) + R(v),\n"
     "Phi_t = cumsum_t(delta) in double."),
    MF_METHOD(b4_backward,
     "b4_backward(dp, delta, gen, start, dgen, dstart) -> ddelta\n\n"
     "Gradients of b4_forward: ddelta float32 (B, T, H, NB) returned; dgen (H, NB, 6) and\n"
     "dstart (H, D) accumulated in place (+=)."),
    {NULL, NULL, 0, NULL}};
