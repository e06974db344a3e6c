/* MapEM-SLN positions on the GPU (csrc/ops/sln.c's math, in double as the C op): per head h
 * and 2x2 block k, A = [[a, b], [c, -a]] the trace-free part of gen, q = a^2 + b c,
 * Phi_t = cumsum_t delta, p[t] = C(Phi_t) p* + S(Phi_t) A p* (cosh / sinh or cos / sin of
 * |Phi| sqrt|q|, series near 0, the hyperbolic argument capped at clamp).
 * Forward: one thread per independent sequence (b, h, k), sequential in t (a cumulative sum
 * and a closed form per step: nothing to gain from a parallel scan at these lengths).
 * Backward: a block per (h, k), its threads over batch rows b, each walking its sequence in
 * reverse (ddelta = the reverse cumulative sum of dPhi, =), summing the block's dgen and
 * dstart terms in double; those are then summed over the block's threads by a fixed tree
 * (mf_block_reduce) and added once (+=): deterministic, no atomics, no scratch. */
#include "common.cuh"
#include "mapformer/sln_coef.h"

#define SLN_THREADS 128 /* forward threads per block */
#define SLN_BTHREADS 32 /* backward threads (over b) per block, a power of two */

/* block (h, k)'s generator and start: a, b, c, q, u, v, A p* = (au, av) */
struct SlnBlock {
    double a, b, c, q, u, v, au, av;
};

__device__ SlnBlock sln_block(const MfSlnParams &p, int64_t item) {
    const int64_t h = item / p.NB, k = item % p.NB;
    const float *g = p.gen + item * 4;
    SlnBlock s;
    s.a = 0.5 * ((double)g[0] - (double)g[3]), s.b = g[1], s.c = g[2];
    s.q = s.a * s.a + s.b * s.c;
    s.u = p.start[h * p.D + 2 * k], s.v = p.start[h * p.D + 2 * k + 1];
    s.au = s.a * s.u + s.b * s.v, s.av = s.c * s.u - s.a * s.v;
    return s;
}

__global__ void sln_forward_kernel(MfSlnParams p) {
    const int64_t n = p.B * p.H * p.NB;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const int64_t item = i % (p.H * p.NB), bb = i / (p.H * p.NB);
        const int64_t h = item / p.NB, k = item % p.NB;
        const SlnBlock s = sln_block(p, item);
        double phi = 0.0;
        for (int64_t t = 0; t < p.T; t++) {
            const int64_t row = (bb * p.T + t) * p.H + h;
            phi += (double)p.delta[row * p.NB + k];
            const SlnCoef r = sln_coef(phi, s.q, p.clamp);
            p.p[row * p.D + 2 * k] = (float)(r.C * s.u + r.S * s.au);
            p.p[row * p.D + 2 * k + 1] = (float)(r.C * s.v + r.S * s.av);
        }
    }
}

__global__ void sln_backward_kernel(MfSlnParams p) {
    __shared__ double buf[SLN_BTHREADS];
    const int64_t item = blockIdx.x, h = item / p.NB, k = item % p.NB;
    const SlnBlock s = sln_block(p, item);
    double acc[7] = {0, 0, 0, 0, 0, 0, 0}; /* dA00, dA01, dA10, dA11, dq, du, dv */
    for (int64_t bb = threadIdx.x; bb < p.B; bb += blockDim.x) {
        double phi = 0.0;
        for (int64_t t = 0; t < p.T; t++)
            phi += (double)p.delta[((bb * p.T + t) * p.H + h) * p.NB + k];
        double rsum = 0.0;
        for (int64_t t = p.T - 1; t >= 0; t--) {
            const int64_t row = (bb * p.T + t) * p.H + h;
            const SlnCoef r = sln_coef(phi, s.q, p.clamp);
            const double g0 = p.dp[row * p.D + 2 * k], g1 = p.dp[row * p.D + 2 * k + 1];
            const double dC = g0 * s.u + g1 * s.v, dS = g0 * s.au + g1 * s.av;
            rsum += dC * r.dC_dphi + dS * r.dS_dphi;
            p.ddelta[row * p.NB + k] = (float)rsum;
            acc[4] += dC * r.dC_dq + dS * r.dS_dq;
            const double s0 = r.S * g0, s1 = r.S * g1;
            acc[0] += s0 * s.u;
            acc[1] += s0 * s.v;
            acc[2] += s1 * s.u;
            acc[3] += s1 * s.v;
            acc[5] += r.C * g0 + s.a * s0 + s.c * s1;
            acc[6] += r.C * g1 + s.b * s0 - s.a * s1;
            phi -= (double)p.delta[row * p.NB + k];
        }
    }
    for (int j = 0; j < 7; j++) acc[j] = mf_block_reduce(acc[j], buf, MfSum());
    if (threadIdx.x != 0) return;
    const double dq = acc[4];
    const double dA00 = acc[0] + dq * s.a, dA01 = acc[1] + dq * s.c, dA10 = acc[2] + dq * s.b,
                 dA11 = acc[3] - dq * s.a;
    const double half_tr = 0.5 * (dA00 + dA11);
    float *dg = p.dgen + item * 4;
    dg[0] += (float)(dA00 - half_tr);
    dg[1] += (float)dA01;
    dg[2] += (float)dA10;
    dg[3] += (float)(dA11 - half_tr);
    p.dstart[h * p.D + 2 * k] += (float)acc[5];
    p.dstart[h * p.D + 2 * k + 1] += (float)acc[6];
}

static int sln_bad(const MfSlnParams *p) {
    return p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 2 * p->NB || p->F != 4 ||
           !(p->clamp > 0.0f) || !isfinite(p->clamp) || p->H * p->NB > MF_MAX_GRID;
}

extern "C" int sln_forward_cuda(const MfSlnParams *p, cudaStream_t stream) {
    if (sln_bad(p)) return MF_EINVAL;
    const int64_t n = p->B * p->H * p->NB;
    if (n == 0 || p->T == 0) return MF_OK;
    const unsigned grid = mf_blocks(n, SLN_THREADS) < MF_MAX_GRID ? mf_blocks(n, SLN_THREADS)
                                                                  : MF_MAX_GRID;
    return MF_LAUNCH(sln_forward_kernel, dim3(grid), dim3(SLN_THREADS), 0, stream, *p);
}

extern "C" int sln_backward_cuda(const MfSlnParams *p, cudaStream_t stream) {
    if (sln_bad(p)) return MF_EINVAL;
    if (p->H * p->NB == 0) return MF_OK;
    return MF_LAUNCH(sln_backward_kernel, dim3((unsigned)(p->H * p->NB)), dim3(SLN_BTHREADS), 0,
                     stream, *p);
}
