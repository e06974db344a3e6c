/* Conjunctive attention (MapEM, csrc/ops/conj_attention.c's math) on the GPU, tiled as
 * cuda/attention.cu (FlashAttention-2's loop order; no T x T matrix in either direction). Per
 * (b, h), content scores sX = qx kx^T, positional scores sP = qp kp^T over the keys the mask
 * shows query i: j <= max(i, P_b - 1), P_b = 0 (MF_MASK_CAUSAL), T (MF_MASK_NONE) or prefix[b]
 * (MF_MASK_PREFIX; the device array cannot be read by the host check, so the kernels clamp it
 * to [0, T]: the Python wrapper checks the range). Modes (MfConjMode):
 *   score_product (0):   A = softmax_j(scale sX sP)                   lse (1, B, H, T)
 *   softmax_product (1): A = softmax_j(scale sX) softmax_j(scale sP)  lse (2, B, H, T)
 *   sum (2):             A = softmax_j(scale (sX + sP))               lse (1, B, H, T)
 *   out = A v.
 * Forward: a block per (tile of CJ_BR query rows, b h), a thread per query row; kx, kp, v
 * tiles of CJ_BC rows in shared memory; each row keeps the online softmax's running max and
 * sum (softmax_product: two passes, both branches' max and sum first, then
 * out = sum_j exp((scale sX - mX) + (scale sP - mP)) v_j / (lX lP), never subtracting two
 * log-sum-exps in the exponent).
 * Backward without atomics (deterministic), Dv_i = dout_i . out_i by a first kernel into the
 * caller's scratch (B, H, T), dA_ij = dout_i . v_j:
 *   score_product:   dS = A (dA - Dv), dsX = scale dS sP, dsP = scale dS sX
 *   softmax_product: dsX = scale (A dA - AX Dv), dsP = scale (A dA - AP Dv)
 *   sum:             dsX = dsP = scale A (dA - Dv)
 * dqx, dqp by a query-row kernel shaped as the forward; dkx, dkp, dv (=) by a key-row kernel
 * (a thread per key row, qx, qp, dout, lse and Dv tiles of CJ_BQ rows in shared memory).
 * First version: per-thread rows in local memory, scalar dot products, no tensor cores: 2.7
 * TFLOP/s forward and 0.5 backward on an H100 (README, "On a GPU"). */
#include "common.cuh"

#define CJ_MAX_D 128
#define CJ_BR 64 /* query rows per forward / dq block: its threads */
#define CJ_BC 16 /* key rows per shared tile (3 tiles: 24 KiB at D = 128) */
#define CJ_BK 64 /* key rows per dk/dv block: its threads */
#define CJ_BQ 16 /* query rows per shared tile in the dk/dv kernel */

__device__ __forceinline__ int64_t cj_row(const MfConjAttentionParams &p, int64_t bh, int64_t t) {
    const int64_t b = bh / p.H, h = bh - b * p.H;
    return ((b * p.T + t) * p.H + h) * p.D;
}

/* P_b: keys j < P_b are seen by every query of batch b */
__device__ __forceinline__ int64_t cj_prefix(const MfConjAttentionParams &p, int64_t bh) {
    if (p.mask == MF_MASK_NONE) return p.T;
    if (p.mask != MF_MASK_PREFIX) return 0;
    const int64_t P = p.prefix[bh / p.H];
    return P < 0 ? 0 : (P > p.T ? p.T : P);
}

/* the last key query i sees */
__device__ __forceinline__ int64_t cj_last(int64_t i, int64_t P) {
    return i > P - 1 ? i : P - 1;
}

/* rows [t0, t0 + rows) of x for head bh into s (rows x D), zeros past T; the whole block */
__device__ __forceinline__ void cj_load(float *s, const float *x, const MfConjAttentionParams &p,
                                        int64_t bh, int64_t t0, int64_t rows) {
    for (int64_t e = threadIdx.x; e < rows * p.D; e += blockDim.x) {
        const int64_t r = e / p.D, d = e - r * p.D, t = t0 + r;
        s[e] = t < p.T ? x[cj_row(p, bh, t) + d] : 0.0f;
    }
}

/* the scaled score of one (query, key) pair for the single-softmax modes */
__device__ __forceinline__ float cj_score(const MfConjAttentionParams &p, float sx, float sp) {
    return p.mode == MF_CONJ_SCORE_PRODUCT ? p.scale * (sx * sp) : p.scale * (sx + sp);
}

__global__ void conj_attention_forward_kernel(MfConjAttentionParams p) {
    MF_DYNAMIC_SHARED(float, smem); /* kx, kp, v tiles: CJ_BC x D each */
    const int64_t D = p.D;
    float *kxs = smem, *kps = smem + CJ_BC * D, *vs = kps + CJ_BC * D;
    const int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * CJ_BR, i = i0 + threadIdx.x;
    const int64_t P = cj_prefix(p, bh);
    const int64_t last = cj_last((i0 + CJ_BR < p.T ? i0 + CJ_BR : p.T) - 1, P);
    const bool row = i < p.T;
    const int64_t lim = cj_last(i, P);
    const bool two = p.mode == MF_CONJ_SOFTMAX_PRODUCT;
    float qx[CJ_MAX_D], qp[CJ_MAX_D], acc[CJ_MAX_D], sx[CJ_BC], sp[CJ_BC];
    for (int64_t d = 0; d < D; d++) {
        qx[d] = row ? p.qx[cj_row(p, bh, i) + d] : 0.0f;
        qp[d] = row ? p.qp[cj_row(p, bh, i) + d] : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f, m2 = -INFINITY, l2 = 0.0f;
    /* pass 1 (softmax_product only): each branch's row max and sum, online */
    for (int64_t j0 = 0; two && j0 <= last; j0 += CJ_BC) {
        cj_load(kxs, p.kx, p, bh, j0, CJ_BC);
        cj_load(kps, p.kp, p, bh, j0, CJ_BC);
        __syncthreads();
        if (row && j0 <= lim) {
            const int64_t n = lim - j0 + 1 < CJ_BC ? lim - j0 + 1 : CJ_BC;
            float mt = m, mt2 = m2;
            for (int64_t jj = 0; jj < n; jj++) {
                float a = 0.0f, c = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    a += qx[d] * kxs[jj * D + d];
                    c += qp[d] * kps[jj * D + d];
                }
                sx[jj] = p.scale * a;
                sp[jj] = p.scale * c;
                mt = fmaxf(mt, sx[jj]);
                mt2 = fmaxf(mt2, sp[jj]);
            }
            l *= expf(m - mt);
            l2 *= expf(m2 - mt2);
            for (int64_t jj = 0; jj < n; jj++) {
                l += expf(sx[jj] - mt);
                l2 += expf(sp[jj] - mt2);
            }
            m = mt;
            m2 = mt2;
        }
        __syncthreads();
    }
    /* pass 2: the output (and, for one softmax, its online max and sum) */
    for (int64_t j0 = 0; j0 <= last; j0 += CJ_BC) {
        cj_load(kxs, p.kx, p, bh, j0, CJ_BC);
        cj_load(kps, p.kp, p, bh, j0, CJ_BC);
        cj_load(vs, p.v, p, bh, j0, CJ_BC);
        __syncthreads();
        if (row && j0 <= lim) {
            const int64_t n = lim - j0 + 1 < CJ_BC ? lim - j0 + 1 : CJ_BC;
            for (int64_t jj = 0; jj < n; jj++) {
                float a = 0.0f, c = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    a += qx[d] * kxs[jj * D + d];
                    c += qp[d] * kps[jj * D + d];
                }
                sx[jj] = a;
                sp[jj] = c;
            }
            if (two) {
                for (int64_t jj = 0; jj < n; jj++) {
                    const float e = expf((p.scale * sx[jj] - m) + (p.scale * sp[jj] - m2));
                    for (int64_t d = 0; d < D; d++) acc[d] += e * vs[jj * D + d];
                }
            } else {
                float mt = m;
                for (int64_t jj = 0; jj < n; jj++) {
                    sx[jj] = cj_score(p, sx[jj], sp[jj]);
                    mt = fmaxf(mt, sx[jj]);
                }
                mf_softmax_tile(m, l, acc, mt, sx, vs, n, D, false);
            }
        }
        __syncthreads();
    }
    if (row) {
        const float inv = 1.0f / (two ? l * l2 : l);
        for (int64_t d = 0; d < D; d++) p.out[cj_row(p, bh, i) + d] = acc[d] * inv;
        p.lse[bh * p.T + i] = m + logf(l);
        if (two) p.lse[p.B * p.H * p.T + bh * p.T + i] = m2 + logf(l2);
    }
}

/* Dv[bh, i] = dout_i . o_i */
__global__ void conj_attention_delta_kernel(MfConjAttentionParams p, float *delta) {
    for (int64_t r = MF_GRID_START; r < p.B * p.H * p.T; r += MF_GRID_STRIDE) {
        const int64_t bh = r / p.T, i = r - bh * p.T, base = cj_row(p, bh, i);
        float s = 0.0f;
        for (int64_t d = 0; d < p.D; d++) s += p.dout[base + d] * p.o[base + d];
        delta[r] = s;
    }
}

/* A_ij and the two score gradients of one pair from its raw scores sx, sp, dA = dout_i . v_j,
 * the row's lse (l0, l1) and Dv */
__device__ __forceinline__ void cj_pair(const MfConjAttentionParams &p, float sx, float sp,
                                        float da, float l0, float l1, float dv, float *a,
                                        float *dsx, float *dsp) {
    if (p.mode == MF_CONJ_SOFTMAX_PRODUCT) {
        const float ax = expf(p.scale * sx - l0), ap = expf(p.scale * sp - l1), aa = ax * ap;
        *a = aa;
        *dsx = p.scale * (aa * da - ax * dv);
        *dsp = p.scale * (aa * da - ap * dv);
    } else {
        const float aa = expf(cj_score(p, sx, sp) - l0), ds = aa * (da - dv);
        *a = aa;
        if (p.mode == MF_CONJ_SCORE_PRODUCT) {
            *dsx = p.scale * ds * sp;
            *dsp = p.scale * ds * sx;
        } else {
            *dsx = *dsp = p.scale * ds;
        }
    }
}

__global__ void conj_attention_dq_kernel(MfConjAttentionParams p, const float *delta) {
    MF_DYNAMIC_SHARED(float, smem); /* kx, kp, v tiles: CJ_BC x D each */
    const int64_t D = p.D, BHT = p.B * p.H * p.T;
    float *kxs = smem, *kps = smem + CJ_BC * D, *vs = kps + CJ_BC * D;
    const int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * CJ_BR, i = i0 + threadIdx.x;
    const int64_t P = cj_prefix(p, bh);
    const int64_t last = cj_last((i0 + CJ_BR < p.T ? i0 + CJ_BR : p.T) - 1, P);
    const bool row = i < p.T;
    const int64_t lim = cj_last(i, P);
    float qx[CJ_MAX_D], qp[CJ_MAX_D], g[CJ_MAX_D], dqx[CJ_MAX_D], dqp[CJ_MAX_D];
    for (int64_t d = 0; d < D; d++) {
        qx[d] = row ? p.qx[cj_row(p, bh, i) + d] : 0.0f;
        qp[d] = row ? p.qp[cj_row(p, bh, i) + d] : 0.0f;
        g[d] = row ? p.dout[cj_row(p, bh, i) + d] : 0.0f;
        dqx[d] = dqp[d] = 0.0f;
    }
    const float l0 = row ? p.lse_in[bh * p.T + i] : 0.0f;
    const float l1 = row && p.mode == MF_CONJ_SOFTMAX_PRODUCT ? p.lse_in[BHT + bh * p.T + i]
                                                              : 0.0f;
    const float dv = row ? delta[bh * p.T + i] : 0.0f;
    for (int64_t j0 = 0; j0 <= last; j0 += CJ_BC) {
        cj_load(kxs, p.kx, p, bh, j0, CJ_BC);
        cj_load(kps, p.kp, p, bh, j0, CJ_BC);
        cj_load(vs, p.v, p, bh, j0, CJ_BC);
        __syncthreads();
        if (row && j0 <= lim) {
            const int64_t n = lim - j0 + 1 < CJ_BC ? lim - j0 + 1 : CJ_BC;
            for (int64_t jj = 0; jj < n; jj++) {
                float sx = 0.0f, sp = 0.0f, da = 0.0f, a, dsx, dsp;
                for (int64_t d = 0; d < D; d++) {
                    sx += qx[d] * kxs[jj * D + d];
                    sp += qp[d] * kps[jj * D + d];
                    da += g[d] * vs[jj * D + d];
                }
                cj_pair(p, sx, sp, da, l0, l1, dv, &a, &dsx, &dsp);
                for (int64_t d = 0; d < D; d++) {
                    dqx[d] += dsx * kxs[jj * D + d];
                    dqp[d] += dsp * kps[jj * D + d];
                }
            }
        }
        __syncthreads();
    }
    if (row)
        for (int64_t d = 0; d < D; d++) {
            p.dqx[cj_row(p, bh, i) + d] = dqx[d];
            p.dqp[cj_row(p, bh, i) + d] = dqp[d];
        }
}

__global__ void conj_attention_dkdv_kernel(MfConjAttentionParams p, const float *delta) {
    MF_DYNAMIC_SHARED(float, smem); /* qx, qp, dout tiles: CJ_BQ x D each; lse0, lse1, Dv */
    const int64_t D = p.D, BHT = p.B * p.H * p.T;
    float *qxs = smem, *qps = smem + CJ_BQ * D, *gs = qps + CJ_BQ * D, *l0s = gs + CJ_BQ * D;
    float *l1s = l0s + CJ_BQ, *dvs = l1s + CJ_BQ;
    const int64_t bh = blockIdx.y, j0 = (int64_t)blockIdx.x * CJ_BK, j = j0 + threadIdx.x;
    const int64_t P = cj_prefix(p, bh);
    const bool row = j < p.T, two = p.mode == MF_CONJ_SOFTMAX_PRODUCT;
    float kx[CJ_MAX_D], kp[CJ_MAX_D], v[CJ_MAX_D], dkx[CJ_MAX_D], dkp[CJ_MAX_D], dv[CJ_MAX_D];
    for (int64_t d = 0; d < D; d++) {
        kx[d] = row ? p.kx[cj_row(p, bh, j) + d] : 0.0f;
        kp[d] = row ? p.kp[cj_row(p, bh, j) + d] : 0.0f;
        v[d] = row ? p.v[cj_row(p, bh, j) + d] : 0.0f;
        dkx[d] = dkp[d] = dv[d] = 0.0f;
    }
    /* every query sees keys j < P; past the prefix, queries from the tile holding row j0 */
    for (int64_t i0 = j0 < P ? 0 : j0 - j0 % CJ_BQ; i0 < p.T; i0 += CJ_BQ) {
        cj_load(qxs, p.qx, p, bh, i0, CJ_BQ);
        cj_load(qps, p.qp, p, bh, i0, CJ_BQ);
        cj_load(gs, p.dout, p, bh, i0, CJ_BQ);
        for (int64_t r = threadIdx.x; r < CJ_BQ; r += blockDim.x) {
            const bool in = i0 + r < p.T;
            l0s[r] = in ? p.lse_in[bh * p.T + i0 + r] : 0.0f;
            l1s[r] = in && two ? p.lse_in[BHT + bh * p.T + i0 + r] : 0.0f;
            dvs[r] = in ? delta[bh * p.T + i0 + r] : 0.0f;
        }
        __syncthreads();
        if (row) {
            for (int64_t ii = 0; ii < CJ_BQ; ii++) {
                const int64_t i = i0 + ii;
                if (i >= p.T || (i < j && j >= P)) continue;
                float sx = 0.0f, sp = 0.0f, da = 0.0f, a, dsx, dsp;
                for (int64_t d = 0; d < D; d++) {
                    sx += qxs[ii * D + d] * kx[d];
                    sp += qps[ii * D + d] * kp[d];
                    da += gs[ii * D + d] * v[d];
                }
                cj_pair(p, sx, sp, da, l0s[ii], l1s[ii], dvs[ii], &a, &dsx, &dsp);
                for (int64_t d = 0; d < D; d++) {
                    dv[d] += a * gs[ii * D + d];
                    dkx[d] += dsx * qxs[ii * D + d];
                    dkp[d] += dsp * qps[ii * D + d];
                }
            }
        }
        __syncthreads();
    }
    if (row)
        for (int64_t d = 0; d < D; d++) {
            p.dkx[cj_row(p, bh, j) + d] = dkx[d];
            p.dkp[cj_row(p, bh, j) + d] = dkp[d];
            p.dv[cj_row(p, bh, j) + d] = dv[d];
        }
}

static int conj_check(const MfConjAttentionParams *p) {
    const bool mode = p->mode == MF_CONJ_SCORE_PRODUCT || p->mode == MF_CONJ_SOFTMAX_PRODUCT
                      || p->mode == MF_CONJ_SUM;
    const bool mask = p->mask == MF_MASK_CAUSAL || p->mask == MF_MASK_NONE
                      || (p->mask == MF_MASK_PREFIX && p->prefix != NULL);
    return p->B < 1 || p->T < 1 || p->H < 1 || p->D < 16 || p->D > CJ_MAX_D || p->D % 2 != 0
                   || !isfinite(p->scale) || p->B * p->H > 65535 || !mode || !mask
                   || p->qx == NULL || p->kx == NULL || p->qp == NULL || p->kp == NULL
                   || p->v == NULL
               ? MF_EINVAL
               : MF_OK;
}

extern "C" int conj_attention_forward_cuda(const MfConjAttentionParams *p, cudaStream_t stream) {
    if (conj_check(p) != MF_OK || p->out == NULL || p->lse == NULL) return MF_EINVAL;
    const dim3 grid(mf_blocks(p->T, CJ_BR), (unsigned)(p->B * p->H));
    return MF_LAUNCH(conj_attention_forward_kernel, grid, dim3(CJ_BR),
                     3 * CJ_BC * p->D * sizeof(float), stream, *p);
}

/* Dv (B, H, T) */
extern "C" int64_t conj_attention_backward_cuda_scratch_floats(const MfConjAttentionParams *p) {
    return p->B * p->H * p->T;
}

extern "C" int conj_attention_backward_cuda(const MfConjAttentionParams *p,
                                            cudaStream_t stream) {
    if (conj_check(p) != MF_OK || p->dqx == NULL || p->dkx == NULL || p->dqp == NULL
        || p->dkp == NULL || p->dv == NULL || p->dout == NULL || p->o == NULL
        || p->lse_in == NULL || p->scratch == NULL
        || p->scratch_floats < conj_attention_backward_cuda_scratch_floats(p))
        return MF_EINVAL;
    float *delta = p->scratch;
    const unsigned rows = mf_blocks(p->B * p->H * p->T, 256);
    int status = MF_LAUNCH(conj_attention_delta_kernel,
                           dim3(rows < MF_MAX_GRID ? rows : MF_MAX_GRID), dim3(256), 0, stream,
                           *p, delta);
    if (status != MF_OK) return status;
    status = MF_LAUNCH(conj_attention_dq_kernel,
                       dim3(mf_blocks(p->T, CJ_BR), (unsigned)(p->B * p->H)), dim3(CJ_BR),
                       3 * CJ_BC * p->D * sizeof(float), stream, *p, delta);
    if (status != MF_OK) return status;
    return MF_LAUNCH(conj_attention_dkdv_kernel,
                     dim3(mf_blocks(p->T, CJ_BK), (unsigned)(p->B * p->H)), dim3(CJ_BK),
                     (3 * CJ_BQ * p->D + 3 * CJ_BQ) * sizeof(float), stream, *p, delta);
}
