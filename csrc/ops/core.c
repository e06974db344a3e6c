/* Shared by all ops: status strings, the int64-checked sgemm wrappers and the row-block
 * helpers of the sgemm-based ops.
 *
 * Threading: the C core uses one thread pool, OpenMP's. OpenBLAS is set to one thread when
 * the module loads (mf_blas_single_thread), and large products are split over OpenMP threads
 * by mf_sgemm_rows. Two pools on two cores spin against each other: measured, a 200K-float
 * norm took 14 ms right after a multithreaded OpenBLAS call instead of 0.1 ms. */
#include <limits.h>

#include "mapformer/blas.h"
#include "mapformer/clones.h"
#include "mapformer/cpu.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/threads.h"

const char *mf_status_string(int status) {
    switch (status) {
        case MF_OK: return "ok";
        case MF_EINVAL: return "a size or scalar argument is out of range";
        case MF_ENOMEM: return "out of memory for scratch buffers";
        case MF_EINDEX: return "an id is outside its range";
        default: return "unknown error";
    }
}

static int fits_int(int64_t x) { return x >= 0 && x <= INT_MAX; }

int mf_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
             int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
        !fits_int(ldc))
        return MF_EINVAL;
    if (m == 0 || n == 0) return MF_OK;
    MF_BLAS(cblas_sgemm)(MfRowMajor, ta ? MfTrans : MfNoTrans, tb ? MfTrans : MfNoTrans, (int)m,
                         (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
    return MF_OK;
}

void mf_blas_single_thread(void) { MF_BLAS(openblas_set_num_threads)(1); }

int mf_sgemm_rows(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    /* Rows of C in blocks of 16, split evenly over the threads; small products stay on the
     * calling thread. Row i of op(A) starts at a + i*lda (A) or a + i (A^T). */
    const int64_t blocks = (m + 15) / 16;
    if (blocks < 2 || m * n * k < ((int64_t)1 << 21))
        return mf_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    int status = MF_OK;
#pragma omp parallel
    {
        const int64_t nt = mf_num_threads(), id = mf_thread_id();
        const int64_t r0 = 16 * (blocks * id / nt), r1 = 16 * (blocks * (id + 1) / nt);
        const int64_t rows = (r1 < m ? r1 : m) - r0;
        if (rows > 0) {
            int st = mf_sgemm(ta, tb, rows, n, k, alpha, ta ? a + r0 : a + r0 * lda, lda, b, ldb,
                              beta, c + r0 * ldc, ldc);
            if (st != MF_OK) {
#pragma omp atomic write
                status = st;
            }
        }
    }
    return status;
}

/* AVX2 (and the portable set, on the same CPUs' caches): 128 rows, the MLP's g and dh 256 KB
 * each at F = 512, beside a 512 KB L2 (Zen 3): against 64 and 256 rows, alternating runs at
 * N = 4096 and 32768 rows on one thread, the MLP backward took 2-4% less time and the
 * linears' times were within the noise. AVX-512: 256 rows, as measured on the AVX-512
 * machines (1-2 MB of L2) this set was tuned on. OpenBLAS: 256 rows (fewer, larger calls). */
int64_t mf_row_block(int kernels) {
    switch (kernels) {
        case MF_KERNELS_AVX2:
        case MF_KERNELS_PORTABLE: return 128;
        default: return 256;
    }
}

MF_CLONES
void mf_column_sums(double *restrict sum, const float *restrict a, int64_t rows, int64_t n) {
    for (int64_t c = 0; c < n; c++) sum[c] = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < n; c++) sum[c] += (double)a[r * n + c];
}

int64_t mf_grad_chunks(int64_t blocks, int64_t weight_floats) {
    int64_t chunks = MF_GRAD_SCRATCH / (weight_floats > 0 ? weight_floats : 1);
    if (chunks > MF_GRAD_CHUNKS) chunks = MF_GRAD_CHUNKS;
    if (chunks > blocks) chunks = blocks;
    return chunks > 1 ? chunks : 1;
}

/* in pieces of MF_ADD_PIECE elements, each summed over the chunks in a double buffer: the
 * loops over elements vectorise (an element's sum still runs over the chunks in order) */
#define MF_ADD_PIECE 512

MF_CLONES
static void add_chunks_piece(float *restrict dst, const float *restrict parts, int64_t chunks,
                             int64_t stride, int64_t n) {
    double sum[MF_ADD_PIECE];
    for (int64_t i = 0; i < n; i++) sum[i] = 0.0;
    for (int64_t c = 0; c < chunks; c++)
        for (int64_t i = 0; i < n; i++) sum[i] += (double)parts[c * stride + i];
    for (int64_t i = 0; i < n; i++) dst[i] = (float)((double)dst[i] + sum[i]);
}

/* dst (n,) += the sum over b < blocks of sums[b * stride : ...], as add_chunks_piece */
MF_CLONES
static void add_sums_piece(float *restrict dst, const double *restrict sums, int64_t blocks,
                           int64_t stride, int64_t n) {
    double sum[MF_ADD_PIECE];
    for (int64_t i = 0; i < n; i++) sum[i] = 0.0;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t i = 0; i < n; i++) sum[i] += sums[b * stride + i];
    for (int64_t i = 0; i < n; i++) dst[i] = (float)((double)dst[i] + sum[i]);
}

void mf_add_block_sums(float *dst, const double *sums, int64_t blocks, int64_t stride,
                       int64_t n) {
    for (int64_t i0 = 0; i0 < n; i0 += MF_ADD_PIECE)
        add_sums_piece(dst + i0, sums + i0, blocks, stride,
                       n - i0 < MF_ADD_PIECE ? n - i0 : MF_ADD_PIECE);
}

void mf_add_chunks(float *dst, const float *parts, int64_t chunks, int64_t stride,
                   int64_t size) {
    const int64_t pieces = (size + MF_ADD_PIECE - 1) / MF_ADD_PIECE;
#pragma omp parallel for schedule(static) if (chunks * size >= ((int64_t)1 << 18))
    for (int64_t q = 0; q < pieces; q++) {
        const int64_t i0 = q * MF_ADD_PIECE;
        add_chunks_piece(dst + i0, parts + i0, chunks, stride,
                         size - i0 < MF_ADD_PIECE ? size - i0 : MF_ADD_PIECE);
    }
}
