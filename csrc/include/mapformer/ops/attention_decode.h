/* The attention_decode family (csrc/ops/attention_decode.c): its parameter struct and its ops,
 * included through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_ATTENTION_DECODE_H
#define MAPFORMER_OPS_ATTENTION_DECODE_H

#include <stdint.h>

/* attention_decode: a block of Tq new queries on the keys of Tk >= Tq positions (incremental
 * decoding); query i sits at position Tk - Tq + i; forward only */
typedef struct {
    float *out, *lse;          /* (B, Tq, H, D), (B, H, Tq) */
    const float *q;            /* (B, Tq, H, D) */
    const float *k, *v;        /* (B, Tmax, H, D): the cached positions, then the block's,
                                * in the first Tk of Tmax (a cache with room to grow) */
    int64_t B, Tq, Tk, Tmax, H, D; /* Tq <= Tk <= Tmax; D even in [16, 128] */
    float scale;               /* usually 1/sqrt(D) */
    float *scratch;
    int64_t scratch_floats;
} MfAttentionDecodeParams;

/* ---- attention_decode.c: causal attention of new queries on cached keys (decoding) ------- */
/* out[b,i,h] = sum_{j <= Tk - Tq + i} softmax_j(scale q_i . k_j) v_j and its lse[b,h,i]: the
 * last Tq rows of causal attention over Tk positions, q holding only those rows, k and v the
 * first Tk of their Tmax positions. Forward only;
 * p->scratch of at least attention_decode_forward_scratch_floats(p) floats (64-byte aligned;
 * 0 when p's sizes are invalid): MfAttentionDecodeParams, mapformer/params.h. */
int64_t attention_decode_forward_scratch_floats(const MfAttentionDecodeParams *p);
int attention_decode_forward(const MfAttentionDecodeParams *p);

#endif
