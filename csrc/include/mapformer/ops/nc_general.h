/* The nc_general family (csrc/ops/nc_general.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_NC_GENERAL_H
#define MAPFORMER_OPS_NC_GENERAL_H

#include <stdint.h>

/* nc_general: MapEM-NC positions for any block size b and K generators per block, per block
 * the ordered product p_t = exp(X_t) ... exp(X_1) p*, X_t = sum_i theta_t,i S_i */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *dtheta;        /* backward (B, T, H, NB, K) (=) */
    float *dgen;          /* backward (H, NB, K, b, b) += */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *theta;   /* (B, T, H, NB, K): each token's coordinates */
    const float *gen;     /* (H, NB, K, b, b): the generators S_i (skew-symmetric in MapEM-NC) */
    const float *start;   /* (H, D) */
    int64_t B, T, H, D, NB, K, b; /* D = NB b, 2 <= b <= 16, K >= 1 */
    float *scratch;       /* backward */
    int64_t scratch_floats;
} MfNcGeneralParams;

/* ---- nc_general.c: MapEM-NC for any block size b (2..16) and K generators --------------- */
/* p_t = exp(X_t) p_{t-1}, p_0 = start, X_t = sum_i theta_t,i S_i; exp by scaling and squaring
 * of a degree-12 Taylor polynomial in double */
int nc_general_forward(const MfNcGeneralParams *p);
/* dtheta (=), dgen +=, dstart +=: reverse-time adjoint, exp's Frechet adjoint.
 * Scratch: nc_general_backward_scratch_floats(p) floats (0 for sizes out of range). */
int nc_general_backward(const MfNcGeneralParams *p);
int64_t nc_general_backward_scratch_floats(const MfNcGeneralParams *p);

#endif
