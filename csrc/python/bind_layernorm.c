/* Binding of csrc/ops/layernorm.c. */
#include "bind.h"

#define P(f) offsetof(MfLayernormParams, f)
static const MfSize sizes[] = {{"N", P(N), "N"}, {"C", P(C), "C"}, {0}};

static const MfArg forward_args[] = {
    {"x", 1, MF_IN, 0, "N C", MF_FIELD(P, x)},
    {"weight", 2, MF_IN, 0, "C", MF_FIELD(P, weight)},
    {"bias", 3, MF_IN, 0, "C", MF_FIELD(P, bias)},
    {"eps", 4, MF_FLOAT, MF_OPTIONAL, MF_FIELD(P, eps), .lo = 0, .hi = INFINITY,
     .open = MF_LO_OPEN | MF_HI_OPEN, .dflt = 1e-5},
    {"y", 0, MF_OUT, 0, "N C", MF_FIELD(P, y)},
    {"mean", 0, MF_OUT, 0, "N", MF_FIELD(P, mean)},
    {"rstd", 0, MF_OUT, 0, "N", MF_FIELD(P, rstd)},
    {0}};
static const MfOp forward = {"layernorm_forward", forward_args, sizes, sizeof(MfLayernormParams),
                             .run = MF_OP(layernorm_forward)};

/* dbias is checked before dweight: of two gradients sharing memory, dbias is named */
static const MfArg backward_args[] = {
    {"dy", 1, MF_IN, 0, "N C", MF_FIELD(P, dy)},
    {"x", 2, MF_IN, 0, "N C", MF_FIELD(P, x)},
    {"mean", 3, MF_IN, 0, "N", MF_FIELD(P, mean_in)},
    {"rstd", 4, MF_IN, 0, "N", MF_FIELD(P, rstd_in)},
    {"weight", 5, MF_IN, 0, "C", MF_FIELD(P, weight)},
    {"dbias", 7, MF_INOUT, 0, "C", MF_FIELD(P, dbias)},
    {"dweight", 6, MF_INOUT, 0, "C", MF_FIELD(P, dweight)},
    {"dx", 8, MF_OUT_OR_INTO, MF_OPTIONAL | MF_NONE, "N C", MF_FIELD(P, dx),
     .given = P(accumulate_dx), .given_name = "accumulate_dx"},
    {0}};
static const MfOp backward = {"layernorm_backward", backward_args, sizes,
                              sizeof(MfLayernormParams), .run = MF_OP(layernorm_backward),
                              .scratch = MF_SCRATCH(layernorm_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfLayernormParams)};

MF_DEFINE(layernorm_forward, forward)
MF_DEFINE(layernorm_backward, backward)

PyMethodDef mf_layernorm_methods[] = {
    MF_METHOD(layernorm_forward,
     "layernorm_forward(x, weight, bias, eps=1e-5) -> (y, mean, rstd)\n\n"
     "x float32 (N, C), weight float32 (C,), bias float32 (C,), eps finite > 0\n"
     "-> y float32 (N, C) = (x - mean) * rstd * weight + bias, mean float32 (N,),\n"
     "rstd float32 (N,) = 1 / sqrt(var + eps) (biased variance); keep mean, rstd for backward."),
    MF_METHOD(layernorm_backward,
     "layernorm_backward(dy, x, mean, rstd, weight, dweight, dbias, dx=None) -> dx\n\n"
     "dy, x float32 (N, C), mean, rstd float32 (N,) from layernorm_forward, weight (C,).\n"
     "Parameter gradients are accumulated in place: dweight (C,) += sum_n dy * xhat,\n"
     "dbias (C,) += sum_n dy.\n"
     "dx None: returns a new dx float32 (N, C); dx given (N, C): accumulated into (+=) and\n"
     "returned. Outputs must not share memory with inputs or each other."),
    {NULL, NULL, 0, NULL}};
