/* The relative family (csrc/ops/relative.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_RELATIVE_H
#define MAPFORMER_OPS_RELATIVE_H

#include <stdint.h>

/* relative: attention with Shaw et al.'s clipped relative position embeddings, any MfMask;
 * only lse is saved */
typedef struct {
    float *out, *lse;          /* forward (B, T, H, D), (B, H, T) */
    float *dq, *dk, *dv;       /* backward (B, T, H, D) (=) */
    float *drel_k, *drel_v;    /* backward (R2, D) +=; drel_v with rel_v only */
    const float *q, *k, *v;    /* (B, T, H, D) */
    const float *rel_k;        /* (R2, D): the keys' embeddings of offsets -R .. R, R2 = 2R+1 */
    const float *rel_v;        /* (R2, D) or NULL: the values' embeddings (NULL: none) */
    const float *dout, *o;     /* backward (B, T, H, D) */
    const float *lse_in;       /* backward (B, H, T) */
    int64_t B, T, H, D, R2;    /* R2 odd */
    float scale;               /* the content logits' scale, usually 1/sqrt(D) */
    float rel_scale;           /* the relative logits' scale (Shaw: scale) */
    int mask;                  /* an MfMask (ops/attention.h); 0 = MF_MASK_CAUSAL */
    const int32_t *prefix;     /* MF_MASK_PREFIX: (B,) prefix lengths in [0, T]; else unused */
    float *scratch;
    int64_t scratch_floats;
} MfRelativeParams;

/* ---- relative.c: relative-position attention (Shaw et al. 2018); only lse is saved ------ */
/* Query i of batch row b sees keys j <= lim_i = max(i, P_b - 1) (the attention masks), at the
 * clipped offset c_ij = min(max(j - i, -R), R):
 *   a_ij = scale q_i . k_j + rel_scale q_i . rel_k[c_ij + R],
 *   out_i = sum_j softmax_j(a_ij) (v_j + rel_v[c_ij + R]) (no rel_v term without rel_v),
 *   lse_i = log sum_j exp(a_ij).
 * Forward reads q, k, v, rel_k, rel_v and writes out, lse; backward reads dout, q, k, v,
 * rel_k, rel_v, o (forward's out), lse_in and writes dq, dk, dv (=), adding into drel_k and
 * drel_v (+=). Both take p->scratch of at least <op>_scratch_floats(p) floats (64-byte
 * aligned; 0 when p's sizes are invalid). */
int relative_forward(const MfRelativeParams *p);
int64_t relative_forward_scratch_floats(const MfRelativeParams *p);
int relative_backward(const MfRelativeParams *p);
int64_t relative_backward_scratch_floats(const MfRelativeParams *p);

#endif
