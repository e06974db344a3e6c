/* The conj_attention family (csrc/ops/conj_attention.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_CONJ_ATTENTION_H
#define MAPFORMER_OPS_CONJ_ATTENTION_H

#include <stdint.h>

/* conj_attention: MapEM's conjunctive attention; mode an MfConjMode, mask an MfMask */
typedef struct {
    float *out, *lse;                    /* forward (B, T, H, D), (M, B, H, T): M = 2 for
                                          * softmax_product, else 1 */
    float *dqx, *dkx, *dqp, *dkp, *dv;   /* backward (B, T, H, D) each (=) */
    const float *qx, *kx, *qp, *kp, *v;  /* (B, T, H, D) */
    const float *dout, *o;               /* backward (B, T, H, D) */
    const float *lse_in;                 /* backward (M, B, H, T) */
    int64_t B, T, H, D;                  /* D even in [16, 128] */
    float scale;
    int mode;
    int mask;                            /* an MfMask (mapformer.h); 0 = MF_MASK_CAUSAL */
    const int32_t *prefix;               /* MF_MASK_PREFIX: (B,) in [0, T]; else unused */
    float *scratch;
    int64_t scratch_floats;
} MfConjAttentionParams;

/* ---- conj_attention.c: MapEM's conjunctive attention, tiled; only lse is saved ------------ */
/* Content scores sX = qx kx^T and positional scores sP = qp kp^T (under the mask, MfMask)
 * combine by mode:
 *   MF_CONJ_SCORE_PRODUCT   A = softmax(scale sX * sP)               (lse: M = 1)
 *   MF_CONJ_SOFTMAX_PRODUCT A = softmax(scale sX) * softmax(scale sP) (lse_X, lse_P: M = 2)
 *   MF_CONJ_SUM             A = softmax(scale (sX + sP))              (lse: M = 1)
 * and out = A v. */
typedef enum {
    MF_CONJ_SCORE_PRODUCT = 0,
    MF_CONJ_SOFTMAX_PRODUCT = 1,
    MF_CONJ_SUM = 2,
} MfConjMode;
/* Forward reads qx, kx, qp, kp, v, scale, mode and writes out (B, T, H, D), lse (M, B, H, T);
 * backward reads dout, qx, kx, qp, kp, v, o (forward's out), lse_in (forward's lse, same scale
 * and mode) and writes dqx, dkx, dqp, dkp, dv (=). Both take p->scratch of at least
 * <op>_scratch_floats(p) floats (64-byte aligned; 0 when p's sizes or mode are invalid):
 * MfConjAttentionParams, mapformer/params.h. */
int64_t conj_attention_forward_scratch_floats(const MfConjAttentionParams *p);
int conj_attention_forward(const MfConjAttentionParams *p);
int64_t conj_attention_backward_scratch_floats(const MfConjAttentionParams *p);
int conj_attention_backward(const MfConjAttentionParams *p);

#endif
