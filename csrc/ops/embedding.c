/* Token embedding lookup.
 * Forward saves nothing (backward needs only the tokens).
 * Gradient rule: dweight is a parameter gradient, accumulated (+=).
 * Ids are checked where they are read: each is loaded once (a volatile read, so the compiler
 * cannot load it again for the indexing) and used only if it is in [0, V). A bad id gives
 * MF_EINDEX: the forward leaves that row of out unwritten, the backward skips that row of dout
 * (what was added for the good ids stays). The binding checks the ids before the call too, for
 * its message; this check is what keeps a kernel that races a writer of tokens in bounds. */
#include <string.h>

#include "mapformer/mapformer.h"
#include "mapformer/threads.h"

/* N*C below this runs on one thread: forking a team costs more than copying a few KiB, and on
 * a shared 2-vCPU machine a tiny parallel region can wait a whole time slice for its sibling. */
#define EMB_MIN_PARALLEL 32768

/* tokens[n], read once */
static inline int64_t token_at(const int32_t *tokens, int64_t n) {
    return ((const volatile int32_t *)tokens)[n];
}

int embedding_forward(const MfEmbeddingParams *p) {
    const int64_t N = p->N, V = p->V, C = p->C;
    if (N < 1 || V < 1 || C < 1) return MF_EINVAL;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (N * C >= EMB_MIN_PARALLEL)
    for (int64_t n = 0; n < N; n++) {
        const int64_t id = token_at(p->tokens, n);
        if (id < 0 || id >= V) {
            bad = 1;
            continue;
        }
        memcpy(p->out + n * C, p->weight + id * C, (size_t)C * sizeof(float));
    }
    return bad ? MF_EINDEX : MF_OK;
}

int embedding_backward(const MfEmbeddingParams *p) {
    const int64_t N = p->N, V = p->V, C = p->C;
    if (N < 1 || V < 1 || C < 1) return MF_EINVAL;
    int bad = 0;
    /* Parallel over columns: every thread walks all tokens but owns its slice of C, so no two
     * threads touch the same dweight entry. */
#pragma omp parallel reduction(| : bad) if (N * C >= EMB_MIN_PARALLEL)
    {
        const int64_t nt = mf_num_threads(), id = mf_thread_id();
        int64_t c0 = C * id / nt, c1 = C * (id + 1) / nt;
        for (int64_t n = 0; n < N; n++) {
            const int64_t t = token_at(p->tokens, n);
            if (t < 0 || t >= V) {
                bad = 1;
                continue;
            }
            float *dst = p->dweight + t * C;
            const float *src = p->dout + n * C;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
    return bad ? MF_EINDEX : MF_OK;
}
