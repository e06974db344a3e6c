/* The sln family (csrc/ops/sln.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_SLN_H
#define MAPFORMER_OPS_SLN_H

#include <stdint.h>

/* sln: MapEM-SLN positions, per 2x2 block a trace-free generator A (from gen, projected) and
 * p[t] = exp(Phi_t A) p*, Phi_t = cumsum_t(delta) in double, the hyperbolic argument clamped */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *ddelta;        /* backward (B, T, H, NB) (=) */
    float *dgen;          /* backward (H, NB, 4) += */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *delta;   /* (B, T, H, NB) */
    const float *gen;     /* (H, NB, 4): A_bar row-major, A = A_bar - tr(A_bar)/2 I */
    const float *start;   /* (H, D) */
    float clamp;          /* > 0: |Phi| sqrt(-det A) is capped at clamp when det A < 0 */
    int64_t B, T, H, D, NB, F; /* D = 2 NB, F = 4 */
} MfSlnParams;

/* ---- sln.c: MapEM-SLN positions p[t] = exp(cumsum(delta)_t A) p*, A trace-free 2x2 ------ */
/* p = exp(Phi A) start per block (Phi in double, hyperbolic |Phi| sqrt(q) clamped) */
int sln_forward(const MfSlnParams *p);
/* ddelta (=), dgen += (projected to trace-free), dstart += */
int sln_backward(const MfSlnParams *p);

#endif
