/* Global L2 norm of a flat buffer, and gradient clipping by that norm.
 *
 * Saves nothing; clip_grad_norm scales grads in place (=).
 *   *norm = sqrt(sum_i x_i^2), squares summed in double.
 *   clip: when *norm > max_norm, grads *= max_norm / (*norm + 1e-6) (PyTorch's rule).
 *         max_norm = +inf never clips (the norm is still computed). A non-finite norm (NaN or
 *         inf in grads) leaves grads untouched and is returned as is, so that the caller can
 *         see it and skip the step; scaling by max_norm / inf would turn every finite gradient
 *         into 0 and every inf into NaN.
 * Determinism: the buffer is cut into at most MF_NORM_BLOCKS blocks, a function of n only;
 * each block's sum of squares goes to its own slot and the slots are added in block order, so
 * the norm is bit-identical for any thread count.
 */
#include <math.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#define MF_NORM_BLOCKS 256
#define MF_NORM_MIN_BLOCK 4096
#define MF_NORM_LANES 8

/* sum of squares of x[0:n] in double, 8 lanes (vectorisable without -ffast-math; the lane
 * order is fixed by the source, so every clone gives the same bits) */
MF_CLONES
static double sum_squares(const float *restrict x, int64_t n) {
    const int64_t nv = n - n % MF_NORM_LANES;
    double acc[MF_NORM_LANES] = {0};
    for (int64_t i = 0; i < nv; i += MF_NORM_LANES)
        for (int j = 0; j < MF_NORM_LANES; j++) {
            double v = (double)x[i + j];
            acc[j] += v * v;
        }
    double s = 0.0;
    for (int j = 0; j < MF_NORM_LANES; j++) s += acc[j];
    for (int64_t i = nv; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

/* *norm = ||x (n,)|| */
static int norm_of(double *norm, const float *x, int64_t n) {
    if (n < 1) return MF_EINVAL;
    int64_t nb = (n + MF_NORM_MIN_BLOCK - 1) / MF_NORM_MIN_BLOCK;
    if (nb > MF_NORM_BLOCKS) nb = MF_NORM_BLOCKS;
    double part[MF_NORM_BLOCKS];
#pragma omp parallel for schedule(dynamic, 1) if (nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = n * b / nb, i1 = n * (b + 1) / nb;
        part[b] = sum_squares(x + i0, i1 - i0);
    }
    double s = 0.0;
    for (int64_t b = 0; b < nb; b++) s += part[b];
    *norm = sqrt(s);
    return MF_OK;
}

int global_norm(const MfGradNormParams *p) { return norm_of(p->norm, p->x, p->n); }

int clip_grad_norm(const MfGradNormParams *p) {
    double *norm = p->norm;
    float *grads = p->grads;
    const int64_t n = p->n;
    const float max_norm = p->max_norm;
    if (n < 1 || !(max_norm > 0.0f)) return MF_EINVAL; /* NaN fails too; +inf is allowed */
    int status = norm_of(norm, grads, n);
    if (status != MF_OK) return status;
    if (!isfinite(*norm) || !(*norm > (double)max_norm)) return MF_OK;
    const float scale = (float)((double)max_norm / (*norm + 1e-6));
#pragma omp parallel for schedule(dynamic, 16384) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) grads[i] *= scale;
    return MF_OK;
}
