/* Vector quantisation with M parallel codebooks (TDB's bottleneck; MfVqParams, params.h).
 *
 * Forward saves nothing beyond its outputs: backward needs z, the codebook and the indices.
 * Gradient rule: dcodebook is a parameter gradient, accumulated (+=); dz an activation
 * gradient, written (=).
 *
 *   forward, per codebook m and block of VQ_ROWS rows (one OpenMP task each):
 *     s (rows, K)      = z[rows, m] codebook[m]^T           (OpenBLAS sgemm, one thread)
 *     indices[n, m]    = argmin_k ||e_k||^2 - 2 s[n, k]      (first k on ties; ||z||^2 is the
 *                                                           same for every k and left out)
 *     codes[n, m]      = codebook[m, indices[n, m]]
 *     dist[n, m]       = ||z[n, m] - codes[n, m]||^2        (recomputed in double)
 *   then *total        = sum of dist in double, in order.
 *   backward:
 *     dz[n, m]         = dcodes[n, m] + 2 commitment_weight (z[n, m] - codebook[m, idx])
 *     dcodebook[m, k] += 2 codebook_weight sum_{n: idx[n, m] = k} (codebook[m, k] - z[n, m])
 *   The codebook gradient is a deterministic scatter: a counting sort (serial, N M ints) lists
 *   each code's rows in row order, then the codes are summed in parallel, each by one thread
 *   in double over its rows in order: the same bits for any thread count.
 *
 * Each product's block is fixed by the sizes, and each block runs on one thread with OpenBLAS
 * single-threaded, so the indices are the same for any thread count.
 * Ids read in the backward are loaded once each (volatile) and checked where they are used.
 *
 * Scratch, each part 64-byte aligned:
 *   forward:  ||e||^2 (M K floats); per thread, a block of products (VQ_ROWS K floats)
 *   backward: the sort's offsets (M K + 1 int64), keys and rows (N M int64 each); per thread,
 *             one code's
 *             sum (D doubles)
 */
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

/* rows per product block: 64 x K products stay in a core's L2 for the argmin pass at K ~ 1000 */
#define VQ_ROWS 64
/* below this many multiply-adds the forward runs on one thread */
#define VQ_MIN_PARALLEL ((int64_t)1 << 20)

static int valid(const MfVqParams *p) {
    return p->N >= 1 && p->M >= 1 && p->K >= 1 && p->D >= 1 && p->K <= INT32_MAX;
}

static int64_t forward_fixed(const MfVqParams *p) { return mf_scratch_size(p->M * p->K); }
static int64_t forward_per_thread(const MfVqParams *p) {
    return mf_scratch_size(VQ_ROWS * p->K);
}

int64_t vq_forward_scratch_floats(const MfVqParams *p) {
    if (!valid(p)) return 0;
    return forward_fixed(p) + mf_max_threads() * forward_per_thread(p);
}

static int64_t block_rows(int64_t N, int64_t b) {
    return N - b * VQ_ROWS < VQ_ROWS ? N - b * VQ_ROWS : VQ_ROWS;
}

int vq_forward(const MfVqParams *p) {
    if (!valid(p) || p->scratch == NULL) return MF_EINVAL;
    const int64_t N = p->N, M = p->M, K = p->K, D = p->D, MD = M * D;
    const int64_t fixed = forward_fixed(p), per_thread = forward_per_thread(p);
    if (p->scratch_floats < fixed + per_thread) return MF_EINVAL;
    const int threads = mf_scratch_threads(p->scratch_floats - fixed, per_thread);
    float *enorm = p->scratch, *products = p->scratch + fixed;
    const int big = N * K * D * M >= VQ_MIN_PARALLEL;

#pragma omp parallel for schedule(static) num_threads(threads) if (big)
    for (int64_t mk = 0; mk < M * K; mk++) {
        const float *e = p->codebook + mk * D;
        double s = 0.0;
        for (int64_t j = 0; j < D; j++) s += (double)e[j] * e[j];
        enorm[mk] = (float)s;
    }

    const int64_t blocks = (N + VQ_ROWS - 1) / VQ_ROWS, tasks = M * blocks;
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (big && tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t m = t / blocks, b = t % blocks, r0 = b * VQ_ROWS;
        const int64_t rows = block_rows(N, b);
        const float *cb = p->codebook + m * K * D, *en = enorm + m * K;
        float *s = products + mf_thread_id() * per_thread;
        /* s (rows, K) = z[r0:r0+rows, m] (row stride M D) . codebook[m]^T */
        const int st = mf_sgemm(0, 1, rows, K, D, 1.0f, p->z + r0 * MD + m * D, MD, cb, D,
                                0.0f, s, K);
        if (st != MF_OK) {
            mf_record_status(&status, st);
            continue;
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *sr = s + r * K;
            int64_t best = 0;
            float best_v = en[0] - 2.0f * sr[0];
            for (int64_t k = 1; k < K; k++) {
                const float v = en[k] - 2.0f * sr[k];
                if (v < best_v) {
                    best_v = v;
                    best = k;
                }
            }
            const int64_t n = r0 + r;
            const float *zr = p->z + n * MD + m * D, *e = cb + best * D;
            double d = 0.0;
            for (int64_t j = 0; j < D; j++) {
                const double diff = (double)zr[j] - (double)e[j];
                d += diff * diff;
            }
            memcpy(p->codes + n * MD + m * D, e, (size_t)D * sizeof(float));
            p->indices[n * M + m] = (int32_t)best;
            p->dist[n * M + m] = (float)d;
        }
    }
    if (status != MF_OK) return status;
    if (p->total != NULL) {
        double total = 0.0;
        for (int64_t i = 0; i < N * M; i++) total += p->dist[i];
        *p->total = total;
    }
    return MF_OK;
}

/* the backward's scratch: offsets (M K + 1 int64), keys and rows (N M int64 each), per-thread
 * sums */
static int64_t backward_fixed(const MfVqParams *p) {
    return mf_scratch_size(2 * (p->M * p->K + 1)) + 2 * mf_scratch_size(2 * p->N * p->M);
}
static int64_t backward_per_thread(const MfVqParams *p) { return mf_scratch_size(2 * p->D); }

int64_t vq_backward_scratch_floats(const MfVqParams *p) {
    if (!valid(p)) return 0;
    return backward_fixed(p) + mf_max_threads() * backward_per_thread(p);
}

/* indices_in[i], read once */
static inline int64_t index_at(const int32_t *indices, int64_t i) {
    return ((const volatile int32_t *)indices)[i];
}

int vq_backward(const MfVqParams *p) {
    if (!valid(p) || p->scratch == NULL) return MF_EINVAL;
    const int64_t N = p->N, M = p->M, K = p->K, D = p->D, MD = M * D, MK = M * K;
    const int64_t fixed = backward_fixed(p), per_thread = backward_per_thread(p);
    if (p->scratch_floats < fixed + per_thread) return MF_EINVAL;
    const int threads = mf_scratch_threads(p->scratch_floats - fixed, per_thread);
    float *at = p->scratch;
    int64_t *offsets = (int64_t *)mf_scratch_take(&at, 2 * (MK + 1));
    int64_t *keys = (int64_t *)mf_scratch_take(&at, 2 * N * M);
    int64_t *members = (int64_t *)mf_scratch_take(&at, 2 * N * M);
    double *sums = (double *)at;
    const int big = N * MD >= (1 << 16);

    /* dz, row-parallel; each id checked where it is read */
    const float c2 = 2.0f * p->commitment_weight;
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(| : bad) if (big)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t m = 0; m < M; m++) {
            const int64_t k = index_at(p->indices_in, n * M + m);
            const float *zr = p->z + n * MD + m * D, *g = p->dcodes + n * MD + m * D;
            float *dz = p->dz + n * MD + m * D;
            if (k < 0 || k >= K) {
                bad = 1;
                continue;
            }
            const float *e = p->codebook + (m * K + k) * D;
            for (int64_t j = 0; j < D; j++) dz[j] = g[j] + c2 * (zr[j] - e[j]);
        }
    }
    if (bad) return MF_EINDEX;

    /* counting sort of the (row, codebook) pairs by code, stable in row order; the ids are
     * read (and checked) once more here, and only these checked copies (keys) are used below */
    memset(offsets, 0, (size_t)(MK + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < N * M; i++) {
        const int64_t k = index_at(p->indices_in, i);
        if (k < 0 || k >= K) return MF_EINDEX;
        keys[i] = (i % M) * K + k;
        offsets[keys[i] + 1]++;
    }
    for (int64_t key = 0; key < MK; key++) offsets[key + 1] += offsets[key];
    /* members[offsets[key] ..) = the rows with that code, in order; offsets[key] moves to the
     * next key's start, so afterwards key's rows are [offsets[key - 1], offsets[key]) */
    for (int64_t i = 0; i < N * M; i++) members[offsets[keys[i]]++] = i / M;

    const double w2 = 2.0 * (double)p->codebook_weight;
#pragma omp parallel num_threads(threads) if (big)
    {
        double *acc = sums + mf_thread_id() * (per_thread / 2);
#pragma omp for schedule(static)
        for (int64_t key = 0; key < MK; key++) {
            const int64_t start = key == 0 ? 0 : offsets[key - 1], end = offsets[key];
            if (start == end) continue;
            const int64_t m = key / K;
            const float *e = p->codebook + key * D;
            for (int64_t j = 0; j < D; j++) acc[j] = 0.0;
            for (int64_t r = start; r < end; r++) {
                const float *zr = p->z + members[r] * MD + m * D;
                for (int64_t j = 0; j < D; j++) acc[j] += (double)e[j] - (double)zr[j];
            }
            float *dcb = p->dcodebook + key * D;
            for (int64_t j = 0; j < D; j++) dcb[j] += (float)(w2 * acc[j]);
        }
    }
    return MF_OK;
}
