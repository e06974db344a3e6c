/* The l2_normalize family (csrc/ops/l2_normalize.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_L2_NORMALIZE_H
#define MAPFORMER_OPS_L2_NORMALIZE_H

#include <stdint.h>

/* l2_normalize: rows of width D scaled to unit length, y = x / norm,
 * norm = sqrt(sum_d x^2 + eps) */
typedef struct {
    float *y, *norm;           /* forward (N, D), (N,): norm saved */
    float *dx;                 /* backward (N, D) (=) */
    const float *dy;           /* backward (N, D) */
    const float *x;            /* forward (N, D) */
    const float *y_in, *norm_in; /* backward: forward's y (N, D), norm (N,) */
    int64_t N, D;
    float eps;                 /* forward: > 0, finite */
} MfL2NormalizeParams;

/* ---- l2_normalize.c: rows scaled to unit L2 norm (TDB's enc objective) --------------------- */
/* y (N, D) = x / norm, norm (N,) = sqrt(sum_d x^2 + eps) (squares summed in double), saved
 * for the backward; x (N, D); eps > 0 and finite (a zero row gives y = 0) */
int l2_normalize_forward(const MfL2NormalizeParams *p);
/* dx (N, D) (=) = (dy - y (y . dy)) / norm per row; dy (N, D), forward's y_in (N, D) and
 * norm_in (N,) */
int l2_normalize_backward(const MfL2NormalizeParams *p);

#endif
