/* TAPE (contextualised equivariant position encoding, Zhu et al. 2025) as mapformer reads it
 * from the MapFormer paper (sec. 3.7: "learns to modify its positional encoding after the
 * attention mechanism, with input-dependent MLPs").
 *
 * Every token carries a per-head positional state E (B, T, H, NB, 2), stored (B, T, H, D) with
 * D = 2 NB and read as NB complex numbers e = e0 + i e1 per head (e[..., 2k] = e0,
 * e[..., 2k+1] = e1), initialised as RoPE: e = exp(i omega_k t). In each layer:
 *  1. complex_rotary (tape_rotate_*): queries and keys are multiplied blockwise by the state as
 *     complex numbers, (x0 + i x1)(e0 + i e1) per pair (x[2k], x[2k+1]):
 *       y0 = x0 e0 - x1 e1,  y1 = x0 e1 + x1 e0.
 *     With |e| = 1 this is exactly the rotary op (e = cos + i sin); in general it also scales.
 *  2. after attention the model updates the state with ops it already has: E_att = A E (the
 *     attention op with E as the values), then the content-gated head-mixing MLP (tape_mix_*):
 *       E_new[b,t,h,:] = E_att[b,t,h,:] + g[b,t,h] sum_h' W[h,h'] E_att[b,t,h',:],
 *       g = sigmoid(G),  G = x W_g^T + b_g (B, T, H) from the layer's content (linear op).
 *     W is real, so the mix commutes with multiplying every head's state by one complex number:
 *     a global rotation of the positions passes through the update unchanged (equivariance).
 *
 * Forward saves nothing: both backwards take the forward's inputs again (the complex products,
 * gates and head mixes are recomputed; cheaper than storing them). Outputs must not overlap
 * the inputs.
 * Gradient rules: dq, dk, de, de_att, dgate_logits are activation gradients, written (=);
 * dw (H, H) is a parameter gradient, accumulated (+=).
 *   rotate: for y = x e (complex x, e) and a real loss, with dy = dL/dy0 + i dL/dy1,
 *     dx = conj(e) dy:   dx0 = dy0 e0 + dy1 e1,   dx1 = dy1 e0 - dy0 e1,
 *     de = conj(x) dy:   de0 = x0 dy0 + x1 dy1,   de1 = x0 dy1 - x1 dy0,
 *     and de sums the q and k terms: de = conj(q) dq_out + conj(k) dk_out.
 *   mix: with Y = de_new (B, T, H, D), M[h] = sum_h' W[h,h'] E_att[h'] and
 *     P[h,h'] = Y[h] . E_att[h'] (a dot product over D), per row (b, t):
 *     de_att[h']       = Y[h'] + sum_h g[h] W[h,h'] Y[h],
 *     dgate_logits[h]  = g[h] (1 - g[h]) Y[h] . M[h] = g (1 - g) sum_h' W[h,h'] P[h,h'],
 *     dw[h,h']        += sum_{b,t} g[h] P[h,h'],
 *     so M is never materialised. g and 1 - g are both computed as sigmoids (of G and -G), so
 *     g (1 - g) keeps its relative accuracy for large |G|.
 *
 * Parallel layout: every tensor is (B*T) rows of H*D (or H) contiguous floats, and every op
 * works row by row: the rotate ops are elementwise over pairs, the mix couples only the H heads
 * of one row. Rows are cut into blocks that depend only on the sizes (never on the thread
 * count) and handed out dynamically (on a shared 2-vCPU machine a static split waits for
 * whichever thread the OS has parked). Inner loops run over D: the complex products as plain
 * loops over pairs (GCC vectorises the interleaved even/odd lanes with permutes; explicit
 * shuffles measured no faster: the op is memory-bound), the head mix over D-chunks of a stack
 * buffer (forward) or in place in the output row (backward), the dot products P with 16
 * float lanes (simd.h's vectors: GCC does not vectorise a float sum without -ffast-math)
 * summed in double, the gates with simd.h's vexp. In the mix backward each row block sums its
 * dw contribution into its own double scratch (the caller's: tape_mix_backward_scratch_floats)
 * and the blocks are added in block order afterwards: race-free and bit-identical for any
 * number of threads.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"

#define TAPE_MIN_PARALLEL 32768   /* B*T*H*D below this runs on one thread */
#define TAPE_BLOCK_FLOATS 16384   /* floats of one tensor per rotate / mix-forward work item */
#define TAPE_MIX_BLOCKS 256       /* row blocks of the mix backward (a function of B*T only) */
#define TAPE_DCHUNK 256           /* D-chunk of the head-mix stack buffer (1 KiB) */

/* ---- complex_rotary ------------------------------------------------------------------------ */

/* y = x e for n pairs of one q run and one k run. */
static inline __attribute__((always_inline)) void cmul_block(
    float *restrict yq, float *restrict yk, const float *restrict xq, const float *restrict xk,
    const float *restrict e, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float e0 = e[2 * j], e1 = e[2 * j + 1];
        float q0 = xq[2 * j], q1 = xq[2 * j + 1], k0 = xk[2 * j], k1 = xk[2 * j + 1];
        yq[2 * j] = q0 * e0 - q1 * e1;
        yq[2 * j + 1] = q0 * e1 + q1 * e0;
        yk[2 * j] = k0 * e0 - k1 * e1;
        yk[2 * j + 1] = k0 * e1 + k1 * e0;
    }
}

/* dx = conj(e) dy for one q run and one k run; de = conj(q) dyq + conj(k) dyk. */
static inline __attribute__((always_inline)) void cmul_back_block(
    float *restrict dxq, float *restrict dxk, float *restrict de, const float *restrict dyq,
    const float *restrict dyk, const float *restrict xq, const float *restrict xk,
    const float *restrict e, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float e0 = e[2 * j], e1 = e[2 * j + 1];
        float a0 = dyq[2 * j], a1 = dyq[2 * j + 1], b0 = dyk[2 * j], b1 = dyk[2 * j + 1];
        float q0 = xq[2 * j], q1 = xq[2 * j + 1], k0 = xk[2 * j], k1 = xk[2 * j + 1];
        dxq[2 * j] = a0 * e0 + a1 * e1;
        dxq[2 * j + 1] = a1 * e0 - a0 * e1;
        dxk[2 * j] = b0 * e0 + b1 * e1;
        dxk[2 * j + 1] = b1 * e0 - b0 * e1;
        de[2 * j] = (q0 * a0 + q1 * a1) + (k0 * b0 + k1 * b1);
        de[2 * j + 1] = (q0 * a1 - q1 * a0) + (k0 * b1 - k1 * b0);
    }
}

/* Rows [r0, r1) of length L = H*D floats (L/2 pairs each, contiguous across rows). */
MF_CLONES
static void rotate_rows(float *q_out, float *k_out, const float *q, const float *k,
                        const float *e, int64_t L, int64_t r0, int64_t r1) {
    const int64_t off = r0 * L;
    cmul_block(q_out + off, k_out + off, q + off, k + off, e + off, (r1 - r0) * L / 2);
}

MF_CLONES
static void rotate_back_rows(float *dq, float *dk, float *de, const float *dq_out,
                             const float *dk_out, const float *q, const float *k, const float *e,
                             int64_t L, int64_t r0, int64_t r1) {
    const int64_t off = r0 * L;
    cmul_back_block(dq + off, dk + off, de + off, dq_out + off, dk_out + off, q + off, k + off,
                    e + off, (r1 - r0) * L / 2);
}

/* Rows per work item of the elementwise passes: about TAPE_BLOCK_FLOATS floats, at least 1. */
static int64_t rows_per_item(int64_t L) {
    int64_t per = TAPE_BLOCK_FLOATS / L;
    return per < 1 ? 1 : per;
}

static int bad_sizes(int64_t B, int64_t T, int64_t H, int64_t D) {
    return B < 1 || T < 1 || H < 1 || D < 2 || D % 2 != 0;
}

int tape_rotate_forward(const MfTapeRotateParams *p) {
    const int64_t B = p->B, T = p->T, H = p->H, D = p->D;
    if (bad_sizes(B, T, H, D)) return MF_EINVAL;
    const int64_t N = B * T, L = H * D, per = rows_per_item(L);
#pragma omp parallel for schedule(dynamic, 1) if (N * L >= TAPE_MIN_PARALLEL)
    for (int64_t r0 = 0; r0 < N; r0 += per)
        rotate_rows(p->q_out, p->k_out, p->q, p->k, p->e, L, r0, r0 + per < N ? r0 + per : N);
    return MF_OK;
}

int tape_rotate_backward(const MfTapeRotateParams *p) {
    const int64_t B = p->B, T = p->T, H = p->H, D = p->D;
    if (bad_sizes(B, T, H, D)) return MF_EINVAL;
    const int64_t N = B * T, L = H * D, per = rows_per_item(L);
#pragma omp parallel for schedule(dynamic, 1) if (N * L >= TAPE_MIN_PARALLEL)
    for (int64_t r0 = 0; r0 < N; r0 += per)
        rotate_back_rows(p->dq, p->dk, p->de, p->dq_out, p->dk_out, p->q, p->k, p->e, L, r0,
                         r0 + per < N ? r0 + per : N);
    return MF_OK;
}

/* ---- tape_mix ------------------------------------------------------------------------------ */

/* g[j] = sigmoid(x[j]) and omg[j] = 1 - sigmoid(x[j]) = sigmoid(-x[j]) for j < n <= MF_VW, both
 * to float relative accuracy: t = exp(-|x|) in (0, 1] (simd.h's vexp) never overflows. A NaN
 * x gives NaN in both. */
MF_INLINE void gate_pairs(float g[MF_VW], float omg[MF_VW], const float *x, int64_t n) {
    vf v;
    if (n < MF_VW)
        vload_part(&v, x, n);
    else
        v = VLOADU(x);
    vf t = (vf)((vi)v | ISPLAT(INT32_MIN)); /* -|x| */
    vexp(&t);
    const vf big = 1.0f / (1.0f + t), small = t / (1.0f + t);
    const vi pos = v >= VSPLAT(0.0f);
    VSTOREU(g, VSELECT(pos, big, small));
    VSTOREU(omg, VSELECT(pos, small, big));
}

/* Rows [r0, r1): e_new (H, D) of row r = e_att + g * W e_att, D in chunks of TAPE_DCHUNK. */
MF_CLONES
static void mix_rows(float *restrict e_new, const float *restrict e_att,
                     const float *restrict gate_logits, const float *restrict w, int64_t H,
                     int64_t D, int64_t r0, int64_t r1) {
    float m[TAPE_DCHUNK], g[MF_VW], omg[MF_VW];
    for (int64_t r = r0; r < r1; r++) {
        const float *er = e_att + r * H * D;
        float *yr = e_new + r * H * D;
        for (int64_t h = 0; h < H; h++) {
            if (h % MF_VW == 0) gate_pairs(g, omg, gate_logits + r * H + h, H - h);
            const float gh = g[h % MF_VW], *wh = w + h * H;
            for (int64_t d0 = 0; d0 < D; d0 += TAPE_DCHUNK) {
                const int64_t n = D - d0 < TAPE_DCHUNK ? D - d0 : TAPE_DCHUNK;
                for (int64_t j = 0; j < n; j++) m[j] = wh[0] * er[d0 + j];
                for (int64_t hp = 1; hp < H; hp++) {
                    const float c = wh[hp], *src = er + hp * D + d0;
                    for (int64_t j = 0; j < n; j++) m[j] += c * src[j];
                }
                const float *src = er + h * D + d0;
                float *dst = yr + h * D + d0;
                for (int64_t j = 0; j < n; j++) dst[j] = src[j] + gh * m[j];
            }
        }
    }
}

/* a . b over n floats: 16 float lanes (16 / MF_VW vectors), summed in double as a fixed tree
 * (lane l + 8 onto lane l, then halving: with H = 2 and D = 64 a lane-order sum was a quarter
 * of the backward's time), then the tail. The same bits for any MF_VW. */
#define TAPE_LANES 16
MF_INLINE double dot_f32(const float *restrict a, const float *restrict b, int64_t n) {
    const int64_t nv = n - n % TAPE_LANES;
    vf acc[TAPE_LANES / MF_VW];
    for (int v = 0; v < TAPE_LANES / MF_VW; v++) acc[v] = VZERO;
    for (int64_t j = 0; j < nv; j += TAPE_LANES)
        for (int v = 0; v < TAPE_LANES / MF_VW; v++)
            acc[v] += VLOADU(a + j + v * MF_VW) * VLOADU(b + j + v * MF_VW);
    float lane[TAPE_LANES];
    memcpy(lane, acc, sizeof lane);
    double t[TAPE_LANES / 2];
    for (int l = 0; l < TAPE_LANES / 2; l++) t[l] = (double)lane[l] + (double)lane[l + 8];
    for (int w = TAPE_LANES / 4; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    double s = t[0];
    for (int64_t j = nv; j < n; j++) s += (double)(a[j] * b[j]);
    return s;
}

/* Rows [r0, r1) of the mix backward. Scratch: pw (H, H) this block's dw partial sums (set
 * here) and gs (2H: g, then g (1 - g)) per-row work space. */
MF_CLONES
static void mix_back_rows(float *restrict de_att, float *restrict dgate_logits,
                          double *restrict pw, double *restrict gs,
                          const float *restrict de_new, const float *restrict e_att,
                          const float *restrict gate_logits, const float *restrict w, int64_t H,
                          int64_t D, int64_t r0, int64_t r1) {
    for (int64_t i = 0; i < H * H; i++) pw[i] = 0.0;
    for (int64_t r = r0; r < r1; r++) {
        const float *yr = de_new + r * H * D, *er = e_att + r * H * D;
        float *dr = de_att + r * H * D;
        for (int64_t h0 = 0; h0 < H; h0 += MF_VW) {
            float g[MF_VW], omg[MF_VW];
            gate_pairs(g, omg, gate_logits + r * H + h0, H - h0);
            for (int64_t h = h0; h < H && h < h0 + MF_VW; h++) {
                gs[h] = g[h - h0];
                gs[H + h] = (double)g[h - h0] * (double)omg[h - h0];
            }
        }
        /* P[h, h'] = Y[h] . E_att[h'];  dG[h] = g (1 - g) sum_h' W[h,h'] P[h,h'];
         * dw[h, h'] += g[h] P[h, h'] */
        for (int64_t h = 0; h < H; h++) {
            double s = 0.0;
            for (int64_t hp = 0; hp < H; hp++) {
                const double v = dot_f32(yr + h * D, er + hp * D, D);
                s += (double)w[h * H + hp] * v;
                pw[h * H + hp] += gs[h] * v;
            }
            dgate_logits[r * H + h] = (float)(gs[H + h] * s);
        }
        /* de_att[h'] = Y[h'] + sum_h (g[h] W[h, h']) Y[h], accumulated in place (the row is
         * in L1) */
        for (int64_t hp = 0; hp < H; hp++) {
            float *restrict dst = dr + hp * D;
            const float *restrict own = yr + hp * D, *restrict y0 = yr;
            const float c0 = (float)gs[0] * w[hp];
            for (int64_t j = 0; j < D; j++) dst[j] = own[j] + c0 * y0[j];
            for (int64_t h = 1; h < H; h++) {
                const float c = (float)gs[h] * w[h * H + hp], *restrict src = yr + h * D;
                for (int64_t j = 0; j < D; j++) dst[j] += c * src[j];
            }
        }
    }
}

int tape_mix_forward(const MfTapeMixParams *p) {
    const int64_t B = p->B, T = p->T, H = p->H, D = p->D;
    if (bad_sizes(B, T, H, D)) return MF_EINVAL;
    const int64_t N = B * T, per = rows_per_item(H * D);
#pragma omp parallel for schedule(dynamic, 1) if (N * H * D >= TAPE_MIN_PARALLEL)
    for (int64_t r0 = 0; r0 < N; r0 += per)
        mix_rows(p->e_new, p->e_att, p->gate_logits, p->w, H, D, r0, r0 + per < N ? r0 + per : N);
    return MF_OK;
}

/* per row block of the backward, in double: dw partials (H*H), then g and g (1 - g) (2H) */
static int64_t mix_blocks(const MfTapeMixParams *p) {
    const int64_t N = p->B * p->T;
    return N < TAPE_MIX_BLOCKS ? N : TAPE_MIX_BLOCKS;
}

int64_t tape_mix_backward_scratch_floats(const MfTapeMixParams *p) {
    return mf_scratch_size(2 * mix_blocks(p) * (p->H * p->H + 2 * p->H));
}

int tape_mix_backward(const MfTapeMixParams *p) {
    float *dw = p->dw;
    const int64_t B = p->B, T = p->T, H = p->H, D = p->D;
    if (bad_sizes(B, T, H, D) || p->scratch_floats < tape_mix_backward_scratch_floats(p))
        return MF_EINVAL;
    const int64_t N = B * T, nb = mix_blocks(p), stride = H * H + 2 * H;
    double *part = (double *)p->scratch;
#pragma omp parallel for schedule(dynamic, 1) if (N * H * D >= TAPE_MIN_PARALLEL)
    for (int64_t b = 0; b < nb; b++) {
        double *s = part + b * stride;
        mix_back_rows(p->de_att, p->dgate_logits, s, s + H * H, p->de_new, p->e_att,
                      p->gate_logits, p->w, H, D, N * b / nb, N * (b + 1) / nb);
    }
    for (int64_t i = 0; i < H * H; i++) {
        double sum = 0.0;
        for (int64_t b = 0; b < nb; b++) sum += part[b * stride + i];
        dw[i] = (float)((double)dw[i] + sum);
    }
    return MF_OK;
}
