/* Token embedding on the GPU (csrc/ops/embedding.c's math): out[n, :] = weight[tokens[n], :];
 * dweight[tokens[n], :] += dout[n, :] (a parameter gradient, +=).
 * One thread per element (n, c) in a grid-stride loop. The backward adds with atomicAdd, so
 * rows whose token repeats are summed in an unspecified order (the last bits may differ from
 * run to run). Token ids are checked where they are read, but a kernel cannot return a status
 * without synchronizing the stream: an id outside [0, V) gives a row of zeros in the forward
 * and adds nothing in the backward (the CPU op returns MF_EINDEX); callers check ids first. */
#include "common.cuh"

#define EMB_THREADS 256

__global__ void embedding_forward_kernel(MfEmbeddingParams p) {
    for (int64_t i = MF_GRID_START; i < p.N * p.C; i += MF_GRID_STRIDE) {
        const int64_t n = i / p.C, c = i - n * p.C, v = p.tokens[n];
        p.out[i] = v >= 0 && v < p.V ? p.weight[v * p.C + c] : 0.0f;
    }
}

__global__ void embedding_backward_kernel(MfEmbeddingParams p) {
    for (int64_t i = MF_GRID_START; i < p.N * p.C; i += MF_GRID_STRIDE) {
        const int64_t n = i / p.C, c = i - n * p.C, v = p.tokens[n];
        if (v >= 0 && v < p.V) atomicAdd(p.dweight + v * p.C + c, p.dout[i]);
    }
}

static unsigned emb_grid(const MfEmbeddingParams *p) {
    const unsigned grid = mf_blocks(p->N * p->C, EMB_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

extern "C" int embedding_forward_cuda(const MfEmbeddingParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->V < 1 || p->C < 1) return MF_EINVAL;
    return MF_LAUNCH(embedding_forward_kernel, dim3(emb_grid(p)), dim3(EMB_THREADS), 0, stream,
                     *p);
}

extern "C" int embedding_backward_cuda(const MfEmbeddingParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->V < 1 || p->C < 1) return MF_EINVAL;
    return MF_LAUNCH(embedding_backward_kernel, dim3(emb_grid(p)), dim3(EMB_THREADS), 0, stream,
                     *p);
}
