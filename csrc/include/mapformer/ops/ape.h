/* The ape family (csrc/ops/ape.c): its parameter structs and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_APE_H
#define MAPFORMER_OPS_APE_H

#include <stdint.h>

/* ape_apply: per-token orthogonal maps (APE), chunk a of the head (E = D / A) multiplied by
 * maps[a, index[tb, t, a], h] */
typedef struct {
    float *y;               /* forward (B, T, H, D) */
    float *dx;              /* backward (B, T, H, D) (=) */
    float *dmaps;           /* backward (A, P, H, E, E) += */
    const float *dy;        /* backward (B, T, H, D) */
    const float *x;         /* (B, T, H, D) */
    const float *maps;      /* (A, P, H, E, E), E = D / A */
    const int32_t *index;   /* (TB, T, A), each in [0, P) (checked by the op) */
    int64_t B, T, H, D, A, P, TB; /* TB = 1 (every sequence at the same positions) or B */
} MfApeParams;

/* ape_decay: APE's multiplicative distance decay of causal logits, as per-token scales of q
 * and k (q_i gamma^(i - c), k_j gamma^(c - j), c = (T - 1) / 2) */
typedef struct {
    float *q_out, *k_out;         /* forward (B, T, H, D) */
    float *dq, *dk;               /* backward (B, T, H, D) (=) */
    const float *q, *k;           /* forward (B, T, H, D) */
    const float *dq_out, *dk_out; /* backward (B, T, H, D) */
    float gamma;                  /* > 0, with |ln gamma| (T - 1) / 2 <= APE_DECAY_MAX_LOG */
    int64_t B, T, H, D;
} MfApeDecayParams;

/* ---- ape.c: APE's per-token orthogonal maps on q or k ------------------------------------ */
/* y[b,t,h,aE+i] = sum_j maps[a, index[tb,t,a], h, i, j] x[b,t,h,aE+j]; y, x (B, T, H, D);
 * maps (A, P, H, E, E), E = D / A; index (TB, T, A) with TB = 1 (broadcast) or B */
int ape_apply_forward(const MfApeParams *p);
/* dx (B, T, H, D) (=) = M^T dy per chunk; dmaps (A, P, H, E, E) += sum over the tokens at each
 * position of dy_chunk x_chunk^T; dy, x (B, T, H, D); maps, index as above */
int ape_apply_backward(const MfApeParams *p);
/* q_out[b,t] = gamma^(t - c) q[b,t], k_out[b,t] = gamma^(c - t) k[b,t], c = (T - 1) / 2, so
 * q_out_i . k_out_j = gamma^(i - j) q_i . k_j: the logits of causal attention (j <= i)
 * multiplied by gamma^distance. MF_EINVAL unless gamma > 0 and |ln gamma| (T - 1) / 2 <=
 * APE_DECAY_MAX_LOG (the scales stay well inside float32's range) */
#define APE_DECAY_MAX_LOG 40.0
int ape_decay_forward(const MfApeDecayParams *p);
/* dq (=) = gamma^(t - c) dq_out, dk (=) = gamma^(c - t) dk_out (gamma is a constant) */
int ape_decay_backward(const MfApeDecayParams *p);

#endif
