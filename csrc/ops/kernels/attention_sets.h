/* The attention family's kernel sets and the one task runner that csrc/ops/attention.c and
 * csrc/ops/conj_attention.c (the thin entries) share.
 *
 * Both ops are one computation, an MfAttnJob, whose `kind` says how a score tile is made:
 *   MF_ATTN_PLAIN           scale q k^T                     (attention.c: qx = q, kx = k)
 *   MF_CONJ_SCORE_PRODUCT   scale (qx kx^T) * (qp kp^T)     (conj_attention.c, mapformer.h)
 *   MF_CONJ_SOFTMAX_PRODUCT softmax(scale qx kx^T) * softmax(scale qp kp^T)
 *   MF_CONJ_SUM             scale (qx kx^T + qp kp^T)
 * Each kernel set implements the job's forward and backward tasks:
 *   mf_attn_avx512    csrc/ops/x86/attention_avx512.c    kernels/attention.h at 16 floats
 *   mf_attn_avx2      csrc/ops/x86/attention_avx2.c      kernels/attention.h at 8 floats, FMA
 *   mf_attn_vec       csrc/ops/portable/attention_vec.c  kernels/attention.h at 4 floats
 *   mf_attn_blas      csrc/ops/portable/attention_blas.c one OpenBLAS sgemm per product
 * (the x86/ ones exist where MF_X86 is 1). Forward tasks are (head, pair of query blocks), so
 * that every task costs the same; backward tasks are heads. A task writes only its own rows of
 * the outputs, and what a task computes does not depend on the thread that runs it: every
 * output has the same bits for any thread count. */
#ifndef MAPFORMER_ATTENTION_SETS_H
#define MAPFORMER_ATTENTION_SETS_H

#include <math.h>
#include <stdint.h>

#include "mapformer/cpu.h"
#include "mapformer/mapformer.h"
#include "mapformer/threads.h"

/* the job's kinds besides the MfConjMode values 0, 1, 2 */
enum { MF_ATTN_PLAIN = 3 };

typedef struct {
    float *out, *lse;                    /* forward (B, T, H, D), (M, B, H, T) */
    float *dqx, *dkx, *dqp, *dkp, *dv;   /* backward (B, T, H, D) (=); dqp, dkp unused (plain) */
    const float *qx, *kx, *qp, *kp, *v;  /* (B, T, H, D); qp, kp unused (plain) */
    const float *dout, *o, *lse_in;      /* backward */
    int64_t B, T, H, D, ld;              /* ld = H * D, the row stride */
    float scale;
    float c2;                            /* scale log2(e): the kernels' scores are base 2 */
    double to_lse;                       /* scale / c2 (ln 2 up to c2's rounding), the
                                          * factor from a base-2 log-sum-exp to lse */
    int kind;                            /* MF_ATTN_PLAIN or an MfConjMode */
    int mask;                            /* an MfMask */
    const int32_t *prefix;               /* MF_MASK_PREFIX: (B,) */
    const int32_t *pos_ids;              /* MF_ATTN_PLAIN's per-pair logit factor, or NULL: */
    const float *factor;                 /* pos_ids (B, T) in [0, npos), factor (npos, npos); */
    int64_t npos;                        /* logit_ij = factor[pos_i, pos_j] scale q_i . k_j */
} MfAttnJob;

/* P_b of batch row b (mapformer.h, MfMask): query i sees the keys j <= max(i, P_b - 1); 0
 * (causal), T (none) or prefix[b], read once; -1 when that read is outside [0, T] (the entry
 * checked it, but another thread may have written the array since: the task then returns
 * MF_EINDEX, and a kernel indexes only with the P it read and checked itself). */
static inline int64_t mf_attn_prefix(const MfAttnJob *j, int64_t b) {
    if (j->mask == MF_MASK_NONE) return j->T;
    if (j->mask != MF_MASK_PREFIX) return 0;
    const int64_t P = ((const volatile int32_t *)j->prefix)[b];
    return P < 0 || P > j->T ? -1 : P;
}

/* The position ids a task with a per-pair factor indexes the table with: pos_ids[b, :]
 * copied into ids (T int32), each entry read once and checked there, since another thread
 * may have written the array after the entry checked it (a kernel indexes only with what it
 * checked itself). MF_OK, or MF_EINDEX when an id is outside [0, npos) (ids is then not to
 * be used). */
static inline int mf_attn_copy_ids(const MfAttnJob *j, int64_t b, int32_t *ids) {
    const volatile int32_t *src = j->pos_ids + b * j->T;
    int bad = 0;
    for (int64_t t = 0; t < j->T; t++) {
        const int32_t id = src[t];
        bad |= id < 0 || id >= j->npos;
        ids[t] = id;
    }
    return bad ? MF_EINDEX : MF_OK;
}

/* How a (query block, key block) pair is masked, the blocks starting at rows i0 and j0, the
 * key block nc rows long, the keys before P seen by every query (a pair with no key seen is
 * never visited: j0 > i0 and j0 >= P):
 *   MF_BLOCK_OPEN     no mask (keys before the queries, or all keys before P)
 *   MF_BLOCK_CAUSAL   the causal diagonal block (i0 = j0 >= P)
 *   MF_BLOCK_PREFIX   a block that P cuts: key c is hidden from query r when
 *                     j0 + c > max(i0 + r, P - 1) */
enum { MF_BLOCK_OPEN = 0, MF_BLOCK_CAUSAL = 1, MF_BLOCK_PREFIX = 2 };
static inline int mf_attn_block_mask(int64_t i0, int64_t j0, int64_t nc, int64_t P) {
    if (j0 < i0 || j0 + nc <= P) return MF_BLOCK_OPEN;
    return j0 == i0 && j0 >= P ? MF_BLOCK_CAUSAL : MF_BLOCK_PREFIX;
}

/* the key blocks (of bt rows) query block ib sees: 0 .. mf_attn_last_key_block */
static inline int64_t mf_attn_last_key_block(int64_t ib, int64_t bt, int64_t T, int64_t P) {
    const int64_t nb = (T + bt - 1) / bt, jp = P > 0 ? (P - 1) / bt : 0;
    const int64_t last = ib > jp ? ib : jp;
    return last < nb ? last : nb - 1;
}

/* the first query block (of bt rows) that sees key block jb */
static inline int64_t mf_attn_first_query_block(int64_t jb, int64_t bt, int64_t P) {
    return jb * bt < P ? 0 : jb;
}

/* One kernel set: forward task count; floats of scratch one thread needs (forward, backward);
 * forward task t and backward task t (head t) on a thread's scratch. Tasks return an
 * MfStatus (the BLAS path's sgemm can refuse sizes). */
typedef struct {
    int64_t (*fwd_tasks)(const MfAttnJob *j);
    int64_t (*fwd_floats)(const MfAttnJob *j);
    int64_t (*bwd_floats)(const MfAttnJob *j);
    int (*fwd)(const MfAttnJob *j, float *scratch, int64_t t);
    int (*bwd)(const MfAttnJob *j, float *scratch, int64_t t);
} MfAttnKernels;

#if MF_X86
extern const MfAttnKernels mf_attn_avx512, mf_attn_avx2;
#endif
extern const MfAttnKernels mf_attn_vec, mf_attn_blas;

/* the kernels of set `kernels` (an MfKernels value the CPU runs) */
static inline const MfAttnKernels *mf_attn_kernels(int kernels) {
    switch (kernels) {
#if MF_X86
        case MF_KERNELS_AVX512: return &mf_attn_avx512;
        case MF_KERNELS_AVX2: return &mf_attn_avx2;
#endif
        case MF_KERNELS_BLAS: return &mf_attn_blas;
        default: return &mf_attn_vec;
    }
}

/* Sizes as the kernels need them: MF_EINVAL for D odd or outside [16, 128], any size < 1, a
 * non-finite scale, or sizes whose products overflow. */
static inline int mf_attn_check_sizes(int64_t B, int64_t T, int64_t H, int64_t D,
                                      float scale) {
    if (B < 1 || T < 1 || H < 1 || D < 16 || D > 128 || D % 2 != 0 || !isfinite(scale))
        return MF_EINVAL;
    if (T > INT32_MAX || H > INT32_MAX / D || B > INT64_MAX / 4 / T / (H * D))
        return MF_EINVAL;
    return MF_OK;
}

/* MF_OK when mask is an MfMask and, for MF_MASK_PREFIX, prefix (B,) is given with every
 * entry in [0, T]; MF_EINVAL for an unknown mask or a missing prefix, MF_EINDEX for an entry
 * outside [0, T] (an index-like value, as the binding's message for it says) */
static inline int mf_attn_check_mask(int mask, const int32_t *prefix, int64_t B, int64_t T) {
    if (mask == MF_MASK_CAUSAL || mask == MF_MASK_NONE) return MF_OK;
    if (mask != MF_MASK_PREFIX || prefix == NULL) return MF_EINVAL;
    for (int64_t b = 0; b < B; b++)
        if (prefix[b] < 0 || prefix[b] > T) return MF_EINDEX;
    return MF_OK;
}

/* The job's sizes and scalars (the causal mask); the caller sets the pointers and mask. */
static inline void mf_attn_job_init(MfAttnJob *j, int64_t B, int64_t T, int64_t H, int64_t D,
                                    float scale, int kind) {
    *j = (MfAttnJob){0};
    j->B = B;
    j->T = T;
    j->H = H;
    j->D = D;
    j->ld = H * D;
    j->scale = scale;
    j->kind = kind;
    j->c2 = (float)((double)scale * 1.4426950408889634);
    /* lse = (m + log2 l) scale / c2 undoes c2's rounding: the base-2 scores are c2 s */
    j->to_lse = scale != 0.0f ? (double)scale / (double)j->c2 : 0.6931471805599453;
}

/* The backward's base-2 lse of a row, lse * to2 (to2 = c2 / scale), as two floats: hi the
 * nearest float and lo the rest, so that (c2 s - hi) - lo, exact in its first step near the
 * row's largest scores, loses nothing to the conversion: the probabilities rebuilt from lse
 * carry only lse's own float32 rounding, as exp(scale s - lse) does. */
static inline void split_lse(float lse, double to2, float *hi, float *lo) {
    const double x = (double)lse * to2;
    *hi = (float)x;
    *lo = (float)(x - (double)*hi);
}

/* One thread's scratch, rounded up to 16 floats so every slice stays 64-byte aligned. */
static inline int64_t mf_attn_slice(int64_t floats) { return (floats + 15) / 16 * 16; }

/* Floats of scratch for `threads` threads on any kernel set, so that a later switch of the
 * active set (mf_set_kernels) never leaves an op short. */
static inline int64_t mf_attn_scratch_floats(const MfAttnJob *j, int backward, int threads) {
    const MfAttnKernels *sets[] = {
#if MF_X86
        &mf_attn_avx512, &mf_attn_avx2,
#endif
        &mf_attn_vec, &mf_attn_blas};
    int64_t most = 0;
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        const int64_t n = mf_attn_slice(backward ? sets[i]->bwd_floats(j) : sets[i]->fwd_floats(j));
        most = n > most ? n : most;
    }
    return most * (threads > 1 ? threads : 1);
}

/* [a, a + na) and [b, b + nb) (floats) share no address; NULL ranges share none. */
static inline int mf_attn_disjoint(const float *a, int64_t na, const float *b, int64_t nb) {
    if (a == NULL || b == NULL) return 1;
    return (uintptr_t)(a + na) <= (uintptr_t)b || (uintptr_t)(b + nb) <= (uintptr_t)a;
}

/* Every one of the nout written ranges (out[i], nout_floats[i]) is disjoint from the others
 * and from the nin read ranges: MF_OK, else MF_EINVAL (an output that overlaps an input
 * changes what the kernels read). */
static inline int mf_attn_check_overlaps(float *const out[], const int64_t out_floats[],
                                         int nout, const float *const in[],
                                         const int64_t in_floats[], int nin) {
    for (int i = 0; i < nout; i++) {
        for (int k = i + 1; k < nout; k++)
            if (!mf_attn_disjoint(out[i], out_floats[i], out[k], out_floats[k]))
                return MF_EINVAL;
        for (int k = 0; k < nin; k++)
            if (!mf_attn_disjoint(out[i], out_floats[i], in[k], in_floats[k])) return MF_EINVAL;
    }
    return MF_OK;
}

/* Run the forward (backward = 0) or backward tasks of job j on kernel set ks with the caller's
 * scratch: MF_EINVAL when scratch is NULL, not 64-byte aligned or short of one thread's share;
 * otherwise on as many OpenMP threads as the scratch serves (at most the team's size), each
 * on its own slice. Problems under about a million multiply-adds (B H T^2 D < 2e6) run on the
 * calling thread: waking the team would cost more than the work. */
static inline int mf_attn_run(const MfAttnKernels *ks, const MfAttnJob *j, int backward,
                              float *scratch, int64_t scratch_floats) {
    const int64_t per = mf_attn_slice(backward ? ks->bwd_floats(j) : ks->fwd_floats(j));
    if (scratch == NULL || (uintptr_t)scratch % 64 != 0 || scratch_floats < per)
        return MF_EINVAL;
    const int64_t served = scratch_floats / per, team = mf_max_threads();
    const int threads = (int)(served < team ? served : team);
    const int64_t ntask = backward ? j->B * j->H : ks->fwd_tasks(j);
    const double work = (double)j->B * j->H * j->T * j->T * j->D;
    int (*const fn)(const MfAttnJob *, float *, int64_t) = backward ? ks->bwd : ks->fwd;
    int status = MF_OK;
#pragma omp parallel num_threads(threads) if (threads > 1 && ntask > 1 && work > 2e6)
    {
        float *mine_scratch = scratch + (int64_t)mf_thread_id() * per;
        int mine = MF_OK;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntask; t++)
            if (mine == MF_OK) mine = fn(j, mine_scratch, t);
        if (mine != MF_OK) {
#pragma omp atomic write
            status = mine;
        }
    }
    return status;
}

#endif
