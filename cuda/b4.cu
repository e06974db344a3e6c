/* MapEM-b4 positions on the GPU (csrc/ops/b4.c's math, in double as the C op): per head h and
 * 4x4 block k one skew generator S = L(u) + R(v), Phi_t = cumsum_t delta,
 *   p[t] = qexp(Phi_t u) p* qexp(Phi_t v)   (quaternion products).
 * Forward: one thread per independent sequence (b, h, k), sequential in t.
 * Backward: a block per (h, k), its threads over batch rows b, each walking its sequence in
 * reverse (Phi recovered by subtracting delta[t] from the double total, ddelta the reverse
 * cumulative sum of dPhi_t = <g, u p + p v>, =), with
 *   dp* += conj(a) g conj(c),  du += Phi J(Phi u)^T (g conj(p* c)),
 *   dv += Phi J(Phi v)^T (conj(a p*) g)
 * summed in double per thread, then over the block's threads by a fixed tree
 * (mf_block_reduce) and added once (+=): deterministic, no atomics, no scratch. */
#include "quat.cuh"

#define B4_THREADS 128 /* forward threads per block */
#define B4_BTHREADS 32 /* backward threads (over b) per block, a power of two */

static __device__ void b4_gen(const MfB4Params &p, int64_t item, double *u, double *v) {
    for (int i = 0; i < 3; i++) {
        u[i] = p.gen[item * 6 + i];
        v[i] = p.gen[item * 6 + 3 + i];
    }
}

__global__ void b4_forward_kernel(MfB4Params p) {
    const int64_t n = p.B * p.H * p.NB;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const int64_t item = i % (p.H * p.NB), bb = i / (p.H * p.NB);
        const int64_t h = item / p.NB, k = item % p.NB;
        double u[3], v[3], sc, kk;
        b4_gen(p, item, u, v);
        const DQuat s = dq_load(p.start + h * p.D + 4 * k);
        double phi = 0.0;
        for (int64_t t = 0; t < p.T; t++) {
            const int64_t row = (bb * p.T + t) * p.H + h;
            phi += (double)p.delta[row * p.NB + k];
            const DQuat a = dq_exp(phi * u[0], phi * u[1], phi * u[2], &sc, &kk);
            const DQuat c = dq_exp(phi * v[0], phi * v[1], phi * v[2], &sc, &kk);
            const DQuat r = dq_mul(dq_mul(a, s), c);
            float *out = p.p + row * p.D + 4 * k;
            out[0] = (float)r.w, out[1] = (float)r.x, out[2] = (float)r.y, out[3] = (float)r.z;
        }
    }
}

__global__ void b4_backward_kernel(MfB4Params p) {
    __shared__ double buf[B4_BTHREADS];
    const int64_t item = blockIdx.x, h = item / p.NB, k = item % p.NB;
    double u[3], v[3];
    b4_gen(p, item, u, v);
    const DQuat pu = {0.0, u[0], u[1], u[2]}, pv = {0.0, v[0], v[1], v[2]};
    const DQuat s = dq_load(p.start + h * p.D + 4 * k);
    double acc[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}; /* du (3), dv (3), dp* (4) */
    for (int64_t bb = threadIdx.x; bb < p.B; bb += blockDim.x) {
        double phi = 0.0;
        for (int64_t t = 0; t < p.T; t++)
            phi += (double)p.delta[((bb * p.T + t) * p.H + h) * p.NB + k];
        double rsum = 0.0;
        for (int64_t t = p.T - 1; t >= 0; t--) {
            const int64_t row = (bb * p.T + t) * p.H + h;
            double sca, ka, scc, kc;
            const DQuat a = dq_exp(phi * u[0], phi * u[1], phi * u[2], &sca, &ka);
            const DQuat c = dq_exp(phi * v[0], phi * v[1], phi * v[2], &scc, &kc);
            const DQuat as = dq_mul(a, s), sc = dq_mul(s, c), r = dq_mul(as, c);
            const DQuat g = dq_load(p.dp + row * p.D + 4 * k);
            rsum += dq_dot(g, dq_add(dq_mul(pu, r), dq_mul(r, pv)));
            p.ddelta[row * p.NB + k] = (float)rsum;
            const DQuat dsi = dq_mul(dq_mul(dq_conj(a), g), dq_conj(c));
            acc[6] += dsi.w, acc[7] += dsi.x, acc[8] += dsi.y, acc[9] += dsi.z;
            dq_exp_vjp(acc, phi, u, sca, ka, dq_mul(g, dq_conj(sc)));
            dq_exp_vjp(acc + 3, phi, v, scc, kc, dq_mul(dq_conj(as), g));
            phi -= (double)p.delta[row * p.NB + k];
        }
    }
    for (int j = 0; j < 10; j++) acc[j] = mf_block_reduce(acc[j], buf, MfSum());
    if (threadIdx.x != 0) return;
    for (int i = 0; i < 6; i++) p.dgen[item * 6 + i] += (float)acc[i];
    for (int i = 0; i < 4; i++) p.dstart[h * p.D + 4 * k + i] += (float)acc[6 + i];
}

static int b4_bad(const MfB4Params *p) {
    return p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 4 * p->NB || p->F != 6 ||
           p->H * p->NB > MF_MAX_GRID;
}

extern "C" int b4_forward_cuda(const MfB4Params *p, cudaStream_t stream) {
    if (b4_bad(p)) return MF_EINVAL;
    const int64_t n = p->B * p->H * p->NB;
    if (n == 0 || p->T == 0) return MF_OK;
    const unsigned grid =
        mf_blocks(n, B4_THREADS) < MF_MAX_GRID ? mf_blocks(n, B4_THREADS) : MF_MAX_GRID;
    return MF_LAUNCH(b4_forward_kernel, dim3(grid), dim3(B4_THREADS), 0, stream, *p);
}

extern "C" int b4_backward_cuda(const MfB4Params *p, cudaStream_t stream) {
    if (b4_bad(p)) return MF_EINVAL;
    if (p->H * p->NB == 0) return MF_OK;
    return MF_LAUNCH(b4_backward_kernel, dim3((unsigned)(p->H * p->NB)), dim3(B4_BTHREADS), 0,
                     stream, *p);
}
