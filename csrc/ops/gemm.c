/* Row-block matrix products (mapformer/gemm.h): each function runs the kernel set it is
 * given. The tiled sets are one body, csrc/ops/kernels/gemm.h, compiled at three vector
 * widths (x86/gemm_avx512.c, x86/gemm_avx2.c, portable/gemm_vec.c); the OpenBLAS set is
 * portable/gemm_blas.c. A set this build lacks (the x86 ones off x86-64) falls to the
 * portable one: mf_set_kernels never makes such a set active. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/gemm_sets.h"
#include "mapformer/cpu.h"
#include "mapformer/gemm.h"

/* return the kernel set's `name` called with `args` */
#if MF_X86
#define MF_GEMM_X86_CASES(name, args)            \
    case MF_KERNELS_AVX512: return name##_avx512 args; \
    case MF_KERNELS_AVX2: return name##_avx2 args;
#else
#define MF_GEMM_X86_CASES(name, args)
#endif
#define MF_GEMM_DISPATCH(kernels, name, args)      \
    switch (kernels) {                             \
        MF_GEMM_X86_CASES(name, args)              \
        case MF_KERNELS_BLAS: return name##_blas args; \
        default: return name##_vec args;           \
    }

int64_t mf_gemm_b_floats(int kernels, int64_t k, int64_t n) {
    MF_GEMM_DISPATCH(kernels, mf_gemm_b_floats, (k, n))
}

int mf_gemm_prepare_b(int kernels, float *out, const float *w, int64_t k, int64_t n,
                      int transposed) {
    MF_GEMM_DISPATCH(kernels, mf_gemm_prepare_b, (out, w, k, n, transposed))
}

int mf_gemm_nn(int kernels, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, float *c, int64_t ldc, const MfGemmOptions *opt) {
    const MfGemmOptions none = {0};
    const MfGemmOptions *o = opt != NULL ? opt : &none;
    MF_GEMM_DISPATCH(kernels, mf_gemm_nn, (m, n, k, a, lda, b, c, ldc, o))
}

int mf_gemm_tn(int kernels, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
               float *pack) {
    MF_GEMM_DISPATCH(kernels, mf_gemm_tn, (m, n, k, a, lda, b, ldb, c, ldc, accumulate, pack))
}

int64_t mf_gemm_tn_pack_floats(int kernels, int64_t m, int64_t n) {
    MF_GEMM_DISPATCH(kernels, mf_gemm_tn_pack_floats, (m, n))
}
