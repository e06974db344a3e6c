/* Path integration on the GPU (MapFormer eq. 12; the math of csrc/ops/path_integration.c):
 *   forward:  theta = wrap(omega cumsum_t(delta)), the sum and the product in double, reduced
 *             to [-pi, pi) (wrap(a) = a - 2 pi floor(a / (2 pi) + 1/2)) before rounding;
 *   backward: R[t] = sum_{s >= t} dtheta[s] (double), ddelta[t] = omega R[t] (=),
 *             domega += sum_{b, t} delta[t] R[t] (the same sum by parts).
 * One thread per sequence column (b, h, i), scanning t (consecutive threads read consecutive
 * columns). domega: each thread writes its double partial to the caller's scratch (B, M),
 * M = H NB, and a second kernel sums them over b in order (deterministic, no atomics). */
#include "common.cuh"

#define PI_THREADS 256
#define TWO_PI 6.283185307179586476925
#define INV_TWO_PI 0.159154943091895335768883763

__global__ void path_integration_forward_kernel(MfPathIntegrationParams p) {
    const int64_t M = p.H * p.NB;
    for (int64_t col = MF_GRID_START; col < p.B * M; col += MF_GRID_STRIDE) {
        const int64_t b = col / M, m = col - b * M;
        const double om = (double)p.omega[m];
        double acc = 0.0;
        for (int64_t t = 0; t < p.T; t++) {
            const int64_t j = (b * p.T + t) * M + m;
            acc += (double)p.delta[j];
            const double a = om * acc;
            p.theta[j] = (float)(a - TWO_PI * floor(a * INV_TWO_PI + 0.5));
        }
    }
}

__global__ void path_integration_backward_kernel(MfPathIntegrationParams p, double *partial) {
    const int64_t M = p.H * p.NB;
    for (int64_t col = MF_GRID_START; col < p.B * M; col += MF_GRID_STRIDE) {
        const int64_t b = col / M, m = col - b * M;
        const double om = (double)p.omega[m];
        double rsum = 0.0, acc = 0.0;
        for (int64_t t = p.T - 1; t >= 0; t--) {
            const int64_t j = (b * p.T + t) * M + m;
            rsum += (double)p.dtheta[j];
            p.ddelta[j] = (float)(om * rsum);
            acc += (double)p.delta[j] * rsum;
        }
        partial[col] = acc;
    }
}

__global__ void path_integration_domega_kernel(MfPathIntegrationParams p, const double *partial) {
    const int64_t M = p.H * p.NB;
    for (int64_t m = MF_GRID_START; m < M; m += MF_GRID_STRIDE) {
        double s = 0.0;
        for (int64_t b = 0; b < p.B; b++) s += partial[b * M + m];
        p.domega[m] = (float)((double)p.domega[m] + s);
    }
}

static unsigned pi_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, PI_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

extern "C" int path_integration_forward_cuda(const MfPathIntegrationParams *p,
                                             cudaStream_t stream) {
    if (p->B < 1 || p->T < 1 || p->H < 1 || p->NB < 1) return MF_EINVAL;
    return MF_LAUNCH(path_integration_forward_kernel, dim3(pi_grid(p->B * p->H * p->NB)),
                     dim3(PI_THREADS), 0, stream, *p);
}

/* the domega partials (B, H NB) in double, in floats of device scratch */
extern "C" int64_t path_integration_backward_cuda_scratch_floats(
    const MfPathIntegrationParams *p) {
    return 2 * p->B * p->H * p->NB;
}

extern "C" int path_integration_backward_cuda(const MfPathIntegrationParams *p,
                                              cudaStream_t stream) {
    if (p->B < 1 || p->T < 1 || p->H < 1 || p->NB < 1 || p->scratch == NULL
        || p->scratch_floats < path_integration_backward_cuda_scratch_floats(p)
        || (uintptr_t)p->scratch % 8 != 0)
        return MF_EINVAL;
    double *partial = (double *)p->scratch;
    const int status = MF_LAUNCH(path_integration_backward_kernel,
                                 dim3(pi_grid(p->B * p->H * p->NB)), dim3(PI_THREADS), 0, stream,
                                 *p, partial);
    if (status != MF_OK) return status;
    return MF_LAUNCH(path_integration_domega_kernel, dim3(pi_grid(p->H * p->NB)),
                     dim3(PI_THREADS), 0, stream, *p, partial);
}
