/* Conjunctive attention (MapEM, MapFormer paper sec. 3.5.1, eq. 13), tiled like
 * FlashAttention-2: the entry points. Per (b, h), with content scores sX = qx kx^T and
 * positional scores sP = qp kp^T (T x T, only the keys j the mask shows query i: j <= i when
 * causal, the default; every j for MF_MASK_NONE; j <= max(i, P_b - 1) for MF_MASK_PREFIX,
 * mapformer.h), one of three modes (MfConjMode):
 *
 *   score_product (0):   A = softmax_j(scale sX * sP)                 lse   = log sum_j exp(..)
 *   softmax_product (1): A = softmax_j(scale sX) * softmax_j(scale sP) lseX, lseP of each
 *                        (eq. 13 read literally: rows of A sum to less than 1)
 *   sum (2):             A = softmax_j(scale (sX + sP)), plain attention on [qx, qp], [kx, kp]
 *   out = A v.
 *
 * Forward saves lse (M, B, H, T): M = 1 (the row log-sum-exp) or, for softmax_product, M = 2
 * (lseX, then lseP). The softmax_product forward makes two passes over the key blocks: both
 * log-sum-exps first (each branch's row max m and sum l, online), then
 * out = sum_j exp(scale sX - lseX + scale sP - lseP) v_j, computed as
 * sum_j 2^((c2 sX - mX) + (c2 sP - mP)) v_j / (lX lP) (c2 = scale log2 e) so that the exponent
 * never subtracts two log-sum-exps, whose float32 rounding would dominate the error.
 * No T x T matrix exists in either direction: the backward recomputes both score tiles.
 * Backward, with dA = dout v^T and Dv_i = dout_i . out_i (= sum_j A_ij dA_ij in every mode):
 *   score_product:   dS = A (dA - Dv),  dsX = scale dS sP,  dsP = scale dS sX
 *   softmax_product: dsX = scale (A dA - AX Dv),  dsP = scale (A dA - AP Dv)
 *   sum:             dsX = dsP = scale A (dA - Dv)
 *   dqx = dsX kx, dkx = dsX^T qx, dqp = dsP kp, dkp = dsP^T qp, dv = A^T dout.
 * Gradient rule: all five gradients are activation gradients, written (=).
 *
 * This file checks the sizes, the mode, the mask and prefix, the pointers and the caller's
 * scratch, and runs the job on the active kernel set (mf_kernels(), read once per call):
 * csrc/ops/kernels/attention.h at 16, 8 or 4 floats, or the OpenBLAS tiles of
 * csrc/ops/portable/attention_blas.c, which serve plain attention (attention.c) too. Products
 * per (query block, key block): forward 3 (5 for softmax_product), backward 8. MF_EINVAL for
 * D odd or outside [16, 128], any size < 1, a non-finite scale, an unknown mode or mask, a
 * prefix NULL, a NULL pointer, outputs overlapping each other or an input,
 * or scratch that is NULL, not 64-byte aligned or smaller than one thread's share
 * (MF_EINDEX for a prefix outside [0, T]: checked again where a task reads it); with less
 * scratch than the team needs, fewer threads run. Every output has the same bits for any
 * thread count. */
#include <stddef.h>

#include "kernels/attention_sets.h"
#include "mapformer/mapformer.h"
#include "mapformer/params.h"

static int valid_mode(int mode) {
    return mode == MF_CONJ_SCORE_PRODUCT || mode == MF_CONJ_SOFTMAX_PRODUCT ||
           mode == MF_CONJ_SUM;
}

/* the job of p (MF_OK), or MF_EINVAL for bad sizes, an unknown mode or missing arrays */
static int make_job(const MfConjAttentionParams *p, int backward, MfAttnJob *j) {
    if (p == NULL || !valid_mode(p->mode)) return MF_EINVAL;
    const int status = mf_attn_check_sizes(p->B, p->T, p->H, p->D, p->scale);
    if (status != MF_OK) return status;
    mf_attn_job_init(j, p->B, p->T, p->H, p->D, p->scale, p->mode);
    const int mask_status = mf_attn_check_mask(p->mask, p->prefix, p->B, p->T);
    if (mask_status != MF_OK) return mask_status;
    j->mask = p->mask;
    j->prefix = p->prefix;
    j->qx = p->qx;
    j->kx = p->kx;
    j->qp = p->qp;
    j->kp = p->kp;
    j->v = p->v;
    if (p->qx == NULL || p->kx == NULL || p->qp == NULL || p->kp == NULL || p->v == NULL)
        return MF_EINVAL;
    if (!backward) {
        j->out = p->out;
        j->lse = p->lse;
        return p->out == NULL || p->lse == NULL ? MF_EINVAL : MF_OK;
    }
    j->dqx = p->dqx;
    j->dkx = p->dkx;
    j->dqp = p->dqp;
    j->dkp = p->dkp;
    j->dv = p->dv;
    j->dout = p->dout;
    j->o = p->o;
    j->lse_in = p->lse_in;
    if (p->dqx == NULL || p->dkx == NULL || p->dqp == NULL || p->dkp == NULL || p->dv == NULL ||
        p->dout == NULL || p->o == NULL || p->lse_in == NULL)
        return MF_EINVAL;
    return MF_OK;
}

int64_t conj_attention_forward_scratch_floats(const MfConjAttentionParams *p) {
    MfAttnJob j;
    return make_job(p, 0, &j) == MF_OK ? mf_attn_scratch_floats(&j, 0, mf_max_threads()) : 0;
}

int64_t conj_attention_backward_scratch_floats(const MfConjAttentionParams *p) {
    MfAttnJob j;
    return make_job(p, 1, &j) == MF_OK ? mf_attn_scratch_floats(&j, 1, mf_max_threads()) : 0;
}

/* floats of lse: M planes of (B, H, T) */
static int64_t lse_floats(const MfConjAttentionParams *p) {
    return (p->mode == MF_CONJ_SOFTMAX_PRODUCT ? 2 : 1) * p->B * p->H * p->T;
}

int conj_attention_forward(const MfConjAttentionParams *p) {
    MfAttnJob j;
    int status = make_job(p, 0, &j);
    if (status != MF_OK) return status;
    const int64_t n = p->B * p->T * p->H * p->D;
    float *const out[] = {p->out, p->lse, p->scratch};
    const int64_t out_n[] = {n, lse_floats(p), p->scratch_floats};
    const float *const in[] = {p->qx, p->kx, p->qp, p->kp, p->v};
    const int64_t in_n[] = {n, n, n, n, n};
    status = mf_attn_check_overlaps(out, out_n, 3, in, in_n, 5);
    if (status != MF_OK) return status;
    return mf_attn_run(mf_attn_kernels(mf_kernels()), &j, 0, p->scratch, p->scratch_floats);
}

int conj_attention_backward(const MfConjAttentionParams *p) {
    MfAttnJob j;
    int status = make_job(p, 1, &j);
    if (status != MF_OK) return status;
    const int64_t n = p->B * p->T * p->H * p->D;
    float *const out[] = {p->dqx, p->dkx, p->dqp, p->dkp, p->dv, p->scratch};
    const int64_t out_n[] = {n, n, n, n, n, p->scratch_floats};
    const float *const in[] = {p->dout, p->qx, p->kx, p->qp, p->kp, p->v, p->o, p->lse_in};
    const int64_t in_n[] = {n, n, n, n, n, n, n, lse_floats(p)};
    status = mf_attn_check_overlaps(out, out_n, 6, in, in_n, 8);
    if (status != MF_OK) return status;
    return mf_attn_run(mf_attn_kernels(mf_kernels()), &j, 1, p->scratch, p->scratch_floats);
}
