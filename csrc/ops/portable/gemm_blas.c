/* The row-block matrix products (mapformer/gemm.h) on OpenBLAS's sgemm: the kernel set
 * MF_KERNELS_BLAS, built on every platform. The prepared weight is b itself, row-major; the
 * extras of mf_gemm_nn are separate passes (a bias fill before the product, the GELU
 * kernel of kernels/gelu.h's mf_gelu_clones after it), and its stream and prefetch hints are
 * ignored. */
#include <stdint.h>
#include <string.h>

#include "../kernels/gelu.h"
#include "../kernels/gemm_sets.h"
#include "mapformer/blas.h"
#include "mapformer/mapformer.h"

int64_t mf_gemm_b_floats_blas(int64_t k, int64_t n) { return k * n; }

int mf_gemm_prepare_b_blas(float *out, const float *w, int64_t k, int64_t n, int transposed) {
    if (!transposed) {
        memcpy(out, w, (size_t)(k * n) * sizeof(float));
        return MF_OK;
    }
    for (int64_t kk = 0; kk < k; kk++) /* w (n, k) */
        for (int64_t c = 0; c < n; c++) out[kk * n + c] = w[c * k + kk];
    return MF_OK;
}

int mf_gemm_nn_blas(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, float *c, int64_t ldc, const MfGemmOptions *o) {
    if (!o->accumulate && o->bias != NULL)
        for (int64_t r = 0; r < m; r++) memcpy(c + r * ldc, o->bias, (size_t)n * sizeof(float));
    const float beta = o->accumulate || o->bias != NULL ? 1.0f : 0.0f;
    const int status = mf_sgemm(0, 0, m, n, k, 1.0f, a, lda, b, n, beta, c, ldc);
    if (status == MF_OK && o->gelu != NULL) {
        const MfGeluKernels *ks = mf_gelu_kernels(MF_KERNELS_BLAS);
        for (int64_t r = 0; r < m; r++)
            (o->gelu_exact ? ks->gelu_erf : ks->gelu)(o->gelu + r * ldc, c + r * ldc, n);
    }
    return status;
}

int mf_gemm_tn_blas(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                    float *pack) {
    (void)pack;
    return mf_sgemm(1, 0, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

int64_t mf_gemm_tn_pack_floats_blas(int64_t m, int64_t n) {
    (void)m;
    (void)n;
    return 0;
}
