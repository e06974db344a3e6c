/* Binding of csrc/ops/tape.c (the TAPE baseline): complex-state rotary and the content-gated
 * head mix of the positional state. */
#include "bind.h"

#define R(f) offsetof(MfTapeRotateParams, f)
#define X(f) offsetof(MfTapeMixParams, f)
static const MfSize rotate_sizes[] = {{"B", R(B), "B"}, {"T", R(T), "T"}, {"H", R(H), "H"},
                                      {"D", R(D), "D"}, {0}};
static const MfSize mix_sizes[] = {{"B", X(B), "B"}, {"T", X(T), "T"}, {"H", X(H), "H"},
                                   {"D", X(D), "D"}, {0}};

/* D even, named by the array that fixed it: the state holds D/2 complex numbers */
static int check(MfCall *c, void *params) {
    (void)params;
    return mf_even_head_dim(c, "pairs are complex numbers");
}

static const MfArg rotate_forward_args[] = {
    {"q", 1, MF_IN, 0, "B T H D", MF_FIELD(R, q)},
    {"k", 2, MF_IN, 0, "B T H D", MF_FIELD(R, k)},
    {"e", 3, MF_IN, 0, "B T H D", MF_FIELD(R, e)},
    {"q_out", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, q_out)},
    {"k_out", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, k_out)},
    {0}};
static const MfOp rotate_forward = {"tape_rotate_forward", rotate_forward_args, rotate_sizes,
                                    sizeof(MfTapeRotateParams),
                                    .run = MF_OP(tape_rotate_forward), .check = check};

static const MfArg rotate_backward_args[] = {
    {"dq_out", 1, MF_IN, 0, "B T H D", MF_FIELD(R, dq_out)},
    {"dk_out", 2, MF_IN, 0, "B T H D", MF_FIELD(R, dk_out)},
    {"q", 3, MF_IN, 0, "B T H D", MF_FIELD(R, q)},
    {"k", 4, MF_IN, 0, "B T H D", MF_FIELD(R, k)},
    {"e", 5, MF_IN, 0, "B T H D", MF_FIELD(R, e)},
    {"dq", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, dq)},
    {"dk", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, dk)},
    {"de", 0, MF_OUT, 0, "B T H D", MF_FIELD(R, de)},
    {0}};
static const MfOp rotate_backward = {"tape_rotate_backward", rotate_backward_args,
                                     rotate_sizes, sizeof(MfTapeRotateParams),
                                     .run = MF_OP(tape_rotate_backward), .check = check};

static const MfArg mix_forward_args[] = {
    {"e_att", 1, MF_IN, 0, "B T H D", MF_FIELD(X, e_att)},
    {"gate_logits", 2, MF_IN, 0, "B T H", MF_FIELD(X, gate_logits)},
    {"w", 3, MF_IN, 0, "H H", MF_FIELD(X, w)},
    {"e_new", 0, MF_OUT, 0, "B T H D", MF_FIELD(X, e_new)},
    {0}};
static const MfOp mix_forward = {"tape_mix_forward", mix_forward_args, mix_sizes,
                                 sizeof(MfTapeMixParams), .run = MF_OP(tape_mix_forward),
                                 .check = check};

static const MfArg mix_backward_args[] = {
    {"de_new", 1, MF_IN, 0, "B T H D", MF_FIELD(X, de_new)},
    {"e_att", 2, MF_IN, 0, "B T H D", MF_FIELD(X, e_att)},
    {"gate_logits", 3, MF_IN, 0, "B T H", MF_FIELD(X, gate_logits)},
    {"w", 4, MF_IN, 0, "H H", MF_FIELD(X, w)},
    {"dw", 5, MF_INOUT, 0, "H H", MF_FIELD(X, dw)},
    {"de_att", 0, MF_OUT, 0, "B T H D", MF_FIELD(X, de_att)},
    {"dgate_logits", 0, MF_OUT, 0, "B T H", MF_FIELD(X, dgate_logits)},
    {0}};
static const MfOp mix_backward = {"tape_mix_backward", mix_backward_args, mix_sizes,
                                  sizeof(MfTapeMixParams), .run = MF_OP(tape_mix_backward),
                                  .scratch = MF_SCRATCH(tape_mix_backward_scratch_floats),
                                  MF_SCRATCH_FIELDS(MfTapeMixParams), .check = check};

MF_DEFINE(tape_rotate_forward, rotate_forward)
MF_DEFINE(tape_rotate_backward, rotate_backward)
MF_DEFINE(tape_mix_forward, mix_forward)
MF_DEFINE(tape_mix_backward, mix_backward)

PyMethodDef mf_tape_methods[] = {
    MF_METHOD(tape_rotate_forward,
     "tape_rotate_forward(q, k, e) -> (q_out, k_out)\n\n"
     "q, k, e float32 (B, T, H, D) with D even -> q_out, k_out float32 (B, T, H, D): each pair\n"
     "(x[2k], x[2k+1]) multiplied as a complex number by the TAPE state e[2k] + i e[2k+1]:\n"
     "(x0 e0 - x1 e1, x0 e1 + x1 e0). With e = (cos, sin) this is rotary_forward."),
    MF_METHOD(tape_rotate_backward,
     "tape_rotate_backward(dq_out, dk_out, q, k, e) -> (dq, dk, de)\n\n"
     "dq_out, dk_out, q, k, e float32 (B, T, H, D) -> dq, dk, de float32 (B, T, H, D), per\n"
     "complex pair: dq = conj(e) dq_out, dk = conj(e) dk_out,\n"
     "de = conj(q) dq_out + conj(k) dk_out."),
    MF_METHOD(tape_mix_forward,
     "tape_mix_forward(e_att, gate_logits, w) -> e_new\n\n"
     "e_att float32 (B, T, H, D) with D even, gate_logits float32 (B, T, H), w float32 (H, H)\n"
     "-> e_new float32 (B, T, H, D) = e_att[b, t, h] + sigmoid(gate_logits[b, t, h])\n"
     "* sum_h' w[h, h'] e_att[b, t, h'] (the content-gated head mix of the TAPE state)."),
    MF_METHOD(tape_mix_backward,
     "tape_mix_backward(de_new, e_att, gate_logits, w, dw) -> (de_att, dgate_logits)\n\n"
     "de_new, e_att float32 (B, T, H, D), gate_logits float32 (B, T, H), w float32 (H, H) ->\n"
     "de_att float32 (B, T, H, D), dgate_logits float32 (B, T, H). dw float32 (H, H) is\n"
     "accumulated in place: dw[h, h'] += sum_{b, t} g[b, t, h] de_new[b, t, h] . e_att[b, t, h'],\n"
     "g = sigmoid(gate_logits); the sum is bit-identical for any number of threads."),
    {NULL, NULL, 0, NULL}};
