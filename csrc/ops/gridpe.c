/* GridPE's complex form (Li et al., GridPE, eq. 22 read with its conjugate): each real channel
 * d of a query or key is multiplied by its own complex exponential e^{i theta_d}, the real and
 * imaginary parts stored side by side:
 *   y[b, t, h, 2d] = x[b, t, h, d] cos theta[tb, t, h, d],
 *   y[b, t, h, 2d + 1] = x[b, t, h, d] sin theta[tb, t, h, d],
 * (tb = b when TB = B, 0 when TB = 1), so that a dot product of two such rows is
 * Re(sum_d conj(x_d e^{i theta_d(m)}) x'_d e^{i theta_d(n)}) = sum_d x_d x'_d
 * cos(theta_d(m) - theta_d(n)): a cosine kernel per channel, a function of the displacement
 * when theta is linear in the position. It is the rotary op applied to the pairs (x_d, 0).
 *
 * Forward saves nothing. Gradient rule (an activation gradient, =):
 *   dx[d] = cos theta_d dy[2d] + sin theta_d dy[2d + 1];
 * theta is fixed (GridPE's frequencies are not learned): no theta gradient.
 * With theta = 0 the forward pads x with zeros (x_d, 0) and the backward picks the even
 * channels, which is how the scheme widens the values and narrows the attention's output.
 * cos and sin are taken in double of the float angle (any magnitude), rounded once.
 * Parallel over (b, t) rows; every output element is computed by one thread from its own
 * inputs, so the bits do not depend on the thread count.
 */
#include <math.h>
#include <stdint.h>

#include "mapformer/mapformer.h"

#define GRIDPE_MIN_PARALLEL 16384 /* B*T*H*W below this runs on one thread */

static int sizes_ok(const MfGridpeParams *p) {
    return p->B >= 1 && p->T >= 1 && p->H >= 1 && p->W >= 2 && p->W % 2 == 0 &&
           (p->TB == 1 || p->TB == p->B);
}

int gridpe_complex_forward(const MfGridpeParams *p) {
    if (!sizes_ok(p)) return MF_EINVAL;
    const int64_t T = p->T, R = p->H * (p->W / 2), rows = p->B * p->T;
#pragma omp parallel for schedule(static) if (rows * R * 2 >= GRIDPE_MIN_PARALLEL)
    for (int64_t i = 0; i < rows; i++) {
        const int64_t tb = p->TB == 1 ? 0 : i / T, t = i % T;
        const float *restrict th = p->theta + (tb * T + t) * R;
        const float *restrict x = p->x + i * R;
        float *restrict y = p->y + i * 2 * R;
        for (int64_t j = 0; j < R; j++) {
            const double a = (double)th[j], v = (double)x[j];
            y[2 * j] = (float)(v * cos(a));
            y[2 * j + 1] = (float)(v * sin(a));
        }
    }
    return MF_OK;
}

int gridpe_complex_backward(const MfGridpeParams *p) {
    if (!sizes_ok(p)) return MF_EINVAL;
    const int64_t T = p->T, R = p->H * (p->W / 2), rows = p->B * p->T;
#pragma omp parallel for schedule(static) if (rows * R * 2 >= GRIDPE_MIN_PARALLEL)
    for (int64_t i = 0; i < rows; i++) {
        const int64_t tb = p->TB == 1 ? 0 : i / T, t = i % T;
        const float *restrict th = p->theta + (tb * T + t) * R;
        const float *restrict dy = p->dy + i * 2 * R;
        float *restrict dx = p->dx + i * R;
        for (int64_t j = 0; j < R; j++) {
            const double a = (double)th[j];
            dx[j] = (float)(cos(a) * (double)dy[2 * j] + sin(a) * (double)dy[2 * j + 1]);
        }
    }
    return MF_OK;
}
