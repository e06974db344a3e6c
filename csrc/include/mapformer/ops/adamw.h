/* The adamw family (csrc/ops/adamw.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_ADAMW_H
#define MAPFORMER_OPS_ADAMW_H

#include <stdint.h>

/* adamw: one fused AdamW step over a flat buffer, in place */
typedef struct {
    float *params, *m, *v;       /* (n,) each, updated */
    const float *grads;          /* (n,) */
    const uint8_t *decay_mask;   /* (n,): decoupled weight decay where != 0 */
    int64_t n;
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step;                /* >= 1: bias correction */
} MfAdamwParams;

/* ---- adamw.c: one fused AdamW step over a flat buffer (in place) -------------------------- */
/* params, m, v, grads, decay_mask (n,); step >= 1 (bias correction). Decoupled weight decay
 * params -= lr * weight_decay * params where decay_mask != 0. */
int adamw_step(const MfAdamwParams *p);

#endif
