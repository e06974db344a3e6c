/* One LSTM layer on the GPU (csrc/ops/lstm.c's math; MfLstmParams), gates (i, f, g, o) fused
 * in one row of G = 4H pre-activations.
 * Forward:
 *   gates (B T, G) = x (B T, C) w_ih^T + b         one GEMM for every step, hoisted out of the
 *                                                  time loop (gemm.cuh's mf_gemm, with b)
 *   for t in order (the recurrence is sequential: two launches per step):
 *     gates[:, t] += h_{t-1} w_hh^T                (B, G), a GEMM accumulating into the rows
 *     fused cell kernel, one thread per (b, j): the four gates of unit j activated in place
 *     (i, f, o = sigmoid, g = tanh), c_t = f c_{t-1} + i g, h_t = o tanh(c_t)
 * Backward (through time, t from T - 1 down), dh_t = dh[:, t] + the recurrent part:
 *   fused cell kernel per (b, j): dc_t = dc_{t+1} f_{t+1} + dh_t o tanh'(c_t),
 *     dpre = (dc_t g i(1-i), dc_t c_{t-1} f(1-f), dc_t i (1-g^2), dh_t tanh(c_t) o(1-o)),
 *     and dc_t f_t carried to the step before
 *   recurrent part of dh_{t-1} = dpre[:, t] w_hh   (B, H), a GEMM per step
 *   then for all steps at once: dx = dpre w_ih (=), dw_ih += dpre^T x, dw_hh += dpre^T h_prev
 *   (h_prev: h shifted one step, h0 or zeros first), db += column sums of dpre
 *   (mf_column_sums2: row lanes, then a fixed tree).
 * Gradient rule: dw_ih, dw_hh, db += ; dx, dh0, dc0 (=). Every sum runs in a fixed order: the
 * same bits on every run.
 * Scratch (backward, the caller's, device): dpre (B T G), h_prev (B T H), the running dh and
 * dc (B H each). */
#include "gemm.cuh"

#define LSTM_THREADS 256

static int lstm_valid(const MfLstmParams *p) {
    return p->B >= 1 && p->T >= 1 && p->C >= 1 && p->H >= 1;
}

extern "C" int64_t lstm_forward_cuda_scratch_floats(const MfLstmParams *) { return 0; }

extern "C" int64_t lstm_backward_cuda_scratch_floats(const MfLstmParams *p) {
    return lstm_valid(p) ? p->B * p->T * (4 * p->H + p->H) + 2 * p->B * p->H : 0;
}

static unsigned lstm_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, LSTM_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

__device__ __forceinline__ float lstm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* step t: (b, j) -> gates of row (b, t) activated in place, c and h of (b, t) */
__global__ void lstm_cell_forward_kernel(MfLstmParams p, int64_t t) {
    const int64_t H = p.H, G = 4 * H, T = p.T;
    for (int64_t i = MF_GRID_START; i < p.B * H; i += MF_GRID_STRIDE) {
        const int64_t b = i / H, j = i - b * H, r = b * T + t;
        float *row = p.gates + r * G;
        const float in = lstm_sigmoid(row[j]), f = lstm_sigmoid(row[H + j]);
        const float g = tanhf(row[2 * H + j]), o = lstm_sigmoid(row[3 * H + j]);
        const float cp = t > 0 ? p.c[(r - 1) * H + j] : (p.c0 != NULL ? p.c0[b * H + j] : 0.0f);
        const float c = f * cp + in * g;
        row[j] = in;
        row[H + j] = f;
        row[2 * H + j] = g;
        row[3 * H + j] = o;
        p.c[r * H + j] = c;
        p.h[r * H + j] = o * tanhf(c);
    }
}

extern "C" int lstm_forward_cuda(const MfLstmParams *p, cudaStream_t stream) {
    if (!lstm_valid(p) || p->h == NULL || p->c == NULL || p->gates == NULL || p->x == NULL
        || p->w_ih == NULL || p->w_hh == NULL || p->b == NULL)
        return MF_EINVAL;
    const int64_t B = p->B, T = p->T, C = p->C, H = p->H, G = 4 * H;
    int status = mf_gemm<false, true>(B * T, G, C, p->x, C, p->w_ih, C, p->gates, G, 0, p->b,
                                      stream);
    for (int64_t t = 0; t < T && status == MF_OK; t++) {
        const float *hp = t > 0 ? p->h + (t - 1) * H : p->h0;
        if (hp != NULL)
            status = mf_gemm<false, true>(B, G, H, hp, t > 0 ? T * H : H, p->w_hh, H,
                                          p->gates + t * G, T * G, 1, NULL, stream);
        if (status == MF_OK)
            status = MF_LAUNCH(lstm_cell_forward_kernel, dim3(lstm_grid(B * H)),
                               dim3(LSTM_THREADS), 0, stream, *p, t);
    }
    return status;
}

/* step t: (b, j) -> dpre of row (b, t), dcn (dc_t f_t for the step before); dhn holds the
 * recurrent part of dh_t */
__global__ void lstm_cell_backward_kernel(MfLstmParams p, int64_t t, float *dpre,
                                          const float *dhn, float *dcn) {
    const int64_t H = p.H, G = 4 * H, T = p.T;
    for (int64_t i = MF_GRID_START; i < p.B * H; i += MF_GRID_STRIDE) {
        const int64_t b = i / H, j = i - b * H, r = b * T + t;
        const float *gt = p.gates_in + r * G;
        const float in = gt[j], f = gt[H + j], g = gt[2 * H + j], o = gt[3 * H + j];
        const float tc = tanhf(p.c_in[r * H + j]);
        const float cp = t > 0 ? p.c_in[(r - 1) * H + j]
                               : (p.c0 != NULL ? p.c0[b * H + j] : 0.0f);
        const float dht = p.dh[r * H + j] + dhn[i];
        const float dct = dcn[i] + dht * o * (1.0f - tc * tc);
        float *dp = dpre + r * G;
        dp[j] = dct * g * in * (1.0f - in);
        dp[H + j] = dct * cp * f * (1.0f - f);
        dp[2 * H + j] = dct * in * (1.0f - g * g);
        dp[3 * H + j] = dht * tc * o * (1.0f - o);
        dcn[i] = dct * f;
    }
}

/* dst (n) = src, or zeros when src is NULL */
__global__ void lstm_copy_kernel(float *dst, const float *src, int64_t n) {
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) dst[i] = src != NULL ? src[i] : 0.0f;
}

/* hprev (B, T, H): h shifted one step along T, h0 (or zeros) first */
__global__ void lstm_hprev_kernel(float *hprev, const float *h, const float *h0, int64_t B,
                                  int64_t T, int64_t H) {
    for (int64_t i = MF_GRID_START; i < B * T * H; i += MF_GRID_STRIDE) {
        const int64_t j = i % H, bt = i / H, t = bt % T, b = bt / T;
        hprev[i] = t > 0 ? h[i - H] : (h0 != NULL ? h0[b * H + j] : 0.0f);
    }
}

extern "C" int lstm_backward_cuda(const MfLstmParams *p, cudaStream_t stream) {
    if (!lstm_valid(p) || p->dx == NULL || p->dw_ih == NULL || p->dw_hh == NULL
        || p->db == NULL || p->dh == NULL || p->x == NULL || p->h_in == NULL
        || p->c_in == NULL || p->gates_in == NULL || p->w_ih == NULL || p->w_hh == NULL
        || p->scratch == NULL || p->scratch_floats < lstm_backward_cuda_scratch_floats(p))
        return MF_EINVAL;
    const int64_t B = p->B, T = p->T, C = p->C, H = p->H, G = 4 * H, BT = B * T;
    float *dpre = p->scratch, *hprev = dpre + BT * G, *dhn = hprev + BT * H, *dcn = dhn + B * H;
    const unsigned bh = lstm_grid(B * H);
    int status = MF_LAUNCH(lstm_copy_kernel, dim3(lstm_grid(2 * B * H)), dim3(LSTM_THREADS), 0,
                           stream, dhn, (const float *)NULL, 2 * B * H);
    for (int64_t t = T - 1; t >= 0 && status == MF_OK; t--) {
        status = MF_LAUNCH(lstm_cell_backward_kernel, dim3(bh), dim3(LSTM_THREADS), 0, stream,
                           *p, t, dpre, (const float *)dhn, dcn);
        /* dh_{t-1}'s recurrent part (B, H) = dpre[:, t] (B, G) w_hh (G, H) */
        if (status == MF_OK)
            status = mf_gemm<false, false>(B, H, G, dpre + t * G, T * G, p->w_hh, H, dhn, H, 0,
                                           NULL, stream);
    }
    if (status == MF_OK && p->dh0 != NULL)
        status = MF_LAUNCH(lstm_copy_kernel, dim3(bh), dim3(LSTM_THREADS), 0, stream, p->dh0,
                           (const float *)dhn, B * H);
    if (status == MF_OK && p->dc0 != NULL)
        status = MF_LAUNCH(lstm_copy_kernel, dim3(bh), dim3(LSTM_THREADS), 0, stream, p->dc0,
                           (const float *)dcn, B * H);
    if (status == MF_OK)
        status = MF_LAUNCH(lstm_hprev_kernel, dim3(lstm_grid(BT * H)), dim3(LSTM_THREADS), 0,
                           stream, hprev, p->h_in, p->h0, B, T, H);
    if (status == MF_OK)
        status = mf_gemm<false, false>(BT, C, G, dpre, G, p->w_ih, C, p->dx, C, 0, NULL, stream);
    if (status == MF_OK)
        status = mf_gemm<true, false>(G, C, BT, dpre, G, p->x, C, p->dw_ih, C, 1, NULL, stream);
    if (status == MF_OK)
        status = mf_gemm<true, false>(G, H, BT, dpre, G, hprev, H, p->dw_hh, H, 1, NULL, stream);
    if (status != MF_OK) return status;
    return mf_add_column_sums(p->db, dpre, BT, G, stream);
}
