/* Binding of csrc/ops/cope.c: CoPE attention (contextual position encoding), forward and
 * backward. */
#include "bind.h"

#define P(f) offsetof(MfCopeParams, f)
static const MfSize sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"H", P(H), "H"},
                               {"D", P(D), "D"}, {"n_pos", P(n_pos), "n_pos"}, {0}};

static int check(MfCall *c, void *params) {
    MfCopeParams *p = params;
    (void)c;
    return mf_head_dim_and_scale(p->D, "q, k, v, e", &p->scale);
}

static const MfArg forward_args[] = {
    {"q", 1, MF_IN, 0, "B T H D", MF_FIELD(P, q)},
    {"k", 2, MF_IN, 0, "B T H D", MF_FIELD(P, k)},
    {"v", 3, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"e", 4, MF_IN, 0, "H n_pos D", MF_FIELD(P, e)},
    {"scale", 5, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE},
    {"out", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, out)},
    {"lse", 0, MF_OUT, 0, "B H T", MF_FIELD(P, lse)},
    {0}};
static const MfOp forward = {"cope_forward", forward_args, sizes, sizeof(MfCopeParams),
                             .run = MF_OP(cope_forward),
                             .scratch = MF_SCRATCH(cope_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfCopeParams), .check = check};

/* q (which fixes B, T, H, D) is checked first */
static const MfArg backward_args[] = {
    {"q", 2, MF_IN, 0, "B T H D", MF_FIELD(P, q)},
    {"dout", 1, MF_IN, 0, "B T H D", MF_FIELD(P, dout)},
    {"k", 3, MF_IN, 0, "B T H D", MF_FIELD(P, k)},
    {"v", 4, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"e", 5, MF_IN, 0, "H n_pos D", MF_FIELD(P, e)},
    {"out", 6, MF_IN, 0, "B T H D", MF_FIELD(P, o)},
    {"lse", 7, MF_IN, 0, "B H T", MF_FIELD(P, lse_in)},
    {"de", 8, MF_INOUT, 0, "H n_pos D", MF_FIELD(P, de)},
    {"scale", 9, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE},
    {"dq", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dq)},
    {"dk", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dk)},
    {"dv", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dv)},
    {0}};
static const MfOp backward = {"cope_backward", backward_args, sizes, sizeof(MfCopeParams),
                              .run = MF_OP(cope_backward),
                              .scratch = MF_SCRATCH(cope_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfCopeParams), .check = check};

MF_DEFINE(cope_forward, forward)
MF_DEFINE(cope_backward, backward)

PyMethodDef mf_cope_methods[] = {
    MF_METHOD(cope_forward,
     "cope_forward(q, k, v, e, scale=None) -> (out, lse)\n\n"
     "Causal CoPE attention (contextual position encoding, Golovneva et al. 2024):\n"
     "s_ij = scale q_i . k_j, gates g_ij = sigmoid(s_ij), positions\n"
     "p_ij = min(sum_{t=j..i} g_it, n_pos - 1), position logits z_i[n] = q_i . e[h, n]\n"
     "interpolated at p_ij and added to s_ij; out_i = sum_{j <= i} softmax_j(...) v_j.\n"
     "q, k, v: float32 C-contiguous (B, T, H, D), head dim D even in [16, 128].\n"
     "e: float32 (H, n_pos, D), the integer position embeddings of each head.\n"
     "scale: float, default 1/sqrt(D).\n"
     "Returns out float32 (B, T, H, D) and lse float32 (B, H, T), the log-sum-exp of each\n"
     "query's attention logits: what cope_backward needs besides out."),
    MF_METHOD(cope_backward,
     "cope_backward(dout, q, k, v, e, out, lse, de, scale=None) -> (dq, dk, dv)\n\n"
     "Gradients of CoPE attention given dout, the gradient of out.\n"
     "dout, q, k, v, out: float32 C-contiguous (B, T, H, D); e: float32 (H, n_pos, D);\n"
     "lse: float32 (B, H, T) from cope_forward with the same e and scale (default 1/sqrt(D)).\n"
     "de: float32 (H, n_pos, D), writeable: the gradient of e is accumulated into it (+=).\n"
     "Returns new float32 arrays dq, dk, dv (B, T, H, D)."),
    {NULL, NULL, 0, NULL}};
