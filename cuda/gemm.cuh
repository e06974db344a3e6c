/* The kernels' single-precision matrix product (linear, mlp, vq, lstm):
 *   C (M, N) = op(A) (M, K) op(B) (K, N) [+ C when accumulate] [+ bias[j] on every row],
 * row-major, op(A)[i][k] = TA ? A[k lda + i] : A[i lda + k], the same for B.
 * mf_gemm runs it on cuBLAS when cuda/blas.cu has loaded it (on a GPU, by default; the bias
 * then added by a second kernel), else on the tiles below: a block of GEMM_TILE x 8 threads
 * computes a GEMM_TILE x GEMM_TILE tile of C (each thread GEMM_TILE / 8 rows of one column),
 * stepping over K in GEMM_TILE-wide slices of op(A) and op(B) staged in shared memory (one
 * padding column against bank conflicts); sums in float in k order (deterministic). Grid:
 * (ceil(N / GEMM_TILE), ceil(M / GEMM_TILE)). The tiles are what the CPU emulation runs, and
 * MAPFORMER_CUDA_GEMM=tiled selects them on a GPU. */
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

/* cuda/blas.cu: which path the products take (MF_BLAS_TILED or MF_BLAS_CUBLAS; loads cuBLAS
 * on the first call), and C = op(A) op(B) [+ C] on cuBLAS: MF_OK, MF_ECUDA, or MF_BLAS_NONE
 * when cuBLAS is not loaded or the sizes do not suit it (a zero size, one past INT_MAX) */
#define MF_BLAS_NONE (-1)
#define MF_BLAS_TILED 0
#define MF_BLAS_CUBLAS 1
extern "C" int mf_blas_library(void);
extern "C" int mf_blas_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                             int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc,
                             int accumulate, cudaStream_t stream);

/* C[i][j] += bias[j] for the M rows of C (ldc apart) */
static __global__ void mf_add_bias_kernel(float *C, const float *bias, int64_t M, int64_t N,
                                          int64_t ldc) {
    for (int64_t e = MF_GRID_START; e < M * N; e += MF_GRID_STRIDE)
        C[e / N * ldc + e % N] += bias[e % N];
}

/* C = op(A) op(B) [+ C] [+ bias] on cuBLAS when loaded, else on gemm_kernel<TA, TB>'s tiles;
 * MF_EINVAL when the tiles' grid would be too tall */
template <bool TA, bool TB>
static int mf_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                   int64_t ldb, float *C, int64_t ldc, int accumulate, const float *bias,
                   cudaStream_t stream) {
    const int blas = mf_blas_sgemm(TA, TB, M, N, K, A, lda, B, ldb, C, ldc, accumulate, stream);
    if (blas != MF_BLAS_NONE) {
        if (blas != MF_OK || bias == NULL) return blas;
        const unsigned grid = mf_blocks(M * N, 256);
        return MF_LAUNCH(mf_add_bias_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                         dim3(256), 0, stream, C, bias, M, N, ldc);
    }
    const int64_t gy = (M + GEMM_TILE - 1) / GEMM_TILE, gx = (N + GEMM_TILE - 1) / GEMM_TILE;
    if (gy > 65535 || gx > 0x7fffffff) return MF_EINVAL;
    return MF_LAUNCH((gemm_kernel<TA, TB>), dim3((unsigned)gx, (unsigned)gy),
                     dim3(GEMM_TILE, GEMM_ROWS), 0, stream, M, N, K, A, lda, B, ldb, C, ldc,
                     accumulate, bias);
}

/* out (C,) += the column sums of a (N, C) (mf_column_sums2: double sums, deterministic) */
static MF_COLUMN_KERNEL void mf_column_sums_kernel(float *out, const float *a, int64_t N, int64_t C) {
    mf_column_sums2(
        N, C, [&](int64_t n, int64_t c, double &s, double &) { s += (double)a[n * C + c]; },
        [&](int64_t c, double s, double) { out[c] = (float)((double)out[c] + s); });
}

static inline int mf_add_column_sums(float *out, const float *a, int64_t N, int64_t C,
                                     cudaStream_t stream) {
    return MF_LAUNCH(mf_column_sums_kernel, mf_column_grid(C), mf_column_block(), 0, stream,
                     out, a, N, C);
}

#endif
