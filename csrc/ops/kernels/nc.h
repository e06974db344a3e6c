/* MapEM-NC's per-group kernels (csrc/ops/nc.c has the method, the numerics and the layout),
 * written once over the SIMD layer (mapformer/simd.h) and compiled once per width. A file
 * defines
 *   MF_VW       the vector width in floats: the lanes of a group (blocks of one batch row)
 *   NC_SUFFIX   the suffix of its exported functions (clones, avx512)
 *   NC_ATTR     the functions' attributes (MF_CLONES for the target_clones copies, or empty)
 * then includes this file. The lanes never interact and every operation is elementwise with
 * one rounding (no contraction: -ffp-contract=off), so every width gives the same bits.
 * The arrays are feature-major within a head (nc.c): a group's feature is one vector load or
 * store.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/mapformer.h"
#include "mapformer/simd.h"
#include "nc_sets.h"

#if !defined(NC_SUFFIX) || !defined(NC_ATTR)
#error "define MF_VW, NC_SUFFIX and NC_ATTR before including nc.h"
#endif
#define NC_CAT2(a, b) a##_##b
#define NC_CAT(a, b) NC_CAT2(a, b)
#define NC_FN(name) NC_CAT(name, NC_SUFFIX)
#if MF_VW == 16 && defined(__AVX512F__)
#define NC_AVX512 1 /* the intrinsics */
#else
#define NC_AVX512 0
#endif

#define NC_POLY2 2.25f /* |w|^2 below which qexp is its Taylor series (|w| < 1.5) */
#define NC_CHUNK 8     /* steps whose qexp the forward evaluates before their products */
#define NC_AHEAD 4     /* steps ahead that the (b, t) rows are prefetched (B 128, T 256, H 2,
                          NB 16, one thread: 4 to 6 alike, 8 a few percent slower in the
                          backward, 2 and 16 slower) */
#define ALIGNED __attribute__((aligned(64)))

/* FMA(a, b, c) = a b + c and FMS(a, b, c) = a b - c, one rounding on every width and target
 * (simd.h's VFMAF; the intrinsic where the file is compiled for AVX-512) */
#if NC_AVX512
#define FMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#define FMS(a, b, c) ((vf)_mm512_fmsub_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#else
#define FMA(a, b, c) VFMAF(a, b, c)
#define FMS(a, b, c) VFMAF(a, b, -(c))
#endif

typedef struct {
    vf w, x, y, z;
} vq;

/* *r = a b, each component's four products one chain: a product and three fused
 * multiply-adds (16 operations; every term holds a factor of b, so on a sequential product
 * the chain's latency is the four operations) */
MF_INLINE void vq_mul(vq *r, const vq *a, const vq *b) {
    const vf w = FMS(a->w, b->w, FMA(a->x, b->x, FMA(a->y, b->y, a->z * b->z)));
    const vf x = FMA(a->w, b->x, FMA(a->x, b->w, FMS(a->y, b->z, a->z * b->y)));
    const vf y = FMA(a->w, b->y, FMA(a->z, b->x, FMS(a->y, b->w, a->x * b->z)));
    const vf z = FMA(a->w, b->z, FMA(a->z, b->w, FMS(a->x, b->y, a->y * b->x)));
    r->w = w, r->x = x, r->y = y, r->z = z;
}

/* *f = 3/2 - |q|^2 hinv, hinv = 1 / (2 s2): one Newton step for |s| / |q| from 1 (s2 = |s|^2,
 * the chain's squared norm: |p*|^2, or 1). The chains apply q_{t-1}'s factor
 * to q_t = x_t q_{t-1} (or q_{t-1} x_t), computed beside the product rather than after it, so
 * that the chain's latency is the products' alone: with |q_{t-1}|^2 = s2 (1 + e) and a step's
 * rounding d_t, |q_t|^2 = s2 (1 + e)(1 + 2 d_t)(1 - e + O(e^2)) = s2 (1 + 2 d_t + O(e^2)): as
 * converged as the factor applied after the product. */
MF_INLINE void vq_renorm_factor(vf *f, const vq *q, const vf *hinv) {
    const vf n2 = FMA(q->w, q->w, FMA(q->x, q->x, FMA(q->y, q->y, q->z * q->z)));
    *f = FMA(-n2, *hinv, VSPLAT(1.5f));
}

MF_INLINE void vq_scale(vq *q, const vf *f) {
    q->w *= *f, q->x *= *f, q->y *= *f, q->z *= *f;
}

MF_INLINE void vsqrt(vf *r, const vf *x) {
#if NC_AVX512
    *r = (vf)_mm512_sqrt_ps((__m512)*x);
#else
    for (int l = 0; l < MF_VW; l++) (*r)[l] = __builtin_sqrtf((*x)[l]);
#endif
}

/* whether any lane of m is set */
MF_INLINE int vany(const vi *m) {
#if NC_AVX512
    return _mm512_test_epi32_mask((__m512i)*m, (__m512i)*m) != 0;
#else
    int any = 0;
    for (int l = 0; l < MF_VW; l++) any |= (*m)[l];
    return any != 0;
#endif
}

/* *a = qexp(w) = (cos n, sinc(n) w) for the pure quaternion w = (w[0], w[1], w[2]), n = |w|;
 * *sc = sinc n, when k is not NULL *k = (1 - sinc n cos n) / n^2 (qexp's Jacobian, see
 * side_coefs), when n2o is not NULL *n2o = n^2. Lanes with n^2 < NC_POLY2: their Taylor
 * series in n^2 (cos and sinc to n^12, k to n^14: the next terms are below 4e-9 there; Horner
 * by fused multiply-adds), no square root, division or reduction; any other lane (only when
 * there is one): sqrt, vsincos and a division. */
#define NC_H(x, c) x = FMA(x, n2, VSPLAT(c)) /* one Horner step */
MF_INLINE void vqexp(vq *a, vf *sc, vf *k, vf *n2o, const vf *w) {
    const vf n2 = FMA(w[2], w[2], FMA(w[0], w[0], w[1] * w[1]));
    if (n2o) *n2o = n2;
    vf c = VSPLAT(1.0f / 479001600);
    NC_H(c, -1.0f / 3628800), NC_H(c, 1.0f / 40320), NC_H(c, -1.0f / 720);
    NC_H(c, 1.0f / 24), NC_H(c, -0.5f), NC_H(c, 1.0f);
    vf s = VSPLAT(1.0f / 6227020800);
    NC_H(s, -1.0f / 39916800), NC_H(s, 1.0f / 362880), NC_H(s, -1.0f / 5040);
    NC_H(s, 1.0f / 120), NC_H(s, -1.0f / 6), NC_H(s, 1.0f);
    vf q = VZERO;
    if (k) { /* sum_{j >= 1} (-1)^(j+1) 4^j n^(2j-2) / (2j+1)!, to j = 8 */
        q = VSPLAT(-65536.0f / 355687428096000.0f);
        NC_H(q, 16384.0f / 1307674368000.0f), NC_H(q, -4096.0f / 6227020800.0f);
        NC_H(q, 1024.0f / 39916800), NC_H(q, -256.0f / 362880);
        NC_H(q, 64.0f / 5040), NC_H(q, -16.0f / 120), NC_H(q, 4.0f / 6);
    }
    const vi big = n2 >= VSPLAT(NC_POLY2);
    if (vany(&big)) {
        const vf m2 = VSELECT(big, n2, VSPLAT(1.0f)); /* 1: lanes taken from the series */
        vf n, sn, cn;
        vsqrt(&n, &m2);
        vsincos(&n, &sn, &cn);
        const vf rn = 1.0f / n, sg = sn * rn;
        c = VSELECT(big, cn, c);
        s = VSELECT(big, sg, s);
        if (k) q = VSELECT(big, (1.0f - sg * cn) * rn * rn, q);
    }
    *sc = s;
    if (k) *k = q;
    a->w = c, a->x = s * w[0], a->y = s * w[1], a->z = s * w[2];
}

/* v[f] (f < F) = lanes k0 .. k0 + n - 1 of feature f at src + f stride (src points at
 * feature 0 of the group's first block), zero lanes beyond n: a whole group is one load a
 * feature, a partial one gathered float by float */
MF_INLINE void tile_load(vf *v, const float *src, int64_t stride, int64_t n, int F) {
    if (n == MF_VW) {
        for (int f = 0; f < F; f++) v[f] = VLOADU(src + f * stride);
        return;
    }
    for (int f = 0; f < F; f++) {
        float tmp[MF_VW] ALIGNED;
        for (int l = 0; l < MF_VW; l++) tmp[l] = l < n ? src[f * stride + l] : 0.0f;
        v[f] = VLOAD(tmp);
    }
}

/* the n lanes of v[f] (f < F) to dst + f stride: nothing outside them is written. stream (a
 * whole group, every dst + f stride 64-byte aligned, NcShape): non-temporal stores */
MF_INLINE void tile_store(float *dst, const vf *v, int64_t stride, int64_t n, int F,
                          int stream) {
    if (n == MF_VW) {
        if (stream)
            for (int f = 0; f < F; f++) vstream(dst + f * stride, &v[f]);
        else
            for (int f = 0; f < F; f++) VSTOREU(dst + f * stride, v[f]);
        return;
    }
    for (int f = 0; f < F; f++) memcpy(dst + f * stride, &v[f], 4 * (size_t)n);
}

/* the cache lines of floats [0, n) at x into the cache (rw 1: for writing); the (b, t) rows
 * of a span are strided by the whole row (a new page every few steps), which the hardware
 * prefetchers do not follow */
MF_INLINE void prefetch_floats(const float *x, int64_t n, int rw) {
    for (int64_t i = 0; i < n; i += 16) {
        if (rw)
            __builtin_prefetch(x + i, 1);
        else
            __builtin_prefetch(x + i, 0);
    }
    if (rw)
        __builtin_prefetch(x + n - 1, 1);
    else
        __builtin_prefetch(x + n - 1, 0);
}

MF_INLINE void vq_load(vq *q, const float *src, int64_t stride, int64_t n) {
    vf v[4];
    tile_load(v, src, stride, n, 4);
    q->w = v[0], q->x = v[1], q->y = v[2], q->z = v[3];
}

/* where group gi of a (b, t) row starts: its head h and first block k0 (offset h F NB + k0 in
 * a row of F floats a block, feature f at + f NB), its lanes n */
typedef struct {
    int64_t h, k0, n;
} NcGroup;

MF_INLINE NcGroup group_of(const NcShape *sh, int64_t gi) {
    NcGroup g;
    g.h = gi / sh->gph, g.k0 = gi % sh->gph * MF_VW;
    g.n = sh->NB - g.k0 < MF_VW ? sh->NB - g.k0 : MF_VW;
    return g;
}


/* The G (1 or 2) groups g0, g0 + 1 of batch row b, in lockstep (the span's part of each
 * (b, t) row is contiguous, the whole row at H NB = 32 blocks and 16 lanes, and the G chains
 * are independent work for the core): per chunk of NC_CHUNK steps their qexp first
 * (independent over t), then the sequential products of the chunk */
MF_INLINE void forward_span(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0,
                            const int G) {
    const int64_t NB = sh->NB, T = sh->T, wrow = 6 * sh->nblk, prow = 4 * sh->nblk;
    NcGroup gr[NC_SPAN];
    int64_t wo[NC_SPAN], po[NC_SPAN]; /* the groups' offsets in a row of w and of p */
    vq q[NC_SPAN]; /* p_t = a_t p_{t-1} c_t, renormalised to |p*| */
    vf hinv[NC_SPAN]; /* 1 / (2 |p*|^2) (0 where |p*|^2 <= 1e-30: such a start is 0, so
                         its lanes stay 0, as the backward's dw = 0 on them says) */
    for (int g = 0; g < G; g++) {
        gr[g] = group_of(sh, g0 + g);
        wo[g] = 6 * NB * gr[g].h + gr[g].k0, po[g] = 4 * NB * gr[g].h + gr[g].k0;
        vq_load(&q[g], p->start + po[g], NB, gr[g].n);
        const vf s2 = (q[g].w * q[g].w + q[g].x * q[g].x) + (q[g].y * q[g].y + q[g].z * q[g].z);
        const vi live = s2 > VSPLAT(1e-30f);
        hinv[g] = VSELECT(live, 0.5f / VSELECT(live, s2, VSPLAT(1.0f)), VZERO);
        q[g] = (vq){VSELECT(live, q[g].w, VZERO), VSELECT(live, q[g].x, VZERO),
                    VSELECT(live, q[g].y, VZERO), VSELECT(live, q[g].z, VZERO)};
    }
    /* the floats of a row that the span reads (w) and writes (p), from wo[0] and po[0] */
    const int64_t wn = wo[G - 1] + 5 * NB + gr[G - 1].n - wo[0];
    const int64_t pn = po[G - 1] + 3 * NB + gr[G - 1].n - po[0];
    vq steps[NC_CHUNK][NC_SPAN][2]; /* a_t, c_t */
    for (int64_t t0 = 0; t0 < T; t0 += NC_CHUNK) {
        const int64_t t1 = t0 + NC_CHUNK < T ? t0 + NC_CHUNK : T;
        for (int64_t t = t0; t < t1; t++) {
            const float *wt = p->w + (b * T + t) * wrow;
            if (t + NC_AHEAD < T) prefetch_floats(wt + NC_AHEAD * wrow + wo[0], wn, 0);
            for (int g = 0; g < G; g++) {
                vf w[6], sc;
                tile_load(w, wt + wo[g], NB, gr[g].n, 6);
                vqexp(&steps[t - t0][g][0], &sc, NULL, NULL, w);
                vqexp(&steps[t - t0][g][1], &sc, NULL, NULL, w + 3);
            }
        }
        for (int64_t t = t0; t < t1; t++) {
            float *pt = p->p + (b * T + t) * prow;
            if (!sh->stream && t + NC_AHEAD < T)
                prefetch_floats(pt + NC_AHEAD * prow + po[0], pn, 1);
            for (int g = 0; g < G; g++) {
                vq *qg = &q[g];
                /* p_{t-1}'s renormalisation, beside the products, applied to p_t */
                vf f;
                vq_renorm_factor(&f, qg, &hinv[g]);
                vq_mul(qg, &steps[t - t0][g][0], qg);
                vq_mul(qg, qg, &steps[t - t0][g][1]);
                vq_scale(qg, &f);
                const vf out[4] = {qg->w, qg->x, qg->y, qg->z};
                tile_store(pt + po[g], out, NB, gr[g].n, 4, sh->stream);
            }
        }
    }
}

NC_ATTR
void NC_FN(nc_forward_span)(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0) {
    if (sh->ngroups - g0 > 1)
        forward_span(p, sh, b, g0, 2);
    else
        forward_span(p, sh, b, g0, 1);
    if (sh->stream) vstream_fence();
}

/* the saved vectors of step t in buf: w (6), the adjoint inputs h (3) and h' (3) */
#define SAVED(buf, t) ((buf) + (t) * NC_SAVED * MF_VW)

/* qexp's coefficients of one side, from sinc s, cos c, k and n^2 = m of the step and
 * hp = |p*| / 2: the rotation (conj(a) x a for u, c x conj(c) for v) is
 * alpha x + beta (w.x) w + gamma X with X = x x u (u) or v x x (v), alpha = 1 - beta m,
 * beta = 2 s^2, gamma = 2 s c; dw = c1 x + c2 (w.x) w + c3 X, c1 = |p*| s c, c2 = |p*| k,
 * c3 = |p*| s^2 (the transposed trivialised derivative of the rotated vector: see the
 * header) */
MF_INLINE void side_coefs(vf *o, const vf *s, const vf *c, const vf *k, const vf *m,
                          const vf *hp) {
    const vf beta = 2.0f * (*s * *s), gamma = 2.0f * (*s * *c);
    o[0] = FMA(-beta, *m, VSPLAT(1.0f)), o[1] = beta, o[2] = gamma;
    o[3] = *hp * gamma, o[4] = (*hp + *hp) * *k, o[5] = *hp * beta;
}

/* one reverse step of one side: y = Z_{t+1} + h_t (3 vectors, replaced by Z_t), w the side's
 * generator, o its coefficients (side_coefs), sign 1 for u (X = y x u), -1 for v (X = v x y);
 * dw = the side's gradient (3 vectors) */
MF_INLINE void side_step(vf *y, vf *dw, const vf *w, const vf *o, int sign) {
    const vf wy = FMA(w[2], y[2], FMA(w[0], y[0], w[1] * y[1]));
    vf x0, x1, x2;
    if (sign > 0)
        x0 = FMS(y[1], w[2], y[2] * w[1]), x1 = FMS(y[2], w[0], y[0] * w[2]),
        x2 = FMS(y[0], w[1], y[1] * w[0]);
    else
        x0 = FMS(y[2], w[1], y[1] * w[2]), x1 = FMS(y[0], w[2], y[2] * w[0]),
        x2 = FMS(y[1], w[0], y[0] * w[1]);
    const vf rb = o[1] * wy, gb = o[4] * wy;
    dw[0] = FMA(o[5], x0, FMA(gb, w[0], o[3] * y[0]));
    dw[1] = FMA(o[5], x1, FMA(gb, w[1], o[3] * y[1]));
    dw[2] = FMA(o[5], x2, FMA(gb, w[2], o[3] * y[2]));
    y[0] = FMA(o[2], x0, FMA(rb, w[0], o[0] * y[0]));
    y[1] = FMA(o[2], x1, FMA(rb, w[1], o[0] * y[1]));
    y[2] = FMA(o[2], x2, FMA(rb, w[2], o[0] * y[2]));
}

/* the backward of a span of G groups (forward_span), in lockstep; step t of group g is
 * SAVED(buf, t G + g). Pass 1, forward in t (the rows of w and dp streamed in the order the
 * hardware prefetchers follow best): the chain of phat_t again and, from it and g_t, the
 * step's adjoint inputs vec(g conj(phat_t)), vec(conj(phat_t) g) and sig; pass 2, reverse in
 * t, reads only the thread's scratch and writes dw. */
MF_INLINE void backward_span(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0,
                             float *buf, float *ds, const int G) {
    const int64_t NB = sh->NB, T = sh->T, wrow = 6 * sh->nblk, prow = 4 * sh->nblk;
    NcGroup gr[NC_SPAN];
    int64_t wo[NC_SPAN], po[NC_SPAN]; /* the groups' offsets in a row of w (dw) and of dp */
    vq q[NC_SPAN], phat[NC_SPAN];
    vf hp[NC_SPAN], sig[NC_SPAN];
    for (int g = 0; g < G; g++) {
        gr[g] = group_of(sh, g0 + g);
        wo[g] = 6 * NB * gr[g].h + gr[g].k0, po[g] = 4 * NB * gr[g].h + gr[g].k0;
        vq s;
        vq_load(&s, p->start + po[g], NB, gr[g].n);
        /* phat = p* / |p*| (1 where |p*|^2 <= 1e-30: the lanes' dw is 0 by hp = 0),
         * hp = |p*| / 2 */
        const vf s2 = (s.w * s.w + s.x * s.x) + (s.y * s.y + s.z * s.z);
        const vi live = s2 > VSPLAT(1e-30f);
        vf r;
        const vf s2l = VSELECT(live, s2, VSPLAT(1.0f));
        vsqrt(&r, &s2l);
        const vf ri = VSELECT(live, 1.0f / r, VZERO);
        hp[g] = VSELECT(live, 0.5f * r, VZERO);
        q[g] = (vq){VSELECT(live, s.w * ri, VSPLAT(1.0f)), s.x * ri, s.y * ri, s.z * ri};
        phat[g] = q[g];
        sig[g] = VZERO;
    }
    /* pass 1: sig_1 = sum_t g_t . phat_t, and per step w (6 vectors), h = vec(g conj(phat_t))
     * and h' = vec(conj(phat_t) g) (3 each: the same but the cross product's sign) */
    /* the floats of a row that the span reads (w, dp) and writes (dw), from wo[0] and po[0] */
    const int64_t wn = wo[G - 1] + 5 * NB + gr[G - 1].n - wo[0];
    const int64_t pn = po[G - 1] + 3 * NB + gr[G - 1].n - po[0];
    const vf half = VSPLAT(0.5f); /* the phat chain's hinv: |phat| = 1 */
    for (int64_t t = 0; t < T; t++) {
        const float *wt = p->w + (b * T + t) * wrow, *gt = p->dp + (b * T + t) * prow;
        if (t + NC_AHEAD < T) {
            prefetch_floats(wt + NC_AHEAD * wrow + wo[0], wn, 0);
            prefetch_floats(gt + NC_AHEAD * prow + po[0], pn, 0);
        }
        for (int g = 0; g < G; g++) {
            vf *v = (vf *)SAVED(buf, t * G + g);
            tile_load(v, wt + wo[g], NB, gr[g].n, 6);
            vq a, c, gq;
            vf sa, sv;
            vqexp(&a, &sa, NULL, NULL, v);
            vqexp(&c, &sv, NULL, NULL, v + 3);
            vf f;
            vq_renorm_factor(&f, &q[g], &half);
            vq_mul(&q[g], &a, &q[g]);
            vq_mul(&q[g], &q[g], &c);
            vq_scale(&q[g], &f);
            vq_load(&gq, gt + po[g], NB, gr[g].n);
            const vf pw = q[g].w, px = q[g].x, py = q[g].y, pz = q[g].z;
            sig[g] = FMA(gq.w, pw, FMA(gq.x, px, FMA(gq.y, py, FMA(gq.z, pz, sig[g]))));
            const vf vx = FMS(pw, gq.x, gq.w * px), vy = FMS(pw, gq.y, gq.w * py),
                     vz = FMS(pw, gq.z, gq.w * pz);
            const vf cx = FMS(gq.y, pz, gq.z * py), cy = FMS(gq.z, px, gq.x * pz),
                     cz = FMS(gq.x, py, gq.y * px);
            v[6] = vx - cx, v[7] = vy - cy, v[8] = vz - cz;
            v[9] = vx + cx, v[10] = vy + cy, v[11] = vz + cz;
        }
    }
    /* pass 2: Z_t = vec(A_{t-1} E_t conj(phat) conj(A_{t-1})) and W_t = vec(conj(C_{t-1})
     * conj(phat) E_t C_{t-1}), reverse in t */
    vf Z[NC_SPAN][3], W[NC_SPAN][3];
    for (int g = 0; g < G; g++)
        for (int i = 0; i < 3; i++) Z[g][i] = W[g][i] = VZERO;
    for (int64_t t = T - 1; t >= 0; t--) {
        float *dwt = p->dw + (b * T + t) * wrow;
        if (!sh->stream && t >= NC_AHEAD) prefetch_floats(dwt - NC_AHEAD * wrow + wo[0], wn, 1);
        for (int g = 0; g < G; g++) {
            const vf *v = (const vf *)SAVED(buf, t * G + g);
            for (int i = 0; i < 3; i++) Z[g][i] += v[6 + i], W[g][i] += v[9 + i];
            /* the step's qexp again, with the Jacobian's k, and its coefficients */
            vq a, c;
            vf sa, ka, ma, sv, kv, mv, o[12], dw[6];
            vqexp(&a, &sa, &ka, &ma, v);
            vqexp(&c, &sv, &kv, &mv, v + 3);
            side_coefs(o, &sa, &a.w, &ka, &ma, &hp[g]);
            side_coefs(o + 6, &sv, &c.w, &kv, &mv, &hp[g]);
            side_step(Z[g], dw, v, o, 1);
            side_step(W[g], dw + 3, v + 3, o + 6, -1);
            tile_store(dwt + wo[g], dw, NB, gr[g].n, 6, sh->stream);
        }
    }
    for (int g = 0; g < G; g++) { /* E_1 = (sig, Z_1) phat */
        const vq zq = {sig[g], Z[g][0], Z[g][1], Z[g][2]};
        vq E;
        vq_mul(&E, &zq, &phat[g]);
        float *d = ds + 4 * g * MF_VW;
        VSTORE(d, E.w);
        VSTORE(d + MF_VW, E.x);
        VSTORE(d + 2 * MF_VW, E.y);
        VSTORE(d + 3 * MF_VW, E.z);
    }
}

NC_ATTR
void NC_FN(nc_backward_span)(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0,
                             float *buf, float *ds) {
    if (sh->ngroups - g0 > 1)
        backward_span(p, sh, b, g0, buf, ds, 2);
    else
        backward_span(p, sh, b, g0, buf, ds, 1);
    if (sh->stream) vstream_fence();
}
