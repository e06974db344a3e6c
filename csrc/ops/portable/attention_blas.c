/* The attention family's OpenBLAS kernel set (mf_attn_blas, kernels/attention_sets.h;
 * MF_KERNELS_BLAS): the tiling of kernels/attention.h with every product one cblas sgemm on a
 * BTB x BTB tile read in place (leading dimension H*D); OpenBLAS picks its own kernel for the
 * CPU. Scores in (query, key) layout; softmax and the elementwise steps are row loops over
 * simd.h vectors of 4 floats, exponentials through vexp2 (the same bits on every CPU).
 * BTB = 32 keeps every sgemm at m n k <= 32 * 32 * 128 = 2^17, under OpenBLAS's threading
 * threshold, so calls from several OpenMP threads never start BLAS threads.
 * Products per (query block, key block): forward 2 (plain), 3 (score_product, sum) or 5
 * (softmax_product: two passes); backward 5 (plain) or 8. The mask (attention_sets.h) gives
 * every query row the keys up to max(i, P_b - 1): in a tile, the first cend of the row. A
 * per-pair factor table (plain attention) multiplies the score tile by its factor tile in a
 * pass of its own before the mask (and dS after it in the backward), run only when given. */
#define MF_VW 4

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/simd.h"
#include "../kernels/attention_sets.h"

#define BTB 32

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* *x = the n <= MF_VW floats at p (0 past n); and the store of its first n lanes. The row
 * loops call their chunk functions with n = MF_VW, a constant, on whole vectors (plain loads
 * and stores), then once on the rest of the row. */
MF_INLINE void vld(vf *x, const float *p, int64_t n) {
    if (n == MF_VW)
        *x = VLOADU(p);
    else
        vload_part(x, p, n);
}
MF_INLINE void vst(float *p, const vf *x, int64_t n) {
    if (n == MF_VW)
        VSTOREU(p, *x);
    else
        vstore_part(p, x, n);
}

/* 2^x */
static float exp2_one(float x) {
    vf v = VSPLAT(x);
    vexp2(&v);
    return v[0];
}

/* The online softmax step of one row of base-2 scores s: with m = max(*mx, s[c < cend]),
 * s[c] = 2^(s[c] - m) for the keys the row sees, c < cend, and 0 for cend <= c < nc,
 * *l = *l a + sum_c s[c], *mx = m; returns a = 2^(*mx before - m) (0 when it was -inf), the
 * factor of the row's earlier sums. */
MF_INLINE void exp_chunk(float *s, int64_t n, float m, vf *sum) {
    vf x;
    vld(&x, s, n);
    x = x - m;
    vexp2(&x);
    if (n < MF_VW) x = VAND(VFIRST(n), x);
    vst(s, &x, n);
    *sum += x;
}

static float row_softmax_step(float *s, int64_t cend, int64_t nc, float *mx, float *l) {
    vf mv = VSPLAT(*mx);
    int64_t c = 0;
    for (; c + MF_VW <= cend; c += MF_VW) mv = VMAX(VLOADU(s + c), mv);
    float m = vhmax(&mv);
    for (; c < cend; c++) m = s[c] > m ? s[c] : m;
    const float a = exp2_one(*mx - m);
    vf sum = VZERO;
    c = 0;
    for (; c + MF_VW <= cend; c += MF_VW) exp_chunk(s + c, MF_VW, m, &sum);
    if (c < cend) exp_chunk(s + c, cend - c, m, &sum);
    for (c = cend; c < nc; c++) s[c] = 0.0f;
    *l = *l * a + vhsum(&sum);
    *mx = m;
    return a;
}

/* s[c] = 2^((s[c] - m) + (s2[c] - mP)) for c < n (softmax_product's second pass) */
MF_INLINE void exp_pair_chunk(float *s, const float *s2, int64_t n, float m, float mP) {
    vf x, y;
    vld(&x, s, n);
    vld(&y, s2, n);
    x = (x - m) + (y - mP);
    vexp2(&x);
    vst(s, &x, n);
}

/* The backward's probabilities of n keys of a row in `kind`, from the scores x (and y) and
 * the row's base-2 lse l2 + l2lo (and l2p + l2plo): P = A; softmax_product also rewrites x, y
 * as AX, AP. */
MF_INLINE void p_chunk(int kind, float *pr, float *x, float *y, int64_t n, float l2, float l2lo,
                       float l2p, float l2plo, float c2) {
    vf a, xs, ys = VZERO;
    vld(&xs, x, n);
    if (kind == MF_CONJ_SCORE_PRODUCT || kind == MF_CONJ_SOFTMAX_PRODUCT) vld(&ys, y, n);
    if (kind == MF_CONJ_SOFTMAX_PRODUCT) {
        xs = (xs - l2) - l2lo;
        ys = (ys - l2p) - l2plo;
        vexp2(&xs);
        vexp2(&ys);
        vst(x, &xs, n);
        vst(y, &ys, n);
        a = xs * ys;
    } else {
        a = kind == MF_CONJ_SCORE_PRODUCT ? (xs * ys * c2 - l2) - l2lo : (xs - l2) - l2lo;
        vexp2(&a);
    }
    vst(pr, &a, n);
}

/* The score gradients of n keys of a row in `kind` from P, dA = dout V^T and the row's Dv:
 * x = dsX and y = dsP (x only for plain and sum); x, y held sX, sP or AX, AP. */
MF_INLINE void ds_chunk(int kind, const float *pr, const float *da, float *x, float *y,
                        int64_t n, float dvr, float scale) {
    vf a, g, xs, ys;
    vld(&a, pr, n);
    vld(&g, da, n);
    if (kind == MF_ATTN_PLAIN || kind == MF_CONJ_SUM) {
        xs = a * (g - dvr) * scale;
        vst(x, &xs, n);
    } else if (kind == MF_CONJ_SCORE_PRODUCT) {
        const vf ds = a * (g - dvr) * scale;
        vld(&xs, x, n);
        vld(&ys, y, n);
        const vf gx = ds * ys, gy = ds * xs;
        vst(x, &gx, n);
        vst(y, &gy, n);
    } else {
        const vf ad = a * g;
        vld(&xs, x, n);
        vld(&ys, y, n);
        xs = (ad - xs * dvr) * scale;
        ys = (ad - ys * dvr) * scale;
        vst(x, &xs, n);
        vst(y, &ys, n);
    }
}

/* lse from the base-2 running max m and sum l (as kernels/attention.h) */
static float lse_of(const MfAttnJob *p, float m, float l) {
    return (float)(((double)m + log2((double)l)) * p->to_lse);
}

/* S (nr, nc) = c2 qx_i kx_j^T, and then, by `second`: 0 nothing (plain); 1 S += c2 qp_i kp_j^T
 * (sum); 2 S2 = qp_i kp_j^T with S = qx_i kx_j^T unscaled (score_product: the caller
 * multiplies); 3 S2 = c2 qp_i kp_j^T (softmax_product). */
static int blas_scores(const MfAttnJob *p, float *S, float *S2, int64_t off, int64_t i0,
                       int64_t nr, int64_t j0, int64_t nc, int second) {
    const int64_t ld = p->ld, D = p->D;
    const float c2 = p->c2;
    const float *qx = p->qx + off + i0 * ld, *kx = p->kx + off + j0 * ld;
    int st = mf_sgemm(0, 1, nr, nc, D, second == 2 ? 1.0f : c2, qx, ld, kx, ld, 0.0f, S, BTB);
    if (st != MF_OK || second == 0) return st;
    const float *qp = p->qp + off + i0 * ld, *kp = p->kp + off + j0 * ld;
    if (second == 1) return mf_sgemm(0, 1, nr, nc, D, c2, qp, ld, kp, ld, 1.0f, S, BTB);
    return mf_sgemm(0, 1, nr, nc, D, second == 2 ? 1.0f : c2, qp, ld, kp, ld, 0.0f, S2, BTB);
}

/* the keys of key block j0 (nc long) that query i sees under P: the first cend */
static inline int64_t row_cend(int64_t i, int64_t j0, int64_t nc, int64_t P) {
    const int64_t n = (i > P - 1 ? i : P - 1) - j0 + 1;
    return n < 0 ? 0 : n > nc ? nc : n;
}

static int64_t fwd_nb(const MfAttnJob *p) { return (p->T + BTB - 1) / BTB; }
static int64_t fwd_npair(const MfAttnJob *p) { return (fwd_nb(p) + 1) / 2; }
static int64_t fwd_tasks(const MfAttnJob *p) { return p->B * p->H * fwd_npair(p); }

/* the per-pair factor tile F (BTB, BTB) [query][key] of a job with a factor table, then
 * the task's checked copy of pos_ids[b, :] (T int32) */
static int64_t fac_floats(const MfAttnJob *p) {
    return p->factor != NULL ? BTB * BTB + p->T : 0;
}

static int64_t fwd_floats(const MfAttnJob *p) {
    return 2 * BTB * BTB + BTB * p->D + 4 * BTB + fac_floats(p);
}

static int64_t bwd_floats(const MfAttnJob *p) {
    return 4 * BTB * BTB + 3 * BTB * p->D + 5 * p->T + fac_floats(p);
}

/* The per-pair factors of the (query, key) tile of rows i0 .. i0+nr, keys j0 .. j0+nc:
 * F[r * BTB + c] = factor[ids[i0 + r], ids[j0 + c]] (ids: the task's checked copy of
 * pos_ids[b, :], mf_attn_copy_ids) */
static void factor_tile(const MfAttnJob *j, const int32_t *ids, float *F, int64_t i0,
                        int64_t nr, int64_t j0, int64_t nc) {
    const int32_t *pq = ids + i0, *pk = ids + j0;
    for (int64_t r = 0; r < nr; r++) {
        const float *row = j->factor + (int64_t)pq[r] * j->npos;
        for (int64_t c = 0; c < nc; c++) F[r * BTB + c] = row[pk[c]];
    }
}

/* S[r][c] *= F[r][c] for the tile's rows r < nr and keys c < nc: the per-pair factors of the
 * pair of blocks (i0, j0) of batch row b, gathered into F first; a pass apart, run only with
 * a factor table */
static void scale_by_factor(const MfAttnJob *p, const int32_t *ids, float *S, float *F,
                            int64_t i0, int64_t nr, int64_t j0, int64_t nc) {
    factor_tile(p, ids, F, i0, nr, j0, nc);
    for (int64_t r = 0; r < nr; r++) {
        float *s = S + r * BTB;
        const float *f = F + r * BTB;
        int64_t c = 0;
        for (; c + MF_VW <= nc; c += MF_VW) VSTOREU(s + c, VLOADU(s + c) * VLOADU(f + c));
        for (; c < nc; c++) s[c] *= f[c];
    }
}

/* S[r][c] *= F[r][c] with F as scale_by_factor left it */
static void rescale_by_factor(float *S, const float *F, int64_t nr, int64_t nc) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) S[r * BTB + c] *= F[r * BTB + c];
}

/* forward task t: head t / npair, query blocks nb-1-pr and pr (pr = t % npair) */
static int fwd(const MfAttnJob *p, float *scr, int64_t t) {
    const int64_t T = p->T, D = p->D, ld = p->ld, kind = p->kind;
    const int64_t npair = fwd_npair(p), bh = t / npair, pr = t % npair;
    const int64_t b = bh / p->H, h = bh % p->H, off = b * T * ld + h * D;
    const int64_t plane = p->B * p->H * T;
    const float c2 = p->c2;
    const int64_t P = mf_attn_prefix(p, b);
    float *S = scr;            /* (BTB, BTB): scores then probabilities [query][key] */
    float *S2 = S + BTB * BTB; /* (BTB, BTB): positional scores (score_product, pass 1) */
    float *O = S2 + BTB * BTB; /* (BTB, D): unnormalised output */
    float *mx = O + BTB * D, *l = mx + BTB, *mxP = l + BTB, *lP = mxP + BTB; /* (BTB,) each */
    float *F = lP + BTB;       /* (BTB, BTB): per-pair factors (a factor table only), */
    int32_t *ids = (int32_t *)(F + BTB * BTB); /* then pos_ids[b, :] as checked here */
    if (p->factor != NULL && mf_attn_copy_ids(p, b, ids) != MF_OK) return MF_EINDEX;
    if (P < 0) return MF_EINDEX;
    const int second = kind == MF_ATTN_PLAIN ? 0 : kind == MF_CONJ_SUM ? 1
                       : kind == MF_CONJ_SCORE_PRODUCT ? 2 : 3;
    for (int half = 0; half < 2; half++) {
        const int64_t ib = half == 0 ? fwd_nb(p) - 1 - pr : pr;
        if (half == 1 && ib == fwd_nb(p) - 1 - pr) break;
        const int64_t i0 = ib * BTB, nr = min64(BTB, T - i0);
        float *lse = p->lse + bh * T + i0;
        const int64_t jlast = mf_attn_last_key_block(ib, BTB, T, P);
        memset(O, 0, (size_t)(nr * D) * sizeof(float));
        for (int64_t r = 0; r < nr; r++) {
            mx[r] = mxP[r] = -INFINITY;
            l[r] = lP[r] = 0.0f;
        }
        if (kind == MF_CONJ_SOFTMAX_PRODUCT) {
            for (int64_t jb = 0; jb <= jlast; jb++) { /* pass 1: both log-sum-exps */
                const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
                int st = blas_scores(p, S, S2, off, i0, nr, j0, nc, second);
                if (st != MF_OK) return st;
                for (int64_t r = 0; r < nr; r++) {
                    const int64_t cend = row_cend(i0 + r, j0, nc, P);
                    row_softmax_step(S + r * BTB, cend, nc, mx + r, l + r);
                    row_softmax_step(S2 + r * BTB, cend, nc, mxP + r, lP + r);
                }
            }
            for (int64_t r = 0; r < nr; r++) {
                lse[r] = lse_of(p, mx[r], l[r]);
                lse[plane + r] = lse_of(p, mxP[r], lP[r]);
            }
            for (int64_t jb = 0; jb <= jlast; jb++) { /* pass 2: O += A V, A lX lP first */
                const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
                int st = blas_scores(p, S, S2, off, i0, nr, j0, nc, second);
                if (st != MF_OK) return st;
                for (int64_t r = 0; r < nr; r++) {
                    float *s = S + r * BTB;
                    const float *s2 = S2 + r * BTB;
                    const int64_t cend = row_cend(i0 + r, j0, nc, P);
                    int64_t c = 0;
                    for (; c + MF_VW <= cend; c += MF_VW)
                        exp_pair_chunk(s + c, s2 + c, MF_VW, mx[r], mxP[r]);
                    if (c < cend) exp_pair_chunk(s + c, s2 + c, cend - c, mx[r], mxP[r]);
                    for (c = cend; c < nc; c++) s[c] = 0.0f;
                }
                st = mf_sgemm(0, 0, nr, D, nc, 1.0f, S, BTB, p->v + off + j0 * ld, ld, 1.0f, O,
                              D);
                if (st != MF_OK) return st;
            }
            for (int64_t r = 0; r < nr; r++) {
                const float inv = 1.0f / (l[r] * lP[r]);
                float *out = p->out + off + (i0 + r) * ld;
                for (int64_t d = 0; d < D; d++) out[d] = O[r * D + d] * inv;
            }
            continue;
        }
        for (int64_t jb = 0; jb <= jlast; jb++) {
            const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
            int st = blas_scores(p, S, S2, off, i0, nr, j0, nc, second);
            if (st != MF_OK) return st;
            if (p->factor != NULL) scale_by_factor(p, ids, S, F, i0, nr, j0, nc);
            for (int64_t r = 0; r < nr; r++) {
                float *s = S + r * BTB, *o = O + r * D;
                const int64_t cend = row_cend(i0 + r, j0, nc, P); /* the keys r sees */
                if (kind == MF_CONJ_SCORE_PRODUCT)
                    for (int64_t c = 0; c < cend; c++) s[c] = s[c] * S2[r * BTB + c] * c2;
                const float a = row_softmax_step(s, cend, nc, mx + r, l + r);
                for (int64_t d = 0; d < D; d++) o[d] *= a;
            }
            st = mf_sgemm(0, 0, nr, D, nc, 1.0f, S, BTB, p->v + off + j0 * ld, ld, 1.0f, O, D);
            if (st != MF_OK) return st;
        }
        for (int64_t r = 0; r < nr; r++) {
            const float inv = 1.0f / l[r];
            float *out = p->out + off + (i0 + r) * ld;
            for (int64_t d = 0; d < D; d++) out[d] = O[r * D + d] * inv;
            lse[r] = lse_of(p, mx[r], l[r]);
        }
    }
    return MF_OK;
}

/* backward task bh: the whole head */
static int bwd(const MfAttnJob *p, float *scr, int64_t bh) {
    const int64_t T = p->T, D = p->D, ld = p->ld, nb = fwd_nb(p), kind = p->kind;
    const int64_t b = bh / p->H, h = bh % p->H, off = b * T * ld + h * D;
    const int two = kind != MF_ATTN_PLAIN;
    const float *qx = p->qx + off, *kx = p->kx + off;
    const float *qp = two ? p->qp + off : NULL, *kp = two ? p->kp + off : NULL;
    const float *v = p->v + off, *dout = p->dout + off, *o = p->o + off;
    const float *lse = p->lse_in + bh * T;
    float *dqx = p->dqx + off, *dqp = two ? p->dqp + off : NULL;
    const float c2 = p->c2, scale = p->scale;
    const double to2 = 1.0 / p->to_lse;
    const int64_t Pb = mf_attn_prefix(p, b);
    float *P = scr;             /* (BTB, BTB) each, [query][key]: A; dA = dout V^T; */
    float *dA = P + BTB * BTB;  /* sX or AX, then dsX; sP or AP, then dsP */
    float *GX = dA + BTB * BTB;
    float *GP = GX + BTB * BTB;
    float *dKx = GP + BTB * BTB, *dKp = dKx + BTB * D, *dV = dKp + BTB * D; /* (BTB, D) each */
    float *Dv = dV + BTB * D;                 /* (T,): dout_t . out_t */
    float *la = Dv + T, *lb = la + 2 * T;     /* (2, T) each: base-2 lse, split_lse */
    float *F = lb + 2 * T;                    /* (BTB, BTB): per-pair factors (a table only), */
    int32_t *ids = (int32_t *)(F + BTB * BTB); /* then pos_ids[b, :] as checked here */
    if (p->factor != NULL && mf_attn_copy_ids(p, b, ids) != MF_OK) return MF_EINDEX;
    if (Pb < 0) return MF_EINDEX;
    for (int64_t t = 0; t < T; t++) {
        const float *a = dout + t * ld, *c = o + t * ld;
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++) s += a[d] * c[d];
        Dv[t] = s;
        split_lse(lse[t], to2, la + t, la + T + t);
        if (kind == MF_CONJ_SOFTMAX_PRODUCT)
            split_lse(lse[p->B * p->H * T + t], to2, lb + t, lb + T + t);
        memset(dqx + t * ld, 0, (size_t)D * sizeof(float));
        if (two) memset(dqp + t * ld, 0, (size_t)D * sizeof(float));
    }
    const int second = kind == MF_ATTN_PLAIN ? 0 : kind == MF_CONJ_SUM ? 1
                       : kind == MF_CONJ_SCORE_PRODUCT ? 2 : 3;
    float *gp = kind == MF_CONJ_SUM ? GX : GP; /* dsP = dsX in sum mode */
    for (int64_t jb = 0; jb < nb; jb++) {
        const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
        memset(dKx, 0, (size_t)(3 * BTB * D) * sizeof(float)); /* dKx, dKp and dV */
        for (int64_t ib = mf_attn_first_query_block(jb, BTB, Pb); ib < nb; ib++) {
            const int64_t i0 = ib * BTB, nr = min64(BTB, T - i0);
            int st = blas_scores(p, GX, GP, off, i0, nr, j0, nc, second);
            if (st != MF_OK) return st;
            if (p->factor != NULL) scale_by_factor(p, ids, GX, F, i0, nr, j0, nc);
            for (int64_t r = 0; r < nr; r++) {
                float *pr = P + r * BTB, *x = GX + r * BTB, *y = GP + r * BTB;
                const float l2 = la[i0 + r], l2lo = la[T + i0 + r];
                const float l2p = kind == MF_CONJ_SOFTMAX_PRODUCT ? lb[i0 + r] : 0.0f;
                const float l2plo = kind == MF_CONJ_SOFTMAX_PRODUCT ? lb[T + i0 + r] : 0.0f;
                const int64_t cend = row_cend(i0 + r, j0, nc, Pb);
                int64_t c = 0;
                for (; c + MF_VW <= cend; c += MF_VW)
                    p_chunk(kind, pr + c, x + c, y + c, MF_VW, l2, l2lo, l2p, l2plo, c2);
                if (c < cend)
                    p_chunk(kind, pr + c, x + c, y + c, cend - c, l2, l2lo, l2p, l2plo, c2);
                for (c = cend; c < nc; c++) pr[c] = 0.0f;
                if (kind == MF_CONJ_SOFTMAX_PRODUCT)
                    for (c = cend; c < nc; c++) x[c] = y[c] = 0.0f;
            }
            st = mf_sgemm(1, 0, nc, D, nr, 1.0f, P, BTB, dout + i0 * ld, ld, 1.0f, dV, D);
            if (st == MF_OK)
                st = mf_sgemm(0, 1, nr, nc, D, 1.0f, dout + i0 * ld, ld, v + j0 * ld, ld, 0.0f,
                              dA, BTB);
            if (st != MF_OK) return st;
            for (int64_t r = 0; r < nr; r++) {
                const float dvr = Dv[i0 + r];
                const float *pr = P + r * BTB, *da = dA + r * BTB;
                float *x = GX + r * BTB, *y = GP + r * BTB;
                int64_t c = 0;
                for (; c + MF_VW <= nc; c += MF_VW)
                    ds_chunk(kind, pr + c, da + c, x + c, y + c, MF_VW, dvr, scale);
                if (c < nc) ds_chunk(kind, pr + c, da + c, x + c, y + c, nc - c, dvr, scale);
            }
            if (p->factor != NULL) rescale_by_factor(GX, F, nr, nc); /* dS_raw = F dS */
            st = mf_sgemm(1, 0, nc, D, nr, 1.0f, GX, BTB, qx + i0 * ld, ld, 1.0f, dKx, D);
            if (st == MF_OK)
                st = mf_sgemm(0, 0, nr, D, nc, 1.0f, GX, BTB, kx + j0 * ld, ld, 1.0f,
                              dqx + i0 * ld, ld);
            if (st == MF_OK && two)
                st = mf_sgemm(1, 0, nc, D, nr, 1.0f, gp, BTB, qp + i0 * ld, ld, 1.0f, dKp, D);
            if (st == MF_OK && two)
                st = mf_sgemm(0, 0, nr, D, nc, 1.0f, gp, BTB, kp + j0 * ld, ld, 1.0f,
                              dqp + i0 * ld, ld);
            if (st != MF_OK) return st;
        }
        for (int64_t c = 0; c < nc; c++) {
            memcpy(p->dkx + off + (j0 + c) * ld, dKx + c * D, (size_t)D * sizeof(float));
            if (two)
                memcpy(p->dkp + off + (j0 + c) * ld, dKp + c * D, (size_t)D * sizeof(float));
            memcpy(p->dv + off + (j0 + c) * ld, dV + c * D, (size_t)D * sizeof(float));
        }
    }
    return MF_OK;
}

const MfAttnKernels mf_attn_blas = {fwd_tasks, fwd_floats, bwd_floats, fwd, bwd};
