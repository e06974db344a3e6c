/* Masked softmax cross-entropy over the last axis.
 *
 * Forward saves nothing: backward recomputes each row's max and sum of exponentials (one
 * extra pass over a row that is in cache anyway; the header's signature has no lse buffer).
 * Gradient rule: dlogits is an activation gradient, written (=).
 *
 *   losses[n] = log sum_v exp(logits[n, v] - m_n) + m_n - logits[n, targets[n]],
 *               m_n = max_v logits[n, v]   (every row, whatever its mask)
 *   *loss     = sum_n mask[n] losses[n] / sum_n mask[n]   (0 when sum(mask) == 0), in double,
 *               summed serially in row order (deterministic)
 *   dlogits[n, v] = scale * mask[n] * (softmax(logits[n])[v] - [v == targets[n]])
 *
 * A row whose max is not finite (a NaN or +inf logit) gets a NaN loss and NaN gradients, as
 * the reference does. Row sums use 16 float lanes of exp(x - m) <= 1, combined in double
 * (explicit vectors: the same summation order, hence the same bits, in every target clone).
 * Targets are checked against [0, V) before anything is written (MF_EINDEX).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/fastmath.h"
#include "mapformer/mapformer.h"

#define MF_XENT_LANES 16

/* helpers of the row kernels are forced inline so that each target clone compiles them for
 * its own ISA (a helper left out of line is compiled for the baseline only) */
#if defined(__GNUC__)
#define MF_XENT_INLINE static inline __attribute__((always_inline))
#else
#define MF_XENT_INLINE static inline
#endif


/* 16 float lanes as a GCC/Clang vector (one zmm under AVX-512, two ymm under AVX2, four xmm
 * at baseline), for the row reductions: GCC does not vectorise a float max or sum reduction
 * without -ffast-math, and left to vectorise 16-lane arrays it may pick the outer loop. */
typedef float mf_xent_v16 __attribute__((vector_size(64)));
typedef int32_t mf_xent_i16 __attribute__((vector_size(64)));
#define MF_XENT_LOAD(v, p) memcpy(&(v), (p), sizeof(mf_xent_v16))
/* exp values are computed a block at a time into a stack buffer by a plain loop (which GCC
 * vectorises, mf_expf included) and then summed with vector lanes */
#define MF_XENT_BLOCK 256

/* max of row (V,), NaN if any element is NaN */
MF_XENT_INLINE float row_max(const float *restrict x, int64_t V) {
    const int64_t Vv = V - V % MF_XENT_LANES;
    float m = -INFINITY;
    int32_t any_nan = 0;
    if (Vv > 0) {
        mf_xent_v16 acc;
        mf_xent_i16 nan = {0};
        MF_XENT_LOAD(acc, x);
        for (int64_t c = 0; c < Vv; c += MF_XENT_LANES) {
            mf_xent_v16 v;
            MF_XENT_LOAD(v, x + c);
            mf_xent_i16 gt = v > acc; /* lanes -1 where v > acc */
            acc = (mf_xent_v16)(((mf_xent_i16)v & gt) | ((mf_xent_i16)acc & ~gt));
            nan |= v != v;
        }
        float lanes[MF_XENT_LANES];
        int32_t nans[MF_XENT_LANES];
        memcpy(lanes, &acc, sizeof lanes);
        memcpy(nans, &nan, sizeof nans);
        for (int j = 0; j < MF_XENT_LANES; j++) {
            m = lanes[j] > m ? lanes[j] : m;
            any_nan |= nans[j];
        }
    }
    for (int64_t c = Vv; c < V; c++) {
        m = x[c] > m ? x[c] : m;
        any_nan |= x[c] != x[c];
    }
    return any_nan ? NAN : m;
}

/* out[0:n] = exp(x[0:n] - m), a plain loop that vectorises */
MF_XENT_INLINE void exp_shifted(float *restrict out, const float *restrict x, float m, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = mf_expf(x[i] - m);
}

/* sum of e[0:n] in 16 float lanes (n < 2^24 terms of at most 1 each per lane: exact enough),
 * lanes and tail combined in double */
MF_XENT_INLINE double lane_sum(const float *restrict e, int64_t n) {
    const int64_t nv = n - n % MF_XENT_LANES;
    mf_xent_v16 acc = {0};
    for (int64_t i = 0; i < nv; i += MF_XENT_LANES) {
        mf_xent_v16 v;
        MF_XENT_LOAD(v, e + i);
        acc += v;
    }
    float lanes[MF_XENT_LANES];
    memcpy(lanes, &acc, sizeof lanes);
    double s = 0.0;
    for (int j = 0; j < MF_XENT_LANES; j++) s += lanes[j];
    for (int64_t i = nv; i < n; i++) s += e[i];
    return s;
}

/* sum_v exp(x[v] - m), blockwise through a stack buffer */
MF_XENT_INLINE double row_sumexp(const float *restrict x, float m, int64_t V) {
    float buf[MF_XENT_BLOCK];
    double s = 0.0;
    for (int64_t c0 = 0; c0 < V; c0 += MF_XENT_BLOCK) {
        int64_t n = V - c0 < MF_XENT_BLOCK ? V - c0 : MF_XENT_BLOCK;
        exp_shifted(buf, x + c0, m, n);
        s += lane_sum(buf, n);
    }
    return s;
}

/* rows [r0, r1) of the forward pass */
MF_CLONES
static void xent_forward_rows(float *restrict losses, const float *restrict logits,
                              const int32_t *restrict targets, int64_t r0, int64_t r1,
                              int64_t V) {
    for (int64_t n = r0; n < r1; n++) {
        const float *x = logits + n * V;
        float m = row_max(x, V);
        if (!isfinite(m)) {
            losses[n] = NAN;
            continue;
        }
        double s = row_sumexp(x, m, V);
        losses[n] = (float)(log(s) + ((double)m - (double)x[targets[n]]));
    }
}

/* rows [r0, r1) of the backward pass: the row of dlogits holds exp(x - m) until it is scaled */
MF_CLONES
static void xent_backward_rows(float *restrict dlogits, const float *restrict logits,
                               const int32_t *restrict targets, const float *restrict mask,
                               float scale, int64_t r0, int64_t r1, int64_t V) {
    for (int64_t n = r0; n < r1; n++) {
        const float *x = logits + n * V;
        float *d = dlogits + n * V;
        const double w = (double)scale * (double)mask[n];
        float m = row_max(x, V);
        if (!isfinite(m) || !isfinite(w)) {
            for (int64_t c = 0; c < V; c++) d[c] = NAN;
            continue;
        }
        if (w == 0.0) {
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        exp_shifted(d, x, m, V);
        const double s = lane_sum(d, V);
        const int64_t t = targets[n];
        const float et = d[t];
        const float coef = (float)(w / s);
        for (int64_t c = 0; c < V; c++) d[c] *= coef;
        d[t] = (float)((double)et * (w / s) - w);
    }
}

/* MF_EINDEX unless every target is in [0, V) */
static int check_targets(const int32_t *targets, int64_t N, int64_t V) {
    int bad = 0;
    for (int64_t n = 0; n < N; n++) bad |= targets[n] < 0 || (int64_t)targets[n] >= V;
    return bad ? MF_EINDEX : MF_OK;
}

/* rows per OpenMP work item: about 2^14 logits, at least one row */
static int64_t rows_per_chunk(int64_t V) { return V >= (1 << 14) ? 1 : (1 << 14) / V; }

int softmax_xent_forward(float *losses, double *loss, const float *logits,
                         const int32_t *targets, const float *mask, int64_t N, int64_t V) {
    if (N < 1 || V < 1) return MF_EINVAL;
    int status = check_targets(targets, N, V);
    if (status != MF_OK) return status;
    const int64_t rc = rows_per_chunk(V), chunks = (N + rc - 1) / rc;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t r0 = k * rc, r1 = r0 + rc < N ? r0 + rc : N;
        xent_forward_rows(losses, logits, targets, r0, r1, V);
    }
    double num = 0.0, den = 0.0;
    for (int64_t n = 0; n < N; n++) {
        if (mask[n] != 0.0f) num += (double)mask[n] * (double)losses[n];
        den += (double)mask[n];
    }
    *loss = den != 0.0 ? num / den : 0.0;
    return MF_OK;
}

int softmax_xent_backward(float *dlogits, const float *logits, const int32_t *targets,
                          const float *mask, float scale, int64_t N, int64_t V) {
    if (N < 1 || V < 1) return MF_EINVAL;
    int status = check_targets(targets, N, V);
    if (status != MF_OK) return status;
    const int64_t rc = rows_per_chunk(V), chunks = (N + rc - 1) / rc;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t r0 = k * rc, r1 = r0 + rc < N ? r0 + rc : N;
        xent_backward_rows(dlogits, logits, targets, mask, scale, r0, r1, V);
    }
    return MF_OK;
}
