/* Row-block matrix products of the sgemm-based ops (linear.c, mlp.c), in gemm.c.
 *
 * Each call is single-threaded: the ops split their rows into blocks over the OpenMP threads
 * and call these on one block. `fast` picks the path, and an op reads it once per call
 * (fast = mf_use_avx512(), mapformer/clones.h) and passes the same value to every call:
 * 1 is gemm.c's AVX-512 kernel, 0 OpenBLAS's sgemm. */
#ifndef MAPFORMER_GEMM_H
#define MAPFORMER_GEMM_H

#include <stdint.h>

/* Floats of a prepared b (k, n), the weight operand of mf_gemm_nn. */
int64_t mf_gemm_b_floats(int64_t k, int64_t n);

/* out = b (k, n), prepared for mf_gemm_nn on the `fast` path, from the weight w: b = w
 * (w is (k, n)) or, when transposed, b = w^T (w is (n, k)). The kernel's layout is column
 * panels of 32, each k x 32 contiguous (the last one zero-padded); OpenBLAS's, row-major. */
void mf_gemm_prepare_b(int fast, float *out, const float *w, int64_t k, int64_t n,
                       int transposed);

/* What mf_gemm_nn does besides the product; {0} is a plain c = a b. */
typedef struct {
    const float *bias;        /* c starts from this row (n,) on every row, not zero */
    int accumulate;           /* c starts from itself (c += a b) */
    float *gelu;              /* also gelu (c) here (m, n; row stride ldc), from registers */
    int stream;               /* c is not read again soon: non-temporal stores (aligned rows) */
    const float *prefetch;    /* the kernel also prefetches prefetch_floats floats here into */
    int64_t prefetch_floats;  /* L2, for the caller's next pass over them */
} MfGemmOptions;

/* c (m, n; row stride ldc) = init + a (m, k; lda) . b (k, n; prepared by mf_gemm_prepare_b),
 * with init and the extras as `opt` says (NULL: none). gelu is the same bits as
 * mf_gelu_kernel on c; stream and prefetch are hints that change no result.
 * Returns MF_OK, or MF_EINVAL when a size does not fit BLAS's int (OpenBLAS path). */
int mf_gemm_nn(int fast, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, float *c, int64_t ldc, const MfGemmOptions *opt);

/* c (m, n; ldc) += a^T . b, with a (k, m; lda) and b (k, n; ldb) read in place: a weight
 * gradient over a block of k rows. pack is scratch of mf_gemm_tn_pack_floats(m, n) floats. */
int mf_gemm_tn(int fast, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc, float *pack);
int64_t mf_gemm_tn_pack_floats(int64_t m, int64_t n);

#endif
