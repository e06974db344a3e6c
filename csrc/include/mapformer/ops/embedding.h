/* The embedding family (csrc/ops/embedding.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_EMBEDDING_H
#define MAPFORMER_OPS_EMBEDDING_H

#include <stdint.h>

/* embedding: out[n, :] = weight[tokens[n], :] */
typedef struct {
    float *out;             /* forward (N, C) */
    float *dweight;         /* backward (V, C) += */
    const float *dout;      /* backward (N, C) */
    const int32_t *tokens;  /* (N,), each in [0, V) (checked by the op) */
    const float *weight;    /* (V, C) */
    int64_t N, V, C;
} MfEmbeddingParams;

/* ---- embedding.c: out[n, :] = weight[tokens[n], :] ---------------------------------------- */
/* out (N, C); tokens (N,), weight (V, C) */
int embedding_forward(const MfEmbeddingParams *p);
/* dweight (V, C) += dout (N, C) rows by tokens (N,); a bad id's row is skipped (MF_EINDEX) */
int embedding_backward(const MfEmbeddingParams *p);

#endif
