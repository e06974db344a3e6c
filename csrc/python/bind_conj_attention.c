/* Binding of csrc/ops/conj_attention.c: MapEM's conjunctive attention (causal, none or prefix
 * mask), forward and backward. */
#include "bind.h"

#define P(f) offsetof(MfConjAttentionParams, f)
static const MfSize sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"H", P(H), "H"},
                               {"D", P(D), "D"}, {0}};
static const char *const modes[] = {"score_product", "softmax_product", "sum", NULL};

/* lse holds M = 2 log-sum-exps per row for softmax_product, else 1 */
static int prepare(MfCall *c, void *params) {
    const MfConjAttentionParams *p = params;
    return mf_pin(c, "M", p->mode == MF_CONJ_SOFTMAX_PRODUCT ? 2 : 1, "mode");
}

static int check(MfCall *c, void *params) {
    MfConjAttentionParams *p = params;
    (void)c;
    if (mf_check_mask(p->mask, p->prefix, p->B, p->T) < 0) return -1;
    return mf_head_dim_and_scale(p->D, "qx, kx, qp, kp, v", &p->scale);
}

#define MODE(pos) {"mode", pos, MF_CHOICE, MF_OPTIONAL, MF_FIELD(P, mode), .choices = modes}
#define SCALE(pos) {"scale", pos, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE}

static const MfArg forward_args[] = {
    {"qx", 1, MF_IN, 0, "B T H D", MF_FIELD(P, qx)},
    {"kx", 2, MF_IN, 0, "B T H D", MF_FIELD(P, kx)},
    {"qp", 3, MF_IN, 0, "B T H D", MF_FIELD(P, qp)},
    {"kp", 4, MF_IN, 0, "B T H D", MF_FIELD(P, kp)},
    {"v", 5, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    MODE(6),
    SCALE(7),
    MF_MASK_ROW(8),
    MF_PREFIX_ROW(9),
    {"out", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, out)},
    {"lse", 0, MF_OUT, 0, "M B H T", MF_FIELD(P, lse)},
    {0}};
static const MfOp forward = {"conj_attention_forward", forward_args, sizes,
                             sizeof(MfConjAttentionParams), .run = MF_OP(conj_attention_forward),
                             .scratch = MF_SCRATCH(conj_attention_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfConjAttentionParams), .prepare = prepare,
                             .check = check, .index_arg = "prefix"};

/* qx (which fixes B, T, H, D) is checked first */
static const MfArg backward_args[] = {
    {"qx", 2, MF_IN, 0, "B T H D", MF_FIELD(P, qx)},
    {"dout", 1, MF_IN, 0, "B T H D", MF_FIELD(P, dout)},
    {"kx", 3, MF_IN, 0, "B T H D", MF_FIELD(P, kx)},
    {"qp", 4, MF_IN, 0, "B T H D", MF_FIELD(P, qp)},
    {"kp", 5, MF_IN, 0, "B T H D", MF_FIELD(P, kp)},
    {"v", 6, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"out", 7, MF_IN, 0, "B T H D", MF_FIELD(P, o)},
    {"lse", 8, MF_IN, 0, "M B H T", MF_FIELD(P, lse_in)},
    MODE(9),
    SCALE(10),
    MF_MASK_ROW(11),
    MF_PREFIX_ROW(12),
    {"dqx", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dqx)},
    {"dkx", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dkx)},
    {"dqp", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dqp)},
    {"dkp", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dkp)},
    {"dv", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dv)},
    {0}};
static const MfOp backward = {"conj_attention_backward", backward_args, sizes,
                              sizeof(MfConjAttentionParams),
                              .run = MF_OP(conj_attention_backward),
                              .scratch = MF_SCRATCH(conj_attention_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfConjAttentionParams), .prepare = prepare,
                              .check = check, .index_arg = "prefix"};

MF_DEFINE(conj_attention_forward, forward)
MF_DEFINE(conj_attention_backward, backward)

PyMethodDef mf_conj_attention_methods[] = {
    MF_METHOD(conj_attention_forward,
     "conj_attention_forward(qx, kx, qp, kp, v, mode='score_product', scale=None, *,\n"
     "                       mask='causal', prefix=None) -> (out, lse)\n"
     "\n"
     "MapEM's conjunctive attention. With content scores sX = qx kx^T and positional\n"
     "scores sP = qp kp^T (per batch and head, keys j <= max(i, P_b - 1) for query i:\n"
     "P_b = 0 for mask='causal', T for 'none', prefix[b] (int32 (B,) in [0, T]) for\n"
     "'prefix', as attention_forward):\n"
     "  'score_product'   A = softmax_j(scale sX * sP)\n"
     "  'softmax_product' A = softmax_j(scale sX) * softmax_j(scale sP) (rows sum to < 1)\n"
     "  'sum'             A = softmax_j(scale (sX + sP))\n"
     "and out[b, i, h] = sum_j A_ij v_j.\n"
     "qx, kx, qp, kp, v: float32 C-contiguous (B, T, H, D), head dim D even in [16, 128].\n"
     "scale: float, default 1/sqrt(D).\n"
     "Returns out float32 (B, T, H, D) and lse float32 (M, B, H, T): the log-sum-exp of each\n"
     "query's scaled scores (M = 1), or for 'softmax_product' those of sX then sP (M = 2);\n"
     "the only thing conj_attention_backward needs besides out."),
    MF_METHOD(conj_attention_backward,
     "conj_attention_backward(dout, qx, kx, qp, kp, v, out, lse, mode='score_product',\n"
     "                        scale=None, *, mask='causal', prefix=None)\n"
     "-> (dqx, dkx, dqp, dkp, dv)\n"
     "\n"
     "Gradients of conjunctive attention given dout, the gradient of out.\n"
     "dout, qx, kx, qp, kp, v, out: float32 C-contiguous (B, T, H, D); lse: float32\n"
     "(M, B, H, T) from conj_attention_forward with the same mode, scale, mask and prefix\n"
     "(M = 2 for\n"
     "'softmax_product', else 1).\n"
     "Returns new float32 arrays dqx, dkx, dqp, dkp, dv (B, T, H, D)."),
    {NULL, NULL, 0, NULL}};
