/* Exponential moving average in place (TDB's teacher: its weights the EMA of the student's).
 *
 *   target = decay target + (1 - decay) source,   decay in [0, 1)
 *
 * Elementwise in float32, 1 - decay rounded to float32 once (in double); two products and a
 * sum, never contracted into an FMA (-ffp-contract=off), so every target clone and thread
 * count gives the same bits. Memory-bound; chunks over OpenMP threads when n is large.
 */
#include <math.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

/* elements per OpenMP work item; below two chunks the update runs on one thread */
#define MF_EMA_CHUNK 32768

MF_CLONES
static void ema_kernel(float *restrict t, const float *restrict s, int64_t n, float a,
                       float b) {
    for (int64_t i = 0; i < n; i++) t[i] = a * t[i] + b * s[i];
}

int ema_update(const MfEmaParams *p) {
    const int64_t n = p->n;
    const float a = p->decay;
    if (n < 1 || !(a >= 0.0f && a < 1.0f)) return MF_EINVAL;
    const float b = (float)(1.0 - (double)a);
    const int64_t chunks = (n + MF_EMA_CHUNK - 1) / MF_EMA_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t i0 = c * MF_EMA_CHUNK, len = n - i0 < MF_EMA_CHUNK ? n - i0 : MF_EMA_CHUNK;
        ema_kernel(p->target + i0, p->source + i0, len, a, b);
    }
    return MF_OK;
}
