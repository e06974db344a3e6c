/* Binding of csrc/ops/attention_decode.c: a block of new queries on cached keys, forward. */
#include "bind.h"

#define P(f) offsetof(MfAttentionDecodeParams, f)
/* S: the queries' positions (Tq), T: the positions k and v hold (Tmax) */
static const MfSize sizes[] = {{"B", P(B), "B"}, {"S", P(Tq), "Tq"}, {"T", P(Tmax), "Tmax"},
                               {"H", P(H), "H"}, {"D", P(D), "D"}, {0}};

/* keys (Tk; omitted: 0, all of k's) within k's positions; the block's queries are the last of
 * the keys' positions: Tq <= Tk */
static int check(MfCall *c, void *params) {
    MfAttentionDecodeParams *p = params;
    (void)c;
    if (mf_head_dim_and_scale(p->D, "q, k, v", &p->scale) != 0) return -1;
    if (p->Tk == 0) p->Tk = p->Tmax;
    if (p->Tk > p->Tmax) {
        PyErr_Format(PyExc_ValueError, "keys must be at most k's %lld positions (axis 1), got "
                     "%lld", (long long)p->Tmax, (long long)p->Tk);
        return -1;
    }
    if (p->Tq > p->Tk) {
        PyErr_Format(PyExc_ValueError,
                     "q has %lld positions (axis 1) but there are %lld keys: the queries are "
                     "the last positions of the keys', so q's axis 1 must not exceed them",
                     (long long)p->Tq, (long long)p->Tk);
        return -1;
    }
    return 0;
}

static const MfArg forward_args[] = {
    {"q", 1, MF_IN, 0, "B S H D", MF_FIELD(P, q)},
    {"k", 2, MF_IN, 0, "B T H D", MF_FIELD(P, k)},
    {"v", 3, MF_IN, 0, "B T H D", MF_FIELD(P, v)},
    {"scale", 4, MF_FLOAT, MF_OPTIONAL | MF_NONE, MF_FIELD(P, scale), MF_FINITE},
    {"keys", 5, MF_INT, MF_OPTIONAL, MF_FIELD(P, Tk), .lo = 1, .dflt = 0},
    {"out", 0, MF_OUT, 0, "B S H D", MF_FIELD(P, out)},
    {"lse", 0, MF_OUT, 0, "B H S", MF_FIELD(P, lse)},
    {0}};
static const MfOp forward = {"attention_decode_forward", forward_args, sizes,
                             sizeof(MfAttentionDecodeParams),
                             .run = MF_OP(attention_decode_forward),
                             .scratch = MF_SCRATCH(attention_decode_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfAttentionDecodeParams), .check = check};

MF_DEFINE(attention_decode_forward, forward)

PyMethodDef mf_attention_decode_methods[] = {
    MF_METHOD(attention_decode_forward,
     "attention_decode_forward(q, k, v, scale=None, keys=<all>) -> (out, lse)\n\n"
     "Causal attention of a block of new queries on cached keys (incremental decoding):\n"
     "q float32 (B, Tq, H, D) are the last Tq of the Tk >= Tq positions in the first\n"
     "Tk = keys of the Tmax positions of k, v (B, Tmax, H, D) (the cached ones, then the\n"
     "block's own; a cache with room to grow); query i sits at position Tk - Tq + i:\n"
     "out[b, i, h] = sum_{j <= Tk - Tq + i} softmax_j(scale q_i . k_j) v_j.\n"
     "Head dim D even in [16, 128]; scale: float, default 1/sqrt(D); keys: int in\n"
     "[Tq, Tmax], default Tmax.\n"
     "Returns out float32 (B, Tq, H, D) and lse float32 (B, H, Tq), the rows' log-sum-exps.\n"
     "With Tq = Tk it computes attention_forward. Forward only."),
    {NULL, NULL, 0, NULL}};
