/* Binding of csrc/ops/relative.c: attention with Shaw et al.'s clipped relative position
 * embeddings (causal, none or prefix mask), forward and backward. */
#include "bind.h"

#define P(f) offsetof(MfRelativeParams, f)
static const MfSize sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"H", P(H), "H"},
                               {"D", P(D), "D"}, {"R2", P(R2), "R2"}, {0}};

/* R2 odd (offsets -R .. R); the mask's prefix; rel_scale defaults to scale */
static int check(MfCall *c, void *params) {
    MfRelativeParams *p = params;
    (void)c;
    if (p->R2 % 2 != 1) {
        PyErr_Format(PyExc_ValueError, "rel_k must be (R2, D) with R2 = 2 R + 1 odd (the "
                     "offsets -R .. R), got R2 = %lld", (long long)p->R2);
        return -1;
    }
    if (mf_check_mask(p->mask, p->prefix, p->B, p->T) < 0) return -1;
    if (mf_head_dim_and_scale(p->D, "q, k, v, rel_k", &p->scale) < 0) return -1;
    if (isnan(p->rel_scale)) p->rel_scale = p->scale;
    return 0;
}

/* check's, and rel_v and drel_v both or neither */
static int check_backward(MfCall *c, void *params) {
    MfRelativeParams *p = params;
    if ((p->rel_v == NULL) != (p->drel_v == NULL)) {
        PyErr_Format(PyExc_ValueError, "%s is required with %s (the value embeddings' gradient "
                     "goes with them)", p->rel_v == NULL ? "rel_v" : "drel_v",
                     p->rel_v == NULL ? "drel_v" : "rel_v");
        return -1;
    }
    return check(c, params);
}


static const MfArg forward_args[] = {
    {"q", 1, MF_IN, 0, "B T H D", MF_FIELD(P, q)},
    {"k", 2, MF_IN, 0, "B T H D", MF_FIELD(P, k)},
    {"v", 3, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"rel_k", 4, MF_IN, 0, "R2 D", MF_FIELD(P, rel_k)},
    {"rel_v", 5, MF_IN, MF_OPTIONAL | MF_NONE, "R2 D", MF_FIELD(P, rel_v)},
    {"scale", 6, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE},
    {"rel_scale", 7, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, rel_scale), MF_FINITE},
    MF_MASK_ROW(8),
    MF_PREFIX_ROW(9),
    {"out", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, out)},
    {"lse", 0, MF_OUT, 0, "B H T", MF_FIELD(P, lse)},
    {0}};
static const MfOp forward = {"relative_forward", forward_args, sizes, sizeof(MfRelativeParams),
                             .run = MF_OP(relative_forward),
                             .scratch = MF_SCRATCH(relative_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfRelativeParams), .check = check,
                             .index_arg = "prefix"};

/* q (which fixes B, T, H, D) is checked first */
static const MfArg backward_args[] = {
    {"q", 2, MF_IN, 0, "B T H D", MF_FIELD(P, q)},
    {"dout", 1, MF_IN, 0, "B T H D", MF_FIELD(P, dout)},
    {"k", 3, MF_IN, 0, "B T H D", MF_FIELD(P, k)},
    {"v", 4, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"rel_k", 5, MF_IN, 0, "R2 D", MF_FIELD(P, rel_k)},
    {"out", 6, MF_IN, 0, "B T H D", MF_FIELD(P, o)},
    {"lse", 7, MF_IN, 0, "B H T", MF_FIELD(P, lse_in)},
    {"drel_k", 8, MF_INOUT, 0, "R2 D", MF_FIELD(P, drel_k)},
    {"rel_v", 9, MF_IN, MF_OPTIONAL | MF_NONE, "R2 D", MF_FIELD(P, rel_v)},
    {"drel_v", 10, MF_INOUT, MF_OPTIONAL | MF_NONE, "R2 D", MF_FIELD(P, drel_v)},
    {"scale", 11, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE},
    {"rel_scale", 12, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, rel_scale), MF_FINITE},
    MF_MASK_ROW(13),
    MF_PREFIX_ROW(14),
    {"dq", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dq)},
    {"dk", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dk)},
    {"dv", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dv)},
    {0}};
static const MfOp backward = {"relative_backward", backward_args, sizes,
                              sizeof(MfRelativeParams), .run = MF_OP(relative_backward),
                              .scratch = MF_SCRATCH(relative_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfRelativeParams), .check = check_backward,
                              .index_arg = "prefix"};

MF_DEFINE(relative_forward, forward)
MF_DEFINE(relative_backward, backward)

PyMethodDef mf_relative_methods[] = {
    MF_METHOD(relative_forward,
     "relative_forward(q, k, v, rel_k, rel_v=None, scale=None, rel_scale=None, *,\n"
     "mask='causal', prefix=None) -> (out, lse)\n\n"
     "Attention with clipped relative position embeddings (Shaw et al. 2018): query i sees\n"
     "keys j <= lim = max(i, P_b - 1) (mask as attention_forward's), at offset\n"
     "c = min(max(j - i, -R), R) + R; logits a_ij = scale q_i . k_j + rel_scale q_i . rel_k[c],\n"
     "out_i = sum_j softmax_j(a_ij) (v_j + rel_v[c]) (no rel_v term when rel_v is None).\n"
     "q, k, v: float32 C-contiguous (B, T, H, D), head dim D even in [16, 128].\n"
     "rel_k, rel_v: float32 (R2, D), R2 = 2 R + 1 odd, shared by the heads.\n"
     "scale: float, default 1/sqrt(D); rel_scale: float, default scale (Shaw et al.'s; the\n"
     "APE paper's code adds q . rel_k unscaled: rel_scale=1).\n"
     "prefix: int32 (B,) in [0, T], with mask='prefix' only.\n"
     "Returns out float32 (B, T, H, D) and lse float32 (B, H, T), the log-sum-exp of each\n"
     "query's logits: what relative_backward needs besides out."),
    MF_METHOD(relative_backward,
     "relative_backward(dout, q, k, v, rel_k, out, lse, drel_k, rel_v=None, drel_v=None,\n"
     "scale=None, rel_scale=None, *, mask='causal', prefix=None) -> (dq, dk, dv)\n\n"
     "Gradients of relative_forward given dout, the gradient of out.\n"
     "dout, q, k, v, out: float32 C-contiguous (B, T, H, D); rel_k, rel_v: float32 (R2, D)\n"
     "(rel_v may be None); lse: float32 (B, H, T) from relative_forward with the same\n"
     "embeddings, scales, mask and prefix.\n"
     "drel_k, drel_v: float32 (R2, D), writeable: the embeddings' gradients are accumulated\n"
     "into them (+=); drel_v is None exactly when rel_v is.\n"
     "Returns new float32 arrays dq, dk, dv (B, T, H, D)."),
    {NULL, NULL, 0, NULL}};
