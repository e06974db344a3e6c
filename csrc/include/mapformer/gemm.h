/* Row-block matrix products of linear.c and mlp.c (csrc/ops/gemm.c dispatches them).
 *
 * Each call is single-threaded: the ops split their rows into blocks over the OpenMP threads
 * and call these on one block. `kernels` is the kernel set (mapformer/cpu.h: MF_KERNELS_*):
 * an op reads mf_kernels() once per call and passes the same value to every call, including
 * the one that prepared the weight (the sets lay weights out differently). The AVX-512, AVX2
 * and portable sets run the same register-tiled kernel (csrc/ops/kernels/gemm.h) at their
 * vector width; MF_KERNELS_BLAS runs OpenBLAS's sgemm (csrc/ops/portable/gemm_blas.c). */
#ifndef MAPFORMER_GEMM_H
#define MAPFORMER_GEMM_H

#include <stdint.h>

/* Floats of a prepared b (k, n), the weight operand of mf_gemm_nn. */
int64_t mf_gemm_b_floats(int kernels, int64_t k, int64_t n);

/* out (mf_gemm_b_floats(kernels, k, n) floats, 64-byte aligned) = b (k, n), prepared for
 * mf_gemm_nn on that kernel set, from the weight w: b = w (w is (k, n)) or, when transposed,
 * b = w^T (w is (n, k)). The tiled kernels' layout is column panels as wide as their register
 * tile, each k x width contiguous (the last one zero-padded); OpenBLAS's, row-major.
 * Returns MF_OK. */
int mf_gemm_prepare_b(int kernels, float *out, const float *w, int64_t k, int64_t n,
                      int transposed);

/* What mf_gemm_nn does besides the product; {0} is a plain c = a b. */
typedef struct {
    const float *bias;        /* c starts from this row (n,) on every row, not zero */
    int accumulate;           /* c starts from itself (c += a b) */
    float *gelu;              /* also gelu (c) here (m, n; row stride ldc), from registers */
    int gelu_exact;           /* that gelu is the exact one (mf_gelu_erf_kernel's bits) */
    int stream;               /* c is not read again soon: non-temporal stores (aligned rows) */
    const float *prefetch;    /* the kernel also prefetches prefetch_floats floats here into */
    int64_t prefetch_floats;  /* L2, for the caller's next pass over them */
} MfGemmOptions;

/* c (m, n; row stride ldc) = init + a (m, k; lda) . b (k, n; prepared by mf_gemm_prepare_b),
 * with init and the extras as `opt` says (NULL: none). Each c element is its init plus the
 * sum of the products (over k in order, one rounding per fused multiply-add, on the tiled
 * sets), so the result depends on the sizes only, and a row's values not on m. OpenBLAS (the
 * blas set) promises neither: a row in the ragged tail of its M tiles may take another
 * kernel (its Haswell kernels give other last bits to the last rows of a 1,000-row call than
 * to the same rows of an 8,197-row one), so there a row's bits may depend on m. gelu has the bits of mf_gelu_kernel on c
 * (simd.h's vgelu), or with gelu_exact those of mf_gelu_erf_kernel (vgelu_erf);
 * stream and prefetch are hints that change no result.
 * Returns MF_OK, or MF_EINVAL when a size does not fit BLAS's int (OpenBLAS path). */
int mf_gemm_nn(int kernels, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, float *c, int64_t ldc, const MfGemmOptions *opt);

/* c (m, n; ldc) = [c +] a^T . b (c's old value added when `accumulate`), with a (k, m; lda)
 * and b (k, n; ldb) read in place: a weight gradient over a block of k rows, its sums as
 * mf_gemm_nn's. pack is scratch of mf_gemm_tn_pack_floats(kernels, m, n) floats, 64-byte
 * aligned. */
int mf_gemm_tn(int kernels, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
               float *pack);
int64_t mf_gemm_tn_pack_floats(int kernels, int64_t m, int64_t n);

#endif
