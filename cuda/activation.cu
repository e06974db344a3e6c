/* SiLU, softplus and the SiLU gate on the GPU, elementwise over n floats (the math of
 * csrc/ops/activation.c):
 *   silu:      y = x s, s = sigmoid(x);               dx = dy s (1 + x (1 - s))
 *   softplus:  y = max(x, 0) + log1p(exp(-|x|)) (x <= 20), x (x > 20);  dx = dy s, dy (x > 20)
 *   silu_gate: out = y silu(z);    dy = dout silu(z), dz = dout y silu'(z)
 * Forward saves nothing; dx, dy and dz are activation gradients (=). One thread per element
 * in a grid-stride loop (256 threads a block). */
#include "common.cuh"

#define ACT_THREADS 256
#define SOFTPLUS_THRESHOLD 20.0f

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void silu_forward_kernel(MfActivationParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) p.y[i] = p.x[i] * sigmoid(p.x[i]);
}

__global__ void silu_backward_kernel(MfActivationParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float x = p.x[i], s = sigmoid(x);
        p.dx[i] = p.dy[i] * (s * (1.0f + x * (1.0f - s)));
    }
}

__global__ void softplus_forward_kernel(MfActivationParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float x = p.x[i];
        p.y[i] = x > SOFTPLUS_THRESHOLD ? x : fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
    }
}

__global__ void softplus_backward_kernel(MfActivationParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float x = p.x[i];
        p.dx[i] = x > SOFTPLUS_THRESHOLD ? p.dy[i] : p.dy[i] * sigmoid(x);
    }
}

__global__ void silu_gate_forward_kernel(MfSiluGateParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float z = p.z[i];
        p.out[i] = p.y[i] * (z * sigmoid(z));
    }
}

__global__ void silu_gate_backward_kernel(MfSiluGateParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) {
        const float g = p.dout[i], z = p.z[i], s = sigmoid(z);
        p.dy[i] = g * (z * s);
        p.dz[i] = (g * p.y[i]) * (s * (1.0f + z * (1.0f - s)));
    }
}

static unsigned act_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, ACT_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

#define ACT_ENTRY(name, Params)                                                               \
    extern "C" int name##_cuda(const Params *p, cudaStream_t stream) {                       \
        if (p->n < 1) return MF_EINVAL;                                                       \
        return MF_LAUNCH(name##_kernel, dim3(act_grid(p->n)), dim3(ACT_THREADS), 0, stream,  \
                         *p);                                                                 \
    }

ACT_ENTRY(silu_forward, MfActivationParams)
ACT_ENTRY(silu_backward, MfActivationParams)
ACT_ENTRY(softplus_forward, MfActivationParams)
ACT_ENTRY(softplus_backward, MfActivationParams)
ACT_ENTRY(silu_gate_forward, MfSiluGateParams)
ACT_ENTRY(silu_gate_backward, MfSiluGateParams)
