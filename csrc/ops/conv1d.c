/* Causal depthwise conv1d along t (the Mamba block's short convolution), any width W:
 *   c[b, t, e] = bias[e] + sum_{j < W} weight[e, j] x[b, t - W + 1 + j, e]   (x = 0 for t < 0)
 *   y = c, or y = silu(c) with p->silu (the Mamba block's conv and SiLU in one pass: c is
 *   never stored; the backward recomputes it from x, which it reads anyway, and the bias).
 * Forward saves nothing. Backward, g = dy, or dy silu'(c) with p->silu (activation.c's SiLU
 * kernels, so the bits are those of the two ops in turn):
 *   dx[b, s, e]    = sum_{j: s + W - 1 - j < T} weight[e, j] g[b, s + W - 1 - j, e]   (=)
 *   dweight[e, j] += sum_{b, t} g[b, t, e] x[b, t - W + 1 + j, e]
 *   dbias[e]      += sum_{b, t} g[b, t, e]
 * Parallel layout: a work item is one batch row b and a block of CONV_TB time steps (a fixed
 * size, not the thread count, so the bits do not depend on the number of threads); its loops
 * run over the contiguous channels e, which the compiler vectorises. Both directions read the
 * weight transposed, (W, E), from the caller's scratch (<op>_scratch_floats), so that every
 * loop runs along the contiguous e (the forward's strided weight loads were one scalar insert
 * per lane: 10.5 -> 5.8 ms at the Mamba step's shape, one thread). The weight and bias
 * gradients are summed per item (at most CONV_TB steps) in float into the same scratch (the
 * weight's as (W, E)) and the items in double in a fixed order (per-item sums in double,
 * converting every product, made the backward compute-bound: 18.3 -> 12.8 ms). With SiLU,
 * a row of c goes through a per-thread row of scratch into SiLU's kernel (forward), and an
 * item first writes the CONV_TB + W - 1 rows of g it reads into per-thread scratch
 * (backward): conv + SiLU 13.1 -> 8.6 ms forward, 21.6 -> 17.0 ms backward against the two
 * ops in turn.
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels/activation.h"
#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

#define CONV_TB 64                /* time steps per work item */
#define CONV_MIN_PARALLEL 32768   /* B*T*E below this runs on one thread */

/* row t of one batch row's convolution into yr (E,): x (T, E); wt (W, E) the weight
 * transposed */
MF_CLONES
static void conv_row(float *restrict yr, const float *restrict x, const float *restrict wt,
                     const float *restrict bias, int64_t t, int64_t E, int64_t W) {
    for (int64_t e = 0; e < E; e++) yr[e] = bias[e];
    for (int64_t j = 0; j < W; j++) {
        const int64_t s = t - W + 1 + j;
        if (s < 0) continue;
        const float *xr = x + s * E, *wj = wt + j * E;
        for (int64_t e = 0; e < E; e++) yr[e] += wj[e] * xr[e];
    }
}

/* wt (W, E) = weight (E, W) transposed */
static void transpose_weight(float *restrict wt, const float *restrict weight, int64_t E,
                             int64_t W) {
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < W; j++) wt[j * E + e] = weight[e * W + j];
}

/* dx rows [t0, t1) of one batch row, and this item's dweight (W, E) (transposed: the loops
 * run along e), dbias (E,) partials; wt (W, E) the weight transposed; dy holds the rows from
 * r0 on (row t at dy + (t - r0) E: the batch row's dy, or the item's rows of the SiLU's) */
MF_CLONES
static void backward_rows(float *restrict dx, float *restrict dw, float *restrict db,
                          const float *restrict dy, int64_t r0, const float *restrict x,
                          const float *restrict wt, int64_t t0, int64_t t1, int64_t T,
                          int64_t E, int64_t W) {
    for (int64_t i = 0; i < E * W; i++) dw[i] = 0.0f;
    for (int64_t e = 0; e < E; e++) db[e] = 0.0f;
    for (int64_t s = t0; s < t1; s++) {
        float *dxr = dx + s * E;
        const float *dyr = dy + (s - r0) * E;
        for (int64_t e = 0; e < E; e++) {
            dxr[e] = 0.0f;
            db[e] += dyr[e];
        }
        for (int64_t j = 0; j < W; j++) {
            const int64_t t = s + W - 1 - j; /* the output x[s] feeds through weight[:, j] */
            if (t < T) {
                const float *g = dy + (t - r0) * E, *wj = wt + j * E;
                for (int64_t e = 0; e < E; e++) dxr[e] += wj[e] * g[e];
            }
            const int64_t u = s - W + 1 + j; /* the input weight[:, j] meets at output s */
            if (u >= 0) {
                const float *xr = x + u * E;
                float *dwj = dw + j * E;
                for (int64_t e = 0; e < E; e++) dwj[e] += dyr[e] * xr[e];
            }
        }
    }
}

static int bad_sizes(const MfConv1dParams *p) {
    return p->B < 1 || p->T < 1 || p->E < 1 || p->W < 1;
}

/* per thread with SiLU: a row of the convolution, E floats */
static int64_t forward_thread_floats(const MfConv1dParams *p) {
    return p->silu ? mf_scratch_size(p->E) : 0;
}

/* the weight transposed, (W, E) floats; with SiLU, forward_thread_floats per thread */
int64_t causal_conv1d_forward_scratch_floats(const MfConv1dParams *p) {
    if (bad_sizes(p)) return 0;
    return mf_scratch_size(p->E * p->W) + mf_max_threads() * forward_thread_floats(p);
}

int causal_conv1d_forward(const MfConv1dParams *p) {
    if (bad_sizes(p) || p->scratch == NULL || p->scratch_floats < mf_scratch_size(p->E * p->W))
        return MF_EINVAL;
    const int64_t T = p->T, E = p->E, W = p->W, nt = (T + CONV_TB - 1) / CONV_TB;
    const int64_t per = forward_thread_floats(p);
    const int threads = mf_scratch_threads(p->scratch_floats - mf_scratch_size(E * W), per);
    if (threads < 1) return MF_EINVAL;
    float *at = p->scratch;
    float *wt = mf_scratch_take(&at, E * W);
    transpose_weight(wt, p->weight, E, W);
    const MfActKernels *ks = mf_act_kernels(mf_kernels());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) \
    if (threads > 1 && p->B * T * E >= CONV_MIN_PARALLEL)
    for (int64_t it = 0; it < p->B * nt; it++) {
        const int64_t b = it / nt, t0 = (it % nt) * CONV_TB;
        const int64_t t1 = t0 + CONV_TB < T ? t0 + CONV_TB : T;
        const float *x = p->x + b * T * E;
        float *y = p->y + b * T * E, *row = at + (int64_t)mf_thread_id() * per;
        for (int64_t t = t0; t < t1; t++) {
            if (!p->silu) {
                conv_row(y + t * E, x, wt, p->bias, t, E, W);
            } else {
                conv_row(row, x, wt, p->bias, t, E, W);
                ks->silu(y + t * E, row, E);
            }
        }
    }
    return MF_OK;
}

/* per thread with SiLU: an item's rows of the SiLU's gradient, CONV_TB + W - 1 rows of E
 * floats, and a row of the recomputed convolution */
static int64_t backward_thread_floats(const MfConv1dParams *p) {
    return p->silu ? mf_scratch_size((CONV_TB + p->W - 1) * p->E) + mf_scratch_size(p->E) : 0;
}

/* the per-item partials: (B * ceil(T / CONV_TB), W * E + E) floats; the weight transposed,
 * (W, E) floats; with SiLU, backward_thread_floats per thread */
static int64_t backward_shared_floats(const MfConv1dParams *p) {
    const int64_t items = p->B * ((p->T + CONV_TB - 1) / CONV_TB);
    return mf_scratch_size(items * (p->E * p->W + p->E)) + mf_scratch_size(p->E * p->W);
}

int64_t causal_conv1d_backward_scratch_floats(const MfConv1dParams *p) {
    if (bad_sizes(p)) return 0;
    return backward_shared_floats(p) + mf_max_threads() * backward_thread_floats(p);
}

int causal_conv1d_backward(const MfConv1dParams *p) {
    if (bad_sizes(p) || p->scratch == NULL || p->scratch_floats < backward_shared_floats(p) ||
        (p->silu && p->bias == NULL))
        return MF_EINVAL;
    const int64_t T = p->T, E = p->E, W = p->W, nt = (T + CONV_TB - 1) / CONV_TB;
    const int64_t items = p->B * nt, per = E * W + E, thread_per = backward_thread_floats(p);
    const int threads = mf_scratch_threads(p->scratch_floats - backward_shared_floats(p),
                                           thread_per);
    if (threads < 1) return MF_EINVAL;
    float *at = p->scratch;
    float *part = mf_scratch_take(&at, items * per);
    float *wt = mf_scratch_take(&at, E * W);
    transpose_weight(wt, p->weight, E, W);
    const MfActKernels *ks = mf_act_kernels(mf_kernels());
#pragma omp parallel num_threads(threads) if (threads > 1 && p->B * T * E >= CONV_MIN_PARALLEL)
    {
        float *g = at + (int64_t)mf_thread_id() * thread_per;
        float *row = g + (p->silu ? mf_scratch_size((CONV_TB + W - 1) * E) : 0);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t b = it / nt, t0 = (it % nt) * CONV_TB;
            const int64_t t1 = t0 + CONV_TB < T ? t0 + CONV_TB : T;
            const float *x = p->x + b * T * E, *dy = p->dy + b * T * E;
            int64_t r0 = 0;
            if (p->silu) { /* the rows [t0, t1 + W - 1) this item reads: dy silu'(conv) */
                const int64_t r1 = t1 + W - 1 < T ? t1 + W - 1 : T;
                for (int64_t t = t0; t < r1; t++) {
                    conv_row(row, x, wt, p->bias, t, E, W);
                    ks->silu_grad(g + (t - t0) * E, dy + t * E, row, E);
                }
                dy = g;
                r0 = t0;
            }
            backward_rows(p->dx + b * T * E, part + it * per, part + it * per + E * W, dy, r0,
                          x, wt, t0, t1, T, E, W);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < per; i++) {
            double s = 0.0;
            for (int64_t it = 0; it < items; it++) s += part[it * per + i];
            if (i < E * W) { /* weight[e, j] from the partials' (j, e) */
                float *dw = p->dweight + (i % E) * W + i / E;
                *dw = (float)((double)*dw + s);
            } else {
                p->dbias[i - E * W] = (float)((double)p->dbias[i - E * W] + s);
            }
        }
    }
    return MF_OK;
}
