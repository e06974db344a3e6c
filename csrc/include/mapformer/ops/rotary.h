/* The rotary family (csrc/ops/rotary.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_ROTARY_H
#define MAPFORMER_OPS_ROTARY_H

#include <stdint.h>

/* rotary: rotate pairs (x[2i], x[2i+1]) of q and k by theta_i */
typedef struct {
    float *q_out, *k_out;           /* forward (B, T, H, D) */
    float *dq, *dk, *dtheta;        /* backward (B, T, H, D) (=), (TB, T, H, D/2) (=, summed
                                     * over b when TB = 1) */
    const float *dq_out, *dk_out;   /* backward (B, T, H, D) */
    const float *q, *k;             /* (B, T, H, D) */
    const float *theta;             /* (TB, T, H, D/2) */
    int64_t B, T, H, D, TB;         /* D even; TB = 1 (broadcast over b) or B */
} MfRotaryParams;

/* ---- rotary.c: rotate pairs (x[2i], x[2i+1]) of q and k by theta_i ------------------------ */
/* q_out, k_out, q, k (B, T, H, D); theta (TB, T, H, D/2) with TB = 1 (broadcast) or B */
int rotary_forward(const MfRotaryParams *p);
/* dq, dk (B, T, H, D) (=); dtheta (TB, T, H, D/2) (=, summed over b when TB = 1);
 * dq_out, dk_out, q, k (B, T, H, D); theta (TB, T, H, D/2) */
int rotary_backward(const MfRotaryParams *p);

#endif
