/* The matrix-product functions of each kernel set, which csrc/ops/gemm.c dispatches to (the
 * arguments and results of mapformer/gemm.h's functions of the same name, less `kernels`):
 *   _avx512  csrc/ops/x86/gemm_avx512.c     csrc/ops/kernels/gemm.h at 16 floats (x86-64 only)
 *   _avx2    csrc/ops/x86/gemm_avx2.c       csrc/ops/kernels/gemm.h at 8 floats (x86-64 only)
 *   _vec     csrc/ops/portable/gemm_vec.c   csrc/ops/kernels/gemm.h at 4 floats
 *   _blas    csrc/ops/portable/gemm_blas.c  OpenBLAS's sgemm */
#ifndef MAPFORMER_GEMM_SETS_H
#define MAPFORMER_GEMM_SETS_H

#include <stdint.h>

#include "mapformer/gemm.h"

#define MF_GEMM_DECLARE(sfx)                                                                  \
    int64_t mf_gemm_b_floats_##sfx(int64_t k, int64_t n);                                     \
    int mf_gemm_prepare_b_##sfx(float *out, const float *w, int64_t k, int64_t n,             \
                                int transposed);                                              \
    int mf_gemm_nn_##sfx(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,        \
                         const float *b, float *c, int64_t ldc, const MfGemmOptions *o);      \
    int mf_gemm_tn_##sfx(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,        \
                         const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,  \
                         float *pack);                                                        \
    int64_t mf_gemm_tn_pack_floats_##sfx(int64_t m, int64_t n);

MF_GEMM_DECLARE(avx512)
MF_GEMM_DECLARE(avx2)
MF_GEMM_DECLARE(vec)
MF_GEMM_DECLARE(blas)

#endif
