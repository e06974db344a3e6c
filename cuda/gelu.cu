/* GELU on the GPU, elementwise over n floats (the math of csrc/ops/gelu.c):
 *   tanh approximation (exact = 0): y = x / (1 + e), e = exp(-2u),
 *       u = sqrt(2/pi) (x + 0.044715 x^3)
 *       dx = dy (s + 2 x s (1 - s) du/dx), s = 1 / (1 + e), du/dx = sqrt(2/pi) (1 + 3 0.044715 x^2)
 *   exact (exact = 1): y = x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2,
 *       dx = dy (Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi))
 * Forward saves nothing; dx is an activation gradient (=). One thread per element in a
 * grid-stride loop (256 threads a block). */
#include "common.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f
#define GELU_THREADS 256

__device__ __forceinline__ float gelu_e(float x) {
    return expf(-2.0f * GELU_K * (x + GELU_C * x * x * x));
}

__global__ void gelu_forward_kernel(MfGeluParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float x = p.x[i];
        p.y[i] = p.exact ? 0.5f * x * erfcf(-x * INV_SQRT2) : x / (1.0f + gelu_e(x));
    }
}

__global__ void gelu_backward_kernel(MfGeluParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float x = p.x[i];
        float g;
        if (p.exact) {
            g = 0.5f * erfcf(-x * INV_SQRT2) + x * expf(-0.5f * x * x) * INV_SQRT_2PI;
        } else {
            const float e = gelu_e(x), s = 1.0f / (1.0f + e);
            const float one_minus_s = e > 1.0f ? 1.0f - s : e * s; /* no cancellation */
            g = s + 2.0f * x * s * one_minus_s * (GELU_K * (1.0f + 3.0f * GELU_C * x * x));
        }
        p.dx[i] = p.dy[i] * g;
    }
}

static int gelu_check(const MfGeluParams *p) {
    return p->n >= 1 && (p->exact == 0 || p->exact == 1) ? MF_OK : MF_EINVAL;
}

extern "C" int gelu_forward_cuda(const MfGeluParams *p, cudaStream_t stream) {
    if (gelu_check(p) != MF_OK) return MF_EINVAL;
    const unsigned grid = mf_blocks(p->n, GELU_THREADS);
    return MF_LAUNCH(gelu_forward_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(GELU_THREADS), 0, stream, *p);
}

extern "C" int gelu_backward_cuda(const MfGeluParams *p, cudaStream_t stream) {
    if (gelu_check(p) != MF_OK) return MF_EINVAL;
    const unsigned grid = mf_blocks(p->n, GELU_THREADS);
    return MF_LAUNCH(gelu_backward_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(GELU_THREADS), 0, stream, *p);
}
