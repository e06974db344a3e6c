/* Binding of csrc/ops/gelu.c, csrc/ops/activation.c (SiLU, softplus, the SiLU gate) and
 * csrc/ops/residual.c: elementwise ops on arrays of any ndim >= 1; every array of one call has
 * the first array's shape ("..."). */
#include "bind.h"

#define G(f) offsetof(MfGeluParams, f)
#define R(f) offsetof(MfResidualParams, f)
#define AC(f) offsetof(MfActivationParams, f)
static const MfSize act_sizes[] = {{"...", AC(n), "n"}, {0}};

/* silu and softplus: the same rows as gelu's */
#define ACT_OPS(name)                                                                        \
    static const MfArg name##_forward_args[] = {                                             \
        {"x", 1, MF_IN, 0, "...", MF_FIELD(AC, x)}, {"y", 0, MF_OUT, 0, "...", MF_FIELD(AC, y)}, \
        {0}};                                                                                \
    static const MfOp name##_forward_op = {#name "_forward", name##_forward_args, act_sizes,  \
                                           sizeof(MfActivationParams),                       \
                                           .run = MF_OP(name##_forward)};                    \
    static const MfArg name##_backward_args[] = {                                            \
        {"dy", 1, MF_IN, 0, "...", MF_FIELD(AC, dy)},                                         \
        {"x", 2, MF_IN, 0, "...", MF_FIELD(AC, x)},                                           \
        {"dx", 0, MF_OUT, 0, "...", MF_FIELD(AC, dx)},                                        \
        {0}};                                                                                \
    static const MfOp name##_backward_op = {#name "_backward", name##_backward_args,         \
                                            act_sizes, sizeof(MfActivationParams),           \
                                            .run = MF_OP(name##_backward)};                  \
    MF_DEFINE(name##_forward, name##_forward_op)                                             \
    MF_DEFINE(name##_backward, name##_backward_op)
ACT_OPS(silu)
ACT_OPS(softplus)

#define SG(f) offsetof(MfSiluGateParams, f)
static const MfSize silu_gate_sizes[] = {{"...", SG(n), "n"}, {0}};
static const MfArg silu_gate_forward_args[] = {
    {"y", 1, MF_IN, 0, "...", MF_FIELD(SG, y)},
    {"z", 2, MF_IN, 0, "...", MF_FIELD(SG, z)},
    {"out", 0, MF_OUT, 0, "...", MF_FIELD(SG, out)},
    {0}};
static const MfOp silu_gate_forward_op = {"silu_gate_forward", silu_gate_forward_args,
                                          silu_gate_sizes, sizeof(MfSiluGateParams),
                                          .run = MF_OP(silu_gate_forward)};
static const MfArg silu_gate_backward_args[] = {
    {"dout", 1, MF_IN, 0, "...", MF_FIELD(SG, dout)},
    {"y", 2, MF_IN, 0, "...", MF_FIELD(SG, y)},
    {"z", 3, MF_IN, 0, "...", MF_FIELD(SG, z)},
    {"dy", 0, MF_OUT, 0, "...", MF_FIELD(SG, dy)},
    {"dz", 0, MF_OUT, 0, "...", MF_FIELD(SG, dz)},
    {0}};
static const MfOp silu_gate_backward_op = {"silu_gate_backward", silu_gate_backward_args,
                                           silu_gate_sizes, sizeof(MfSiluGateParams),
                                           .run = MF_OP(silu_gate_backward)};
MF_DEFINE(silu_gate_forward, silu_gate_forward_op)
MF_DEFINE(silu_gate_backward, silu_gate_backward_op)
static const MfSize gelu_sizes[] = {{"...", G(n), "n"}, {0}};
/* approximate: PyTorch's names, "tanh" (index 0, exact = 0) or "none" (the exact GELU) */
static const char *const gelu_approximations[] = {"tanh", "none", NULL};
static const MfSize residual_sizes[] = {{"...", R(n), "n"}, {0}};

static const MfArg gelu_forward_args[] = {
    {"x", 1, MF_IN, 0, "...", MF_FIELD(G, x)},
    {"approximate", 2, MF_CHOICE, MF_OPTIONAL | MF_KWONLY, MF_FIELD(G, exact),
     .choices = gelu_approximations},
    {"y", 0, MF_OUT, 0, "...", MF_FIELD(G, y)},
    {0}};
static const MfOp gelu_forward_op = {"gelu_forward", gelu_forward_args, gelu_sizes,
                                     sizeof(MfGeluParams), .run = MF_OP(gelu_forward)};

static const MfArg gelu_backward_args[] = {
    {"dy", 1, MF_IN, 0, "...", MF_FIELD(G, dy)},
    {"x", 2, MF_IN, 0, "...", MF_FIELD(G, x)},
    {"approximate", 3, MF_CHOICE, MF_OPTIONAL | MF_KWONLY, MF_FIELD(G, exact),
     .choices = gelu_approximations},
    {"dx", 0, MF_OUT, 0, "...", MF_FIELD(G, dx)},
    {0}};
static const MfOp gelu_backward_op = {"gelu_backward", gelu_backward_args, gelu_sizes,
                                      sizeof(MfGeluParams), .run = MF_OP(gelu_backward)};

static const MfArg residual_forward_args[] = {
    {"a", 1, MF_IN, 0, "...", MF_FIELD(R, a)},
    {"b", 2, MF_IN, 0, "...", MF_FIELD(R, b)},
    {"out", 0, MF_OUT, 0, "...", MF_FIELD(R, out)},
    {0}};
static const MfOp residual_forward_op = {"residual_forward", residual_forward_args,
                                         residual_sizes, sizeof(MfResidualParams),
                                         .run = MF_OP(residual_forward)};

static const MfArg residual_backward_args[] = {
    {"dx", 1, MF_INOUT, 0, "...", MF_FIELD(R, dx)},
    {"dout", 2, MF_IN, 0, "...", MF_FIELD(R, dout)},
    {0}};
static const MfOp residual_backward_op = {"residual_backward", residual_backward_args,
                                          residual_sizes, sizeof(MfResidualParams),
                                          .run = MF_OP(residual_backward)};

MF_DEFINE(gelu_forward, gelu_forward_op)
MF_DEFINE(gelu_backward, gelu_backward_op)
MF_DEFINE(residual_forward, residual_forward_op)
MF_DEFINE(residual_backward, residual_backward_op)

PyMethodDef mf_elementwise_methods[] = {
    MF_METHOD(gelu_forward,
     "gelu_forward(x, *, approximate='tanh') -> y\n\n"
     "x float32 (...), any ndim >= 1 -> y float32 (...) = 0.5 x (1 + tanh(sqrt(2/pi) (x +\n"
     "0.044715 x^3))) (approximate 'tanh'), or 0.5 x (1 + erf(x / sqrt(2))) (approximate\n"
     "'none', the exact GELU: PyTorch's nn.GELU() default)."),
    MF_METHOD(gelu_backward,
     "gelu_backward(dy, x, *, approximate='tanh') -> dx\n\n"
     "dy, x float32 (...) of one shape -> dx float32 (...) = dy * gelu'(x), approximate as\n"
     "gelu_forward's."),
    MF_METHOD(residual_forward,
     "residual_forward(a, b) -> out\n\n"
     "a, b float32 (...) of one shape -> out float32 (...) = a + b."),
    MF_METHOD(residual_backward,
     "residual_backward(dx, dout) -> None\n\n"
     "dx, dout float32 (...) of one shape: dx += dout in place (the residual stream's\n"
     "gradient reaching a branch input). dx must not share memory with dout."),
    MF_METHOD(silu_forward,
     "silu_forward(x) -> y\n\n"
     "x float32 (...), any ndim >= 1 -> y float32 (...) = x sigmoid(x)."),
    MF_METHOD(silu_backward,
     "silu_backward(dy, x) -> dx\n\n"
     "dy, x float32 (...) of one shape -> dx float32 (...) = dy s (1 + x (1 - s)),\n"
     "s = sigmoid(x)."),
    MF_METHOD(softplus_forward,
     "softplus_forward(x) -> y\n\n"
     "x float32 (...) -> y float32 (...) = log(1 + e^x), or x where x > 20 (Mamba's\n"
     "threshold)."),
    MF_METHOD(softplus_backward,
     "softplus_backward(dy, x) -> dx\n\n"
     "dy, x float32 (...) of one shape -> dx float32 (...) = dy sigmoid(x), or dy where\n"
     "x > 20."),
    MF_METHOD(silu_gate_forward,
     "silu_gate_forward(y, z) -> out\n\n"
     "y, z float32 (...) of one shape -> out float32 (...) = y * z sigmoid(z) (Mamba's output\n"
     "gate: one pass, the bits of silu_forward(z) and the product)."),
    MF_METHOD(silu_gate_backward,
     "silu_gate_backward(dout, y, z) -> (dy, dz)\n\n"
     "dout, y, z float32 (...) of one shape -> dy float32 (...) = dout z s, dz float32 (...)\n"
     "= dout y s (1 + z (1 - s)), s = sigmoid(z) (one pass)."),
    {NULL, NULL, 0, NULL}};
