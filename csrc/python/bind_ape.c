/* Binding of csrc/ops/ape.c (APE's per-token orthogonal maps and distance decay). */
#include "bind.h"

#define P(f) offsetof(MfApeParams, f)
static const MfSize sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"H", P(H), "H"},
                               {"D", P(D), "D"}, {"A", P(A), "A"}, {"P", P(P), "P"},
                               {"TB", P(TB), "TB"}, {0}};

/* D = A E (the maps' chunks tile the head), TB = 1 or B, every index entry in [0, P) (the
 * kernel checks each again as it reads it: MF_EINDEX, raised naming index) */
static int check(MfCall *c, void *params) {
    const MfApeParams *p = params;
    const int64_t E = mf_size(c, "E");
    if (p->A * E != p->D) {
        PyErr_Format(PyExc_ValueError,
                     "maps must have shape (A, P, H, E, E) with A E = D (the head dim of %s, "
                     "%lld), got A = %lld, E = %lld",
                     mf_size_from(c, "D"), (long long)p->D, (long long)p->A, (long long)E);
        return -1;
    }
    if (p->TB != 1 && p->TB != p->B) {
        PyErr_Format(PyExc_ValueError,
                     "index must have shape (TB, T, A) with TB = 1 or TB = B = %lld, got "
                     "TB = %lld",
                     (long long)p->B, (long long)p->TB);
        return -1;
    }
    return mf_check_ids(p->index, p->TB * p->T * p->A, p->P, "index");
}

static const MfArg forward_args[] = {
    {"x", 1, MF_IN, 0, "B T H D", MF_FIELD(P, x)},
    {"maps", 2, MF_IN, 0, "A P H E E", MF_FIELD(P, maps)},
    {"index", 3, MF_IN, 0, "TB T A", MF_FIELD(P, index), .dtype = MF_I32},
    {"y", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, y)},
    {0}};
static const MfOp forward = {"ape_apply_forward", forward_args, sizes, sizeof(MfApeParams),
                             .run = MF_OP(ape_apply_forward), .check = check,
                             .index_arg = "index"};

static const MfArg backward_args[] = {
    {"dy", 1, MF_IN, 0, "B T H D", MF_FIELD(P, dy)},
    {"x", 2, MF_IN, 0, "B T H D", MF_FIELD(P, x)},
    {"maps", 3, MF_IN, 0, "A P H E E", MF_FIELD(P, maps)},
    {"index", 4, MF_IN, 0, "TB T A", MF_FIELD(P, index), .dtype = MF_I32},
    {"dmaps", 5, MF_INOUT, 0, "A P H E E", MF_FIELD(P, dmaps)},
    {"dx", 0, MF_OUT, 0, "B T H D", MF_FIELD(P, dx)},
    {0}};
static const MfOp backward = {"ape_apply_backward", backward_args, sizes, sizeof(MfApeParams),
                              .run = MF_OP(ape_apply_backward), .check = check,
                              .index_arg = "index"};

#define DP(f) offsetof(MfApeDecayParams, f)
static const MfSize decay_sizes[] = {{"B", DP(B), "B"}, {"T", DP(T), "T"}, {"H", DP(H), "H"},
                                     {"D", DP(D), "D"}, {0}};

/* the scales gamma^(+-(T - 1) / 2) must stay well inside float32's range */
static int decay_check(MfCall *c, void *params) {
    (void)c;
    const MfApeDecayParams *p = params;
    if (fabs(log((double)p->gamma)) * (double)(p->T - 1) / 2.0 <= APE_DECAY_MAX_LOG) return 0;
    char msg[200]; /* PyErr_Format has no float conversions */
    snprintf(msg, sizeof msg,
             "gamma = %g over T = %lld tokens scales q and k by gamma^(+-(T - 1) / 2), beyond "
             "e^%g: need |ln gamma| (T - 1) / 2 <= %g",
             (double)p->gamma, (long long)p->T, APE_DECAY_MAX_LOG, APE_DECAY_MAX_LOG);
    PyErr_SetString(PyExc_ValueError, msg);
    return -1;
}

static const MfArg decay_forward_args[] = {
    {"q", 1, MF_IN, 0, "B T H D", MF_FIELD(DP, q)},
    {"k", 2, MF_IN, 0, "B T H D", MF_FIELD(DP, k)},
    {"gamma", 3, MF_FLOAT, 0, MF_FIELD(DP, gamma), .lo = 0.0, .hi = INFINITY,
     .open = MF_LO_OPEN | MF_HI_OPEN},
    {"q_out", 0, MF_OUT, 0, "B T H D", MF_FIELD(DP, q_out)},
    {"k_out", 0, MF_OUT, 0, "B T H D", MF_FIELD(DP, k_out)},
    {0}};
static const MfOp decay_forward = {"ape_decay_forward", decay_forward_args, decay_sizes,
                                   sizeof(MfApeDecayParams), .run = MF_OP(ape_decay_forward),
                                   .check = decay_check};

static const MfArg decay_backward_args[] = {
    {"dq_out", 1, MF_IN, 0, "B T H D", MF_FIELD(DP, dq_out)},
    {"dk_out", 2, MF_IN, 0, "B T H D", MF_FIELD(DP, dk_out)},
    {"gamma", 3, MF_FLOAT, 0, MF_FIELD(DP, gamma), .lo = 0.0, .hi = INFINITY,
     .open = MF_LO_OPEN | MF_HI_OPEN},
    {"dq", 0, MF_OUT, 0, "B T H D", MF_FIELD(DP, dq)},
    {"dk", 0, MF_OUT, 0, "B T H D", MF_FIELD(DP, dk)},
    {0}};
static const MfOp decay_backward = {"ape_decay_backward", decay_backward_args, decay_sizes,
                                    sizeof(MfApeDecayParams), .run = MF_OP(ape_decay_backward),
                                    .check = decay_check};

MF_DEFINE(ape_apply_forward, forward)
MF_DEFINE(ape_apply_backward, backward)
MF_DEFINE(ape_decay_forward, decay_forward)
MF_DEFINE(ape_decay_backward, decay_backward)

PyMethodDef mf_ape_methods[] = {
    MF_METHOD(ape_apply_forward,
     "ape_apply_forward(x, maps, index) -> y\n\n"
     "x float32 (B, T, H, D), maps float32 (A, P, H, E, E) with D = A E, index int32\n"
     "(TB, T, A) in [0, P) with TB = 1 (broadcast over b) or B -> y float32 (B, T, H, D):\n"
     "y[b, t, h, aE + i] = sum_j maps[a, index[tb, t, a], h, i, j] x[b, t, h, aE + j]."),
    MF_METHOD(ape_apply_backward,
     "ape_apply_backward(dy, x, maps, index, dmaps) -> dx\n\n"
     "dy, x float32 (B, T, H, D), maps float32 (A, P, H, E, E), index int32 (TB, T, A) ->\n"
     "dx float32 (B, T, H, D) = maps^T dy chunk by chunk. dmaps float32 (A, P, H, E, E) is\n"
     "accumulated in place: dmaps[a, p, h] += sum over tokens at position p of dy x^T."),
    MF_METHOD(ape_decay_forward,
     "ape_decay_forward(q, k, gamma) -> (q_out, k_out)\n\n"
     "q, k float32 (B, T, H, D), gamma > 0 -> q_out = gamma^(t - c) q, k_out = gamma^(c - t) k\n"
     "per token t, c = (T - 1) / 2: q_out_i . k_out_j = gamma^(i - j) q_i . k_j, the causal\n"
     "logits decayed by gamma^distance. ValueError naming gamma unless\n"
     "|ln gamma| (T - 1) / 2 <= 40."),
    MF_METHOD(ape_decay_backward,
     "ape_decay_backward(dq_out, dk_out, gamma) -> (dq, dk)\n\n"
     "dq_out, dk_out float32 (B, T, H, D) -> dq = gamma^(t - c) dq_out, dk = gamma^(c - t)\n"
     "dk_out (gamma is a constant)."),
    {NULL, NULL, 0, NULL}};
