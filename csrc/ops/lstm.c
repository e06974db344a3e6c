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
 * OpenMP threads; the elementwise step runs over (b, j) in simd.h vectors (sigmoid by vexp,
 * tanh(x) = 2 sigmoid(2x) - 1), as target_clones copies; every output has the same bits for
 * any thread count.
 * Scratch (backward): dpre (B T G), h_prev (B T H), the running dh and dc (B H each), db's
 * column sums (G doubles).
 */
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/scratch.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"

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

/* *x = tanh(*x) = 2 sigmoid(2x) - 1 (simd.h's one exponential) */
MF_INLINE void vtanh(vf *x) {
    *x = *x + *x;
    vsigmoid(x);
    *x = *x + *x - 1.0f;
}

/* *x = n < MF_VW lanes of p (zeros beyond), or a whole vector; and the store of n lanes */
MF_INLINE void load(vf *x, const float *p, int64_t n) {
    if (n == MF_VW)
        *x = VLOADU(p);
    else
        vload_part(x, p, n);
}
MF_INLINE void store(float *p, const vf *x, int64_t n) {
    if (n == MF_VW)
        VSTOREU(p, *x);
    else
        vstore_part(p, x, n);
}

/* One step of one sequence: row (G) pre-activations in, activated gates out; c = f cp + i g
 * (cp NULL: zeros), h = o tanh(c) */
MF_CLONES
static void cell_forward(float *row, const float *cp, float *c, float *h, int64_t H) {
    for (int64_t j = 0; j < H; j += MF_VW) {
        const int64_t n = H - j < MF_VW ? H - j : MF_VW;
        vf i, f, g, o, cn = VZERO, tc;
        load(&i, row + j, n);
        load(&f, row + H + j, n);
        load(&g, row + 2 * H + j, n);
        load(&o, row + 3 * H + j, n);
        vsigmoid(&i);
        vsigmoid(&f);
        vtanh(&g);
        vsigmoid(&o);
        if (cp != NULL) load(&cn, cp + j, n);
        cn = f * cn + i * g;
        tc = cn;
        vtanh(&tc);
        tc = o * tc;
        store(row + j, &i, n);
        store(row + H + j, &f, n);
        store(row + 2 * H + j, &g, n);
        store(row + 3 * H + j, &o, n);
        store(c + j, &cn, n);
        store(h + j, &tc, n);
    }
}

/* The step's backward for one sequence: gates gt, cell c, previous cell cp (NULL: zeros),
 * dh (the loss's), dhb (the recurrent part), dcb (dc_{t+1} f_{t+1}, becomes dc_t f_t); writes
 * dp (G) */
MF_CLONES
static void cell_backward(float *dp, float *dcb, const float *gt, const float *c,
                          const float *cp, const float *dh, const float *dhb, int64_t H) {
    for (int64_t j = 0; j < H; j += MF_VW) {
        const int64_t n = H - j < MF_VW ? H - j : MF_VW;
        vf i, f, g, o, tc, dht, dhr, dct, cpj = VZERO, out;
        load(&i, gt + j, n);
        load(&f, gt + H + j, n);
        load(&g, gt + 2 * H + j, n);
        load(&o, gt + 3 * H + j, n);
        load(&tc, c + j, n);
        vtanh(&tc);
        load(&dht, dh + j, n);
        load(&dhr, dhb + j, n);
        dht = dht + dhr;
        load(&dct, dcb + j, n);
        dct = dct + dht * o * (1.0f - tc * tc);
        if (cp != NULL) load(&cpj, cp + j, n);
        out = dct * g * i * (1.0f - i);
        store(dp + j, &out, n);
        out = dct * cpj * f * (1.0f - f);
        store(dp + H + j, &out, n);
        out = dct * i * (1.0f - g * g);
        store(dp + 2 * H + j, &out, n);
        out = dht * tc * o * (1.0f - o);
        store(dp + 3 * H + j, &out, n);
        out = dct * f;
        store(dcb + j, &out, n);
    }
}

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
            cell_forward(row, cp, c, h, H);
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
            const float *c = p->c_in + r * H;
            const float *cp = t > 0 ? c - H : (p->c0 != NULL ? p->c0 + b * H : NULL);
            cell_backward(dpre + r * G, dcn + b * H, p->gates_in + r * G, c, cp, p->dh + r * H,
                          dhn + b * H, H);
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
