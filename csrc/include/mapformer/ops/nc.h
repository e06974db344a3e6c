/* The nc family (csrc/ops/nc.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_NC_H
#define MAPFORMER_OPS_NC_H

#include <stdint.h>

/* nc: MapEM-NC positions, per 4x4 block the ordered product of per-token rotations
 * exp(S_t), S_t = L(u_t) + R(v_t), as a pair of unit-quaternion prefix products */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *dw;            /* backward (B, T, H, NB, 6) (=) */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *w;       /* (B, T, H, NB, 6): (u_t, v_t) per token and block */
    const float *start;   /* (H, D) */
    int64_t B, T, H, D, NB, F; /* D = 4 NB, F = 6 */
    float *scratch;       /* backward */
    int64_t scratch_floats;
} MfNcParams;

/* ---- nc.c: MapEM-NC positions p[t] = exp(S_t) ... exp(S_1) p*, quaternion prefix pairs -- */
/* p = A_t start C_t, A_t = qexp(u_t) A_{t-1}, C_t = C_{t-1} qexp(v_t) (renormalised) */
int nc_forward(const MfNcParams *p);
/* dw (=) by the reverse-time adjoints, dstart +=.
 * Scratch: nc_backward_scratch_floats(p) floats (0 for sizes out of range). */
int nc_backward(const MfNcParams *p);
int64_t nc_backward_scratch_floats(const MfNcParams *p);

#endif
