/* A tiled single-precision matrix product for the kernels (linear, and the MLP to come):
 *   C (M, N) = op(A) (M, K) op(B) (K, N) [+ C when accumulate] [+ bias[j] on every row],
 * row-major, op(A)[i][k] = TA ? A[k lda + i] : A[i lda + k], the same for B.
 * A block of GEMM_TILE x 8 threads computes a GEMM_TILE x GEMM_TILE tile of C (each thread
 * GEMM_TILE / 8 rows of one column), stepping over K in GEMM_TILE-wide slices of op(A) and
 * op(B) staged in shared memory (one padding column against bank conflicts); sums in float in
 * k order (deterministic). Grid: (ceil(N / GEMM_TILE), ceil(M / GEMM_TILE)).
 * A first version, correct on every shape; cuBLAS (or register-blocked tiles) is the way to
 * speed (issue 15). */
#ifndef MAPFORMER_CUDA_GEMM_CUH
#define MAPFORMER_CUDA_GEMM_CUH

#include "common.cuh"

#define GEMM_TILE 32
#define GEMM_ROWS 8 /* blockDim.y */

template <bool TA, bool TB>
__global__ void gemm_kernel(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                            const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate,
                            const float *bias) {
    __shared__ float as[GEMM_TILE][GEMM_TILE + 1]; /* as[i][k] = op(A)[i0 + i][k0 + k] */
    __shared__ float bs[GEMM_TILE][GEMM_TILE + 1]; /* bs[k][j] = op(B)[k0 + k][j0 + j] */
    const int64_t i0 = (int64_t)blockIdx.y * GEMM_TILE, j0 = (int64_t)blockIdx.x * GEMM_TILE;
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    float acc[GEMM_TILE / GEMM_ROWS];
    for (int r = 0; r < GEMM_TILE / GEMM_ROWS; r++) acc[r] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += GEMM_TILE) {
        for (int r = ty; r < GEMM_TILE; r += GEMM_ROWS) {
            /* as[r][tx] = op(A)[i0 + r][k0 + tx], bs[r][tx] = op(B)[k0 + r][j0 + tx] */
            const int64_t ai = i0 + r, ak = k0 + tx, bk = k0 + r, bj = j0 + tx;
            as[r][tx] = ai < M && ak < K ? (TA ? A[ak * lda + ai] : A[ai * lda + ak]) : 0.0f;
            bs[r][tx] = bk < K && bj < N ? (TB ? B[bj * ldb + bk] : B[bk * ldb + bj]) : 0.0f;
        }
        __syncthreads();
        for (int r = 0; r < GEMM_TILE / GEMM_ROWS; r++) {
            const int i = ty + r * GEMM_ROWS;
            float s = acc[r];
            for (int k = 0; k < GEMM_TILE; k++) s += as[i][k] * bs[k][tx];
            acc[r] = s;
        }
        __syncthreads();
    }
    const int64_t j = j0 + tx;
    if (j >= N) return;
    for (int r = 0; r < GEMM_TILE / GEMM_ROWS; r++) {
        const int64_t i = i0 + ty + r * GEMM_ROWS;
        if (i >= M) continue;
        float v = acc[r];
        if (bias != NULL) v += bias[j];
        C[i * ldc + j] = accumulate ? C[i * ldc + j] + v : v;
    }
}

/* launch gemm_kernel<TA, TB>; MF_EINVAL when the grid would be too tall */
template <bool TA, bool TB>
static int mf_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc, int accumulate, const float *bias,
                   cudaStream_t stream) {
    const int64_t gy = (M + GEMM_TILE - 1) / GEMM_TILE, gx = (N + GEMM_TILE - 1) / GEMM_TILE;
    if (gy > 65535 || gx > 0x7fffffff) return MF_EINVAL;
    return MF_LAUNCH((gemm_kernel<TA, TB>), dim3((unsigned)gx, (unsigned)gy),
                     dim3(GEMM_TILE, GEMM_ROWS), 0, stream, M, N, K, A, lda, B, ldb, C, ldc,
                     accumulate, bias);
}

/* out (C,) += the column sums of a (N, C): one thread per column, rows in order (deterministic) */
static __global__ void mf_column_sums_kernel(float *out, const float *a, int64_t N, int64_t C) {
    for (int64_t c = MF_GRID_START; c < C; c += MF_GRID_STRIDE) {
        float s = 0.0f;
        for (int64_t n = 0; n < N; n++) s += a[n * C + c];
        out[c] += s;
    }
}

static inline int mf_add_column_sums(float *out, const float *a, int64_t N, int64_t C,
                              cudaStream_t stream) {
    const unsigned grid = mf_blocks(C, 256);
    return MF_LAUNCH(mf_column_sums_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(256), 0, stream, out, a, N, C);
}

#endif
