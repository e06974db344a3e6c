/* Input-dependent rotary embedding (MapWM; RoPE when theta = omega * t).
 *
 * Each pair (x[2i], x[2i+1]) of q and k is rotated by theta_i:
 *   y0 = x0 cos - x1 sin,  y1 = x0 sin + x1 cos.
 * q, k (B, T, H, D); theta (TB, T, H, D/2) with TB = B (one angle per batch row, MapWM) or
 * TB = 1 (broadcast over b, RoPE).
 *
 * Forward saves nothing: the backward takes q, k and theta again (cos/sin are recomputed,
 * cheaper than storing them). Outputs must not overlap the inputs.
 * Gradient rules: every gradient here is an activation gradient, written (=):
 *   dq = R(theta)^T dq_out,  dk = R(theta)^T dk_out,
 *   dtheta = sum over {q, k} of (y0 dy1 - y1 dy0) = x0 dx1 - x1 dx0 (dx = R^T dy, the same
 *   number: R^T preserves the cross product), also summed over b when TB = 1.
 *
 * cos/sin are computed once per (tb, t, h, i) and used for q and k (and for every b when
 * TB = 1). They come from a vectorisable float polynomial (Cody-Waite reduction by pi/2 and
 * Cephes' sinf/cosf kernels on [-pi/4, pi/4], error ~1e-7) valid for |theta| <= 8192; a block
 * holding a larger or non-finite angle falls back to libm's sinf/cosf for those entries.
 * Measured on this project's Xeon (AVX-512 clone): ~0.5 ns per angle against ~8 ns for a
 * scalar libm sincosf call, which would otherwise dominate the op (2M angles at B=128, T=256).
 *
 * Parallel layout: slab tb of theta (T, H, NB) and batch row b of q (T, H, D) pair up angle a
 * with pair a, so theta is cut into segments of ROT_SEG consecutive angles (ignoring row
 * boundaries) and a work item is one segment plus the batch rows that use it: b = tb when
 * TB = B, every b (or, in the forward with few segments, a slice of b) when TB = 1. cos/sin of a
 * segment are computed once into stack scratch and then applied to contiguous runs of q and k.
 * In the backward with TB = 1 the item sums dtheta over every b itself (double accumulator), so
 * no two threads write the same dtheta entry. Chunks of items are handed out dynamically: on a
 * shared 2-vCPU machine a static split waits for whichever thread the OS has parked.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/threads.h"

#define ROT_SEG 1024           /* angles per segment: cos/sin (4 KiB each) and dtheta (8 KiB)
                                  scratch on the stack; a segment's q, k and outputs fit L1/L2 */
#define ROT_MIN_PARALLEL 16384 /* B*T*H*D below this runs on one thread */
#define ROT_CHUNK_PAIRS 8192   /* pairs of q (and of k) per scheduled chunk, at least */
#define ROT_POLY_MAX 8192.0f   /* |theta| up to which the polynomial sincos is accurate */
#define ROT_POLY_MAX_BITS 0x46000000u /* the bits of 8192.0f */

/* sin and cos of x[0..n) into s, c. Branch-free so that it vectorises: angles outside
 * [-ROT_POLY_MAX, ROT_POLY_MAX] (or NaN) go through the polynomial as 0 and are redone with
 * libm afterwards (rare: path-integration angles are already in [-pi, pi)). */
static inline __attribute__((always_inline)) void sincos_block(float *restrict s,
                                                               float *restrict c,
                                                               const float *restrict x,
                                                               int64_t n) {
    /* pi/2 = PIO2_1 + PIO2_2 + PIO2_3, the first two with few enough bits that k * PIO2_i is
     * exact for |k| < 2^13 (Cephes' DP1..DP3, doubled). */
    const float PIO2_1 = 1.5703125f, PIO2_2 = 4.837512969970703125e-4f,
                PIO2_3 = 7.54978995489188216e-8f, TWO_OVER_PI = 0.636619772367581343f;
    int32_t far = 0;
    for (int64_t j = 0; j < n; j++) {
        /* |x| <= ROT_POLY_MAX tested on the bits: a float comparison (which may trap on NaN)
         * would stop GCC from if-converting, hence vectorising, the loop. */
        uint32_t bits;
        memcpy(&bits, &x[j], sizeof bits);
        int32_t ok = (bits & 0x7fffffffu) <= ROT_POLY_MAX_BITS;
        far += 1 - ok;
        bits &= 0u - (uint32_t)ok; /* far or NaN angles become +0 */
        float xr;
        memcpy(&xr, &bits, sizeof xr);
        float kf = (xr * TWO_OVER_PI + 0x1.8p23f) - 0x1.8p23f; /* nearest integer */
        int32_t quad = (int32_t)kf;
        float r = ((xr - kf * PIO2_1) - kf * PIO2_2) - kf * PIO2_3; /* in [-pi/4, pi/4] */
        float z = r * r;
        float sr = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
        float cr = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z +
                    4.166664568298827e-2f) * z * z - 0.5f * z + 1.0f;
        /* quadrant q: sin = (s, c, -s, -c)[q], cos = (c, -s, -c, s)[q] */
        int32_t odd = quad & 1;
        float sv = odd ? cr : sr, cv = odd ? sr : cr;
        float ssign = 1.0f - (float)(quad & 2), csign = 1.0f - (float)((quad + 1) & 2);
        s[j] = ssign * sv;
        c[j] = csign * cv;
    }
    if (far) {
        for (int64_t j = 0; j < n; j++) {
            if (!(fabsf(x[j]) <= ROT_POLY_MAX)) {
                s[j] = sinf(x[j]);
                c[j] = cosf(x[j]);
            }
        }
    }
}

/* y = R x for n pairs of one q row and one k row. */
static inline __attribute__((always_inline)) void rotate_block(
    float *restrict yq, float *restrict yk, const float *restrict xq, const float *restrict xk,
    const float *restrict s, const float *restrict c, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float q0 = xq[2 * j], q1 = xq[2 * j + 1], k0 = xk[2 * j], k1 = xk[2 * j + 1];
        yq[2 * j] = q0 * c[j] - q1 * s[j];
        yq[2 * j + 1] = q0 * s[j] + q1 * c[j];
        yk[2 * j] = k0 * c[j] - k1 * s[j];
        yk[2 * j + 1] = k0 * s[j] + k1 * c[j];
    }
}

/* dx = R^T dy for one q row and one k row; acc += x0 dx1 - x1 dx0 over q and k. */
static inline __attribute__((always_inline)) void rotate_back_block(
    float *restrict dxq, float *restrict dxk, double *restrict acc, const float *restrict dyq,
    const float *restrict dyk, const float *restrict xq, const float *restrict xk,
    const float *restrict s, const float *restrict c, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float a0 = dyq[2 * j], a1 = dyq[2 * j + 1], b0 = dyk[2 * j], b1 = dyk[2 * j + 1];
        float dq0 = a0 * c[j] + a1 * s[j], dq1 = a1 * c[j] - a0 * s[j];
        float dk0 = b0 * c[j] + b1 * s[j], dk1 = b1 * c[j] - b0 * s[j];
        dxq[2 * j] = dq0;
        dxq[2 * j + 1] = dq1;
        dxk[2 * j] = dk0;
        dxk[2 * j + 1] = dk1;
        float g = (xq[2 * j] * dq1 - xq[2 * j + 1] * dq0) + (xk[2 * j] * dk1 - xk[2 * j + 1] * dk0);
        acc[j] += (double)g;
    }
}

/* A work item: segment g (angles [g*ROT_SEG, ...) of one (T, P) slab tb of theta) and the batch
 * rows b in [b0, b1) that use it. Slab tb of theta and batch row b of q are both laid out
 * (T, P) with angle a <-> pair a, so the pairs of a segment are contiguous in every q row. */
typedef struct {
    int64_t tb, a0, n, b0, b1;
} Item;

static inline __attribute__((always_inline)) Item item_at(int64_t i, int64_t B, int64_t TP,
                                                          int64_t TB, int64_t nseg,
                                                          int64_t nbb) {
    Item it;
    int64_t g;
    if (TB == 1) {
        int64_t bb = i % nbb;
        g = i / nbb;
        it.tb = 0;
        it.b0 = B * bb / nbb;
        it.b1 = B * (bb + 1) / nbb;
    } else {
        g = i % nseg;
        it.tb = it.b0 = i / nseg;
        it.b1 = it.b0 + 1;
    }
    it.a0 = g * ROT_SEG;
    it.n = TP - it.a0 < ROT_SEG ? TP - it.a0 : ROT_SEG;
    return it;
}

MF_CLONES
static void forward_items(float *q_out, float *k_out, const float *q, const float *k,
                          const float *theta, int64_t B, int64_t TP, int64_t TB, int64_t nseg,
                          int64_t nbb, int64_t i0, int64_t i1) {
    float s[ROT_SEG], c[ROT_SEG];
    for (int64_t i = i0; i < i1; i++) {
        Item it = item_at(i, B, TP, TB, nseg, nbb);
        sincos_block(s, c, theta + it.tb * TP + it.a0, it.n);
        for (int64_t b = it.b0; b < it.b1; b++) {
            int64_t off = 2 * (b * TP + it.a0);
            rotate_block(q_out + off, k_out + off, q + off, k + off, s, c, it.n);
        }
    }
}

MF_CLONES
static void backward_items(float *dq, float *dk, float *dtheta, const float *dq_out,
                           const float *dk_out, const float *q, const float *k,
                           const float *theta, int64_t B, int64_t TP, int64_t TB, int64_t nseg,
                           int64_t i0, int64_t i1) {
    float s[ROT_SEG], c[ROT_SEG];
    double acc[ROT_SEG];
    for (int64_t i = i0; i < i1; i++) {
        Item it = item_at(i, B, TP, TB, nseg, 1);
        sincos_block(s, c, theta + it.tb * TP + it.a0, it.n);
        for (int64_t j = 0; j < it.n; j++) acc[j] = 0.0;
        for (int64_t b = it.b0; b < it.b1; b++) {
            int64_t off = 2 * (b * TP + it.a0);
            rotate_back_block(dq + off, dk + off, acc, dq_out + off, dk_out + off, q + off,
                              k + off, s, c, it.n);
        }
        float *dth = dtheta + it.tb * TP + it.a0;
        for (int64_t j = 0; j < it.n; j++) dth[j] = (float)acc[j];
    }
}

/* Items per dynamically scheduled chunk: about ROT_CHUNK_PAIRS pairs of q (and of k), so a
 * parked thread holds up little work and the scheduling cost stays negligible. */
static int64_t chunk_items(int64_t items, int64_t pairs_per_item) {
    int64_t per = ROT_CHUNK_PAIRS / pairs_per_item;
    if (per < 1) per = 1;
    if (per > items) per = items;
    return per;
}

int rotary_forward(const MfRotaryParams *p) {
    float *q_out = p->q_out, *k_out = p->k_out;
    const float *q = p->q, *k = p->k, *theta = p->theta;
    const int64_t B = p->B, T = p->T, H = p->H, D = p->D, TB = p->TB;
    if (B < 1 || T < 1 || H < 1 || D < 2 || D % 2 != 0 || (TB != 1 && TB != B))
        return MF_EINVAL;
    const int64_t TP = T * H * (D / 2), nseg = (TP + ROT_SEG - 1) / ROT_SEG;
    /* With TB = 1 and few segments, split b too so that every thread gets work. */
    int64_t nbb = 1;
    if (TB == 1 && nseg < 4 * mf_max_threads()) {
        nbb = (4 * mf_max_threads() + nseg - 1) / nseg;
        if (nbb > B) nbb = B;
    }
    const int64_t items = TB == 1 ? nseg * nbb : B * nseg;
    const int64_t per = chunk_items(items, ROT_SEG * (TB == 1 ? (B + nbb - 1) / nbb : 1));
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * D >= ROT_MIN_PARALLEL)
    for (int64_t i0 = 0; i0 < items; i0 += per)
        forward_items(q_out, k_out, q, k, theta, B, TP, TB, nseg, nbb, i0,
                      i0 + per < items ? i0 + per : items);
    return MF_OK;
}

int rotary_backward(const MfRotaryParams *p) {
    float *dq = p->dq, *dk = p->dk, *dtheta = p->dtheta;
    const float *dq_out = p->dq_out, *dk_out = p->dk_out, *q = p->q, *k = p->k;
    const float *theta = p->theta;
    const int64_t B = p->B, T = p->T, H = p->H, D = p->D, TB = p->TB;
    if (B < 1 || T < 1 || H < 1 || D < 2 || D % 2 != 0 || (TB != 1 && TB != B))
        return MF_EINVAL;
    const int64_t TP = T * H * (D / 2), nseg = (TP + ROT_SEG - 1) / ROT_SEG;
    /* With TB = 1 an item owns its dtheta segment and sums over every b itself. */
    const int64_t items = TB == 1 ? nseg : B * nseg;
    const int64_t per = chunk_items(items, ROT_SEG * (TB == 1 ? B : 1));
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * D >= ROT_MIN_PARALLEL)
    for (int64_t i0 = 0; i0 < items; i0 += per)
        backward_items(dq, dk, dtheta, dq_out, dk_out, q, k, theta, B, TP, TB, nseg, i0,
                       i0 + per < items ? i0 + per : items);
    return MF_OK;
}
