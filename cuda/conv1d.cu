/* Depthwise causal convolution along t on the GPU (csrc/ops/conv1d.c's math):
 *   c[b, t, e] = bias[e] + sum_{j < W} weight[e, j] x[b, t - W + 1 + j, e]  (x = 0 before 0)
 *   y = c, or silu(c) with p.silu
 *   backward, g = dy, or dy silu'(c) with p.silu (c recomputed where g is read):
 *             dx[b, u, e] = sum_j weight[e, j] g[b, u + W - 1 - j, e] (=);
 *             dweight[e, j] += sum_{b, t} g[b, t, e] x[b, t - W + 1 + j, e];
 *             dbias[e] += sum_{b, t} g[b, t, e].
 * One thread per element of y / dx (grid-stride); the parameter gradients as double column
 * sums over the (b, t) rows (mf_column_sums2: deterministic, no scratch: the struct's scratch
 * is ignored). */
#include "common.cuh"

#define CONV_THREADS 256

__device__ float conv_at(const MfConv1dParams &p, int64_t b, int64_t t, int64_t e) {
    float s = p.bias[e];
    for (int64_t j = 0; j < p.W; j++) {
        const int64_t u = t - p.W + 1 + j;
        if (u >= 0) s += p.weight[e * p.W + j] * p.x[(b * p.T + u) * p.E + e];
    }
    return s;
}

__device__ float sigmoid_of(float c) { return 1.0f / (1.0f + expf(-c)); }

/* g[b, t, e]: dy, or dy silu'(c) */
__device__ float grad_at(const MfConv1dParams &p, int64_t b, int64_t t, int64_t e) {
    const float g = p.dy[(b * p.T + t) * p.E + e];
    if (!p.silu) return g;
    const float c = conv_at(p, b, t, e), s = sigmoid_of(c);
    return g * (s * (1.0f + c * (1.0f - s)));
}

__global__ void conv1d_forward_kernel(MfConv1dParams p) {
    const int64_t n = p.B * p.T * p.E;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const int64_t e = i % p.E, t = (i / p.E) % p.T, b = i / (p.E * p.T);
        const float c = conv_at(p, b, t, e);
        p.y[i] = p.silu ? c * sigmoid_of(c) : c;
    }
}

__global__ void conv1d_dx_kernel(MfConv1dParams p) {
    const int64_t n = p.B * p.T * p.E;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const int64_t e = i % p.E, u = (i / p.E) % p.T, b = i / (p.E * p.T);
        float s = 0.0f;
        for (int64_t j = 0; j < p.W; j++) {
            const int64_t t = u + p.W - 1 - j;
            if (t < p.T) s += p.weight[e * p.W + j] * grad_at(p, b, t, e);
        }
        p.dx[i] = s;
    }
}

MF_COLUMN_KERNEL void conv1d_params_kernel(MfConv1dParams p) {
    /* columns j E + e: j < W is dweight[e, j], j = W is dbias[e]; rows b T + t */
    mf_column_sums2(
        p.B * p.T, (p.W + 1) * p.E,
        [&](int64_t r, int64_t i, double &acc, double &) {
            const int64_t j = i / p.E, e = i % p.E, b = r / p.T, t = r % p.T, s = p.W - 1 - j;
            if (j < p.W && t < s) return;
            const float dy = grad_at(p, b, t, e);
            acc += j < p.W ? (double)dy * p.x[(b * p.T + t - s) * p.E + e] : (double)dy;
        },
        [&](int64_t i, double acc, double) {
            const int64_t j = i / p.E, e = i % p.E;
            if (j < p.W)
                p.dweight[e * p.W + j] = (float)((double)p.dweight[e * p.W + j] + acc);
            else
                p.dbias[e] = (float)((double)p.dbias[e] + acc);
        });
}

static unsigned conv_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, CONV_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

static int conv_bad(const MfConv1dParams *p) {
    return p->B < 1 || p->T < 1 || p->E < 1 || p->W < 1 || (p->silu && p->bias == NULL);
}

extern "C" int causal_conv1d_forward_cuda(const MfConv1dParams *p, cudaStream_t stream) {
    if (conv_bad(p)) return MF_EINVAL;
    return MF_LAUNCH(conv1d_forward_kernel, dim3(conv_grid(p->B * p->T * p->E)),
                     dim3(CONV_THREADS), 0, stream, *p);
}

extern "C" int causal_conv1d_backward_cuda(const MfConv1dParams *p, cudaStream_t stream) {
    if (conv_bad(p)) return MF_EINVAL;
    const int status = MF_LAUNCH(conv1d_dx_kernel, dim3(conv_grid(p->B * p->T * p->E)),
                                 dim3(CONV_THREADS), 0, stream, *p);
    if (status != MF_OK) return status;
    return MF_LAUNCH(conv1d_params_kernel, mf_column_grid((p->W + 1) * p->E),
                     mf_column_block(), 0, stream, *p);
}
