/* Exponential moving average in place on the GPU (the math and checks of csrc/ops/ema.c):
 * target = decay target + (1 - decay) source, 1 - decay rounded to float32 once on the host.
 * One thread per element in a grid-stride loop (256 threads a block). */
#include "common.cuh"

#define EMA_THREADS 256

__global__ void ema_kernel(MfEmaParams p, float b) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE)
        p.target[i] = p.decay * p.target[i] + b * p.source[i];
}

extern "C" int ema_update_cuda(const MfEmaParams *p, cudaStream_t stream) {
    if (p->n < 1 || !(p->decay >= 0.0f && p->decay < 1.0f)) return MF_EINVAL;
    const float b = (float)(1.0 - (double)p->decay);
    const unsigned grid = mf_blocks(p->n, EMA_THREADS);
    return MF_LAUNCH(ema_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(EMA_THREADS), 0, stream, *p, b);
}
