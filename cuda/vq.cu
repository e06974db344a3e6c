/* Vector quantisation on the GPU (csrc/ops/vq.c's math; MfVqParams): M codebooks of K codes of
 * width D; row n's slice m is snapped to its nearest code.
 *
 *   forward, per codebook m:
 *     enorm (M, K)      = ||e_k||^2                    (one thread per code, double, rounded)
 *     s (N, K)          = z[:, m] codebook[m]^T         (gemm.cuh; the GEMM of the expansion
 *                                                      ||z||^2 - 2 z.e + ||e||^2, whose
 *                                                      ||z||^2 is the same for every k and, as
 *                                                      in the C op, left out of the argmin)
 *     indices[n, m]     = argmin_k enorm[k] - 2 s[n, k] (one block per row: a tree reduction
 *                                                      of (value, k) pairs, the lowest k on
 *                                                      ties, so the same code as a serial scan)
 *     codes[n, m]       = codebook[m, indices[n, m]]
 *     dist[n, m]        = ||z[n, m] - codes[n, m]||^2   (the exact residual of the chosen code,
 *                                                      in double: a fixed tree over D)
 *   *total              = sum of dist (one block, double, fixed tree).
 *   backward:
 *     dz[n, m]          = dcodes[n, m] + 2 commitment_weight (z[n, m] - codebook[m, idx])
 *                                                     (straight through + commitment)
 *     dcodebook[m, k]  += 2 codebook_weight sum_{n: idx[n, m] = k} (codebook[m, k] - z[n, m])
 *   The codebook gradient is a deterministic scatter without atomics: one block per code
 *   compacts, chunk by chunk of VQ_THREADS rows, the rows that chose it (a block prefix sum of
 *   the match flags keeps them in row order), and each thread sums its column over them in
 *   double in row order: the C op's order, hence its bits.
 * Ids are checked where they are read, but a kernel cannot return a status without
 * synchronising the stream: an id outside [0, K) adds no commitment term to dz and nothing to
 * the codebook gradient (the C op returns MF_EINDEX); callers check ids first.
 * Scratch (the caller's, device): forward enorm (M K) and the products (N K floats); the
 * backward needs none. */
#include "gemm.cuh"

#define VQ_THREADS 128

static int vq_valid(const MfVqParams *p) {
    return p->N >= 1 && p->M >= 1 && p->K >= 1 && p->D >= 1 && p->K <= INT32_MAX;
}

extern "C" int64_t vq_forward_cuda_scratch_floats(const MfVqParams *p) {
    return vq_valid(p) ? p->M * p->K + p->N * p->K : 0;
}

extern "C" int64_t vq_backward_cuda_scratch_floats(const MfVqParams *) { return 0; }

static unsigned capped(int64_t blocks) {
    return (unsigned)(blocks < MF_MAX_GRID ? blocks : MF_MAX_GRID);
}

/* enorm[mk] = ||codebook[mk]||^2, summed in double in j order */
__global__ void vq_enorm_kernel(float *enorm, const float *codebook, int64_t MK, int64_t D) {
    for (int64_t mk = MF_GRID_START; mk < MK; mk += MF_GRID_STRIDE) {
        const float *e = codebook + mk * D;
        double s = 0.0;
        for (int64_t j = 0; j < D; j++) s += (double)e[j] * e[j];
        enorm[mk] = (float)s;
    }
}

/* the smaller of two (value, index) candidates, the lower index on equal values; a NaN value
 * never wins */
__device__ static inline void vq_pick(float *v, int64_t *k, float v2, int64_t k2) {
    if (v2 < *v || (v2 == *v && k2 < *k)) {
        *v = v2;
        *k = k2;
    }
}

/* codebook m: block per row n (grid-stride over rows): the argmin over k of enorm - 2 s, the
 * code, its distance */
__global__ void vq_argmin_kernel(MfVqParams p, int64_t m, const float *enorm, const float *s) {
    __shared__ float bv[VQ_THREADS];
    __shared__ int64_t bk[VQ_THREADS];
    __shared__ double bd[VQ_THREADS];
    const int64_t K = p.K, D = p.D, MD = p.M * p.D;
    const unsigned t = threadIdx.x;
    for (int64_t n = blockIdx.x; n < p.N; n += gridDim.x) {
        float v = INFINITY;
        int64_t best = K; /* none yet: any real candidate has a lower index */
        for (int64_t k = t; k < K; k += VQ_THREADS)
            vq_pick(&v, &best, enorm[m * K + k] - 2.0f * s[n * K + k], k);
        bv[t] = v;
        bk[t] = best;
        __syncthreads();
        for (unsigned h = VQ_THREADS / 2; h > 0; h >>= 1) {
            if (t < h) {
                float a = bv[t];
                int64_t ka = bk[t];
                vq_pick(&a, &ka, bv[t + h], bk[t + h]);
                bv[t] = a;
                bk[t] = ka;
            }
            __syncthreads();
        }
        const int64_t k = bk[0] < K ? bk[0] : 0; /* every value NaN: the C op keeps k = 0 */
        const float *zr = p.z + n * MD + m * D, *e = p.codebook + (m * K + k) * D;
        float *code = p.codes + n * MD + m * D;
        double d = 0.0;
        for (int64_t j = t; j < D; j += VQ_THREADS) {
            const double diff = (double)zr[j] - (double)e[j];
            d += diff * diff;
            code[j] = e[j];
        }
        d = mf_block_reduce(d, bd, MfSum());
        if (t == 0) {
            p.indices[n * p.M + m] = (int32_t)k;
            p.dist[n * p.M + m] = (float)d;
        }
        __syncthreads(); /* bv, bk are read above before the next row overwrites them */
    }
}

/* *total = sum of dist (N M), one block, double */
__global__ void vq_total_kernel(double *total, const float *dist, int64_t n) {
    __shared__ double buf[VQ_THREADS];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += VQ_THREADS) s += dist[i];
    s = mf_block_reduce(s, buf, MfSum());
    if (threadIdx.x == 0) *total = s;
}

extern "C" int vq_forward_cuda(const MfVqParams *p, cudaStream_t stream) {
    if (!vq_valid(p) || p->codes == NULL || p->indices == NULL || p->dist == NULL
        || p->z == NULL || p->codebook == NULL || p->scratch == NULL
        || p->scratch_floats < vq_forward_cuda_scratch_floats(p))
        return MF_EINVAL;
    const int64_t N = p->N, M = p->M, K = p->K, D = p->D;
    float *enorm = p->scratch, *s = p->scratch + M * K;
    int status = MF_LAUNCH(vq_enorm_kernel, dim3(capped(mf_blocks(M * K, VQ_THREADS))),
                           dim3(VQ_THREADS), 0, stream, enorm, p->codebook, M * K, D);
    for (int64_t m = 0; m < M && status == MF_OK; m++) {
        /* s (N, K) = z[:, m] (row stride M D) codebook[m]^T */
        status = mf_gemm<false, true>(N, K, D, p->z + m * D, M * D, p->codebook + m * K * D, D,
                                      s, K, 0, NULL, stream);
        if (status == MF_OK)
            status = MF_LAUNCH(vq_argmin_kernel, dim3(capped(N)), dim3(VQ_THREADS), 0, stream,
                               *p, m, (const float *)enorm, (const float *)s);
    }
    if (status != MF_OK || p->total == NULL) return status;
    return MF_LAUNCH(vq_total_kernel, dim3(1), dim3(VQ_THREADS), 0, stream, p->total,
                     (const float *)p->dist, N * M);
}

/* dz = dcodes + 2 commitment_weight (z - codebook[idx]), one thread per element */
__global__ void vq_dz_kernel(MfVqParams p) {
    const int64_t D = p.D, total = p.N * p.M * D;
    const float c2 = 2.0f * p.commitment_weight;
    for (int64_t i = MF_GRID_START; i < total; i += MF_GRID_STRIDE) {
        const int64_t nm = i / D, j = i - nm * D, m = nm % p.M, k = p.indices_in[nm];
        p.dz[i] = k >= 0 && k < p.K ? p.dcodes[i] + c2 * (p.z[i] - p.codebook[(m * p.K + k) * D + j])
                                    : p.dcodes[i];
    }
}

/* block per code key = (m, k) (grid-stride): dcodebook[key] += 2 codebook_weight sum over the
 * rows that chose it, in row order, of (codebook[key] - z[n, m]); columns in tiles of
 * VQ_THREADS, thread t summing column j0 + t in double */
__global__ void vq_dcodebook_kernel(MfVqParams p) {
    __shared__ int scan[2][VQ_THREADS];
    __shared__ int64_t rows[VQ_THREADS];
    const int64_t N = p.N, M = p.M, K = p.K, D = p.D, MD = M * D;
    const double w2 = 2.0 * (double)p.codebook_weight;
    const int t = (int)threadIdx.x;
    for (int64_t key = blockIdx.x; key < M * K; key += gridDim.x) {
        const int64_t m = key / K, k = key - m * K;
        const float *e = p.codebook + key * D;
        for (int64_t j0 = 0; j0 < D; j0 += VQ_THREADS) {
            const int64_t j = j0 + t;
            double acc = 0.0;
            for (int64_t n0 = 0; n0 < N; n0 += VQ_THREADS) {
                /* inclusive prefix sum of the chunk's match flags (Hillis-Steele, two buffers) */
                const int64_t n = n0 + t;
                const int hit = n < N && p.indices_in[n * M + m] == k;
                int in = 0;
                scan[0][t] = hit;
                __syncthreads();
                for (int h = 1; h < VQ_THREADS; h <<= 1) {
                    scan[in ^ 1][t] = scan[in][t] + (t >= h ? scan[in][t - h] : 0);
                    in ^= 1;
                    __syncthreads();
                }
                if (hit) rows[scan[in][t] - 1] = n;
                const int count = scan[in][VQ_THREADS - 1];
                __syncthreads();
                if (j < D)
                    for (int r = 0; r < count; r++)
                        acc += (double)e[j] - (double)p.z[rows[r] * MD + m * D + j];
                __syncthreads(); /* rows and scan are rewritten by the next chunk */
            }
            if (j < D && acc != 0.0) p.dcodebook[key * D + j] += (float)(w2 * acc);
        }
    }
}

extern "C" int vq_backward_cuda(const MfVqParams *p, cudaStream_t stream) {
    if (!vq_valid(p) || p->dz == NULL || p->dcodebook == NULL || p->dcodes == NULL
        || p->indices_in == NULL || p->z == NULL || p->codebook == NULL)
        return MF_EINVAL;
    int status = MF_LAUNCH(vq_dz_kernel,
                           dim3(capped(mf_blocks(p->N * p->M * p->D, VQ_THREADS))),
                           dim3(VQ_THREADS), 0, stream, *p);
    if (status != MF_OK) return status;
    return MF_LAUNCH(vq_dcodebook_kernel, dim3(capped(p->M * p->K)), dim3(VQ_THREADS), 0, stream,
                     *p);
}
