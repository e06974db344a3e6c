/* AdamW (PyTorch's, decoupled weight decay), one fused in-place pass over a flat buffer.
 *
 * Saves nothing: m and v are the optimizer state, updated in place with params.
 *   m = beta1 m + (1 - beta1) g
 *   v = beta2 v + (1 - beta2) g^2
 *   p -= lr * (weight_decay * [decay_mask] * p + (m / (1 - beta1^step)) /
 *              (sqrt(v / (1 - beta2^step)) + eps))
 * The decay uses the parameter before this step's update, as the reference does. Bias
 * corrections are computed once in double; the element loop is float32. It is compiled for
 * AVX-512, AVX2 and baseline x86-64 (picked at load time) but GCC vectorises it only under
 * -fno-math-errno (sqrtf's errno branch is control flow in the loop; optimize attributes do
 * not reach it); the pass is memory-bound (29 bytes per element) either way.
 */
#include <math.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

/* elements per OpenMP work item; below two chunks the step runs on one thread */
#define MF_ADAMW_CHUNK 32768

MF_CLONES
static void adamw_kernel(float *restrict p, float *restrict m, float *restrict v,
                         const float *restrict g, const uint8_t *restrict mask, int64_t n,
                         float beta1, float beta2, float eps, float lr_wd, float step_size,
                         float inv_sqrt_bc2) {
    const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = beta1 * m[i] + a1 * gi;
        float vi = beta2 * v[i] + a2 * (gi * gi);
        float denom = __builtin_sqrtf(vi) * inv_sqrt_bc2 + eps;
        float pi = p[i];
        float decay = mask[i] ? lr_wd * pi : 0.0f;
        p[i] = pi - decay - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

int adamw_step(const MfAdamwParams *p) {
    float *params = p->params, *m = p->m, *v = p->v;
    const float *grads = p->grads;
    const uint8_t *decay_mask = p->decay_mask;
    const int64_t n = p->n, step = p->step;
    const float lr = p->lr, beta1 = p->beta1, beta2 = p->beta2, eps = p->eps;
    const float weight_decay = p->weight_decay;
    if (n < 1 || step < 1 || !isfinite(lr) || lr < 0.0f || !(beta1 >= 0.0f && beta1 < 1.0f) ||
        !(beta2 >= 0.0f && beta2 < 1.0f) || !isfinite(eps) || !(eps > 0.0f) ||
        !isfinite(weight_decay) || weight_decay < 0.0f)
        return MF_EINVAL;
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const double bc2 = 1.0 - pow((double)beta2, (double)step);
    /* m / bc1 / (sqrt(v / bc2) + eps) = (1 / bc1) m / (sqrt(v) / sqrt(bc2) + eps) */
    const float step_size = (float)((double)lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float lr_wd = (float)((double)lr * (double)weight_decay);
    const int64_t chunks = (n + MF_ADAMW_CHUNK - 1) / MF_ADAMW_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_ADAMW_CHUNK, len = n - i0 < MF_ADAMW_CHUNK ? n - i0 : MF_ADAMW_CHUNK;
        adamw_kernel(params + i0, m + i0, v + i0, grads + i0, decay_mask + i0, len, beta1,
                     beta2, eps, lr_wd, step_size, inv_sqrt_bc2);
    }
    return MF_OK;
}
