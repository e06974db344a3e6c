/* Global L2 norm and gradient clipping on the GPU (csrc/ops/grad_norm.c's rules):
 *   *norm = sqrt(sum_i x_i^2), squares summed in double;
 *   clip: when *norm > max_norm (and finite), grads *= max_norm / (*norm + 1e-6).
 * The struct has no scratch, so the sum is one block of 1024 threads (a grid-stride loop, a
 * fixed tree: deterministic, and reentrant on concurrent streams; one multiprocessor's
 * bandwidth, a first version). norm is a device pointer; the clip kernel reads it there (no
 * host synchronization). */
#include "common.cuh"

#define NORM_THREADS 1024

__global__ void grad_norm_kernel(double *norm, const float *x, int64_t n) {
    __shared__ double buf[NORM_THREADS];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i] * (double)x[i];
    s = mf_block_reduce(s, buf, MfSum());
    if (threadIdx.x == 0) *norm = sqrt(s);
}

__global__ void clip_kernel(float *grads, const double *norm, int64_t n, float max_norm) {
    const double v = *norm;
    if (!isfinite(v) || !(v > (double)max_norm)) return;
    const float scale = (float)((double)max_norm / (v + 1e-6));
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) grads[i] *= scale;
}

extern "C" int global_norm_cuda(const MfGradNormParams *p, cudaStream_t stream) {
    if (p->n < 1 || p->norm == NULL || p->x == NULL) return MF_EINVAL;
    return MF_LAUNCH(grad_norm_kernel, dim3(1), dim3(NORM_THREADS), 0, stream, p->norm, p->x,
                     p->n);
}

extern "C" int clip_grad_norm_cuda(const MfGradNormParams *p, cudaStream_t stream) {
    if (p->n < 1 || !(p->max_norm > 0.0f) || p->norm == NULL || p->grads == NULL)
        return MF_EINVAL;
    const int status = MF_LAUNCH(grad_norm_kernel, dim3(1), dim3(NORM_THREADS), 0, stream,
                                 p->norm, p->grads, p->n);
    if (status != MF_OK) return status;
    const unsigned grid = mf_blocks(p->n, 256);
    return MF_LAUNCH(clip_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID), dim3(256), 0,
                     stream, p->grads, p->norm, p->n, p->max_norm);
}
