/* The scan family (csrc/ops/scan.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_SCAN_H
#define MAPFORMER_OPS_SCAN_H

#include <stdint.h>

/* selective_scan (Mamba, real diagonal A: K = N states per channel, S = N floats of state)
 * and complex_scan (MAMPa, K complex states = 2x2 rotation-scaling blocks per channel,
 * S = 2K floats of state as (re, im) pairs), both by mapformer/mapformer.h's scan section */
typedef enum { MF_BBAR_EULER = 0, MF_BBAR_ZOH = 1 } MfBbar;
typedef struct {
    float *y;                 /* forward (B, T, E) */
    float *states;            /* forward (B, NC, E, S): the state at each chunk's last step */
    float *dx, *ddelta;       /* backward (B, T, E) (=) */
    float *ddelta_angle;      /* complex_scan backward (B, T, E) (=) */
    float *dBm, *dCm;         /* backward (B, T, S) (=) */
    float *dA, *domega, *dD;  /* backward (E, K) +=, complex_scan (E, K) +=, (E,) += */
    float *ddelta_bias;       /* backward (E,) += when delta_bias is given, else NULL */
    const float *dy;          /* backward (B, T, E) */
    const float *states_in;   /* backward: forward's states (B, NC, E, S) */
    const float *x, *delta;   /* (B, T, E); the step is delta (+ delta_bias) (through softplus
                               * with delta_softplus): > 0 in Mamba's use (not checked) */
    const float *delta_bias;  /* (E,) or NULL: added to delta (Mamba's delta_bias) */
    const float *delta_angle; /* complex_scan (B, T, E): the rotation's step, taken as it is
                               * (signed); NULL: the rotation takes the step (delta's), and
                               * ddelta_angle is not written (ddelta holds its part) */
    const float *A, *omega;   /* (E, K): decay rate (A <= 0 keeps the scan stable), and
                               * complex_scan's angular rate */
    const float *Bm, *Cm;     /* (B, T, S) */
    const float *D;           /* (E,) */
    int64_t B, T, E, K, chunk; /* NC = ceil(T / chunk) */
    int bbar;                 /* MfBbar */
    int delta_softplus;       /* 1: the step is softplus(delta + delta_bias) (threshold 20, as
                               * softplus_forward; Mamba's delta_softplus), and ddelta the
                               * gradient of delta before it */
    float *scratch;
    int64_t scratch_floats;
} MfScanParams;

/* ---- scan.c: selective scans, sequential in t, parallel over (b, channel block) ---------- */
/* Per channel e and state k, z_t = delta_t A[e,k] (+ i delta_angle_t omega[e,k], complex_scan):
 *   h_t = e^z_t h_{t-1} + delta_t x_t phi(z_t) B_t[k],   y_t = sum_k <C_t[k], h_t[k]> + D x_t
 * with phi = 1 (MF_BBAR_EULER, Mamba's) or (e^z - 1) / z (MF_BBAR_ZOH); complex states are
 * (re, im) pairs of B, C, states (<c, h> = c_re h_re + c_im h_im = 2 Re(C' h) with
 * C' = (c_re - i c_im) / 2: selective_scan_ref's complex convention). The forward keeps only
 * the state at each chunk's end (states, (B, NC, E, S)); the backward recomputes each chunk
 * from the previous chunk's end state, in reverse, so memory is O(B E S (T/chunk + chunk)).
 * The backwards take p->scratch of at least <op>_scratch_floats(p) floats (0: invalid sizes).
 * S (the state floats per channel) = K for selective_scan, 2K for complex_scan; S <= 256. */
int selective_scan_forward(const MfScanParams *p);
int64_t selective_scan_backward_scratch_floats(const MfScanParams *p);
int selective_scan_backward(const MfScanParams *p);
int complex_scan_forward(const MfScanParams *p);
int64_t complex_scan_backward_scratch_floats(const MfScanParams *p);
int complex_scan_backward(const MfScanParams *p);

#endif
