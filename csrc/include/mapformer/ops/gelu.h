/* The gelu family (csrc/ops/gelu.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_GELU_H
#define MAPFORMER_OPS_GELU_H

#include <stdint.h>

/* gelu, elementwise over n floats: exact 0 the tanh approximation, 1 the exact x Phi(x) */
typedef struct {
    float *y;        /* forward (n,) */
    float *dx;       /* backward (n,) */
    const float *dy; /* backward (n,) */
    const float *x;  /* (n,) */
    int64_t n;
    int exact;
} MfGeluParams;

/* ---- gelu.c: tanh approximation, y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), or
 * with exact = 1 the exact y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) ----------------------- */
/* y (n,) = gelu(x (n,)) */
int gelu_forward(const MfGeluParams *p);
/* dx (n,) = dy (n,) * gelu'(x (n,)) */
int gelu_backward(const MfGeluParams *p);
/* the single-threaded kernels, shared with mlp.c and the BLAS products: csrc/ops/kernels/gelu.h */

#endif
