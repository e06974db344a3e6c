/* The conv1d family (csrc/ops/conv1d.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_CONV1D_H
#define MAPFORMER_OPS_CONV1D_H

#include <stdint.h>

/* causal_conv1d: depthwise causal convolution along t,
 * y[b,t,e] = bias[e] + sum_{j<W} weight[e,j] x[b, t-W+1+j, e] */
typedef struct {
    float *y;                /* forward (B, T, E) */
    float *dx;               /* backward (B, T, E) (=) */
    float *dweight, *dbias;  /* backward (E, W) +=, (E,) += */
    const float *dy;         /* backward (B, T, E) */
    const float *x;          /* (B, T, E) */
    const float *weight;     /* (E, W) */
    const float *bias;       /* (E,) (forward; backward with silu) */
    int64_t B, T, E, W;
    int silu;                /* 1: y = silu(conv), and dy is the gradient of that y */
    float *scratch;
    int64_t scratch_floats;
} MfConv1dParams;

/* ---- conv1d.c: causal depthwise conv1d along t, any width W (MfConv1dParams) ------------- */
/* y (B, T, E) = bias + sum_j weight[:, j] x[t - W + 1 + j], through SiLU with p->silu */
int64_t causal_conv1d_forward_scratch_floats(const MfConv1dParams *p);
int causal_conv1d_forward(const MfConv1dParams *p);
/* dx (B, T, E) (=), dweight (E, W) +=, dbias (E,) += (with p->silu dy is SiLU's output's
 * gradient, and the bias is read) */
int64_t causal_conv1d_backward_scratch_floats(const MfConv1dParams *p);
int causal_conv1d_backward(const MfConv1dParams *p);

#endif
