/* Binding of csrc/ops/linear.c. */
#include "bind.h"

#include <limits.h>

#define P(f) offsetof(MfLinearParams, f)
static const MfSize sizes[] = {{"N", P(N), "N"}, {"Cin", P(Cin), "Cin"}, {"Cout", P(Cout), "Cout"},
                               {0}};

/* N, Cin and Cout each fit OpenBLAS's int (a weight of more than 2^18 floats is multiplied by
 * it on every kernel set, and the blas set multiplies every one) */
static int check(MfCall *c, void *params) {
    (void)c;
    const MfLinearParams *p = params;
    const char *size = p->N > INT_MAX     ? "x's N (rows)"
                       : p->Cin > INT_MAX  ? "x's Cin (columns)"
                       : p->Cout > INT_MAX ? "weight's Cout (rows)"
                                           : NULL;
    if (size == NULL) return 0;
    PyErr_Format(PyExc_ValueError, "%s must be at most 2**31 - 1 (OpenBLAS's int), got N = "
                 "%lld, Cin = %lld, Cout = %lld", size, (long long)p->N, (long long)p->Cin,
                 (long long)p->Cout);
    return -1;
}

static const MfArg forward_args[] = {
    {"x", 1, MF_IN, 0, "N Cin", MF_FIELD(P, x)},
    {"weight", 2, MF_IN, 0, "Cout Cin", MF_FIELD(P, weight)},
    {"bias", 3, MF_IN, MF_OPTIONAL | MF_NONE, "Cout", MF_FIELD(P, bias)},
    {"y", 0, MF_OUT, 0, "N Cout", MF_FIELD(P, y)},
    {0}};
static const MfOp forward = {"linear_forward", forward_args, sizes, sizeof(MfLinearParams),
                             .run = MF_OP(linear_forward),
                             .scratch = MF_SCRATCH(linear_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfLinearParams), .check = check};

/* dbias is checked before dweight: of two gradients sharing memory, dbias is named */
static const MfArg backward_args[] = {
    {"dy", 1, MF_IN, 0, "N Cout", MF_FIELD(P, dy)},
    {"x", 2, MF_IN, 0, "N Cin", MF_FIELD(P, x)},
    {"weight", 3, MF_IN, 0, "Cout Cin", MF_FIELD(P, weight)},
    {"dbias", 5, MF_INOUT, MF_OPTIONAL | MF_NONE, "Cout", MF_FIELD(P, dbias)},
    {"dweight", 4, MF_INOUT, 0, "Cout Cin", MF_FIELD(P, dweight)},
    {"dx", 6, MF_OUT_OR_INTO, MF_OPTIONAL | MF_NONE, "N Cin", MF_FIELD(P, dx),
     .given = P(accumulate_dx), .given_name = "accumulate_dx"},
    {0}};
static const MfOp backward = {"linear_backward", backward_args, sizes, sizeof(MfLinearParams),
                              .run = MF_OP(linear_backward),
                              .scratch = MF_SCRATCH(linear_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfLinearParams), .check = check};

MF_DEFINE(linear_forward, forward)
MF_DEFINE(linear_backward, backward)

PyMethodDef mf_linear_methods[] = {
    MF_METHOD(linear_forward,
     "linear_forward(x, weight, bias=None) -> y\n\n"
     "x float32 (N, Cin), weight float32 (Cout, Cin), bias float32 (Cout,) or None\n"
     "-> y float32 (N, Cout) = x @ weight.T + bias."),
    MF_METHOD(linear_backward,
     "linear_backward(dy, x, weight, dweight, dbias=None, dx=None) -> dx\n\n"
     "dy float32 (N, Cout), x float32 (N, Cin), weight float32 (Cout, Cin).\n"
     "Parameter gradients are accumulated in place: dweight (Cout, Cin) += dy.T @ x and,\n"
     "when given, dbias (Cout,) += dy.sum(0).\n"
     "dx None: returns a new dx float32 (N, Cin) = dy @ weight; dx given (N, Cin): dx += dy @\n"
     "weight in place and dx itself is returned. Outputs must not share memory with inputs."),
    {NULL, NULL, 0, NULL}};
