/* L2 normalisation of rows on the GPU (the math of csrc/ops/l2_normalize.c):
 *   forward:  norm = sqrt(sum_d x^2 + eps), y = x (1 / norm)   (norm saved);
 *   backward: dx = (dy - y (y . dy)) / norm.
 * One block of 128 threads per row (rows in a grid-stride loop); each thread sums its
 * columns' products in double, the block's sums by common.cuh's fixed shared-memory tree (the
 * same bits on every run); 1 / norm rounded once to float32 scales the row, as on the CPU. */
#include "common.cuh"

#define L2_THREADS 128

__global__ void l2_normalize_forward_kernel(MfL2NormalizeParams p) {
    __shared__ double buf[L2_THREADS];
    const int64_t D = p.D;
    for (int64_t row = blockIdx.x; row < p.N; row += gridDim.x) {
        const float *x = p.x + row * D;
        double s = 0.0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += (double)x[d] * (double)x[d];
        const double norm = sqrt(mf_block_reduce(s, buf, MfSum()) + (double)p.eps);
        const float inv = (float)(1.0 / norm);
        float *y = p.y + row * D;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) y[d] = x[d] * inv;
        if (threadIdx.x == 0) p.norm[row] = (float)norm;
    }
}

__global__ void l2_normalize_backward_kernel(MfL2NormalizeParams p) {
    __shared__ double buf[L2_THREADS];
    const int64_t D = p.D;
    for (int64_t row = blockIdx.x; row < p.N; row += gridDim.x) {
        const float *y = p.y_in + row * D, *dy = p.dy + row * D;
        double s = 0.0;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += (double)y[d] * (double)dy[d];
        const float dot = (float)mf_block_reduce(s, buf, MfSum());
        const float inv = (float)(1.0 / (double)p.norm_in[row]);
        float *dx = p.dx + row * D;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dx[d] = (dy[d] - y[d] * dot) * inv;
    }
}

static unsigned l2_rows(int64_t N) { return N < MF_MAX_GRID ? (unsigned)N : MF_MAX_GRID; }

extern "C" int l2_normalize_forward_cuda(const MfL2NormalizeParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->D < 1 || !(p->eps > 0.0f) || !isfinite(p->eps)) return MF_EINVAL;
    return MF_LAUNCH(l2_normalize_forward_kernel, dim3(l2_rows(p->N)), dim3(L2_THREADS), 0,
                     stream, *p);
}

extern "C" int l2_normalize_backward_cuda(const MfL2NormalizeParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->D < 1) return MF_EINVAL;
    return MF_LAUNCH(l2_normalize_backward_kernel, dim3(l2_rows(p->N)), dim3(L2_THREADS), 0,
                     stream, *p);
}
