/* One LSTM layer (the baseline of TDB's Table 1; MfLstmParams, params.h).
 *
 * The gates of a step are one row of G = 4H pre-activations, in the order (i, f, g, o).
 * Forward:
 *   gates (B T, G)  = b + x (B T, C) w_ih^T       one product for every step (hoisted)
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
 * Products are gemm.c's row-block kernels of the active kernel set (mf_kernels(), read once
 * per call), as linear.c's: the weights laid out for them once per call in the scratch (an
 * OpenBLAS call per step packed w_hh again 400 times a sequence of 400 steps: the packing was
 * a third of OpenBLAS's time in a cpu-scale LSTM step), the hoisted products in row blocks of
 * mf_row_block rows over the OpenMP threads, the weight gradients in chunks of blocks
 * (rows.h: mf_grad_chunks, each chunk's sum in its own scratch, added in chunk order). The
 * elementwise step runs over (b, j) in simd.h vectors (sigmoid by vexp, tanh(x) = 2
 * sigmoid(2x) - 1), as target_clones copies. Every output has the same bits for any thread
 * count.
 * Scratch, each part 64-byte aligned: forward, w_ih^T and w_hh^T prepared; backward, w_hh and
 * w_ih prepared, dpre (B T G), h_prev (B T H), the running dh and dc (B H each), db's column
 * sums (G doubles), the chunks' dw_ih and dw_hh sums and, per thread, the weight-gradient
 * product's pack.
 */
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/cpu.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/threads.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"

/* the elementwise step runs on one thread below this many (b, j) */
#define LSTM_MIN_PARALLEL (1 << 14)
/* products below this many multiply-adds run on one thread */
#define LSTM_MIN_PARALLEL_GEMM ((int64_t)1 << 21)

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
/* floats rounded up to a 64-byte multiple */
static int64_t aligned(int64_t floats) { return (floats + 15) / 16 * 16; }

/* c (m, n; ldc) = [init +] a (m, k; lda) b, b prepared (mf_gemm_prepare_b), the rows in
 * blocks of R over the threads (o: mf_gemm_nn's options) */
static int rows_nn(int kernels, int64_t R, int64_t m, int64_t n, int64_t k, const float *a,
                   int64_t lda, const float *b, float *c, int64_t ldc, const MfGemmOptions *o) {
    const int64_t blocks = (m + R - 1) / R;
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1 && m * n * k >= LSTM_MIN_PARALLEL_GEMM)
    for (int64_t i = 0; i < blocks; i++) {
        const int64_t r0 = i * R;
        mf_record_status(&status, mf_gemm_nn(kernels, min64(R, m - r0), n, k, a + r0 * lda,
                                             lda, b, c + r0 * ldc, ldc, o));
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

/* One step of one sequence: row (G) pre-activations in, activated gates out; c = f cp + i g
 * (cp NULL: zeros), h = o tanh(c) */
MF_CLONES
static void cell_forward(float *row, const float *cp, float *c, float *h, int64_t H) {
    for (int64_t j = 0; j < H; j += MF_VW) {
        const int64_t n = H - j < MF_VW ? H - j : MF_VW;
        vf i, f, g, o, cn = VZERO, tc;
        vload_n(&i, row + j, n);
        vload_n(&f, row + H + j, n);
        vload_n(&g, row + 2 * H + j, n);
        vload_n(&o, row + 3 * H + j, n);
        vsigmoid(&i);
        vsigmoid(&f);
        vtanh(&g);
        vsigmoid(&o);
        if (cp != NULL) vload_n(&cn, cp + j, n);
        cn = f * cn + i * g;
        tc = cn;
        vtanh(&tc);
        tc = o * tc;
        vstore_n(row + j, &i, n);
        vstore_n(row + H + j, &f, n);
        vstore_n(row + 2 * H + j, &g, n);
        vstore_n(row + 3 * H + j, &o, n);
        vstore_n(c + j, &cn, n);
        vstore_n(h + j, &tc, n);
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
        vload_n(&i, gt + j, n);
        vload_n(&f, gt + H + j, n);
        vload_n(&g, gt + 2 * H + j, n);
        vload_n(&o, gt + 3 * H + j, n);
        vload_n(&tc, c + j, n);
        vtanh(&tc);
        vload_n(&dht, dh + j, n);
        vload_n(&dhr, dhb + j, n);
        dht = dht + dhr;
        vload_n(&dct, dcb + j, n);
        dct = dct + dht * o * (1.0f - tc * tc);
        if (cp != NULL) vload_n(&cpj, cp + j, n);
        out = dct * g * i * (1.0f - i);
        vstore_n(dp + j, &out, n);
        out = dct * cpj * f * (1.0f - f);
        vstore_n(dp + H + j, &out, n);
        out = dct * i * (1.0f - g * g);
        vstore_n(dp + 2 * H + j, &out, n);
        out = dht * tc * o * (1.0f - o);
        vstore_n(dp + 3 * H + j, &out, n);
        out = dct * f;
        vstore_n(dcb + j, &out, n);
    }
}

static int64_t forward_floats(int kernels, const MfLstmParams *p) {
    const int64_t G = 4 * p->H;
    return aligned(mf_gemm_b_floats(kernels, p->C, G)) +
           aligned(mf_gemm_b_floats(kernels, p->H, G));
}

int64_t lstm_forward_scratch_floats(const MfLstmParams *p) {
    return valid(p) ? forward_floats(mf_kernels(), p) : 0;
}

int lstm_forward(const MfLstmParams *p) {
    if (!valid(p)) return MF_EINVAL;
    const int kernels = mf_kernels();
    if (p->scratch == NULL || p->scratch_floats < forward_floats(kernels, p)) return MF_EINVAL;
    const int64_t B = p->B, T = p->T, C = p->C, H = p->H, G = 4 * H;
    const int64_t R = mf_row_block(kernels);
    float *gates = p->gates, *wih = p->scratch;
    float *whh = wih + aligned(mf_gemm_b_floats(kernels, C, G));
    mf_gemm_prepare_b(kernels, wih, p->w_ih, C, G, 1); /* w_ih^T (C, G) */
    mf_gemm_prepare_b(kernels, whh, p->w_hh, H, G, 1); /* w_hh^T (H, G) */
    const MfGemmOptions with_bias = {.bias = p->b}, accumulate = {.accumulate = 1};
    int st = rows_nn(kernels, R, B * T, G, C, p->x, C, wih, gates, G, &with_bias);
    if (st != MF_OK) return st;
    for (int64_t t = 0; t < T; t++) {
        const float *hp = t > 0 ? p->h + (t - 1) * H : p->h0;
        const int64_t ldh = t > 0 ? T * H : H;
        if (hp != NULL) {
            st = rows_nn(kernels, R, B, G, H, hp, ldh, whh, gates + t * G, T * G, &accumulate);
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

/* The backward's scratch: its parts' offsets (floats) and sizes */
typedef struct {
    int64_t R, blocks, chunks, W;                    /* row blocks, chunks, a chunk's floats */
    int64_t whh, wih, dpre, hprev, dhn, dcn, sums, dw; /* offsets */
    int64_t fixed, per_thread;
} BackwardScratch;

static BackwardScratch backward_scratch(int kernels, const MfLstmParams *p) {
    BackwardScratch s;
    const int64_t BT = p->B * p->T, H = p->H, C = p->C, G = 4 * H;
    s.R = mf_row_block(kernels);
    s.blocks = (BT + s.R - 1) / s.R;
    s.W = G * C + G * H; /* a chunk's dw_ih, then its dw_hh */
    s.chunks = mf_grad_chunks(s.blocks, s.W);
    s.whh = 0;
    s.wih = s.whh + aligned(mf_gemm_b_floats(kernels, G, H));
    s.dpre = s.wih + aligned(mf_gemm_b_floats(kernels, G, C));
    s.hprev = s.dpre + aligned(BT * G);
    s.dhn = s.hprev + aligned(BT * H);
    s.dcn = s.dhn + aligned(p->B * H);
    s.sums = s.dcn + aligned(p->B * H);
    s.dw = s.sums + aligned(2 * G);
    s.fixed = s.dw + aligned(s.chunks * s.W);
    const int64_t pi = mf_gemm_tn_pack_floats(kernels, G, C);
    const int64_t ph = mf_gemm_tn_pack_floats(kernels, G, H);
    s.per_thread = aligned(pi > ph ? pi : ph);
    return s;
}

int64_t lstm_backward_scratch_floats(const MfLstmParams *p) {
    if (!valid(p)) return 0;
    const BackwardScratch s = backward_scratch(mf_kernels(), p);
    return s.fixed + mf_max_threads() * s.per_thread;
}

int lstm_backward(const MfLstmParams *p) {
    if (!valid(p)) return MF_EINVAL;
    const int kernels = mf_kernels();
    const BackwardScratch s = backward_scratch(kernels, p);
    if (p->scratch == NULL || p->scratch_floats < s.fixed + s.per_thread) return MF_EINVAL;
    /* as many threads as the scratch serves */
    int threads = mf_max_threads();
    const int64_t served = (p->scratch_floats - s.fixed) / s.per_thread;
    if (served < threads) threads = (int)served;
    const int64_t B = p->B, T = p->T, C = p->C, H = p->H, G = 4 * H, BT = B * T;
    float *base = p->scratch;
    float *whh = base + s.whh, *wih = base + s.wih, *dpre = base + s.dpre;
    float *hprev = base + s.hprev, *dhn = base + s.dhn, *dcn = base + s.dcn;
    double *sums = (double *)(base + s.sums);
    float *dw_chunks = base + s.dw, *pack = base + s.fixed;
    mf_gemm_prepare_b(kernels, whh, p->w_hh, G, H, 0); /* w_hh (G, H) */
    mf_gemm_prepare_b(kernels, wih, p->w_ih, G, C, 0); /* w_ih (G, C) */
    memset(dhn, 0, (size_t)(B * H) * sizeof(float));
    memset(dcn, 0, (size_t)(B * H) * sizeof(float));
    const MfGemmOptions none = {0};
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
        st = rows_nn(kernels, s.R, B, H, G, dpre + t * G, T * G, whh, dhn, H, &none);
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
    /* dx = dpre w_ih; per chunk of row blocks, in block order: dw_ih += dpre^T x, dw_hh +=
     * dpre^T h_prev into the chunk's own sums */
    const int64_t R = s.R, blocks = s.blocks, chunks = s.chunks, W = s.W;
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) \
    if (blocks > 1 && BT * G * C >= LSTM_MIN_PARALLEL_GEMM)
    for (int64_t ch = 0; ch < chunks; ch++) {
        float *dwi = dw_chunks + ch * W, *dwh = dwi + G * C;
        float *pk = pack + mf_thread_id() * s.per_thread;
        const int64_t b0 = ch * blocks / chunks;
        for (int64_t blk = b0; blk < (ch + 1) * blocks / chunks; blk++) {
            const int64_t r0 = blk * R, rows = min64(R, BT - r0);
            const float *dp = dpre + r0 * G;
            mf_record_status(&status, mf_gemm_nn(kernels, rows, C, G, dp, G, wih,
                                                 p->dx + r0 * C, C, &none));
            mf_record_status(&status, mf_gemm_tn(kernels, G, C, rows, dp, G, p->x + r0 * C, C,
                                                 dwi, C, blk > b0, pk));
            mf_record_status(&status, mf_gemm_tn(kernels, G, H, rows, dp, G, hprev + r0 * H, H,
                                                 dwh, H, blk > b0, pk));
        }
    }
    if (status != MF_OK) return status;
    mf_add_chunks(p->dw_ih, dw_chunks, chunks, W, G * C);
    mf_add_chunks(p->dw_hh, dw_chunks + G * C, chunks, W, G * H);
    mf_column_sums(sums, dpre, BT, G);
    mf_add_block_sums(p->db, sums, 1, G, G);
    return MF_OK;
}
