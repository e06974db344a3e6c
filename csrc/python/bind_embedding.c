/* Binding of csrc/ops/embedding.c. */
#include "bind.h"

#define P(f) offsetof(MfEmbeddingParams, f)
static const MfSize sizes[] = {{"N", P(N), "N"}, {"V", P(V), "V"}, {"C", P(C), "C"}, {0}};

/* every id in [0, V), checked here for the message; the kernel checks each again as it reads
 * it (MF_EINDEX, raised naming tokens) */
static int check(MfCall *c, void *params) {
    const MfEmbeddingParams *p = params;
    (void)c;
    return mf_check_ids(p->tokens, p->N, p->V, "tokens");
}

static const MfArg forward_args[] = {
    {"tokens", 1, MF_IN, 0, "N", MF_FIELD(P, tokens), .dtype = MF_I32},
    {"weight", 2, MF_IN, 0, "V C", MF_FIELD(P, weight)},
    {"out", 0, MF_OUT, 0, "N C", MF_FIELD(P, out)},
    {0}};
static const MfOp forward = {"embedding_forward", forward_args, sizes,
                             sizeof(MfEmbeddingParams), .run = MF_OP(embedding_forward),
                             .check = check, .index_arg = "tokens"};

static const MfArg backward_args[] = {
    {"dweight", 1, MF_INOUT, 0, "V C", MF_FIELD(P, dweight)},
    {"dout", 2, MF_IN, 0, "N C", MF_FIELD(P, dout)},
    {"tokens", 3, MF_IN, 0, "N", MF_FIELD(P, tokens), .dtype = MF_I32},
    {0}};
static const MfOp backward = {"embedding_backward", backward_args, sizes,
                              sizeof(MfEmbeddingParams), .run = MF_OP(embedding_backward),
                              .check = check, .index_arg = "tokens"};

MF_DEFINE(embedding_forward, forward)
MF_DEFINE(embedding_backward, backward)

PyMethodDef mf_embedding_methods[] = {
    MF_METHOD(embedding_forward,
     "embedding_forward(tokens, weight) -> out\n\n"
     "tokens int32 (N,), weight float32 (V, C) -> out float32 (N, C) = weight[tokens]."),
    MF_METHOD(embedding_backward,
     "embedding_backward(dweight, dout, tokens) -> None\n\n"
     "dweight float32 (V, C) is accumulated in place: dweight[tokens[n]] += dout[n].\n"
     "dout float32 (N, C), tokens int32 (N,)."),
    {NULL, NULL, 0, NULL}};
