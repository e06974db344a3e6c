/* Token embedding lookup.
 * Forward saves nothing (backward needs only the tokens).
 * Gradient rule: dweight is a parameter gradient, accumulated (+=).
 * Ids are trusted here; the binding checks them against V before calling. */
#include <string.h>

#include "mapformer/mapformer.h"
#include "mapformer/threads.h"

/* N*C below this runs on one thread: forking a team costs more than copying a few KiB, and on
 * a shared 2-vCPU machine a tiny parallel region can wait a whole time slice for its sibling. */
#define EMB_MIN_PARALLEL 32768

int embedding_forward(float *out, const int32_t *tokens, const float *weight, int64_t N,
                      int64_t V, int64_t C) {
    if (N < 1 || V < 1 || C < 1) return MF_EINVAL;
#pragma omp parallel for schedule(static) if (N * C >= EMB_MIN_PARALLEL)
    for (int64_t n = 0; n < N; n++)
        memcpy(out + n * C, weight + (int64_t)tokens[n] * C, (size_t)C * sizeof(float));
    return MF_OK;
}

int embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int64_t N,
                       int64_t V, int64_t C) {
    if (N < 1 || V < 1 || C < 1) return MF_EINVAL;
    /* Parallel over columns: every thread walks all tokens but owns its slice of C, so no two
     * threads touch the same dweight entry. */
#pragma omp parallel if (N * C >= EMB_MIN_PARALLEL)
    {
        const int64_t nt = mf_num_threads(), id = mf_thread_id();
        int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
        for (int64_t n = 0; n < N; n++) {
            float *dst = dweight + (int64_t)tokens[n] * C;
            const float *src = dout + n * C;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
    return MF_OK;
}
