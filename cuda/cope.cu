/* CoPE attention (csrc/ops/cope.c's math) on the GPU, causal. Per (b, h), query i, keys j <= i:
 *   s_ij = scale q_i . k_j, g_ij = sigmoid(s_ij), p_ij = min(sum_{t=j..i} g_it, n_pos - 1),
 *   z_i[n] = q_i . e[h, n], f = floor p, c = ceil p, w = p - f,
 *   a_ij = s_ij + (1 - w) z_i[f] + w z_i[c], out_i = sum_j softmax_j(a_ij) v_j, lse_i.
 * Backward (P = softmax(a), Dv_i = dout_i . out_i): dA = P (dout_i . v_j - Dv_i),
 *   dz_i[f] += (1 - w) dA, dz_i[c] += w dA, dp = dA (z_i[c] - z_i[f]),
 *   dg_ij = sum_{j' <= j} dp_ij', ds = dA + dg g (1 - g),
 *   dq_i = scale sum_j ds k_j + sum_n dz_i[n] e[h, n] (=), dk_j = scale sum_i ds q_i (=),
 *   dv_j = sum_i P dout_i (=), de[h, n] += sum_{b, i} dz_i[n] q_i.
 * Positions need nz = min(n_pos, T + 1) logits per row (a position never exceeds T).
 *
 * Forward: Z = Q E^T (B, H, T, nz) into the caller's scratch by one kernel (a thread per
 * logit), then a block per (tile of COPE_BR query rows, b h), a thread per query row, key and
 * value tiles of COPE_BC rows in shared memory visited from the row's own tile DOWN to the
 * first, so that each row's position is its running reverse sum of gates (in double); online
 * softmax as cuda/attention.cu.
 * Backward, deterministic (no atomics): Z and Dv; a query-row kernel that walks the keys twice
 * in the same reverse order (pass 1: G_i = sum_j dp_ij and dz_i, the row's own dz in scratch;
 * pass 2: dg_ij = G_i - sum_{j' > j} dp_ij' in double, ds, dq) and writes P and ds of each
 * (i, j <= i) to scratch; a key-row kernel for dk, dv from them; a kernel per (h, n, d) for de.
 * FIRST VERSION, NOT FLASH-LIKE IN THE BACKWARD: the backward's scratch holds two T x T planes
 * per (b, h) (P and ds: cope_backward_cuda_scratch_floats), because a key's gradient needs the
 * gate sums and dp sums over every key between it and the query, which a key-row kernel
 * cannot form from per-row statistics alone; a scan over key blocks would remove them. The
 * forward: 0.6 TFLOP/s on an H100 (README, "On a GPU"). */
#include "common.cuh"

#define COPE_MAX_D 128
#define COPE_BR 64 /* query rows per block: its threads */
#define COPE_BC 32 /* key rows per shared tile */
#define COPE_BK 64 /* key rows per dk/dv block: its threads */
#define COPE_BQ 32 /* query rows per shared tile in the dk/dv kernel */
#define COPE_THREADS 256

static int64_t cope_nz(const MfCopeParams *p) { return p->n_pos < p->T + 1 ? p->n_pos : p->T + 1; }

__device__ __forceinline__ int64_t cope_row(const MfCopeParams &p, int64_t bh, int64_t t) {
    const int64_t b = bh / p.H, h = bh - b * p.H;
    return ((b * p.T + t) * p.H + h) * p.D;
}

__device__ __forceinline__ void cope_load(float *s, const float *x, const MfCopeParams &p,
                                          int64_t bh, int64_t t0, int64_t rows) {
    for (int64_t e = threadIdx.x; e < rows * p.D; e += blockDim.x) {
        const int64_t r = e / p.D, d = e - r * p.D, t = t0 + r;
        s[e] = t < p.T ? x[cope_row(p, bh, t) + d] : 0.0f;
    }
}

/* z[(bh T + i) nz + n] = q_i . e[h, n] */
__global__ void cope_z_kernel(MfCopeParams p, float *z, int64_t nz) {
    for (int64_t r = MF_GRID_START; r < p.B * p.H * p.T * nz; r += MF_GRID_STRIDE) {
        const int64_t n = r % nz, bhi = r / nz, i = bhi % p.T, bh = bhi / p.T;
        const float *q = p.q + cope_row(p, bh, i), *e = p.e + ((bh % p.H) * p.n_pos + n) * p.D;
        float s = 0.0f;
        for (int64_t d = 0; d < p.D; d++) s += q[d] * e[d];
        z[r] = s;
    }
}

/* one key of a row: its gate g from the scaled score s, the reverse gate sum *pos advanced,
 * the logit a and the positions' floor f, ceil c and weight w */
struct CopeKey {
    float g, a, w;
    int64_t f, c;
};

__device__ __forceinline__ CopeKey cope_key(float s, double *pos, const float *zrow,
                                            int64_t n_pos) {
    CopeKey r;
    r.g = 1.0f / (1.0f + expf(-s));
    *pos += (double)r.g;
    const double pp = *pos < (double)(n_pos - 1) ? *pos : (double)(n_pos - 1), fl = floor(pp);
    r.f = (int64_t)fl;
    r.w = (float)(pp - fl);
    r.c = r.w > 0.0f ? r.f + 1 : r.f;
    r.a = s + (1.0f - r.w) * zrow[r.f] + r.w * zrow[r.c];
    return r;
}

__global__ void cope_forward_kernel(MfCopeParams p, const float *z, int64_t nz) {
    MF_DYNAMIC_SHARED(float, smem); /* K tile, V tile: COPE_BC x D each */
    const int64_t D = p.D;
    float *ks = smem, *vs = smem + COPE_BC * D;
    const int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * COPE_BR, i = i0 + threadIdx.x;
    const int64_t last = (i0 + COPE_BR < p.T ? i0 + COPE_BR : p.T) - 1;
    const bool row = i < p.T;
    const float *zrow = z + (bh * p.T + (row ? i : 0)) * nz;
    float q[COPE_MAX_D], acc[COPE_MAX_D], a[COPE_BC];
    for (int64_t d = 0; d < D; d++) {
        q[d] = row ? p.q[cope_row(p, bh, i) + d] * p.scale : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    double pos = 0.0;
    for (int64_t j0 = last - last % COPE_BC; j0 >= 0; j0 -= COPE_BC) {
        cope_load(ks, p.k, p, bh, j0, COPE_BC);
        cope_load(vs, p.v, p, bh, j0, COPE_BC);
        __syncthreads();
        if (row && j0 <= i) {
            const int64_t n = i - j0 + 1 < COPE_BC ? i - j0 + 1 : COPE_BC;
            float mt = m;
            for (int64_t jj = n - 1; jj >= 0; jj--) {
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += q[d] * ks[jj * D + d];
                a[jj] = cope_key(s, &pos, zrow, p.n_pos).a;
                mt = fmaxf(mt, a[jj]);
            }
            mf_softmax_tile(m, l, acc, mt, a, vs, n, D, true);
        }
        __syncthreads();
    }
    if (row) {
        const float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++) p.out[cope_row(p, bh, i) + d] = acc[d] * inv;
        p.lse[bh * p.T + i] = m + logf(l);
    }
}

/* Dv[bh, i] = dout_i . o_i */
__global__ void cope_delta_kernel(MfCopeParams p, float *delta) {
    for (int64_t r = MF_GRID_START; r < p.B * p.H * p.T; r += MF_GRID_STRIDE) {
        const int64_t bh = r / p.T, i = r - bh * p.T, base = cope_row(p, bh, i);
        float s = 0.0f;
        for (int64_t d = 0; d < p.D; d++) s += p.dout[base + d] * p.o[base + d];
        delta[r] = s;
    }
}

/* the scratch of the backward, in order: z, dz (B H T nz each), Dv (B H T), P, ds (B H T T) */
struct CopeBack {
    float *z, *dz, *delta, *pm, *dsm;
    int64_t nz;
};

__global__ void cope_dq_kernel(MfCopeParams p, CopeBack s) {
    MF_DYNAMIC_SHARED(float, smem); /* K tile, V tile: COPE_BC x D each */
    const int64_t D = p.D, nz = s.nz;
    float *ks = smem, *vs = smem + COPE_BC * D;
    const int64_t bh = blockIdx.y, i0 = (int64_t)blockIdx.x * COPE_BR, i = i0 + threadIdx.x;
    const int64_t last = (i0 + COPE_BR < p.T ? i0 + COPE_BR : p.T) - 1;
    const bool row = i < p.T;
    const int64_t ri = bh * p.T + (row ? i : 0);
    const float *zrow = s.z + ri * nz;
    float *dzrow = s.dz + ri * nz, *prow = s.pm + ri * p.T, *dsrow = s.dsm + ri * p.T;
    float q[COPE_MAX_D], g[COPE_MAX_D], dq[COPE_MAX_D];
    for (int64_t d = 0; d < D; d++) {
        q[d] = row ? p.q[cope_row(p, bh, i) + d] * p.scale : 0.0f;
        g[d] = row ? p.dout[cope_row(p, bh, i) + d] : 0.0f;
        dq[d] = 0.0f;
    }
    if (row)
        for (int64_t n = 0; n < nz; n++) dzrow[n] = 0.0f;
    const float lse = row ? p.lse_in[ri] : 0.0f, dv = row ? s.delta[ri] : 0.0f;
    double total = 0.0, rest = 0.0; /* G_i; sum of dp over the keys after j */
    for (int pass = 0; pass < 2; pass++) {
        double pos = 0.0;
        for (int64_t j0 = last - last % COPE_BC; j0 >= 0; j0 -= COPE_BC) {
            cope_load(ks, p.k, p, bh, j0, COPE_BC);
            cope_load(vs, p.v, p, bh, j0, COPE_BC);
            __syncthreads();
            if (row && j0 <= i) {
                const int64_t n = i - j0 + 1 < COPE_BC ? i - j0 + 1 : COPE_BC;
                for (int64_t jj = n - 1; jj >= 0; jj--) {
                    float sc = 0.0f, dp = 0.0f;
                    for (int64_t d = 0; d < D; d++) {
                        sc += q[d] * ks[jj * D + d];
                        dp += g[d] * vs[jj * D + d];
                    }
                    const CopeKey key = cope_key(sc, &pos, zrow, p.n_pos);
                    const float pij = expf(key.a - lse), da = pij * (dp - dv);
                    const float dpos = da * (zrow[key.c] - zrow[key.f]);
                    if (pass == 0) {
                        total += (double)dpos;
                        dzrow[key.f] += (1.0f - key.w) * da;
                        dzrow[key.c] += key.w * da;
                        continue;
                    }
                    const float dg = (float)(total - rest);
                    rest += (double)dpos;
                    const float ds = da + dg * (key.g * (1.0f - key.g));
                    prow[j0 + jj] = pij;
                    dsrow[j0 + jj] = ds;
                    for (int64_t d = 0; d < D; d++) dq[d] += ds * ks[jj * D + d];
                }
            }
            __syncthreads();
        }
    }
    if (row) {
        const float *e = p.e + (bh % p.H) * p.n_pos * D;
        for (int64_t d = 0; d < D; d++) {
            float t = 0.0f;
            for (int64_t n = 0; n < nz; n++) t += dzrow[n] * e[n * D + d];
            p.dq[cope_row(p, bh, i) + d] = p.scale * dq[d] + t;
        }
    }
}

__global__ void cope_dkdv_kernel(MfCopeParams p, CopeBack s) {
    MF_DYNAMIC_SHARED(float, smem); /* Q tile, dout tile: COPE_BQ x D each */
    const int64_t D = p.D;
    float *qs = smem, *gs = smem + COPE_BQ * D;
    const int64_t bh = blockIdx.y, j0 = (int64_t)blockIdx.x * COPE_BK, j = j0 + threadIdx.x;
    const bool row = j < p.T;
    float dk[COPE_MAX_D], dv[COPE_MAX_D];
    for (int64_t d = 0; d < D; d++) dk[d] = dv[d] = 0.0f;
    for (int64_t i0 = j0 - j0 % COPE_BQ; i0 < p.T; i0 += COPE_BQ) {
        cope_load(qs, p.q, p, bh, i0, COPE_BQ);
        cope_load(gs, p.dout, p, bh, i0, COPE_BQ);
        __syncthreads();
        if (row) {
            for (int64_t ii = 0; ii < COPE_BQ; ii++) {
                const int64_t i = i0 + ii;
                if (i < j || i >= p.T) continue;
                const float pij = s.pm[(bh * p.T + i) * p.T + j];
                const float ds = s.dsm[(bh * p.T + i) * p.T + j];
                for (int64_t d = 0; d < D; d++) {
                    dv[d] += pij * gs[ii * D + d];
                    dk[d] += ds * qs[ii * D + d];
                }
            }
        }
        __syncthreads();
    }
    if (row)
        for (int64_t d = 0; d < D; d++) {
            p.dk[cope_row(p, bh, j) + d] = p.scale * dk[d];
            p.dv[cope_row(p, bh, j) + d] = dv[d];
        }
}

/* de[h, n, d] += sum_{b, i} dz[b, h, i, n] q[b, i, h, d], one thread per entry, n < nz */
__global__ void cope_de_kernel(MfCopeParams p, CopeBack s) {
    for (int64_t r = MF_GRID_START; r < p.H * s.nz * p.D; r += MF_GRID_STRIDE) {
        const int64_t d = r % p.D, n = (r / p.D) % s.nz, h = r / (p.D * s.nz);
        float t = 0.0f;
        for (int64_t b = 0; b < p.B; b++)
            for (int64_t i = 0; i < p.T; i++)
                t += s.dz[((b * p.H + h) * p.T + i) * s.nz + n]
                     * p.q[cope_row(p, b * p.H + h, i) + d];
        p.de[(h * p.n_pos + n) * p.D + d] += t;
    }
}

static int cope_bad(const MfCopeParams *p) {
    return p->B < 1 || p->T < 1 || p->H < 1 || p->D < 1 || p->D > COPE_MAX_D || p->n_pos < 1
           || !isfinite(p->scale) || p->B * p->H > 65535 || p->q == NULL || p->k == NULL
           || p->v == NULL || p->e == NULL || p->scratch == NULL;
}

static unsigned cope_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, COPE_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

/* Z (B, H, T, nz) */
extern "C" int64_t cope_forward_cuda_scratch_floats(const MfCopeParams *p) {
    return p->B * p->H * p->T * cope_nz(p);
}

/* Z, dZ (B, H, T, nz), Dv (B, H, T), P and ds (B, H, T, T) */
extern "C" int64_t cope_backward_cuda_scratch_floats(const MfCopeParams *p) {
    return p->B * p->H * p->T * (2 * cope_nz(p) + 1 + 2 * p->T);
}

extern "C" int cope_forward_cuda(const MfCopeParams *p, cudaStream_t stream) {
    if (cope_bad(p) || p->out == NULL || p->lse == NULL
        || p->scratch_floats < cope_forward_cuda_scratch_floats(p))
        return MF_EINVAL;
    const int64_t nz = cope_nz(p);
    int status = MF_LAUNCH(cope_z_kernel, dim3(cope_grid(p->B * p->H * p->T * nz)),
                           dim3(COPE_THREADS), 0, stream, *p, p->scratch, nz);
    if (status != MF_OK) return status;
    return MF_LAUNCH(cope_forward_kernel, dim3(mf_blocks(p->T, COPE_BR), (unsigned)(p->B * p->H)),
                     dim3(COPE_BR), 2 * COPE_BC * p->D * sizeof(float), stream, *p, p->scratch,
                     nz);
}

extern "C" int cope_backward_cuda(const MfCopeParams *p, cudaStream_t stream) {
    if (cope_bad(p) || p->dq == NULL || p->dk == NULL || p->dv == NULL || p->de == NULL
        || p->dout == NULL || p->o == NULL || p->lse_in == NULL
        || p->scratch_floats < cope_backward_cuda_scratch_floats(p))
        return MF_EINVAL;
    const int64_t BHT = p->B * p->H * p->T, nz = cope_nz(p);
    CopeBack s;
    s.nz = nz;
    s.z = p->scratch;
    s.dz = s.z + BHT * nz;
    s.delta = s.dz + BHT * nz;
    s.pm = s.delta + BHT;
    s.dsm = s.pm + BHT * p->T;
    int status = MF_LAUNCH(cope_z_kernel, dim3(cope_grid(BHT * nz)), dim3(COPE_THREADS), 0,
                           stream, *p, s.z, nz);
    if (status != MF_OK) return status;
    status = MF_LAUNCH(cope_delta_kernel, dim3(cope_grid(BHT)), dim3(COPE_THREADS), 0, stream,
                       *p, s.delta);
    if (status != MF_OK) return status;
    status = MF_LAUNCH(cope_dq_kernel, dim3(mf_blocks(p->T, COPE_BR), (unsigned)(p->B * p->H)),
                       dim3(COPE_BR), 2 * COPE_BC * p->D * sizeof(float), stream, *p, s);
    if (status != MF_OK) return status;
    status = MF_LAUNCH(cope_dkdv_kernel, dim3(mf_blocks(p->T, COPE_BK), (unsigned)(p->B * p->H)),
                       dim3(COPE_BK), 2 * COPE_BQ * p->D * sizeof(float), stream, *p, s);
    if (status != MF_OK) return status;
    return MF_LAUNCH(cope_de_kernel, dim3(cope_grid(p->H * nz * p->D)), dim3(COPE_THREADS), 0,
                     stream, *p, s);
}
