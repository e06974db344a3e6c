/* Softmax attention, tiled like FlashAttention-2: the entry points.
 *
 *   out[b,i,h] = sum_{j <= lim} softmax_j(scale * q_i . k_j) v_j
 *   lse[b,h,i] = log sum_{j <= lim} exp(scale * q_i . k_j)
 *
 * with lim = max(i, P_b - 1) by the mask (mapformer.h, MfMask): P_b = 0 causal (the default),
 * T none (full attention), prefix[b] prefix (a prefix LM: full attention within the first P_b
 * tokens, causal after them). With a per-pair factor (pos_ids and pair_factor given), the
 * logit scale q_i . k_j becomes f_ij scale q_i . k_j, f_ij = pair_factor[pos_ids[b,i],
 * pos_ids[b,j]] (APE's distance decay gamma^d(i,j): any metric of the positions), applied
 * before the mask: the mask still decides which keys a query sees, the factor only rescales
 * the logits of those it sees; backward: dS_raw = f_ij dS. The factor tile of each pair of
 * blocks is gathered from the table into scratch (no T x T matrix); without a table the
 * kernels are the plain ones, unchanged.
 *
 * Forward saves lse (B, H, T), one float per query row; the caller keeps out. No T x T matrix
 * exists in either direction: scores live in block x block tiles of per-thread scratch.
 * Backward recomputes the probabilities of every tile from lse:
 *   P = exp(scale S - lse), Dv_i = dout_i . out_i, dS = scale P (dout V^T - Dv),
 *   dv = P^T dout, dk = dS^T q, dq = dS k.
 * Gradient rule: dq, dk, dv are activation gradients, written (=).
 *
 * This file checks the sizes, the mask and prefix, the pointers and the caller's scratch, and
 * runs the job on the active kernel set (mf_kernels(), read once per call): plain attention is
 * the conjunctive attention kernels' MF_ATTN_PLAIN kind, one score product per tile
 * (csrc/ops/kernels/attention.h at 16, 8 or 4 floats, or the OpenBLAS tiles of
 * csrc/ops/portable/attention_blas.c). MF_EINDEX for a prefix outside [0, T]
 * (MF_MASK_PREFIX) or a position id outside [0, npos), here or where a task reads it (another
 * thread may write the arrays while the op runs: each task indexes with its own copy of its
 * row of pos_ids, checked as it is copied, and with the prefix it read once and checked; the
 * outputs are then unspecified). MF_EINVAL for D odd or outside [16, 128], any size < 1, a non-finite
 * scale, an unknown mask, a prefix NULL (MF_MASK_PREFIX), only one of pos_ids and
 * pair_factor, npos outside [1, MF_ATTN_MAX_POSITIONS], a non-finite factor (the backward scales masked pairs' zeros too), a
 * NULL pointer, outputs overlapping each other or an input (pos_ids and prefix included),
 * or scratch that is NULL, not 64-byte aligned or smaller than one thread's share; with less
 * scratch than the team needs, fewer threads run. Every output has the same bits for any
 * thread count. */
#include <math.h>
#include <stddef.h>

#include "kernels/attention_sets.h"
#include "mapformer/mapformer.h"
#include "mapformer/params.h"

/* the job of p (MF_OK), or MF_EINVAL for bad sizes or missing arrays */
static int make_job(const MfAttentionParams *p, int backward, MfAttnJob *j) {
    if (p == NULL) return MF_EINVAL;
    const int status = mf_attn_check_sizes(p->B, p->T, p->H, p->D, p->scale);
    if (status != MF_OK) return status;
    mf_attn_job_init(j, p->B, p->T, p->H, p->D, p->scale, MF_ATTN_PLAIN);
    const int mask_status = mf_attn_check_mask(p->mask, p->prefix, p->B, p->T);
    if (mask_status != MF_OK) return mask_status;
    j->mask = p->mask;
    j->prefix = p->prefix;
    if ((p->pos_ids == NULL) != (p->pair_factor == NULL)) return MF_EINVAL;
    if (p->pair_factor != NULL) {
        if (p->npos < 1 || p->npos > MF_ATTN_MAX_POSITIONS) return MF_EINVAL;
        for (int64_t t = 0; t < p->B * p->T; t++)
            if (p->pos_ids[t] < 0 || p->pos_ids[t] >= p->npos) return MF_EINDEX;
        for (int64_t i = 0; i < p->npos * p->npos; i++)
            if (!isfinite(p->pair_factor[i])) return MF_EINVAL;
        j->pos_ids = p->pos_ids;
        j->factor = p->pair_factor;
        j->npos = p->npos;
    }
    j->qx = p->q;
    j->kx = p->k;
    j->v = p->v;
    if (p->q == NULL || p->k == NULL || p->v == NULL) return MF_EINVAL;
    if (!backward) {
        j->out = p->out;
        j->lse = p->lse;
        return p->out == NULL || p->lse == NULL ? MF_EINVAL : MF_OK;
    }
    j->dqx = p->dq;
    j->dkx = p->dk;
    j->dv = p->dv;
    j->dout = p->dout;
    j->o = p->o;
    j->lse_in = p->lse_in;
    if (p->dq == NULL || p->dk == NULL || p->dv == NULL || p->dout == NULL || p->o == NULL ||
        p->lse_in == NULL)
        return MF_EINVAL;
    return MF_OK;
}

int64_t attention_forward_scratch_floats(const MfAttentionParams *p) {
    MfAttnJob j;
    return make_job(p, 0, &j) == MF_OK ? mf_attn_scratch_floats(&j, 0, mf_max_threads()) : 0;
}

int64_t attention_backward_scratch_floats(const MfAttentionParams *p) {
    MfAttnJob j;
    return make_job(p, 1, &j) == MF_OK ? mf_attn_scratch_floats(&j, 1, mf_max_threads()) : 0;
}

int attention_forward(const MfAttentionParams *p) {
    MfAttnJob j;
    int status = make_job(p, 0, &j);
    if (status != MF_OK) return status;
    const int64_t n = p->B * p->T * p->H * p->D, nl = p->B * p->H * p->T;
    float *const out[] = {p->out, p->lse, p->scratch};
    const int64_t out_n[] = {n, nl, p->scratch_floats};
    /* the int32 ids and prefix lengths are 4 bytes a value, as floats are */
    const float *const prefix = p->mask == MF_MASK_PREFIX ? (const float *)p->prefix : NULL;
    const float *const in[] = {p->q, p->k, p->v, p->pair_factor, (const float *)p->pos_ids,
                               prefix};
    const int64_t in_n[] = {n, n, n, p->npos * p->npos, p->B * p->T, p->B};
    status = mf_attn_check_overlaps(out, out_n, 3, in, in_n, 6);
    if (status != MF_OK) return status;
    return mf_attn_run(mf_attn_kernels(mf_kernels()), &j, 0, p->scratch, p->scratch_floats);
}

int attention_backward(const MfAttentionParams *p) {
    MfAttnJob j;
    int status = make_job(p, 1, &j);
    if (status != MF_OK) return status;
    const int64_t n = p->B * p->T * p->H * p->D, nl = p->B * p->H * p->T;
    float *const out[] = {p->dq, p->dk, p->dv, p->scratch};
    const int64_t out_n[] = {n, n, n, p->scratch_floats};
    const float *const prefix = p->mask == MF_MASK_PREFIX ? (const float *)p->prefix : NULL;
    const float *const in[] = {p->dout, p->q, p->k, p->v, p->o, p->lse_in, p->pair_factor,
                               (const float *)p->pos_ids, prefix};
    const int64_t in_n[] = {n, n, n, n, n, nl, p->npos * p->npos, p->B * p->T, p->B};
    status = mf_attn_check_overlaps(out, out_n, 4, in, in_n, 9);
    if (status != MF_OK) return status;
    return mf_attn_run(mf_attn_kernels(mf_kernels()), &j, 1, p->scratch, p->scratch_floats);
}
