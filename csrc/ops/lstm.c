/* One LSTM layer (the baseline of TDB's Table 1; MfLstmParams, params.h).
 *
 * The gates of a step are one row of G = 4H pre-activations, in the order (i, f, g, o).
 * Forward:
 *   gates (B T, G)  = x (B T, C) w_ih^T + b       one product for every step (hoisted)
 *   for t in order:  gates[:, t] += h_{t-1} w_hh^T (B, G; one product per step)
 *                    activated in place: i, f, o = sigmoid, g = tanh
 *                    c_t = f c_{t-1} + i g,  h_t = o tanh(c_t)
 * The activated gates, h and c are the forward's outputs and the backward's saved state.
 * Backward (through time, t from T - 1 down), with dh_t = dh[:, t] + the recurrent part:
 *   dc_t  = dc_{t+1} f_{t+1} + dh_t o tanh'(c_t)
 *   dpre  = (dc_t g i(1-i), dc_t c_{t-1} f(1-f), dc_t i (1-g^2), dh_t tanh(c_t) o(1-o))
 *   recurrent part of dh_{t-1} = dpre[:, t] w_hh   (B, H; one product per step)
 *   then, for all steps at once: dx = dpre w_ih, dw_ih += dpre^T x, dw_hh += dpre^T h_prev
 *   (h_prev: h shifted one step, h0 or zeros first), db += column sums of dpre (double).
 * Gradient rule: dw_ih, dw_hh, db are parameter gradients (+=); dx, dh0, dc0 activation
 * gradients (=).
 * Products are OpenBLAS's, single-threaded on row blocks of a fixed size split over the
 * OpenMP threads; the elementwise step is a plain loop over (b, j); every output has the same
 * bits for any thread count.
 * Scratch (backward): dpre (B T G), h_prev (B T H), the running dh and dc (B H each), db's
 * column sums (G doubles).
 */
#include <math.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/scratch.h"

/* the elementwise step runs on one thread below this many (b, j) */
#define LSTM_MIN_PARALLEL (1 << 14)

/* rows per block of the products: fixed by the sizes, so the bits do not depend on the
 * thread count (each block is one single-threaded OpenBLAS call) */
#define LSTM_ROWS 64
/* products below this many multiply-adds run on one thread */
#define LSTM_MIN_PARALLEL_GEMM ((int64_t)1 << 21)

/* c (m, n; ldc) = alpha op(a) op(b) + beta c (mf_sgemm's arguments), the rows of c in blocks
 * of LSTM_ROWS over the threads */
static int gemm_blocks(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc) {
    const int64_t blocks = (m + LSTM_ROWS - 1) / LSTM_ROWS;
    int status = MF_OK;
#pragma omp parallel for schedule(static) if (blocks > 1 && m * n * k >= LSTM_MIN_PARALLEL_GEMM)
    for (int64_t i = 0; i < blocks; i++) {
        const int64_t r0 = i * LSTM_ROWS, rows = m - r0 < LSTM_ROWS ? m - r0 : LSTM_ROWS;
        mf_record_status(&status, mf_sgemm(ta, tb, rows, n, k, 1.0f,
                                           ta ? a + r0 : a + r0 * lda, lda, b, ldb, beta,
                                           c + r0 * ldc, ldc));
    }
    return status;
}

static int valid(const MfLstmParams *p) {
    return p->B >= 1 && p->T >= 1 && p->C >= 1 && p->H >= 1;
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

int lstm_forward(const MfLstmParams *p) {
    if (!valid(p)) return MF_EINVAL;
    const int64_t B = p->B, T = p->T, C = p->C, H = p->H, G = 4 * H;
    float *gates = p->gates;
    for (int64_t r = 0; r < B * T; r++) memcpy(gates + r * G, p->b, (size_t)G * sizeof(float));
    int st = gemm_blocks(0, 1, B * T, G, C, p->x, C, p->w_ih, C, 1.0f, gates, G);
    if (st != MF_OK) return st;
    for (int64_t t = 0; t < T; t++) {
        const float *hp = t > 0 ? p->h + (t - 1) * H : p->h0;
        const int64_t ldh = t > 0 ? T * H : H;
        if (hp != NULL) {
            st = gemm_blocks(0, 1, B, G, H, hp, ldh, p->w_hh, H, 1.0f, gates + t * G, T * G);
            if (st != MF_OK) return st;
        }
#pragma omp parallel for schedule(static) if (B * H >= LSTM_MIN_PARALLEL)
        for (int64_t b = 0; b < B; b++) {
            float *row = gates + (b * T + t) * G;
            float *c = p->c + (b * T + t) * H, *h = p->h + (b * T + t) * H;
            const float *cp = t > 0 ? c - H : (p->c0 != NULL ? p->c0 + b * H : NULL);
            for (int64_t j = 0; j < H; j++) {
                const float i = sigmoid(row[j]), f = sigmoid(row[H + j]);
                const float g = tanhf(row[2 * H + j]), o = sigmoid(row[3 * H + j]);
                const float cn = (cp != NULL ? f * cp[j] : 0.0f) + i * g;
                row[j] = i;
                row[H + j] = f;
                row[2 * H + j] = g;
                row[3 * H + j] = o;
                c[j] = cn;
                h[j] = o * tanhf(cn);
            }
        }
    }
    return MF_OK;
}

static int64_t backward_floats(const MfLstmParams *p) {
    const int64_t BT = p->B * p->T, G = 4 * p->H;
    return mf_scratch_size(BT * G) + mf_scratch_size(BT * p->H) +
           2 * mf_scratch_size(p->B * p->H) + mf_scratch_size(2 * G);
}

int64_t lstm_backward_scratch_floats(const MfLstmParams *p) {
    return valid(p) ? backward_floats(p) : 0;
}

int lstm_backward(const MfLstmParams *p) {
    if (!valid(p)) return MF_EINVAL;
    if (p->scratch == NULL || p->scratch_floats < backward_floats(p)) return MF_EINVAL;
    const int64_t B = p->B, T = p->T, C = p->C, H = p->H, G = 4 * H, BT = B * T;
    float *at = p->scratch;
    float *dpre = mf_scratch_take(&at, BT * G), *hprev = mf_scratch_take(&at, BT * H);
    float *dhn = mf_scratch_take(&at, B * H), *dcn = mf_scratch_take(&at, B * H);
    double *sums = (double *)at;
    memset(dhn, 0, (size_t)(B * H) * sizeof(float));
    memset(dcn, 0, (size_t)(B * H) * sizeof(float));
    int st;
    for (int64_t t = T - 1; t >= 0; t--) {
#pragma omp parallel for schedule(static) if (B * H >= LSTM_MIN_PARALLEL)
        for (int64_t b = 0; b < B; b++) {
            const int64_t r = b * T + t;
            const float *gt = p->gates_in + r * G, *c = p->c_in + r * H, *dh = p->dh + r * H;
            const float *cp = t > 0 ? c - H : (p->c0 != NULL ? p->c0 + b * H : NULL);
            float *dp = dpre + r * G, *dhb = dhn + b * H, *dcb = dcn + b * H;
            for (int64_t j = 0; j < H; j++) {
                const float i = gt[j], f = gt[H + j], g = gt[2 * H + j], o = gt[3 * H + j];
                const float tc = tanhf(c[j]), dht = dh[j] + dhb[j];
                const float dct = dcb[j] + dht * o * (1.0f - tc * tc);
                const float cpj = cp != NULL ? cp[j] : 0.0f;
                dp[j] = dct * g * i * (1.0f - i);
                dp[H + j] = dct * cpj * f * (1.0f - f);
                dp[2 * H + j] = dct * i * (1.0f - g * g);
                dp[3 * H + j] = dht * tc * o * (1.0f - o);
                dcb[j] = dct * f;
            }
        }
        /* dh_{t-1}'s recurrent part (B, H) = dpre[:, t] (B, G) w_hh (G, H) */
        st = gemm_blocks(0, 0, B, H, G, dpre + t * G, T * G, p->w_hh, H, 0.0f, dhn, H);
        if (st != MF_OK) return st;
    }
    if (p->dh0 != NULL) memcpy(p->dh0, dhn, (size_t)(B * H) * sizeof(float));
    if (p->dc0 != NULL) memcpy(p->dc0, dcn, (size_t)(B * H) * sizeof(float));
    /* h_prev: h shifted one step (h0, or zeros, first) */
    for (int64_t b = 0; b < B; b++) {
        float *dst = hprev + b * T * H;
        if (p->h0 != NULL)
            memcpy(dst, p->h0 + b * H, (size_t)H * sizeof(float));
        else
            memset(dst, 0, (size_t)H * sizeof(float));
        memcpy(dst + H, p->h_in + b * T * H, (size_t)((T - 1) * H) * sizeof(float));
    }
    st = gemm_blocks(0, 0, BT, C, G, dpre, G, p->w_ih, C, 0.0f, p->dx, C);
    if (st == MF_OK) st = gemm_blocks(1, 0, G, C, BT, dpre, G, p->x, C, 1.0f, p->dw_ih, C);
    if (st == MF_OK) st = gemm_blocks(1, 0, G, H, BT, dpre, G, hprev, H, 1.0f, p->dw_hh, H);
    if (st != MF_OK) return st;
    mf_column_sums(sums, dpre, BT, G);
    mf_add_block_sums(p->db, sums, 1, G, G);
    return MF_OK;
}
