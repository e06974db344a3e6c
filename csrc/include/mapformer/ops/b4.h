/* The b4 family (csrc/ops/b4.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_B4_H
#define MAPFORMER_OPS_B4_H

#include <stdint.h>

/* b4: MapEM-b4 positions, per 4x4 block one skew generator S = L(u) + R(v) (quaternion
 * split) and p[t] = qexp(Phi_t u) p* qexp(Phi_t v), Phi_t = cumsum_t(delta) in double */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *ddelta;        /* backward (B, T, H, NB) (=) */
    float *dgen;          /* backward (H, NB, 6) += */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *delta;   /* (B, T, H, NB) */
    const float *gen;     /* (H, NB, 6): (u, v), two pure quaternions per block */
    const float *start;   /* (H, D) */
    int64_t B, T, H, D, NB, F; /* D = 4 NB, F = 6 */
} MfB4Params;

/* ---- b4.c: MapEM-b4 positions p[t] = exp(cumsum(delta)_t S) p*, S = L(u) + R(v) in so(4) - */
/* p = qexp(Phi u) start qexp(Phi v) per 4-block (Phi in double) */
int b4_forward(const MfB4Params *p);
/* ddelta (=), dgen += (du, dv), dstart += */
int b4_backward(const MfB4Params *p);

#endif
