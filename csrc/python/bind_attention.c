/* Binding of csrc/ops/attention.c: softmax attention (causal, none or prefix mask), forward
 * and backward. */
#include "bind.h"

#define P(f) offsetof(MfAttentionParams, f)
static const MfSize sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"H", P(H), "H"},
                               {"D", P(D), "D"}, {0}};

/* pos_ids and pair_factor: both or neither; ids in [0, N); N at most MF_ATTN_MAX_POSITIONS;
 * the factors finite */
static int check_factor(MfCall *c, MfAttentionParams *p) {
    if ((p->pos_ids == NULL) != (p->pair_factor == NULL)) {
        PyErr_Format(PyExc_ValueError, "%s is required with %s (a per-pair logit factor takes "
                     "both: pos_ids int32 (B, T), pair_factor float32 (N, N))",
                     p->pos_ids == NULL ? "pos_ids" : "pair_factor",
                     p->pos_ids == NULL ? "pair_factor" : "pos_ids");
        return -1;
    }
    if (p->pair_factor == NULL) return 0;
    p->npos = mf_size(c, "N");
    if (p->npos < 1 || p->npos > MF_ATTN_MAX_POSITIONS) {
        PyErr_Format(PyExc_ValueError, "pair_factor must be (N, N) with N in [1, %d], got N = "
                     "%lld", MF_ATTN_MAX_POSITIONS, (long long)p->npos);
        return -1;
    }
    for (int64_t i = 0; i < p->npos * p->npos; i++)
        if (!isfinite(p->pair_factor[i])) {
            PyErr_Format(PyExc_ValueError, "pair_factor must be finite: entry (%lld, %lld) is "
                         "not (it would reach the backward's masked pairs as 0 * inf)",
                         (long long)(i / p->npos), (long long)(i % p->npos));
            return -1;
        }
    return mf_check_ids(p->pos_ids, p->B * p->T, p->npos, "pos_ids");
}

static int check(MfCall *c, void *params) {
    MfAttentionParams *p = params;
    if (mf_check_mask(p->mask, p->prefix, p->B, p->T) < 0) return -1;
    if (check_factor(c, p) < 0) return -1;
    return mf_head_dim_and_scale(p->D, "q, k, v", &p->scale);
}

#define POS_IDS(pos) {"pos_ids", pos, MF_IN, MF_OPTIONAL | MF_NONE | MF_KWONLY, "B T", \
                      MF_FIELD(P, pos_ids), .dtype = MF_I32}
#define PAIR_FACTOR(pos) {"pair_factor", pos, MF_IN, MF_OPTIONAL | MF_NONE | MF_KWONLY, "N N", \
                          MF_FIELD(P, pair_factor)}

static const MfArg forward_args[] = {
    {"q", 1, MF_IN, 0, "B T H D", MF_FIELD(P, q)},
    {"k", 2, MF_IN, 0, "B T H D", MF_FIELD(P, k)},
    {"v", 3, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"scale", 4, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE},
    MF_MASK_ROW(5),
    MF_PREFIX_ROW(6),
    POS_IDS(7),
    PAIR_FACTOR(8),
    {"out", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, out)},
    {"lse", 0, MF_OUT, 0, "B H T", MF_FIELD(P, lse)},
    {0}};
static const MfOp forward = {"attention_forward", forward_args, sizes, sizeof(MfAttentionParams),
                             .run = MF_OP(attention_forward),
                             .scratch = MF_SCRATCH(attention_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfAttentionParams), .check = check,
                             .index_arg = "pos_ids or prefix"};

/* q (which fixes B, T, H, D) is checked first */
static const MfArg backward_args[] = {
    {"q", 2, MF_IN, 0, "B T H D", MF_FIELD(P, q)},
    {"dout", 1, MF_IN, 0, "B T H D", MF_FIELD(P, dout)},
    {"k", 3, MF_IN, 0, "B T H D", MF_FIELD(P, k)},
    {"v", 4, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"out", 5, MF_IN, 0, "B T H D", MF_FIELD(P, o)},
    {"lse", 6, MF_IN, 0, "B H T", MF_FIELD(P, lse_in)},
    {"scale", 7, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE},
    MF_MASK_ROW(8),
    MF_PREFIX_ROW(9),
    POS_IDS(10),
    PAIR_FACTOR(11),
    {"dq", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dq)},
    {"dk", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dk)},
    {"dv", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dv)},
    {0}};
static const MfOp backward = {"attention_backward", backward_args, sizes,
                              sizeof(MfAttentionParams), .run = MF_OP(attention_backward),
                              .scratch = MF_SCRATCH(attention_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfAttentionParams), .check = check,
                             .index_arg = "pos_ids or prefix"};

MF_DEFINE(attention_forward, forward)
MF_DEFINE(attention_backward, backward)

PyMethodDef mf_attention_methods[] = {
    MF_METHOD(attention_forward,
     "attention_forward(q, k, v, scale=None, *, mask='causal', prefix=None, pos_ids=None,\n"
     "pair_factor=None) -> (out, lse)\n\n"
     "Softmax attention: out[b, i, h] = sum_{j <= lim} softmax_j(f_ij scale q_i . k_j) v_j,\n"
     "where lim = max(i, P_b - 1): P_b = 0 for mask='causal' (j <= i), T for 'none' (every\n"
     "key) and prefix[b] for 'prefix' (a prefix LM: full attention within the first\n"
     "prefix[b] tokens, causal after them); f_ij = pair_factor[pos_ids[b, i], pos_ids[b, j]]\n"
     "(1 without a table: APE's distance decay gamma^d(i, j) with any metric d), applied to\n"
     "the logits before the mask, which still decides the keys each query sees.\n"
     "q, k, v: float32 C-contiguous (B, T, H, D), head dim D even in [16, 128].\n"
     "scale: float, default 1/sqrt(D).\n"
     "prefix: int32 (B,) in [0, T], with mask='prefix' only.\n"
     "pos_ids: int32 (B, T) in [0, N) and pair_factor: float32 (N, N), N <= 4096: both or\n"
     "neither.\n"
     "Returns out float32 (B, T, H, D) and lse float32 (B, H, T), the log-sum-exp of each\n"
     "query's scaled scores: the only thing attention_backward needs besides out."),
    MF_METHOD(attention_backward,
     "attention_backward(dout, q, k, v, out, lse, scale=None, *, mask='causal', prefix=None,\n"
     "pos_ids=None, pair_factor=None) -> (dq, dk, dv)\n\n"
     "Gradients of attention given dout, the gradient of out.\n"
     "dout, q, k, v, out: float32 C-contiguous (B, T, H, D); lse: float32 (B, H, T) from\n"
     "attention_forward with the same scale (default 1/sqrt(D)), mask, prefix, pos_ids and\n"
     "pair_factor.\n"
     "Returns new float32 arrays dq, dk, dv (B, T, H, D)."),
    {NULL, NULL, 0, NULL}};
