/* Binding of csrc/ops/mlp.c. */
#include "bind.h"

#define P(f) offsetof(MfMlpParams, f)
static const MfSize sizes[] = {{"N", P(N), "N"}, {"C", P(C), "C"}, {"F", P(F), "F"}, {0}};
static const char *const approximations[] = {"tanh", "none", NULL}; /* exact = the index */
#define APPROXIMATE(pos) {"approximate", pos, MF_CHOICE, MF_OPTIONAL | MF_KWONLY, \
                          MF_FIELD(P, exact), .choices = approximations}

static const MfArg forward_args[] = {
    {"x", 1, MF_IN, 0, "N C", MF_FIELD(P, x)},
    {"w_fc", 2, MF_IN, 0, "F C", MF_FIELD(P, w_fc)},
    {"b_fc", 3, MF_IN, 0, "F", MF_FIELD(P, b_fc)},
    {"w_proj", 4, MF_IN, 0, "C F", MF_FIELD(P, w_proj)},
    {"b_proj", 5, MF_IN, 0, "C", MF_FIELD(P, b_proj)},
    APPROXIMATE(6),
    {"y", 0, MF_OUT, 0, "N C", MF_FIELD(P, y)},
    {"h", 0, MF_OUT, 0, "N F", MF_FIELD(P, h)},
    {0}};
static const MfOp forward = {"mlp_forward", forward_args, sizes, sizeof(MfMlpParams),
                             .run = MF_OP(mlp_forward),
                             .scratch = MF_SCRATCH(mlp_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfMlpParams)};

/* w_fc (which fixes F) is checked before h */
static const MfArg backward_args[] = {
    {"dy", 1, MF_IN, 0, "N C", MF_FIELD(P, dy)},
    {"x", 2, MF_IN, 0, "N C", MF_FIELD(P, x)},
    {"w_fc", 4, MF_IN, 0, "F C", MF_FIELD(P, w_fc)},
    {"h", 3, MF_IN, 0, "N F", MF_FIELD(P, h_in)},
    {"w_proj", 5, MF_IN, 0, "C F", MF_FIELD(P, w_proj)},
    {"dw_fc", 6, MF_INOUT, 0, "F C", MF_FIELD(P, dw_fc)},
    {"db_fc", 7, MF_INOUT, 0, "F", MF_FIELD(P, db_fc)},
    {"dw_proj", 8, MF_INOUT, 0, "C F", MF_FIELD(P, dw_proj)},
    {"db_proj", 9, MF_INOUT, 0, "C", MF_FIELD(P, db_proj)},
    APPROXIMATE(10),
    {"dx", 0, MF_OUT, 0, "N C", MF_FIELD(P, dx)},
    {0}};
static const MfOp backward = {"mlp_backward", backward_args, sizes, sizeof(MfMlpParams),
                              .run = MF_OP(mlp_backward),
                              .scratch = MF_SCRATCH(mlp_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfMlpParams)};

MF_DEFINE(mlp_forward, forward)
MF_DEFINE(mlp_backward, backward)

PyMethodDef mf_mlp_methods[] = {
    MF_METHOD(mlp_forward,
     "mlp_forward(x, w_fc, b_fc, w_proj, b_proj, *, approximate='tanh') -> (y, h)\n\n"
     "x float32 (N, C), w_fc (F, C), b_fc (F,), w_proj (C, F), b_proj (C,) ->\n"
     "y (N, C) = gelu(h) @ w_proj.T + b_proj (GELU's tanh approximation; approximate 'none':\n"
     "the exact GELU, as gelu_forward's), and\n"
     "h (N, F) = x @ w_fc.T + b_fc, which mlp_backward needs."),
    MF_METHOD(mlp_backward,
     "mlp_backward(dy, x, h, w_fc, w_proj, dw_fc, db_fc, dw_proj, db_proj, *,\n"
     "             approximate='tanh') -> dx\n\n"
     "dy float32 (N, C); x, h, w_fc, w_proj as given to / returned by mlp_forward.\n"
     "Parameter gradients are accumulated in place: dw_fc (F, C), db_fc (F,), dw_proj (C, F),\n"
     "db_proj (C,); they must not share memory with the inputs or with each other.\n"
     "Returns a new dx float32 (N, C)."),
    {NULL, NULL, 0, NULL}};
