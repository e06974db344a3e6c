/* Shared by all ops: status strings and the int64-checked sgemm wrapper. */
#include <limits.h>

#include "mapformer/blas.h"
#include "mapformer/mapformer.h"

const char *mf_status_string(int status) {
    switch (status) {
        case MF_OK: return "ok";
        case MF_EINVAL: return "a size or scalar argument is out of range";
        case MF_ENOMEM: return "out of memory for scratch buffers";
        case MF_EINDEX: return "an index is outside [0, V)";
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
