/* Path integration (MapFormer eq. 12): theta = wrap(omega * cumsum_t(delta)).
 *
 * Forward saves nothing: the backward needs only delta and omega, which the caller keeps.
 * Gradient rules: domega (H, NB) is a parameter gradient, accumulated (+=); ddelta
 * (B, T, H, NB) is an activation gradient, written (=).
 *
 * Numerics: the cumulative sum runs in double, theta = omega * C is formed in double and
 * reduced to [-pi, pi) there (wrap(a) = a - 2 pi floor(a / (2 pi) + 1/2)) before it is rounded
 * to float, so angles stay exact to float precision however long the sequence (OOD sequences
 * are 4x longer than training). The rounding to float can land on +pi's float neighbour; only
 * the angle modulo 2 pi matters to the rotations. Reductions of |a| >= 2^51 * 2 pi (no phase
 * left at double precision) give a finite but meaningless angle.
 *
 * Backward, one reverse scan over t: with R[t] = sum_{s >= t} dtheta[s] (double),
 *   ddelta[t] = omega * R[t]                       (= reverse_cumsum_t(dtheta * omega))
 *   domega   += sum_{b,t} delta[t] * R[t]          (= sum_{b,t} dtheta[t] * cumsum(delta)[t],
 *                                                     the same double sum by parts)
 * so the cumulative sum of delta is never materialised.
 *
 * Parallel layout: (B, T, H, NB) is scanned along t with stride M = H*NB. A work item is one
 * batch row b and one block of at most PI_BLOCK contiguous columns; it walks t carrying one
 * double accumulator per column (on the stack), so the inner loop runs over contiguous
 * columns and vectorises. domega partials go to a (B, M) double scratch (the caller's:
 * path_integration_backward_scratch_floats), one slot per work item, summed over b in a fixed
 * order afterwards: race-free and independent of the number of threads. Items are handed out
 * dynamically: on a shared 2-vCPU machine a static split waits for whichever thread the OS has
 * parked.
 */
#include <math.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

#define PI_BLOCK 256          /* columns per work item: at most 3 double arrays of 2 KiB each */
#define PI_MIN_PARALLEL 32768 /* B*T*M below this runs on one thread */

static const double TWO_PI = 6.283185307179586476925;
static const double INV_TWO_PI = 0.159154943091895335768883763;

/* floor(v) for |v| < 2^51 without a branch or a libm call, so the loop vectorises at every
 * ISA level: r = round-to-nearest(v) by the 1.5 * 2^52 trick, then step down by one when
 * r > v. copysign(1, v - r) is +1 when v >= r (v - r = +0 when v is an integer). */
static inline double floor_small(double v) {
    double r = (v + 0x1.8p52) - 0x1.8p52;
    return r - 0.5 + 0.5 * copysign(1.0, v - r);
}

static inline double wrap_angle(double a) { return a - TWO_PI * floor_small(a * INV_TWO_PI + 0.5); }

/* theta, delta: column m0 of batch row b, i.e. (T, M) with stride M; omega: (n,) at m0. */
MF_CLONES
static void forward_block(float *restrict theta, const float *restrict delta,
                          const float *restrict omega, int64_t T, int64_t M, int64_t n) {
    double acc[PI_BLOCK], om[PI_BLOCK];
    for (int64_t j = 0; j < n; j++) {
        acc[j] = 0.0;
        om[j] = (double)omega[j];
    }
    for (int64_t t = 0; t < T; t++) {
        const float *d = delta + t * M;
        float *th = theta + t * M;
        for (int64_t j = 0; j < n; j++) {
            acc[j] += (double)d[j];
            th[j] = (float)wrap_angle(om[j] * acc[j]);
        }
    }
}

/* As forward_block, backward: writes ddelta and this block's domega partial dom (n,). */
MF_CLONES
static void backward_block(float *restrict ddelta, double *restrict dom,
                           const float *restrict dtheta, const float *restrict delta,
                           const float *restrict omega, int64_t T, int64_t M, int64_t n) {
    double rsum[PI_BLOCK], om[PI_BLOCK], acc[PI_BLOCK];
    for (int64_t j = 0; j < n; j++) {
        rsum[j] = 0.0;
        acc[j] = 0.0;
        om[j] = (double)omega[j];
    }
    for (int64_t t = T - 1; t >= 0; t--) {
        const float *dt = dtheta + t * M, *d = delta + t * M;
        float *dd = ddelta + t * M;
        for (int64_t j = 0; j < n; j++) {
            rsum[j] += (double)dt[j];
            dd[j] = (float)(om[j] * rsum[j]);
            acc[j] += (double)d[j] * rsum[j];
        }
    }
    for (int64_t j = 0; j < n; j++) dom[j] = acc[j];
}

/* Columns per work item: all M (up to PI_BLOCK) when there are enough batch rows to feed every
 * thread, else M split so that B * blocks >= threads, in multiples of 16 columns. */
static int64_t block_width(int64_t B, int64_t M) {
    const int64_t threads = mf_max_threads();
    int64_t per_row = (threads + B - 1) / B;
    int64_t w = (M + per_row - 1) / per_row;
    w = (w + 15) / 16 * 16;
    if (w > PI_BLOCK) w = PI_BLOCK;
    if (w > M) w = M;
    return w;
}

int path_integration_forward(const MfPathIntegrationParams *p) {
    float *theta = p->theta;
    const float *delta = p->delta, *omega = p->omega;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB;
    if (B < 1 || T < 1 || H < 1 || NB < 1) return MF_EINVAL;
    const int64_t M = H * NB, w = block_width(B, M), nblk = (M + w - 1) / w;
    const int64_t items = B * nblk;
#pragma omp parallel for schedule(dynamic, 1) if (B * T * M >= PI_MIN_PARALLEL)
    for (int64_t it = 0; it < items; it++) {
        int64_t b = it / nblk, m0 = (it % nblk) * w;
        int64_t n = M - m0 < w ? M - m0 : w;
        forward_block(theta + b * T * M + m0, delta + b * T * M + m0, omega + m0, T, M, n);
    }
    return MF_OK;
}

/* the domega partials (B, M) in double */
int64_t path_integration_backward_scratch_floats(const MfPathIntegrationParams *p) {
    return mf_scratch_size(2 * p->B * p->H * p->NB);
}

int path_integration_backward(const MfPathIntegrationParams *p) {
    float *ddelta = p->ddelta, *domega = p->domega;
    const float *dtheta = p->dtheta, *delta = p->delta, *omega = p->omega;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB;
    if (B < 1 || T < 1 || H < 1 || NB < 1 ||
        p->scratch_floats < path_integration_backward_scratch_floats(p))
        return MF_EINVAL;
    const int64_t M = H * NB, w = block_width(B, M), nblk = (M + w - 1) / w;
    const int64_t items = B * nblk;
    double *partial = (double *)p->scratch; /* (B, M) */
#pragma omp parallel if (B * T * M >= PI_MIN_PARALLEL)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t b = it / nblk, m0 = (it % nblk) * w;
            int64_t n = M - m0 < w ? M - m0 : w;
            backward_block(ddelta + b * T * M + m0, partial + b * M + m0,
                           dtheta + b * T * M + m0, delta + b * T * M + m0, omega + m0, T, M,
                           n);
        }
        /* implicit barrier: every partial is written */
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            double s = 0.0;
            for (int64_t b = 0; b < B; b++) s += partial[b * M + m];
            domega[m] = (float)((double)domega[m] + s);
        }
    }
    return MF_OK;
}
