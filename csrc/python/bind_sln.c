/* Binding of csrc/ops/sln.c (MapEM-SLN positions). */
#include "bind.h"

#define S(f) offsetof(MfSlnParams, f)
static const MfSize sln_sizes[] = {{"B", S(B), "B"}, {"T", S(T), "T"}, {"H", S(H), "H"},
                                   {"D", S(D), "D"}, {"NB", S(NB), "NB"}, {"F", S(F), "F"},
                                   {0}};

/* D even, NB = D / 2 (the start vectors' pairs), gen's last axis 4 (a 2x2 block) */
static int sln_check(MfCall *c, void *params) {
    const MfSlnParams *p = params;
    if (mf_even_head_dim(c, "2x2 blocks") < 0) return -1;
    if (p->NB != p->D / 2) {
        PyErr_Format(PyExc_ValueError,
                     "delta must have shape (B, T, H, D/2) with D = %lld the start vectors' "
                     "head dim, got NB = %lld", (long long)p->D, (long long)p->NB);
        return -1;
    }
    if (p->F != 4) {
        PyErr_Format(PyExc_ValueError,
                     "gen must have shape (H, NB, 4) (a 2x2 matrix per block), got last axis "
                     "%lld", (long long)p->F);
        return -1;
    }
    return 0;
}

#define CLAMP(pos) {"clamp", pos, MF_FLOAT, MF_OPTIONAL, MF_FIELD(S, clamp), .lo = 0, \
                    .hi = 80, .open = MF_LO_OPEN, .dflt = 10}

static const MfArg sln_forward_args[] = {
    {"start", 3, MF_IN, 0, "H D", MF_FIELD(S, start)},
    {"delta", 1, MF_IN, 0, "B T H NB", MF_FIELD(S, delta)},
    {"gen", 2, MF_IN, 0, "H NB F", MF_FIELD(S, gen)},
    CLAMP(4),
    {"p", 0, MF_OUT, 0, "B T H D", MF_FIELD(S, p)},
    {0}};
static const MfOp sln_forward_op = {"sln_forward", sln_forward_args, sln_sizes,
                                    sizeof(MfSlnParams), .run = MF_OP(sln_forward),
                                    .check = sln_check};

static const MfArg sln_backward_args[] = {
    {"start", 4, MF_IN, 0, "H D", MF_FIELD(S, start)},
    {"dp", 1, MF_IN, 0, "B T H D", MF_FIELD(S, dp)},
    {"delta", 2, MF_IN, 0, "B T H NB", MF_FIELD(S, delta)},
    {"gen", 3, MF_IN, 0, "H NB F", MF_FIELD(S, gen)},
    {"dgen", 5, MF_INOUT, 0, "H NB F", MF_FIELD(S, dgen)},
    {"dstart", 6, MF_INOUT, 0, "H D", MF_FIELD(S, dstart)},
    CLAMP(7),
    {"ddelta", 0, MF_OUT, 0, "B T H NB", MF_FIELD(S, ddelta)},
    {0}};
static const MfOp sln_backward_op = {"sln_backward", sln_backward_args, sln_sizes,
                                     sizeof(MfSlnParams), .run = MF_OP(sln_backward),
                                     .check = sln_check};

MF_DEFINE(sln_forward, sln_forward_op)
MF_DEFINE(sln_backward, sln_backward_op)

PyMethodDef mf_sln_methods[] = {
    MF_METHOD(sln_forward,
     "sln_forward(delta, gen, start, clamp=10) -> p\n\n"
     "delta float32 (B, T, H, NB), gen float32 (H, NB, 4) (A_bar per block, row-major),\n"
     "start float32 (H, D), D = 2 NB -> p float32 (B, T, H, D): per block\n"
     "p[t] = exp(Phi_t A) start, A = A_bar - tr(A_bar)/2 I, Phi_t = cumsum_t(delta) (double);\n"
     "when det A < 0 the argument |Phi| sqrt(-det A) is capped at clamp (0, 80]."),
    MF_METHOD(sln_backward,
     "sln_backward(dp, delta, gen, start, dgen, dstart, clamp=10) -> ddelta\n\n"
     "Gradients of sln_forward: ddelta float32 (B, T, H, NB) returned; dgen (H, NB, 4)\n"
     "(trace-free part) and dstart (H, D) accumulated in place (+=)."),
    {NULL, NULL, 0, NULL}};
