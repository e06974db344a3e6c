/* The attention family (csrc/ops/attention.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_ATTENTION_H
#define MAPFORMER_OPS_ATTENTION_H

#include <stdint.h>

/* attention: softmax attention, causal or another MfMask; only the row log-sum-exp is saved */
typedef struct {
    float *out, *lse;          /* forward (B, T, H, D), (B, H, T) */
    float *dq, *dk, *dv;       /* backward (B, T, H, D) each (=) */
    const float *q, *k, *v;    /* (B, T, H, D) */
    const float *dout, *o;     /* backward (B, T, H, D): out's gradient, forward's out */
    const float *lse_in;       /* backward (B, H, T) */
    int64_t B, T, H, D;        /* D even in [16, 128] */
    float scale;               /* usually 1/sqrt(D) */
    int mask;                  /* an MfMask (mapformer.h); 0 = MF_MASK_CAUSAL */
    const int32_t *prefix;     /* MF_MASK_PREFIX: (B,) prefix lengths in [0, T]; else unused */
    float *scratch;
    int64_t scratch_floats;
    const int32_t *pos_ids;    /* optional per-pair logit factor (both or neither): (B, T) */
    const float *pair_factor;  /* position ids in [0, npos), table (npos, npos): the logit of
                                * query i, key j is multiplied by
                                * pair_factor[pos_ids[b,i], pos_ids[b,j]] before the mask */
    int64_t npos;
} MfAttentionParams;

/* ---- attention.c: softmax attention, tiled (FlashAttention-2); only lse is saved ---------- */
/* The attention masks (MfAttentionParams.mask, MfConjAttentionParams.mask): query i of batch
 * row b attends to key j when j <= max(i, P_b - 1), with P_b = 0 (causal), T (none: full
 * attention) or prefix[b] in [0, T] (prefix: full attention within the first P_b tokens, the
 * source of a prefix LM, causal after them). The keys a query sees are always a prefix of the
 * sequence, never empty. */
typedef enum {
    MF_MASK_CAUSAL = 0,
    MF_MASK_NONE = 1,
    MF_MASK_PREFIX = 2,
} MfMask;
/* attention's optional per-pair logit factor (MfAttentionParams.pos_ids, pair_factor): the
 * most positions its table may index (npos^2 floats: 64 MiB) */
#define MF_ATTN_MAX_POSITIONS 4096
/* out[b,i,h] = sum_{j seen} softmax_j(scale q_i . k_j) v_j, lse[b,h,i] = log sum_j exp(..);
 * with pos_ids and pair_factor given, the logits are f_ij scale q_i . k_j, f_ij =
 * pair_factor[pos_ids[b,i], pos_ids[b,j]] (before the mask). Forward reads q, k, v, scale
 * and writes out, lse; backward reads dout, q, k, v, o (forward's
 * out), lse_in (forward's lse) and writes dq, dk, dv (=). Both take p->scratch of at least
 * <op>_scratch_floats(p) floats (64-byte aligned; 0 when p's sizes are invalid): MfAttentionParams,
 * mapformer/params.h. */
int64_t attention_forward_scratch_floats(const MfAttentionParams *p);
int attention_forward(const MfAttentionParams *p);
int64_t attention_backward_scratch_floats(const MfAttentionParams *p);
int attention_backward(const MfAttentionParams *p);

#endif
