/* APE's multiplicative distance decay on the GPU (csrc/ops/ape.c's ape_decay math): per token
 * t of q and k, q_out = gamma^(t - c) q, k_out = gamma^(c - t) k, c = (T - 1) / 2, each
 * scale exp(+-(t - c) ln gamma) computed in double and rounded to float; the backward scales
 * dq_out and dk_out the same way (gamma a constant). One thread per element (grid-stride).
 * ape_apply and the generator-side APE ops have no CUDA kernels yet. */
#include "common.cuh"

#define APE_THREADS 256

__global__ void ape_decay_kernel(float *qo, float *ko, const float *q, const float *k,
                                 int64_t n, int64_t T, int64_t R, double lg) {
    const double c = (double)(T - 1) / 2.0;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const double e = ((double)((i / R) % T) - c) * lg;
        qo[i] = (float)exp(e) * q[i];
        ko[i] = (float)exp(-e) * k[i];
    }
}

static int ape_decay_ok(const MfApeDecayParams *p) {
    return p->B >= 1 && p->T >= 1 && p->H >= 1 && p->D >= 1 && p->gamma > 0.0f
           && isfinite(p->gamma)
           && fabs(log((double)p->gamma)) * (double)(p->T - 1) / 2.0 <= APE_DECAY_MAX_LOG;
}

static int ape_decay_launch(float *qo, float *ko, const float *q, const float *k,
                            const MfApeDecayParams *p, cudaStream_t stream) {
    const int64_t n = p->B * p->T * p->H * p->D;
    const unsigned grid = mf_blocks(n, APE_THREADS);
    return MF_LAUNCH(ape_decay_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(APE_THREADS), 0, stream, qo, ko, q, k, n, p->T, p->H * p->D,
                     log((double)p->gamma));
}

extern "C" int ape_decay_forward_cuda(const MfApeDecayParams *p, cudaStream_t stream) {
    if (!ape_decay_ok(p)) return MF_EINVAL;
    return ape_decay_launch(p->q_out, p->k_out, p->q, p->k, p, stream);
}

extern "C" int ape_decay_backward_cuda(const MfApeDecayParams *p, cudaStream_t stream) {
    if (!ape_decay_ok(p)) return MF_EINVAL;
    return ape_decay_launch(p->dq, p->dk, p->dq_out, p->dk_out, p, stream);
}
