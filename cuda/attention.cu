/* Softmax attention on the GPU, tiled as FlashAttention-2 (Dao 2023): the T x T score matrix is
 * never stored; the forward keeps only the row log-sum-exp. Query i sees the keys
 * j <= max(i, P_b - 1) (the C op's masks, MfMask): P_b = 0 causal, T none, prefix[b] for the
 * prefix mask (a device array the host check cannot read: the kernels clamp it to [0, T], the
 * Python wrapper checks its range).
 *   forward:  out_i = sum_{j seen} softmax_j(scale q_i . k_j) v_j, lse_i = log sum_j exp(...)
 *   backward: p_ij = exp(scale q_i . k_j - lse_i), delta_i = dout_i . out_i,
 *             ds_ij = p_ij (dout_i . v_j - delta_i) scale,
 *             dq_i = sum_j ds_ij k_j, dk_j = sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i (=)
 * q, k, v, out (B, T, H, D) with D even in [16, 128]; lse (B, H, T). With a per-pair factor
 * (pos_ids (B, T) and pair_factor (npos, npos), both device arrays; the Python wrapper checks
 * the ids' range) every logit scale q_i . k_j is f_ij scale q_i . k_j, f_ij =
 * pair_factor[pos_ids[b, i], pos_ids[b, j]], before the mask, and ds_ij gets the factor f_ij.
 *
 * Forward: a block per (tile of ATT_BR query rows, b h), one thread per query row holding q_i
 * and its output accumulator; the key/value tiles of ATT_BC rows are loaded into shared
 * memory by the whole block, and each row keeps the online softmax's running max and sum,
 * rescaled once per tile (FlashAttention-2's loop order: queries outside, keys inside).
 * Backward without atomics (deterministic): delta by one kernel into the caller's scratch
 * (B, H, T); dq by a query-row kernel shaped as the forward; dk and dv by a key-row kernel,
 * one thread per key row, looping over the query tiles that see it (from its own, or from the
 * first for keys inside the prefix; Q, dout, lse and delta tiles in shared memory).
 * First version: per-thread rows in local memory and scalar dot products, no tensor cores:
 * about 1.1 TFLOP/s forward and 0.7 backward on an H100 (README, "On a GPU"). */
#include "common.cuh"

#define ATT_MAX_D 128
#define ATT_BR 64 /* query rows per forward / dq block: its threads */
#define ATT_BC 32 /* key rows per shared tile */
#define ATT_BK 64 /* key rows per dk/dv block: its threads */
#define ATT_BQ 32 /* query rows per shared tile in the dk/dv kernel */

__device__ __forceinline__ int64_t att_row(const MfAttentionParams &p, int64_t bh, int64_t t) {
    const int64_t b = bh / p.H, h = bh - b * p.H;
    return ((b * p.T + t) * p.H + h) * p.D;
}

/* P_b: the keys j < P_b are seen by every query of batch b */
__device__ __forceinline__ int64_t att_prefix(const MfAttentionParams &p, int64_t bh) {
    if (p.mask == MF_MASK_NONE) return p.T;
    if (p.mask != MF_MASK_PREFIX) return 0;
    const int64_t P = p.prefix[bh / p.H];
    return P < 0 ? 0 : (P > p.T ? p.T : P);
}

/* the per-pair factors of query i (row pair_factor[pos_ids[b, i]]) and the ids of batch b's
 * keys; factor(i) row at fr[ids[j]]: only with a table (p.pair_factor != NULL) */
__device__ __forceinline__ const float *att_factor_row(const MfAttentionParams &p, int64_t bh,
                                                       int64_t i) {
    return p.pair_factor + (int64_t)p.pos_ids[(bh / p.H) * p.T + i] * p.npos;
}
__device__ __forceinline__ const int32_t *att_ids(const MfAttentionParams &p, int64_t bh) {
    return p.pos_ids + (bh / p.H) * p.T;
}

/* the last key query i sees */
__device__ __forceinline__ int64_t att_last(int64_t i, int64_t P) { return i > P - 1 ? i : P - 1; }

/* rows [t0, t0 + rows) of x for head bh into s (rows x D), zeros past T; the whole block */
__device__ __forceinline__ void att_load(float *s, const float *x, const MfAttentionParams &p,
                                         int64_t bh, int64_t t0, int64_t rows) {
    for (int64_t e = threadIdx.x; e < rows * p.D; e += blockDim.x) {
        const int64_t r = e / p.D, d = e - r * p.D, t = t0 + r;
        s[e] = t < p.T ? x[att_row(p, bh, t) + d] : 0.0f;
    }
}

__global__ void attention_forward_kernel(MfAttentionParams p) {
    MF_DYNAMIC_SHARED(float, smem); /* K tile, V tile: ATT_BC x D each */
    float *ks = smem, *vs = smem + ATT_BC * p.D;
    const int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_BR, i = i0 + threadIdx.x;
    const int64_t D = p.D, P = att_prefix(p, bh);
    const int64_t last = att_last((i0 + ATT_BR < p.T ? i0 + ATT_BR : p.T) - 1, P);
    const bool row = i < p.T;
    const int64_t lim = att_last(i, P);
    float q[ATT_MAX_D], acc[ATT_MAX_D], s[ATT_BC];
    for (int64_t d = 0; d < D; d++) {
        q[d] = row ? p.q[att_row(p, bh, i) + d] * p.scale : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = 0; j0 <= last; j0 += ATT_BC) {
        att_load(ks, p.k, p, bh, j0, ATT_BC);
        att_load(vs, p.v, p, bh, j0, ATT_BC);
        __syncthreads();
        if (row && j0 <= lim) {
            const int64_t n = lim - j0 + 1 < ATT_BC ? lim - j0 + 1 : ATT_BC; /* the mask */
            float mt = mf_tile_scores(s, q, ks, n, D, m);
            if (p.pair_factor != NULL) { /* the factors, and the tile's max of the products */
                const float *fr = att_factor_row(p, bh, i);
                const int32_t *ids = att_ids(p, bh) + j0;
                mt = m;
                for (int64_t jj = 0; jj < n; jj++) {
                    s[jj] *= fr[ids[jj]];
                    mt = fmaxf(mt, s[jj]);
                }
            }
            mf_softmax_tile(m, l, acc, mt, s, vs, n, D, false);
        }
        __syncthreads();
    }
    if (row) {
        const float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++) p.out[att_row(p, bh, i) + d] = acc[d] * inv;
        p.lse[bh * p.T + i] = m + logf(l);
    }
}

/* delta[bh, i] = dout_i . o_i */
__global__ void attention_delta_kernel(MfAttentionParams p, float *delta) {
    for (int64_t r = MF_GRID_START; r < p.B * p.H * p.T; r += MF_GRID_STRIDE) {
        const int64_t bh = r / p.T, i = r - bh * p.T, base = att_row(p, bh, i);
        float s = 0.0f;
        for (int64_t d = 0; d < p.D; d++) s += p.dout[base + d] * p.o[base + d];
        delta[r] = s;
    }
}

__global__ void attention_dq_kernel(MfAttentionParams p, const float *delta) {
    MF_DYNAMIC_SHARED(float, smem); /* K tile, V tile: ATT_BC x D each */
    float *ks = smem, *vs = smem + ATT_BC * p.D;
    const int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_BR, i = i0 + threadIdx.x;
    const int64_t D = p.D, P = att_prefix(p, bh);
    const int64_t last = att_last((i0 + ATT_BR < p.T ? i0 + ATT_BR : p.T) - 1, P);
    const bool row = i < p.T;
    const int64_t lim = att_last(i, P);
    float q[ATT_MAX_D], g[ATT_MAX_D], dq[ATT_MAX_D];
    for (int64_t d = 0; d < D; d++) {
        q[d] = row ? p.q[att_row(p, bh, i) + d] * p.scale : 0.0f;
        g[d] = row ? p.dout[att_row(p, bh, i) + d] : 0.0f;
        dq[d] = 0.0f;
    }
    const float lse = row ? p.lse_in[bh * p.T + i] : 0.0f, di = row ? delta[bh * p.T + i] : 0.0f;
    for (int64_t j0 = 0; j0 <= last; j0 += ATT_BC) {
        att_load(ks, p.k, p, bh, j0, ATT_BC);
        att_load(vs, p.v, p, bh, j0, ATT_BC);
        __syncthreads();
        if (row && j0 <= lim) {
            const int64_t n = lim - j0 + 1 < ATT_BC ? lim - j0 + 1 : ATT_BC;
            for (int64_t jj = 0; jj < n; jj++) {
                float s = 0.0f, dp = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    s += q[d] * ks[jj * D + d];
                    dp += g[d] * vs[jj * D + d];
                }
                float ds;
                if (p.pair_factor != NULL) {
                    const float f = att_factor_row(p, bh, i)[att_ids(p, bh)[j0 + jj]];
                    ds = expf(s * f - lse) * (dp - di) * p.scale * f;
                } else {
                    ds = expf(s - lse) * (dp - di) * p.scale;
                }
                for (int64_t d = 0; d < D; d++) dq[d] += ds * ks[jj * D + d];
            }
        }
        __syncthreads();
    }
    if (row)
        for (int64_t d = 0; d < D; d++) p.dq[att_row(p, bh, i) + d] = dq[d];
}

__global__ void attention_dkdv_kernel(MfAttentionParams p, const float *delta) {
    MF_DYNAMIC_SHARED(float, smem); /* Q tile, dout tile: ATT_BQ x D each; lse, delta tiles */
    float *qs = smem, *gs = smem + ATT_BQ * p.D, *ls = gs + ATT_BQ * p.D, *ds_ = ls + ATT_BQ;
    const int64_t bh = blockIdx.y, j0 = (int64_t)blockIdx.x * ATT_BK, j = j0 + threadIdx.x;
    const int64_t D = p.D, P = att_prefix(p, bh);
    const bool row = j < p.T;
    float k[ATT_MAX_D], v[ATT_MAX_D], dk[ATT_MAX_D], dv[ATT_MAX_D];
    for (int64_t d = 0; d < D; d++) {
        k[d] = row ? p.k[att_row(p, bh, j) + d] : 0.0f;
        v[d] = row ? p.v[att_row(p, bh, j) + d] : 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    /* query tiles from the one holding row j0 (earlier rows see none of this block's keys
     * unless some of them lie in the prefix: then from the first) */
    for (int64_t i0 = j0 < P ? 0 : j0 - j0 % ATT_BQ; i0 < p.T; i0 += ATT_BQ) {
        att_load(qs, p.q, p, bh, i0, ATT_BQ);
        att_load(gs, p.dout, p, bh, i0, ATT_BQ);
        for (int64_t r = threadIdx.x; r < ATT_BQ; r += blockDim.x) {
            const bool in = i0 + r < p.T;
            ls[r] = in ? p.lse_in[bh * p.T + i0 + r] : 0.0f;
            ds_[r] = in ? delta[bh * p.T + i0 + r] : 0.0f;
        }
        __syncthreads();
        if (row) {
            for (int64_t ii = 0; ii < ATT_BQ; ii++) {
                const int64_t i = i0 + ii;
                if (i >= p.T || (i < j && j >= P)) continue;
                float s = 0.0f, dp = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    s += qs[ii * D + d] * k[d];
                    dp += gs[ii * D + d] * v[d];
                }
                const float f =
                    p.pair_factor != NULL ? att_factor_row(p, bh, i)[att_ids(p, bh)[j]] : 1.0f;
                const float pij = expf(s * p.scale * f - ls[ii]);
                const float dsij = pij * (dp - ds_[ii]) * p.scale * f;
                for (int64_t d = 0; d < D; d++) {
                    dv[d] += pij * gs[ii * D + d];
                    dk[d] += dsij * qs[ii * D + d];
                }
            }
        }
        __syncthreads();
    }
    if (row)
        for (int64_t d = 0; d < D; d++) {
            p.dk[att_row(p, bh, j) + d] = dk[d];
            p.dv[att_row(p, bh, j) + d] = dv[d];
        }
}

/* masks causal, none, and prefix with its array; pos_ids and pair_factor both or neither,
 * npos in [1, MF_ATTN_MAX_POSITIONS] */
static int attention_check(const MfAttentionParams *p) {
    const bool mask = p->mask == MF_MASK_CAUSAL || p->mask == MF_MASK_NONE
                      || (p->mask == MF_MASK_PREFIX && p->prefix != NULL);
    const bool factor = p->pair_factor == NULL
                            ? p->pos_ids == NULL
                            : p->pos_ids != NULL && p->npos >= 1
                                  && p->npos <= MF_ATTN_MAX_POSITIONS;
    return p->B < 1 || p->T < 1 || p->H < 1 || p->D < 16 || p->D > ATT_MAX_D || p->D % 2 != 0
                   || !isfinite(p->scale) || p->B * p->H > 65535 || !mask || !factor
               ? MF_EINVAL
               : MF_OK;
}

extern "C" int attention_forward_cuda(const MfAttentionParams *p, cudaStream_t stream) {
    if (attention_check(p) != MF_OK || p->q == NULL || p->k == NULL || p->v == NULL
        || p->out == NULL || p->lse == NULL)
        return MF_EINVAL;
    const dim3 grid(mf_blocks(p->T, ATT_BR), (unsigned)(p->B * p->H));
    return MF_LAUNCH(attention_forward_kernel, grid, dim3(ATT_BR),
                     2 * ATT_BC * p->D * sizeof(float), stream, *p);
}

/* delta (B, H, T) */
extern "C" int64_t attention_backward_cuda_scratch_floats(const MfAttentionParams *p) {
    return p->B * p->H * p->T;
}

extern "C" int attention_backward_cuda(const MfAttentionParams *p, cudaStream_t stream) {
    if (attention_check(p) != MF_OK || p->q == NULL || p->k == NULL || p->v == NULL
        || p->dq == NULL || p->dk == NULL || p->dv == NULL || p->dout == NULL || p->o == NULL
        || p->lse_in == NULL || p->scratch == NULL
        || p->scratch_floats < attention_backward_cuda_scratch_floats(p))
        return MF_EINVAL;
    float *delta = p->scratch;
    const unsigned rows = mf_blocks(p->B * p->H * p->T, 256);
    int status = MF_LAUNCH(attention_delta_kernel, dim3(rows < MF_MAX_GRID ? rows : MF_MAX_GRID),
                           dim3(256), 0, stream, *p, delta);
    if (status != MF_OK) return status;
    status = MF_LAUNCH(attention_dq_kernel, dim3(mf_blocks(p->T, ATT_BR), (unsigned)(p->B * p->H)),
                       dim3(ATT_BR), 2 * ATT_BC * p->D * sizeof(float), stream, *p, delta);
    if (status != MF_OK) return status;
    return MF_LAUNCH(attention_dkdv_kernel, dim3(mf_blocks(p->T, ATT_BK), (unsigned)(p->B * p->H)),
                     dim3(ATT_BK), (2 * ATT_BQ * p->D + 2 * ATT_BQ) * sizeof(float), stream, *p,
                     delta);
}
