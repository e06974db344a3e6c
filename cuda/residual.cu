/* The residual stream on the GPU (csrc/ops/residual.c's math): out = a + b (forward);
 * dx += dout (backward: the stream's gradient reaching one branch). One thread per element in
 * a grid-stride loop. */
#include "common.cuh"

#define RES_THREADS 256

__global__ void residual_forward_kernel(MfResidualParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) p.out[i] = p.a[i] + p.b[i];
}

__global__ void residual_backward_kernel(MfResidualParams p) {
    for (int64_t i = MF_GRID_START; i < p.n; i += MF_GRID_STRIDE) p.dx[i] += p.dout[i];
}

static unsigned res_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, RES_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

extern "C" int residual_forward_cuda(const MfResidualParams *p, cudaStream_t stream) {
    if (p->n < 1) return MF_EINVAL;
    return MF_LAUNCH(residual_forward_kernel, dim3(res_grid(p->n)), dim3(RES_THREADS), 0, stream,
                     *p);
}

extern "C" int residual_backward_cuda(const MfResidualParams *p, cudaStream_t stream) {
    if (p->n < 1) return MF_EINVAL;
    return MF_LAUNCH(residual_backward_kernel, dim3(res_grid(p->n)), dim3(RES_THREADS), 0,
                     stream, *p);
}
