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
 * the reference does. exp is simd.h's vexp (the core's one exponential); row sums use
 * MF_VW float lanes of exp(x - m) <= 1, combined in double (explicit vectors: the same
 * summation order, hence the same bits, in every target clone).
 * Each target is read once, where its row uses it, and checked against [0, V) there: a bad one
 * makes its row NaN and the op return MF_EINDEX (rows whose logits or weight make them NaN or
 * zero anyway do not read their target).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"

/* exponentials are summed in float lanes over blocks of this many logits, each block's lanes
 * then added in double: a lane never sums more than MF_XENT_BLOCK / MF_VW terms */
#define MF_XENT_BLOCK 256

/* max of row (V,), NaN if any element is NaN */
MF_INLINE float row_max(const float *restrict x, int64_t V) {
    const int64_t Vv = V - V % MF_VW;
    float m = -INFINITY;
    int32_t any_nan = 0;
    if (Vv > 0) {
        vf acc = VLOADU(x);
        vi nan = ISPLAT(0);
        for (int64_t c = 0; c < Vv; c += MF_VW) {
            const vf v = VLOADU(x + c);
            acc = VSELECT(v > acc, v, acc);
            nan |= v != v;
        }
        for (int l = 0; l < MF_VW; l++) {
            m = acc[l] > m ? acc[l] : m;
            any_nan |= nan[l];
        }
    }
    for (int64_t c = Vv; c < V; c++) {
        m = x[c] > m ? x[c] : m;
        any_nan |= x[c] != x[c];
    }
    return any_nan ? NAN : m;
}

/* sum_v exp(x[v] - m) (simd.h's vexp), and the exponentials into out[0:V] unless out is
 * NULL: float lanes per block of MF_XENT_BLOCK, the blocks' lanes added in double */
MF_INLINE double row_exp_sum(float *restrict out, const float *restrict x, float m, int64_t V) {
    double s = 0.0;
    for (int64_t c0 = 0; c0 < V; c0 += MF_XENT_BLOCK) {
        const int64_t n = V - c0 < MF_XENT_BLOCK ? V - c0 : MF_XENT_BLOCK;
        const int64_t nv = n - n % MF_VW;
        vf acc = VZERO;
        for (int64_t i = c0; i < c0 + nv; i += MF_VW) {
            vf v = VLOADU(x + i) - m;
            vexp(&v);
            if (out != NULL) VSTOREU(out + i, v);
            acc += v;
        }
        if (nv < n) { /* the block's tail, lanes past it zeroed */
            vf v;
            vload_part(&v, x + c0 + nv, n - nv);
            v = v - m;
            vexp(&v);
            v = VAND(VFIRST(n - nv), v);
            if (out != NULL) vstore_part(out + c0 + nv, &v, n - nv);
            acc += v;
        }
        for (int l = 0; l < MF_VW; l++) s += acc[l];
    }
    return s;
}

/* targets[n], read once (volatile: the compiler cannot load it again for the indexing) */
MF_INLINE int64_t target_at(const int32_t *targets, int64_t n) {
    return ((const volatile int32_t *)targets)[n];
}

/* rows [r0, r1) of the forward pass; returns 1 if a target was outside [0, V) (its loss NaN) */
MF_CLONES
static int xent_forward_rows(float *restrict losses, const float *restrict logits,
                             const int32_t *targets, int64_t r0, int64_t r1, int64_t V) {
    int bad = 0;
    for (int64_t n = r0; n < r1; n++) {
        const float *x = logits + n * V;
        float m = row_max(x, V);
        const int64_t t = isfinite(m) ? target_at(targets, n) : 0;
        if (t < 0 || t >= V) bad = 1;
        if (!isfinite(m) || t < 0 || t >= V) {
            losses[n] = NAN;
            continue;
        }
        double s = row_exp_sum(NULL, x, m, V);
        losses[n] = (float)(log(s) + ((double)m - (double)x[t]));
    }
    return bad;
}

/* rows [r0, r1) of the backward pass: the row of dlogits holds exp(x - m) until it is scaled;
 * returns 1 if a target was outside [0, V) (its row NaN) */
MF_CLONES
static int xent_backward_rows(float *restrict dlogits, const float *restrict logits,
                              const int32_t *targets, const float *restrict mask, float scale,
                              int64_t r0, int64_t r1, int64_t V) {
    int bad = 0;
    for (int64_t n = r0; n < r1; n++) {
        const float *x = logits + n * V;
        float *d = dlogits + n * V;
        const double w = (double)scale * (double)mask[n];
        float m = row_max(x, V);
        const int64_t t = isfinite(m) && isfinite(w) && w != 0.0 ? target_at(targets, n) : 0;
        if (t < 0 || t >= V) bad = 1;
        if (!isfinite(m) || !isfinite(w) || t < 0 || t >= V) {
            for (int64_t c = 0; c < V; c++) d[c] = NAN;
            continue;
        }
        if (w == 0.0) {
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        const double s = row_exp_sum(d, x, m, V);
        const float et = d[t];
        const float coef = (float)(w / s);
        for (int64_t c = 0; c < V; c++) d[c] *= coef;
        d[t] = (float)((double)et * (w / s) - w);
    }
    return bad;
}

/* rows per OpenMP work item: about 2^14 logits, at least one row */
static int64_t rows_per_chunk(int64_t V) { return V >= (1 << 14) ? 1 : (1 << 14) / V; }

int softmax_xent_forward(const MfSoftmaxXentParams *p) {
    const int64_t N = p->N, V = p->V;
    if (N < 1 || V < 1) return MF_EINVAL;
    const int64_t rc = rows_per_chunk(V), chunks = (N + rc - 1) / rc;
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad) if (chunks > 1)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t r0 = k * rc, r1 = r0 + rc < N ? r0 + rc : N;
        bad |= xent_forward_rows(p->losses, p->logits, p->targets, r0, r1, V);
    }
    double num = 0.0, den = 0.0;
    for (int64_t n = 0; n < N; n++) {
        if (p->mask[n] != 0.0f) num += (double)p->mask[n] * (double)p->losses[n];
        den += (double)p->mask[n];
    }
    *p->loss = den != 0.0 ? num / den : 0.0;
    return bad ? MF_EINDEX : MF_OK;
}

int softmax_xent_backward(const MfSoftmaxXentParams *p) {
    const int64_t N = p->N, V = p->V;
    if (N < 1 || V < 1) return MF_EINVAL;
    const int64_t rc = rows_per_chunk(V), chunks = (N + rc - 1) / rc;
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad) if (chunks > 1)
    for (int64_t k = 0; k < chunks; k++) {
        int64_t r0 = k * rc, r1 = r0 + rc < N ? r0 + rc : N;
        bad |= xent_backward_rows(p->dlogits, p->logits, p->targets, p->mask, p->scale, r0, r1,
                                  V);
    }
    return bad ? MF_EINDEX : MF_OK;
}
