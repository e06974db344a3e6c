/* The gridpe family (csrc/ops/gridpe.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_GRIDPE_H
#define MAPFORMER_OPS_GRIDPE_H

#include <stdint.h>

/* gridpe_complex: GridPE's complex form, one angle per real channel: y (B, T, H, W) holds
 * (x cos theta, x sin theta) of each channel of x (B, T, H, W/2) interleaved */
typedef struct {
    float *y;               /* forward (B, T, H, W) */
    float *dx;              /* backward (B, T, H, W/2) (=) */
    const float *x;         /* forward (B, T, H, W/2) */
    const float *dy;        /* backward (B, T, H, W) */
    const float *theta;     /* (TB, T, H, W/2) */
    int64_t B, T, H, W, TB; /* W even; TB = 1 (broadcast over b) or B */
} MfGridpeParams;

/* ---- gridpe.c: GridPE's complex form (one angle per real channel) ----------------------- */
/* y[b,t,h,2d] = x[b,t,h,d] cos theta[tb,t,h,d], y[b,t,h,2d+1] = x[b,t,h,d] sin theta[tb,t,h,d]:
 * y_m . y'_n = sum_d x_d x'_d cos(theta_d(m) - theta_d(n)). x (B, T, H, W/2), y (B, T, H, W),
 * theta (TB, T, H, W/2) with TB = 1 (broadcast) or B; cos and sin in double */
int gridpe_complex_forward(const MfGridpeParams *p);
/* dx (B, T, H, W/2) (=) = cos theta dy[2d] + sin theta dy[2d+1]; dy (B, T, H, W); theta as
 * above (fixed: no theta gradient) */
int gridpe_complex_backward(const MfGridpeParams *p);

#endif
