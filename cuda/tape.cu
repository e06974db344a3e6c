/* TAPE's rotation on the GPU (csrc/ops/tape.c's tape_rotate math): per pair, as complex
 * numbers, q_out = q e, k_out = k e;
 *   backward: dq = conj(e) dq_out, dk = conj(e) dk_out (=), de = conj(q) dq_out + conj(k) dk_out
 *   (=). q, k, e (B, T, H, D), D even. One thread per pair in a grid-stride loop.
 * tape_mix has no CUDA kernel yet. */
#include "common.cuh"

#define TAPE_THREADS 256

__global__ void tape_rotate_forward_kernel(MfTapeRotateParams p) {
    for (int64_t i = MF_GRID_START; i < p.B * p.T * p.H * p.D / 2; i += MF_GRID_STRIDE) {
        const int64_t j = 2 * i;
        const float e0 = p.e[j], e1 = p.e[j + 1];
        const float q0 = p.q[j], q1 = p.q[j + 1], k0 = p.k[j], k1 = p.k[j + 1];
        p.q_out[j] = q0 * e0 - q1 * e1;
        p.q_out[j + 1] = q0 * e1 + q1 * e0;
        p.k_out[j] = k0 * e0 - k1 * e1;
        p.k_out[j + 1] = k0 * e1 + k1 * e0;
    }
}

__global__ void tape_rotate_backward_kernel(MfTapeRotateParams p) {
    for (int64_t i = MF_GRID_START; i < p.B * p.T * p.H * p.D / 2; i += MF_GRID_STRIDE) {
        const int64_t j = 2 * i;
        const float e0 = p.e[j], e1 = p.e[j + 1];
        const float g0 = p.dq_out[j], g1 = p.dq_out[j + 1];
        const float h0 = p.dk_out[j], h1 = p.dk_out[j + 1];
        const float q0 = p.q[j], q1 = p.q[j + 1], k0 = p.k[j], k1 = p.k[j + 1];
        p.dq[j] = g0 * e0 + g1 * e1;
        p.dq[j + 1] = g1 * e0 - g0 * e1;
        p.dk[j] = h0 * e0 + h1 * e1;
        p.dk[j + 1] = h1 * e0 - h0 * e1;
        p.de[j] = (q0 * g0 + q1 * g1) + (k0 * h0 + k1 * h1);
        p.de[j + 1] = (q0 * g1 - q1 * g0) + (k0 * h1 - k1 * h0);
    }
}

static int tape_bad(const MfTapeRotateParams *p) {
    return p->B < 1 || p->T < 1 || p->H < 1 || p->D < 2 || p->D % 2 != 0;
}

static unsigned tape_grid(const MfTapeRotateParams *p) {
    const unsigned grid = mf_blocks(p->B * p->T * p->H * p->D / 2, TAPE_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

extern "C" int tape_rotate_forward_cuda(const MfTapeRotateParams *p, cudaStream_t stream) {
    if (tape_bad(p)) return MF_EINVAL;
    return MF_LAUNCH(tape_rotate_forward_kernel, dim3(tape_grid(p)), dim3(TAPE_THREADS), 0,
                     stream, *p);
}

extern "C" int tape_rotate_backward_cuda(const MfTapeRotateParams *p, cudaStream_t stream) {
    if (tape_bad(p)) return MF_EINVAL;
    return MF_LAUNCH(tape_rotate_backward_kernel, dim3(tape_grid(p)), dim3(TAPE_THREADS), 0,
                     stream, *p);
}
