/* Binding of csrc/ops/path_integration.c and csrc/ops/rotary.c (the MapWM rotary family). */
#include "bind.h"

#define PT(f) offsetof(MfPathIntegrationParams, f)
#define R(f) offsetof(MfRotaryParams, f)
static const MfSize pi_sizes[] = {{"B", PT(B), "B"}, {"T", PT(T), "T"}, {"H", PT(H), "H"},
                                  {"NB", PT(NB), "NB"}, {0}};
static const MfSize rotary_sizes[] = {{"B", R(B), "B"}, {"T", R(T), "T"}, {"H", R(H), "H"},
                                      {"D", R(D), "D"}, {"TB", R(TB), "TB"}, {0}};

static const MfArg pi_forward_args[] = {
    {"delta", 1, MF_IN, 0, "B T H NB", MF_FIELD(PT, delta)},
    {"omega", 2, MF_IN, 0, "H NB", MF_FIELD(PT, omega)},
    {"theta", 0, MF_OUT, 0, "B T H NB", MF_FIELD(PT, theta)},
    {0}};
static const MfOp pi_forward = {"path_integration_forward", pi_forward_args, pi_sizes,
                                sizeof(MfPathIntegrationParams),
                                .run = MF_OP(path_integration_forward)};

static const MfArg pi_backward_args[] = {
    {"dtheta", 1, MF_IN, 0, "B T H NB", MF_FIELD(PT, dtheta)},
    {"delta", 2, MF_IN, 0, "B T H NB", MF_FIELD(PT, delta)},
    {"omega", 3, MF_IN, 0, "H NB", MF_FIELD(PT, omega)},
    {"domega", 4, MF_INOUT, 0, "H NB", MF_FIELD(PT, domega)},
    {"ddelta", 0, MF_OUT, 0, "B T H NB", MF_FIELD(PT, ddelta)},
    {0}};
static const MfOp pi_backward = {"path_integration_backward", pi_backward_args, pi_sizes,
                                 sizeof(MfPathIntegrationParams),
                                 .run = MF_OP(path_integration_backward),
                                 .scratch = MF_SCRATCH(path_integration_backward_scratch_floats),
                                 MF_SCRATCH_FIELDS(MfPathIntegrationParams)};

/* D even (named by q's or dq_out's name); theta's TB = 1 (broadcast over b) or B */
static int rotary_check(MfCall *c, void *params) {
    const MfRotaryParams *p = params;
    if (mf_even_head_dim(c, "pairs are rotated") < 0) return -1;
    if (p->TB == 1 || p->TB == p->B) return 0;
    PyErr_Format(PyExc_ValueError,
                 "theta must have shape (TB, T, H, D/2) with TB = 1 or TB = B = %lld, got "
                 "TB = %lld",
                 (long long)p->B, (long long)p->TB);
    return -1;
}

static const MfArg rotary_forward_args[] = {
    {"q", 1, MF_IN, 0, "B T H D", MF_FIELD(R, q)},
    {"k", 2, MF_IN, 0, "B T H D", MF_FIELD(R, k)},
    {"theta", 3, MF_IN, 0, "TB T H D/2", MF_FIELD(R, theta)},
    {"q_out", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, q_out)},
    {"k_out", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, k_out)},
    {0}};
static const MfOp rotary_forward_op = {"rotary_forward", rotary_forward_args, rotary_sizes,
                                       sizeof(MfRotaryParams), .run = MF_OP(rotary_forward),
                                       .check = rotary_check};

static const MfArg rotary_backward_args[] = {
    {"dq_out", 1, MF_IN, 0, "B T H D", MF_FIELD(R, dq_out)},
    {"dk_out", 2, MF_IN, 0, "B T H D", MF_FIELD(R, dk_out)},
    {"q", 3, MF_IN, 0, "B T H D", MF_FIELD(R, q)},
    {"k", 4, MF_IN, 0, "B T H D", MF_FIELD(R, k)},
    {"theta", 5, MF_IN, 0, "TB T H D/2", MF_FIELD(R, theta)},
    {"dq", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, dq)},
    {"dk", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, dk)},
    {"dtheta", 0, MF_OUT, 0, "TB T H D/2", MF_FIELD(R, dtheta)},
    {0}};
static const MfOp rotary_backward_op = {"rotary_backward", rotary_backward_args, rotary_sizes,
                                        sizeof(MfRotaryParams), .run = MF_OP(rotary_backward),
                                        .check = rotary_check};

MF_DEFINE(path_integration_forward, pi_forward)
MF_DEFINE(path_integration_backward, pi_backward)
MF_DEFINE(rotary_forward, rotary_forward_op)
MF_DEFINE(rotary_backward, rotary_backward_op)

PyMethodDef mf_rotary_methods[] = {
    MF_METHOD(path_integration_forward,
     "path_integration_forward(delta, omega) -> theta\n\n"
     "delta float32 (B, T, H, NB), omega float32 (H, NB) -> theta float32 (B, T, H, NB):\n"
     "theta[b, t, h, i] = omega[h, i] * sum_{s <= t} delta[b, s, h, i] (summed in double),\n"
     "reduced to [-pi, pi) before rounding to float32."),
    MF_METHOD(path_integration_backward,
     "path_integration_backward(dtheta, delta, omega, domega) -> ddelta\n\n"
     "dtheta, delta float32 (B, T, H, NB), omega float32 (H, NB) -> ddelta float32\n"
     "(B, T, H, NB) = reverse_cumsum_t(dtheta * omega). domega float32 (H, NB) is accumulated\n"
     "in place: domega += sum_{b, t} dtheta * cumsum_t(delta)."),
    MF_METHOD(rotary_forward,
     "rotary_forward(q, k, theta) -> (q_out, k_out)\n\n"
     "q, k float32 (B, T, H, D) with D even, theta float32 (TB, T, H, D/2) with TB = 1\n"
     "(broadcast over b, RoPE) or TB = B -> q_out, k_out float32 (B, T, H, D): each pair\n"
     "(x[2i], x[2i+1]) rotated by theta_i: (x0 cos - x1 sin, x0 sin + x1 cos)."),
    MF_METHOD(rotary_backward,
     "rotary_backward(dq_out, dk_out, q, k, theta) -> (dq, dk, dtheta)\n\n"
     "dq_out, dk_out, q, k float32 (B, T, H, D), theta float32 (TB, T, H, D/2) ->\n"
     "dq, dk float32 (B, T, H, D) = R(theta)^T d*_out, dtheta float32 (TB, T, H, D/2) =\n"
     "sum over q and k of (y0 dy1 - y1 dy0), also summed over b when TB = 1."),
    {NULL, NULL, 0, NULL}};
