/* AdamW on the GPU: one fused in-place step over a flat buffer (the math and checks of
 * csrc/ops/adamw.c; the bias corrections once in double on the host, the element update in
 * float32):
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr wd [mask] p + (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
 * One thread per element in a grid-stride loop (256 threads a block). */
#include "common.cuh"

#define ADAMW_THREADS 256

struct AdamwScalars {
    float a1, a2, step_size, inv_sqrt_bc2, lr_wd;
};

__global__ void adamw_kernel(MfAdamwParams p, AdamwScalars s) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float g = p.grads[i];
        const float m = p.beta1 * p.m[i] + s.a1 * g;
        const float v = p.beta2 * p.v[i] + s.a2 * (g * g);
        const float denom = sqrtf(v) * s.inv_sqrt_bc2 + p.eps;
        const float x = p.params[i];
        const float decay = p.decay_mask[i] ? s.lr_wd * x : 0.0f;
        p.params[i] = x - decay - s.step_size * (m / denom);
        p.m[i] = m;
        p.v[i] = v;
    }
}

extern "C" int adamw_step_cuda(const MfAdamwParams *p, cudaStream_t stream) {
    if (p->n < 1 || p->step < 1 || !isfinite(p->lr) || p->lr < 0.0f
        || !(p->beta1 >= 0.0f && p->beta1 < 1.0f) || !(p->beta2 >= 0.0f && p->beta2 < 1.0f)
        || !isfinite(p->eps) || !(p->eps > 0.0f) || !isfinite(p->weight_decay)
        || p->weight_decay < 0.0f)
        return MF_EINVAL;
    const double bc1 = 1.0 - pow((double)p->beta1, (double)p->step);
    const double bc2 = 1.0 - pow((double)p->beta2, (double)p->step);
    AdamwScalars s;
    s.a1 = 1.0f - p->beta1;
    s.a2 = 1.0f - p->beta2;
    s.step_size = (float)((double)p->lr / bc1);
    s.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    s.lr_wd = (float)((double)p->lr * (double)p->weight_decay);
    const unsigned grid = mf_blocks(p->n, ADAMW_THREADS);
    return MF_LAUNCH(adamw_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(ADAMW_THREADS), 0, stream, *p, s);
}
