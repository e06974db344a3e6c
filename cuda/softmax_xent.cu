/* Masked softmax cross-entropy on the GPU (csrc/ops/softmax_xent.c's math):
 *   forward:  losses[n] = logsumexp(logits[n]) - logits[n, target[n]] for every row;
 *             *loss = sum(mask losses) / sum(mask) in double (0 when sum(mask) = 0);
 *   backward: dlogits = scale mask[n] (softmax(logits[n]) - onehot(target[n])) (=).
 * One block of 256 threads per row (rows in a grid-stride loop): the row's max and sum of
 * exponentials by fixed shared-memory trees; the loss by one block summing the rows in a
 * fixed order (deterministic). A target outside [0, V) gives a NaN loss for its row and a
 * dlogits row without the one-hot term (a kernel cannot return a status without synchronizing
 * the stream; the CPU op returns MF_EINDEX). */
#include "common.cuh"

#define XENT_THREADS 256

/* max and sum of exp(x - max) over the row, in every thread of the block */
__device__ __forceinline__ void xent_row(const float *x, int64_t V, float *buf, float *mx,
                                         float *sum) {
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    m = mf_block_reduce(m, buf, MfMax());
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - m);
    *sum = mf_block_reduce(s, buf, MfSum());
    *mx = m;
}

__global__ void softmax_xent_losses_kernel(MfSoftmaxXentParams p) {
    __shared__ float buf[XENT_THREADS];
    for (int64_t n = blockIdx.x; n < p.N; n += gridDim.x) {
        const float *x = p.logits + n * p.V;
        float m, s;
        xent_row(x, p.V, buf, &m, &s);
        if (threadIdx.x == 0) {
            const int64_t target = p.targets[n];
            p.losses[n] = target >= 0 && target < p.V ? m + logf(s) - x[target] : NAN;
        }
    }
}

__global__ void softmax_xent_loss_kernel(MfSoftmaxXentParams p) {
    __shared__ double buf[XENT_THREADS];
    double num = 0.0, den = 0.0;
    for (int64_t n = threadIdx.x; n < p.N; n += blockDim.x) {
        num += (double)p.mask[n] * (double)p.losses[n];
        den += (double)p.mask[n];
    }
    num = mf_block_reduce(num, buf, MfSum());
    den = mf_block_reduce(den, buf, MfSum());
    if (threadIdx.x == 0) *p.loss = den != 0.0 ? num / den : 0.0;
}

__global__ void softmax_xent_backward_kernel(MfSoftmaxXentParams p) {
    __shared__ float buf[XENT_THREADS];
    for (int64_t n = blockIdx.x; n < p.N; n += gridDim.x) {
        const float *x = p.logits + n * p.V;
        float m, s;
        xent_row(x, p.V, buf, &m, &s);
        const float g = p.scale * p.mask[n], inv = 1.0f / s;
        const int64_t target = p.targets[n];
        for (int64_t v = threadIdx.x; v < p.V; v += blockDim.x)
            p.dlogits[n * p.V + v] = g * (expf(x[v] - m) * inv - (v == target ? 1.0f : 0.0f));
    }
}

static unsigned xent_rows(int64_t N) { return N < MF_MAX_GRID ? (unsigned)N : MF_MAX_GRID; }

extern "C" int softmax_xent_forward_cuda(const MfSoftmaxXentParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->V < 1) return MF_EINVAL;
    const int status = MF_LAUNCH(softmax_xent_losses_kernel, dim3(xent_rows(p->N)),
                                 dim3(XENT_THREADS), 0, stream, *p);
    if (status != MF_OK || p->loss == NULL) return status;
    return MF_LAUNCH(softmax_xent_loss_kernel, dim3(1), dim3(XENT_THREADS), 0, stream, *p);
}

extern "C" int softmax_xent_backward_cuda(const MfSoftmaxXentParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->V < 1) return MF_EINVAL;
    return MF_LAUNCH(softmax_xent_backward_kernel, dim3(xent_rows(p->N)), dim3(XENT_THREADS), 0,
                     stream, *p);
}
