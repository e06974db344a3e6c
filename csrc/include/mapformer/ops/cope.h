/* The cope family (csrc/ops/cope.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_COPE_H
#define MAPFORMER_OPS_COPE_H

#include <stdint.h>

/* cope: CoPE attention, causal; only lse is saved */
typedef struct {
    float *out, *lse;          /* forward (B, T, H, D), (B, H, T) */
    float *dq, *dk, *dv;       /* backward (B, T, H, D) (=) */
    float *de;                 /* backward (H, n_pos, D) += */
    const float *q, *k, *v;    /* (B, T, H, D) */
    const float *e;            /* (H, n_pos, D): integer position embeddings */
    const float *dout, *o;     /* backward (B, T, H, D) */
    const float *lse_in;       /* backward (B, H, T) */
    int64_t B, T, H, D, n_pos;
    float scale;               /* the content logits' scale, usually 1/sqrt(D) */
    float *scratch;
    int64_t scratch_floats;
} MfCopeParams;

/* ---- cope.c: CoPE attention (contextual position encoding), causal; only lse is saved --- */
/* out (B, T, H, D), lse (B, H, T); q, k, v (B, T, H, D); e (H, n_pos, D) integer position
 * embeddings; scale usually 1/sqrt(D) (the position logits q . e are not scaled) */
int cope_forward(const MfCopeParams *p);
int64_t cope_forward_scratch_floats(const MfCopeParams *p);
/* dq, dk, dv (B, T, H, D) (=), de (H, n_pos, D) +=; dout, q, k, v, o (B, T, H, D);
 * e (H, n_pos, D); lse_in (B, H, T) from cope_forward */
int cope_backward(const MfCopeParams *p);
int64_t cope_backward_scratch_floats(const MfCopeParams *p);

#endif
