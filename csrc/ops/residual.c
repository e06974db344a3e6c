/* Residual connection: out = a + b.
 *
 * Forward saves nothing. Gradient rule: the residual stream is the one place where an
 * activation gradient is accumulated: residual_backward adds dout into an existing dx (+=),
 * because both the skip path and the branch send the same dout back.
 * Both loops are memory-bound; they vectorise at the baseline ISA and split into chunks over
 * OpenMP threads when n is large.
 */
#include "mapformer/mapformer.h"

/* elements per OpenMP work item; below two chunks the op runs on one thread */
#define MF_RESIDUAL_CHUNK 32768

static void add_kernel(float *restrict out, const float *restrict a, const float *restrict b,
                       int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* dx and dout must not overlap (restrict; the binding checks) */
static void accumulate_kernel(float *restrict dx, const float *restrict dout, int64_t n) {
    for (int64_t i = 0; i < n; i++) dx[i] += dout[i];
}

int residual_forward(const MfResidualParams *p) {
    const int64_t n = p->n;
    if (n < 1) return MF_EINVAL;
    const int64_t chunks = (n + MF_RESIDUAL_CHUNK - 1) / MF_RESIDUAL_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_RESIDUAL_CHUNK;
        int64_t len = n - i0 < MF_RESIDUAL_CHUNK ? n - i0 : MF_RESIDUAL_CHUNK;
        add_kernel(p->out + i0, p->a + i0, p->b + i0, len);
    }
    return MF_OK;
}

int residual_backward(const MfResidualParams *p) {
    const int64_t n = p->n;
    if (n < 1) return MF_EINVAL;
    const int64_t chunks = (n + MF_RESIDUAL_CHUNK - 1) / MF_RESIDUAL_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_RESIDUAL_CHUNK;
        int64_t len = n - i0 < MF_RESIDUAL_CHUNK ? n - i0 : MF_RESIDUAL_CHUNK;
        accumulate_kernel(p->dx + i0, p->dout + i0, len);
    }
    return MF_OK;
}
