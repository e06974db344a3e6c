/* Input-dependent rotary on the GPU (the math of csrc/ops/rotary.c): pairs (x[2i], x[2i+1])
 * of q and k rotated by theta_i, theta (TB, T, H, D/2), TB = B or 1 (broadcast over b).
 *   forward:  q_out = R(theta) q, k_out = R(theta) k
 *   backward: dq = R(theta)^T dq_out, dk = R(theta)^T dk_out (=),
 *             dtheta = sum over {q, k} (and over b when TB = 1) of x0 dx1 - x1 dx0 (=)
 * One thread per angle (tb, t, h, i) in a grid-stride loop: it rotates that pair in every
 * batch row using the angle, and in the backward sums dtheta over them in double in b order
 * (deterministic, no atomics). cos and sin by sincosf (full range). */
#include "common.cuh"

#define ROT_THREADS 256

/* the angle index a = ((tb T + t) H + h) NB + i -> the index of the pair in batch row b */
__device__ __forceinline__ int64_t rot_pair(int64_t a, int64_t b, int64_t TB, int64_t THNB) {
    const int64_t r = TB == 1 ? a : a - (a / THNB) * THNB; /* (t H + h) NB + i */
    return (b * THNB + r) * 2;
}

__global__ void rotary_forward_kernel(MfRotaryParams p) {
    const int64_t NB = p.D / 2, THNB = p.T * p.H * NB, n = p.TB * THNB;
    for (int64_t a = MF_GRID_START; a < n; a += MF_GRID_STRIDE) {
        float s, c;
        sincosf(p.theta[a], &s, &c);
        const int64_t b0 = p.TB == 1 ? 0 : a / THNB, b1 = p.TB == 1 ? p.B : b0 + 1;
        for (int64_t b = b0; b < b1; b++) {
            const int64_t j = rot_pair(a, b, p.TB, THNB);
            const float q0 = p.q[j], q1 = p.q[j + 1], k0 = p.k[j], k1 = p.k[j + 1];
            p.q_out[j] = q0 * c - q1 * s;
            p.q_out[j + 1] = q0 * s + q1 * c;
            p.k_out[j] = k0 * c - k1 * s;
            p.k_out[j + 1] = k0 * s + k1 * c;
        }
    }
}

__global__ void rotary_backward_kernel(MfRotaryParams p) {
    const int64_t NB = p.D / 2, THNB = p.T * p.H * NB, n = p.TB * THNB;
    for (int64_t a = MF_GRID_START; a < n; a += MF_GRID_STRIDE) {
        float s, c;
        sincosf(p.theta[a], &s, &c);
        const int64_t b0 = p.TB == 1 ? 0 : a / THNB, b1 = p.TB == 1 ? p.B : b0 + 1;
        double dtheta = 0.0;
        for (int64_t b = b0; b < b1; b++) {
            const int64_t j = rot_pair(a, b, p.TB, THNB);
            const float gq0 = p.dq_out[j], gq1 = p.dq_out[j + 1];
            const float gk0 = p.dk_out[j], gk1 = p.dk_out[j + 1];
            const float dq0 = gq0 * c + gq1 * s, dq1 = gq1 * c - gq0 * s;
            const float dk0 = gk0 * c + gk1 * s, dk1 = gk1 * c - gk0 * s;
            p.dq[j] = dq0;
            p.dq[j + 1] = dq1;
            p.dk[j] = dk0;
            p.dk[j + 1] = dk1;
            dtheta += (double)(p.q[j] * dq1 - p.q[j + 1] * dq0)
                      + (double)(p.k[j] * dk1 - p.k[j + 1] * dk0);
        }
        p.dtheta[a] = (float)dtheta;
    }
}

static int rotary_check(const MfRotaryParams *p) {
    return p->B < 1 || p->T < 1 || p->H < 1 || p->D < 2 || p->D % 2 != 0
                   || (p->TB != 1 && p->TB != p->B)
               ? MF_EINVAL
               : MF_OK;
}

static unsigned rotary_grid(const MfRotaryParams *p) {
    const unsigned grid = mf_blocks(p->TB * p->T * p->H * (p->D / 2), ROT_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

extern "C" int rotary_forward_cuda(const MfRotaryParams *p, cudaStream_t stream) {
    if (rotary_check(p) != MF_OK) return MF_EINVAL;
    return MF_LAUNCH(rotary_forward_kernel, dim3(rotary_grid(p)), dim3(ROT_THREADS), 0, stream,
                     *p);
}

extern "C" int rotary_backward_cuda(const MfRotaryParams *p, cudaStream_t stream) {
    if (rotary_check(p) != MF_OK) return MF_EINVAL;
    return MF_LAUNCH(rotary_backward_kernel, dim3(rotary_grid(p)), dim3(ROT_THREADS), 0, stream,
                     *p);
}
