/* The layernorm family (csrc/ops/layernorm.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_LAYERNORM_H
#define MAPFORMER_OPS_LAYERNORM_H

#include <stdint.h>

/* layernorm: y = (x - mean) * rstd * weight + bias over the last axis */
typedef struct {
    float *y, *mean, *rstd;      /* forward (N, C), (N,), (N,): mean and rstd saved */
    float *dx, *dweight, *dbias; /* backward (N, C) (= or += with accumulate_dx), (C,) +=,
                                  * (C,) += */
    const float *dy;             /* backward (N, C) */
    const float *x;              /* (N, C) */
    const float *mean_in, *rstd_in; /* backward: forward's mean, rstd (N,) */
    const float *weight, *bias;  /* (C,), (C,) */
    int64_t N, C;
    float eps;
    int accumulate_dx;
    float *scratch;
    int64_t scratch_floats;
} MfLayernormParams;

/* ---- layernorm.c: y = (x - mean) * rstd * weight + bias over the last axis ---------------- */
/* y (N, C), mean (N,), rstd (N,) saved for backward; x (N, C), weight (C,), bias (C,); eps > 0 */
int layernorm_forward(const MfLayernormParams *p);
/* dx (N, C) (= or += with accumulate_dx), dweight (C,) +=, dbias (C,) +=; dy, x (N, C),
 * mean_in, rstd_in (N,) from the forward, weight (C,) */
int layernorm_backward(const MfLayernormParams *p);
int64_t layernorm_backward_scratch_floats(const MfLayernormParams *p);

#endif
