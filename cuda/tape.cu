/* TAPE's rotation on the GPU (csrc/ops/tape.c's tape_rotate math): per pair, as complex
 * numbers, q_out = q e, k_out = k e;
 *   backward: dq = conj(e) dq_out, dk = conj(e) dk_out (=), de = conj(q) dq_out + conj(k) dk_out
 *   (=). q, k, e (B, T, H, D), D even. One thread per pair in a grid-stride loop.
 * tape_mix (the content-gated head mix): e_new[b,t,h] = e_att[b,t,h] + g[b,t,h] sum_h' w[h,h']
 * e_att[b,t,h'], g = sigmoid(gate_logits); backward with Y = de_new, P[h,h'] = Y[h] . e_att[h']:
 *   de_att[h'] = Y[h'] + sum_h g[h] w[h,h'] Y[h] (=), dgate_logits[h] = g (1 - g)
 *   sum_h' w[h,h'] P[h,h'] (=), dw[h,h'] += sum_{b,t} g[h] P[h,h'].
 * One thread per element for e_new and de_att, per (b, t, h) for dgate_logits (P in double);
 * dw by a block per (h, h') summing its rows in a fixed order per thread, then a shared-memory
 * tree in double (no atomics: the same bits every run). g and 1 - g are both sigmoids (of G
 * and -G) as in the C op. The C op's scratch is not used. */
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

#define MIX_THREADS 256

/* (sigmoid(x), sigmoid(-x)), both to float relative accuracy */
__device__ __forceinline__ void mix_gate(float x, float *g, float *omg) {
    const float t = expf(-fabsf(x)), big = 1.0f / (1.0f + t), small = t / (1.0f + t);
    *g = x >= 0.0f ? big : small;
    *omg = x >= 0.0f ? small : big;
}

__global__ void tape_mix_forward_kernel(MfTapeMixParams p) {
    const int64_t HD = p.H * p.D;
    for (int64_t i = MF_GRID_START; i < p.B * p.T * HD; i += MF_GRID_STRIDE) {
        const int64_t r = i / HD, h = (i - r * HD) / p.D, d = i - r * HD - h * p.D;
        const float *er = p.e_att + r * HD;
        float m = 0.0f, g, omg;
        for (int64_t hp = 0; hp < p.H; hp++) m += p.w[h * p.H + hp] * er[hp * p.D + d];
        mix_gate(p.gate_logits[r * p.H + h], &g, &omg);
        p.e_new[i] = er[h * p.D + d] + g * m;
    }
}

__global__ void tape_mix_de_kernel(MfTapeMixParams p) {
    const int64_t HD = p.H * p.D;
    for (int64_t i = MF_GRID_START; i < p.B * p.T * HD; i += MF_GRID_STRIDE) {
        const int64_t r = i / HD, hp = (i - r * HD) / p.D, d = i - r * HD - hp * p.D;
        const float *yr = p.de_new + r * HD;
        float s = 0.0f, g, omg;
        for (int64_t h = 0; h < p.H; h++) {
            mix_gate(p.gate_logits[r * p.H + h], &g, &omg);
            s += g * p.w[h * p.H + hp] * yr[h * p.D + d];
        }
        p.de_att[i] = yr[hp * p.D + d] + s;
    }
}

/* Y[h] . e_att[h'] of row r in double */
__device__ __forceinline__ double mix_dot(const MfTapeMixParams &p, int64_t r, int64_t h,
                                          int64_t hp) {
    const float *y = p.de_new + (r * p.H + h) * p.D, *e = p.e_att + (r * p.H + hp) * p.D;
    double s = 0.0;
    for (int64_t d = 0; d < p.D; d++) s += (double)y[d] * (double)e[d];
    return s;
}

__global__ void tape_mix_dgate_kernel(MfTapeMixParams p) {
    for (int64_t i = MF_GRID_START; i < p.B * p.T * p.H; i += MF_GRID_STRIDE) {
        const int64_t r = i / p.H, h = i - r * p.H;
        double s = 0.0;
        for (int64_t hp = 0; hp < p.H; hp++) s += (double)p.w[h * p.H + hp] * mix_dot(p, r, h, hp);
        float g, omg;
        mix_gate(p.gate_logits[i], &g, &omg);
        p.dgate_logits[i] = (float)((double)g * (double)omg * s);
    }
}

/* a block per (h, h') = blockIdx.x */
__global__ void tape_mix_dw_kernel(MfTapeMixParams p) {
    __shared__ double part[MIX_THREADS];
    const int64_t h = blockIdx.x / p.H, hp = blockIdx.x - h * p.H;
    double s = 0.0;
    for (int64_t r = threadIdx.x; r < p.B * p.T; r += blockDim.x) {
        float g, omg;
        mix_gate(p.gate_logits[r * p.H + h], &g, &omg);
        s += (double)g * mix_dot(p, r, h, hp);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int n = MIX_THREADS / 2; n > 0; n /= 2) {
        if ((int)threadIdx.x < n) part[threadIdx.x] += part[threadIdx.x + n];
        __syncthreads();
    }
    if (threadIdx.x == 0) p.dw[blockIdx.x] += (float)part[0];
}

static int tape_mix_bad(const MfTapeMixParams *p) {
    return p->B < 1 || p->T < 1 || p->H < 1 || p->D < 2 || p->D % 2 != 0
           || p->H * p->H > MF_MAX_GRID
           || p->e_att == NULL || p->gate_logits == NULL || p->w == NULL;
}

static unsigned tape_mix_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, MIX_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

extern "C" int tape_mix_forward_cuda(const MfTapeMixParams *p, cudaStream_t stream) {
    if (tape_mix_bad(p) || p->e_new == NULL) return MF_EINVAL;
    return MF_LAUNCH(tape_mix_forward_kernel, dim3(tape_mix_grid(p->B * p->T * p->H * p->D)),
                     dim3(MIX_THREADS), 0, stream, *p);
}

extern "C" int tape_mix_backward_cuda(const MfTapeMixParams *p, cudaStream_t stream) {
    if (tape_mix_bad(p) || p->de_att == NULL || p->dgate_logits == NULL || p->dw == NULL
        || p->de_new == NULL)
        return MF_EINVAL;
    int status = MF_LAUNCH(tape_mix_de_kernel, dim3(tape_mix_grid(p->B * p->T * p->H * p->D)),
                           dim3(MIX_THREADS), 0, stream, *p);
    if (status != MF_OK) return status;
    status = MF_LAUNCH(tape_mix_dgate_kernel, dim3(tape_mix_grid(p->B * p->T * p->H)),
                       dim3(MIX_THREADS), 0, stream, *p);
    if (status != MF_OK) return status;
    return MF_LAUNCH(tape_mix_dw_kernel, dim3((unsigned)(p->H * p->H)), dim3(MIX_THREADS), 0,
                     stream, *p);
}
