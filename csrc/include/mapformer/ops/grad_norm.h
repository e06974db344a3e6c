/* The grad_norm family (csrc/ops/grad_norm.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_GRAD_NORM_H
#define MAPFORMER_OPS_GRAD_NORM_H

#include <stdint.h>

/* grad_norm: global L2 norm in double (global_norm), and clipping (clip_grad_norm:
 * when *norm > max_norm, grads *= max_norm / (*norm + 1e-6)) */
typedef struct {
    double *norm;         /* out */
    float *grads;         /* clip_grad_norm: (n,), scaled in place */
    const float *x;       /* global_norm: (n,) */
    int64_t n;
    float max_norm;
} MfGradNormParams;

/* ---- grad_norm.c: global L2 norm (double accumulation) and clipping ----------------------- */
/* *norm = ||x (n,)|| */
int global_norm(const MfGradNormParams *p);
/* *norm = ||grads (n,)||; when *norm > max_norm, grads *= max_norm / (*norm + 1e-6) */
int clip_grad_norm(const MfGradNormParams *p);

#endif
