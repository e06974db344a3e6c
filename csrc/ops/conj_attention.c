/* Conjunctive attention (MapEM, MapFormer paper sec. 3.5.1, eq. 13), causal, tiled like
 * FlashAttention-2. Per (b, h), with content scores sX = qx kx^T and positional scores
 * sP = qp kp^T (T x T, only j <= i), one of three modes (MfConjMode):
 *
 *   score_product (0):   A = softmax_j(scale sX * sP)                 lse   = log sum_j exp(..)
 *   softmax_product (1): A = softmax_j(scale sX) * softmax_j(scale sP) lseX, lseP of each
 *                        (eq. 13 read literally: rows of A sum to less than 1)
 *   sum (2):             A = softmax_j(scale (sX + sP)), plain attention on [qx, qp], [kx, kp]
 *   out = A v.
 *
 * Forward saves lse (M, B, H, T): M = 1 (the row log-sum-exp) or, for softmax_product, M = 2
 * (lseX, then lseP). The softmax_product forward makes two passes over the key blocks: both
 * log-sum-exps first (each branch's row max m and sum l, online), then
 * out = sum_j exp(scale sX - lseX + scale sP - lseP) v_j, computed as
 * sum_j 2^((c2 sX - mX) + (c2 sP - mP)) v_j / (lX lP) (c2 = scale log2 e) so that the exponent
 * never subtracts two log-sum-exps, whose float32 rounding would dominate the error.
 * No T x T matrix exists in either direction: the backward recomputes both score tiles.
 * Backward, with dA = dout v^T and Dv_i = dout_i . out_i (= sum_j A_ij dA_ij in every mode):
 *   score_product:   dS = A (dA - Dv),  dsX = scale dS sP,  dsP = scale dS sX
 *   softmax_product: dsX = scale (A dA - AX Dv),  dsP = scale (A dA - AP Dv)
 *   sum:             dsX = dsP = scale A (dA - Dv)
 *   dqx = dsX kx, dkx = dsX^T qx, dqp = dsP kp, dkp = dsP^T qp, dv = A^T dout.
 * Gradient rule: all five gradients are activation gradients, written (=).
 *
 * The tiling, task split and kernels are those of attention.c, shared through
 * mapformer/attention_kernels.h:
 *  - AVX-512: forward one task per (head, pair of query blocks nb-1-p and p), scores kept
 *    transposed S^T[key][query] against Qx^T and Qp^T packed once per query block, online
 *    softmax down the columns, O += P^T V. Backward one task per head (it owns that head's
 *    dqx and dqp rows); per key block it packs Kx^T, Kp^T, V^T, Kx, Kp, then per query block
 *    builds A, dsX and dsP in (query, key) layout from three register-tile products
 *    (qx Kx^T, qp Kp^T, dout V^T) and accumulates dKx, dKp, dV (scratch) and dqx, dqp (in
 *    place). Modes are compile-time constants inside one entry point per direction.
 *  - portable (MAPFORMER_KERNELS=blas, or CPUs without AVX-512): the same tiling with
 *    one sgemm per product on BTB x BTB tiles read in place.
 * Products per (query block, key block): forward 3 (5 for softmax_product), backward 8.
 * Sizes are checked again here: MF_EINVAL for D odd or outside [16, 128], any size < 1, a
 * non-finite scale or an unknown mode; MF_ENOMEM when per-thread scratch cannot be had. */
#include "mapformer/attention_kernels.h"

typedef struct {
    float *out, *lse;                      /* forward: out (B, T, H, D), lse (M, B, H, T) */
    float *dqx, *dkx, *dqp, *dkp, *dv;     /* backward: (B, T, H, D) each */
    const float *qx, *kx, *qp, *kp, *v;    /* (B, T, H, D) */
    const float *dout, *o;                 /* backward inputs (B, T, H, D) */
    const float *lse_in;                   /* backward input (M, B, H, T) */
    int64_t B, T, H, D, Dp, nb, ld;        /* Dp = D rounded up to 16; nb blocks; ld = H*D */
    float scale;
    int mode;                              /* MfConjMode */
} ConjAttnParams;

/* lse of row t of head bh: lse_X (or the only one) and, for softmax_product, lse_P. */
static inline int64_t lse_offset(const ConjAttnParams *p, int64_t bh) { return bh * p->T; }
static inline int64_t lse_plane(const ConjAttnParams *p) { return p->B * p->H * p->T; }

/* ---- forward (AVX-512) ------------------------------------------------------------------- */

/* What a score tile holds (compile-time at every call):
 *   SC_ONE  c2 s_a                   (one branch: the softmax_product first pass)
 *   SC_PROD c2 s_a * s_b             (score_product)
 *   SC_SUM  c2 (s_a + s_b)           (sum)
 *   SC_EXP  2^((c2 s_a - ma[r]) + (c2 s_b - mb[r]))
 *                                    (softmax_product second pass: A times lX lP)
 * with s_a = k_a . q_a and s_b = k_b . q_b; c2 = scale log2 e (base-2 scores). In SC_EXP each
 * branch's score is shifted by its own row max ma or mb before the two are added: the
 * exponent then carries the rounding of numbers of the size of the scores, not of the
 * log-sum-exps, as a plain softmax's does. */
enum { SC_ONE, SC_PROD, SC_SUM, SC_EXP };

/* S^T[c][r] for keys c0 <= c < c0 + MR (rows past nc repeat key nc - 1 and are not stored)
 * and query vectors v >= vlo; above the diagonal (diag) -inf, or 0 for SC_EXP. Except for
 * SC_EXP, mrun[r] = max(mrun[r], S^T[c][r]) over these keys; SC_EXP reads mrun as ma and
 * mb = mrun + BT. */
INLINE void fwd_scores(int kind, int vlo, float *ST, float *mrun,
                       const float *const ka[MR], const float *QaT, const float *const kb[MR],
                       const float *QbT, int64_t D, int64_t c0, int64_t nc, int diag,
                       float c2) {
    v16 acc[MR][NVMAX];
    zero_acc(acc);
    mk(acc, vlo, NVB, ka, 1, QaT, BT, 0, D);
    if (kind == SC_PROD || kind == SC_EXP) {
        /* s_a parked in the tile's own rows (c0 + m < BT always: scratch even past nc), so
         * the second product has all the registers; then s_b in acc */
        for (int m = 0; m < MR; m++)
            for (int v = vlo; v < NVB; v++) VSTORE(ST + (c0 + m) * BT + 16 * v, acc[m][v]);
        zero_acc(acc);
    }
    if (kind != SC_ONE) mk(acc, vlo, NVB, kb, 1, QbT, BT, 0, D);
    for (int v = vlo; v < NVB; v++) {
        v16 mx = VLOAD(mrun + 16 * v), mb = VSPLAT(0.0f);
        if (kind == SC_EXP) mb = VLOAD(mrun + BT + 16 * v);
        for (int m = 0; m < MR; m++) {
            v16 x;
            if (kind == SC_PROD)
                x = acc[m][v] * VLOAD(ST + (c0 + m) * BT + 16 * v) * c2;
            else if (kind == SC_EXP)
                x = (VLOAD(ST + (c0 + m) * BT + 16 * v) * c2 - mx) + (acc[m][v] * c2 - mb);
            else
                x = acc[m][v] * c2;
            const vi16 masked = LANES + 16 * v < ISPLAT(c0 + m); /* query r < key c */
            if (kind == SC_EXP) {
                exp2v(&x);
                if (diag) x = (v16)(~masked & (vi16)x);
            } else {
                if (diag) x = VSELECT(masked, VSPLAT(-INFINITY), x);
                mx = VSELECT(x > mx, x, mx);
            }
            if (c0 + m < nc) VSTORE(ST + (c0 + m) * BT + 16 * v, x);
        }
        if (kind != SC_EXP) VSTORE(mrun + 16 * v, mx);
    }
}

/* Scores of key block [j0, j0 + nc) against the packed query block, MR keys at a time, with
 * the query vectors wholly above the diagonal skipped; pf_step once per MR keys. SC_ONE reads
 * only ka and QaT (the callers pass them twice). */
INLINE void fwd_score_block(int kind, float *ST, float *mrun,
                            const float *ka, const float *QaT, const float *kb,
                            const float *QbT, int64_t ld, int64_t D, int64_t nc, int diag,
                            float c2, Prefetch *pf) {
    for (int64_t c0 = 0; c0 < nc; c0 += MR) {
        pf_step(pf);
        const float *kac[MR], *kbc[MR];
        for (int m = 0; m < MR; m++) {
            kac[m] = ka + min64(c0 + m, nc - 1) * ld;
            kbc[m] = kb + min64(c0 + m, nc - 1) * ld;
        }
#define MF_SCORES(vlo) \
    fwd_scores(kind, vlo, ST, mrun, kac, QaT, kbc, QbT, D, c0, nc, diag, c2)
        switch (diag ? c0 / 16 : 0) {
            case 0: MF_SCORES(0); break;
            case 1: MF_SCORES(1); break;
            case 2: MF_SCORES(2); break;
            default: MF_SCORES(3); break;
        }
#undef MF_SCORES
    }
}

/* O = alpha O + P V_j for the query rows < nr (keys c <= r on a diagonal block); V_j is
 * packed to aligned rows padded to Dp first. pf_step once per MR queries. */
INLINE void fwd_pv_block(float *O, const float *ST, float *Vs, const float *alpha,
                         const float *v, int64_t ld, int64_t D, int64_t Dp, int64_t nr,
                         int64_t nc, int diag, Prefetch *pf) {
    pack_rows(Vs, Dp, v, ld, nc, D);
    for (int64_t r0 = 0; r0 < nr; r0 += MR) {
        pf_step(pf);
        const int64_t kn = diag ? min64(nc, r0 + MR) : nc;
        for (int64_t d0 = 0; d0 < Dp; d0 += 16 * NVMAX) {
            switch (min64(NVMAX, (Dp - d0) / 16)) {
                case 1: fwd_pv(1, O, ST, Vs, alpha, Dp, d0, r0, kn); break;
                case 2: fwd_pv(2, O, ST, Vs, alpha, Dp, d0, r0, kn); break;
                case 3: fwd_pv(3, O, ST, Vs, alpha, Dp, d0, r0, kn); break;
                default: fwd_pv(4, O, ST, Vs, alpha, Dp, d0, r0, kn); break;
            }
        }
    }
}

/* One query block (rows i0 .. i0+nr of head (b, h)) against key blocks 0 .. ib, in `mode`
 * (a compile-time constant at every call). */
INLINE void fwd_block(int mode, const ConjAttnParams *p, float *scr, Prefetch *pf, int64_t b,
                      int64_t h, int64_t ib) {
    const int64_t T = p->T, D = p->D, Dp = p->Dp, ld = p->ld;
    const int64_t i0 = ib * BT, nr = min64(BT, T - i0);
    const int64_t off = b * T * ld + h * D; /* element (b, 0, h, 0) */
    const float *qx = p->qx + off, *kx = p->kx + off, *qp = p->qp + off, *kp = p->kp + off;
    const float *v = p->v + off;
    const float c2 = (float)(p->scale * LOG2E);
    float *QxT = scr;           /* (D, BT): content queries of the block, transposed, 0 past nr */
    float *QpT = QxT + D * BT;  /* (D, BT): positional queries, likewise */
    float *ST = QpT + D * BT;   /* (BT, BT): scores then probabilities, [key][query] */
    float *O = ST + BT * BT;    /* (BT, Dp): unnormalised output */
    float *Vs = O + BT * Dp;    /* (BT, Dp): the key block's values, 0 past D */
    float *mx = Vs + BT * Dp;   /* (BT,): running max of the base-2 scores (X branch) */
    float *l = mx + BT;         /* (BT,): running sum of exponentials (X branch) */
    float *alpha = l + BT;      /* (BT,): rescale factor of the current key block */
    float *mrun = alpha + BT;   /* (BT,): max including the current key block */
    float *mxP = mrun + BT;     /* (BT,): softmax_product: running max of the P branch, */
    float *lP = mxP + BT;       /* (BT,): and its running sum */

    transpose(QxT, BT, qx + i0 * ld, ld, nr, D);
    transpose(QpT, BT, qp + i0 * ld, ld, nr, D);
    for (int64_t d = 0; d < D; d++)
        for (int64_t r = nr; r < BT; r++) QxT[d * BT + r] = QpT[d * BT + r] = 0.0f;
    memset(O, 0, (size_t)(BT * Dp) * sizeof(float));
    for (int64_t r = 0; r < BT; r++) {
        mx[r] = mxP[r] = -INFINITY;
        l[r] = lP[r] = 0.0f;
    }
    float *lse = p->lse + lse_offset(p, b * p->H + h) + i0;

    if (mode == MF_CONJ_SOFTMAX_PRODUCT) {
        /* pass 1: the log-sum-exp of each branch (the exponentials in ST are discarded) */
        for (int64_t jb = 0; jb <= ib; jb++) {
            const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
            const int diag = jb == ib;
            memcpy(mrun, mx, BT * sizeof(float));
            fwd_score_block(SC_ONE, ST, mrun, kx + j0 * ld, QxT, kx + j0 * ld, QxT, ld, D,
                            nc, diag, c2, pf);
            fwd_softmax_cols(ST, mx, l, alpha, mrun, nc, diag);
            memcpy(mrun, mxP, BT * sizeof(float));
            fwd_score_block(SC_ONE, ST, mrun, kp + j0 * ld, QpT, kp + j0 * ld, QpT, ld, D,
                            nc, diag, c2, pf);
            fwd_softmax_cols(ST, mxP, lP, alpha, mrun, nc, diag);
        }
        /* pass 2: O += A' V with A' = 2^((c2 sX - mx) + (c2 sP - mxP)) = A lX lP, no rescaling
         * (alpha = 1); mrun, mrun + BT = mx, mxP for fwd_scores */
        for (int64_t r = 0; r < BT; r++) {
            if (r < nr) {
                lse[r] = (float)LN2 * (mx[r] + log2f(l[r]));
                lse[lse_plane(p) + r] = (float)LN2 * (mxP[r] + log2f(lP[r]));
            }
            alpha[r] = 1.0f;
        }
        memcpy(mrun, mx, BT * sizeof(float)); /* mrun + BT is mxP already */
        for (int64_t jb = 0; jb <= ib; jb++) {
            const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
            const int diag = jb == ib;
            fwd_score_block(SC_EXP, ST, mrun, kx + j0 * ld, QxT, kp + j0 * ld, QpT, ld, D, nc,
                            diag, c2, pf);
            fwd_pv_block(O, ST, Vs, alpha, v + j0 * ld, ld, D, Dp, nr, nc, diag, pf);
        }
        for (int64_t r = 0; r < nr; r++) l[r] = 1.0f / (l[r] * lP[r]);
        unpack_rows(p->out + off + i0 * ld, ld, O, Dp, nr, D, l);
        return;
    }

    const int kind = mode == MF_CONJ_SCORE_PRODUCT ? SC_PROD : SC_SUM;
    for (int64_t jb = 0; jb <= ib; jb++) {
        const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
        const int diag = jb == ib;
        memcpy(mrun, mx, BT * sizeof(float));
        fwd_score_block(kind, ST, mrun, kx + j0 * ld, QxT, kp + j0 * ld, QpT, ld, D, nc,
                        diag, c2, pf);
        fwd_softmax_cols(ST, mx, l, alpha, mrun, nc, diag);
        fwd_pv_block(O, ST, Vs, alpha, v + j0 * ld, ld, D, Dp, nr, nc, diag, pf);
    }
    for (int64_t r = 0; r < nr; r++) {
        lse[r] = (float)LN2 * (mx[r] + log2f(l[r]));
        alpha[r] = 1.0f / l[r];
    }
    unpack_rows(p->out + off + i0 * ld, ld, O, Dp, nr, D, alpha);
}

/* ---- backward (AVX-512) ------------------------------------------------------------------ */

/* For query rows r0 .. r0+MR of block i against key block j, key vectors w < vhi, in `mode`:
 * P[r][c] = A_rc (0 above the diagonal), GX[r][c] = dsX_rc, GP[r][c] = dsP_rc (GP is GX in
 * sum mode). la, lb: the rows' base-2 lse (lb: softmax_product's P branch); dvr: Dv of the
 * rows. Rows past nr are computed on clamped pointers and stored (scratch rows < BT) but never
 * read. */
INLINE void bwd_scores(int mode, int vhi, float *P, float *GX, float *GP,
                       const float *const qxr[MR], const float *const qpr[MR],
                       const float *const dor[MR], const float *KxT, const float *KpT,
                       const float *VT, const float *la, const float *lb, const float *dvr,
                       int64_t D, int64_t r0, int diag, float c2, float scale) {
    v16 acc[MR][NVMAX];
    zero_acc(acc);
    mk(acc, 0, vhi, qxr, 1, KxT, BT, 0, D);
    if (mode == MF_CONJ_SUM) {
        mk(acc, 0, vhi, qpr, 1, KpT, BT, 0, D);
    } else {
        /* GX = sX (score_product) or AX (softmax_product); then acc = sP */
        for (int m = 0; m < MR; m++) {
            for (int w = 0; w < vhi; w++) {
                v16 x = acc[m][w];
                if (mode == MF_CONJ_SOFTMAX_PRODUCT) {
                    x = x * c2 - la[m];
                    exp2v(&x);
                    if (diag) {
                        const vi16 masked = LANES + 16 * w > ISPLAT(r0 + m); /* key > query */
                        x = (v16)(~masked & (vi16)x);
                    }
                }
                VSTORE(GX + (r0 + m) * BT + 16 * w, x);
            }
        }
        zero_acc(acc);
        mk(acc, 0, vhi, qpr, 1, KpT, BT, 0, D);
    }
    /* P = A; GP = sP (score_product) or AP (softmax_product) */
    for (int m = 0; m < MR; m++) {
        for (int w = 0; w < vhi; w++) {
            const vi16 masked = LANES + 16 * w > ISPLAT(r0 + m); /* key c > query r */
            v16 a = acc[m][w];
            if (mode == MF_CONJ_SOFTMAX_PRODUCT) {
                a = a * c2 - lb[m];
                exp2v(&a);
                if (diag) a = (v16)(~masked & (vi16)a);
                VSTORE(GP + (r0 + m) * BT + 16 * w, a);
                a *= VLOAD(GX + (r0 + m) * BT + 16 * w);
            } else {
                if (mode == MF_CONJ_SCORE_PRODUCT) {
                    VSTORE(GP + (r0 + m) * BT + 16 * w, a);
                    a = VLOAD(GX + (r0 + m) * BT + 16 * w) * a * c2 - la[m];
                } else {
                    a = a * c2 - la[m];
                }
                exp2v(&a);
                if (diag) a = (v16)(~masked & (vi16)a);
            }
            VSTORE(P + (r0 + m) * BT + 16 * w, a);
        }
    }
    /* acc = dA = dout V^T; the score gradients */
    zero_acc(acc);
    mk(acc, 0, vhi, dor, 1, VT, BT, 0, D);
    for (int m = 0; m < MR; m++) {
        for (int w = 0; w < vhi; w++) {
            const int64_t e = (r0 + m) * BT + 16 * w;
            const v16 a = VLOAD(P + e);
            if (mode == MF_CONJ_SUM) {
                VSTORE(GX + e, a * (acc[m][w] - dvr[m]) * scale);
            } else if (mode == MF_CONJ_SCORE_PRODUCT) {
                const v16 ds = a * (acc[m][w] - dvr[m]) * scale, sx = VLOAD(GX + e);
                VSTORE(GX + e, ds * VLOAD(GP + e));
                VSTORE(GP + e, ds * sx);
            } else {
                const v16 ad = a * acc[m][w];
                VSTORE(GX + e, (ad - VLOAD(GX + e) * dvr[m]) * scale);
                VSTORE(GP + e, (ad - VLOAD(GP + e) * dvr[m]) * scale);
            }
        }
    }
}

/* G[c] += sum_r Y[r][c] X[r] over the block's queries r (r >= c on a diagonal block) for the
 * keys c < nc, every column slice of Dp. */
INLINE void bwd_dkv_block(float *G, const float *Y, const float *X, int64_t Dp, int64_t c0,
                          int64_t k0, int64_t nr) {
    for (int64_t d0 = 0; d0 < Dp; d0 += 16 * NVMAX) {
        switch (min64(NVMAX, (Dp - d0) / 16)) {
            case 1: bwd_dkv(1, G, Y, X, Dp, d0, c0, k0, nr); break;
            case 2: bwd_dkv(2, G, Y, X, Dp, d0, c0, k0, nr); break;
            case 3: bwd_dkv(3, G, Y, X, Dp, d0, c0, k0, nr); break;
            default: bwd_dkv(4, G, Y, X, Dp, d0, c0, k0, nr); break;
        }
    }
}

/* dq rows r0 .. r0+MR (< nr) of the block += G[r][c < kn] K[c]. */
INLINE void bwd_dq_rows(float *dqi, int64_t ld, const float *G, const float *Ks, int64_t Dp,
                        int64_t D, int64_t kn, int64_t r0, int64_t nr) {
    const float *gr[MR];
    for (int m = 0; m < MR; m++) gr[m] = G + min64(r0 + m, nr - 1) * BT;
    for (int64_t d0 = 0; d0 < Dp; d0 += 16 * NVMAX) {
        switch (min64(NVMAX, (Dp - d0) / 16)) {
            case 1: bwd_dq(1, dqi, ld, gr, Ks, Dp, D, d0, kn, r0, nr); break;
            case 2: bwd_dq(2, dqi, ld, gr, Ks, Dp, D, d0, kn, r0, nr); break;
            case 3: bwd_dq(3, dqi, ld, gr, Ks, Dp, D, d0, kn, r0, nr); break;
            default: bwd_dq(4, dqi, ld, gr, Ks, Dp, D, d0, kn, r0, nr); break;
        }
    }
}

/* Everything of head (b, h) in `mode` (compile-time); pf: the next head's rows to prefetch. */
INLINE void bwd_task(int mode, const ConjAttnParams *p, float *scr, Prefetch *pf, int64_t b,
                     int64_t h) {
    const int64_t T = p->T, D = p->D, Dp = p->Dp, ld = p->ld, nb = p->nb;
    const int64_t off = b * T * ld + h * D, bh = b * p->H + h;
    const float *qx = p->qx + off, *kx = p->kx + off, *qp = p->qp + off, *kp = p->kp + off;
    const float *v = p->v + off, *dout = p->dout + off, *o = p->o + off;
    const float *lse = p->lse_in + lse_offset(p, bh);
    float *dqx = p->dqx + off, *dqp = p->dqp + off;
    const float c2 = (float)(p->scale * LOG2E), scale = p->scale;
    float *KxT = scr;           /* (D, BT): content keys of the block transposed, 0 past nc */
    float *KpT = KxT + D * BT;  /* (D, BT): positional keys transposed, 0 past nc */
    float *VT = KpT + D * BT;   /* (D, BT): values transposed, 0 past nc */
    float *Kxs = VT + D * BT;   /* (BT, Dp): content keys, 0 past D */
    float *Kps = Kxs + BT * Dp; /* (BT, Dp): positional keys, 0 past D */
    float *dKx = Kps + BT * Dp; /* (BT, Dp) each: dkx, dkp, dv of the key block */
    float *dKp = dKx + BT * Dp;
    float *dV = dKp + BT * Dp;
    float *Qxs = dV + BT * Dp;  /* (BT, Dp) each: qx, qp, dout of the query block, 0 past D */
    float *Qps = Qxs + BT * Dp;
    float *dOs = Qps + BT * Dp;
    float *P = dOs + BT * Dp;   /* (BT, BT) each, [query][key]: A, dsX, dsP */
    float *GX = P + BT * BT;
    float *GP = mode == MF_CONJ_SUM ? GX : GX + BT * BT;
    float *Dv = GX + 2 * BT * BT; /* (T,): dout_t . out_t */
    float *la = Dv + T;           /* (T,): base-2 lse (lse_X for softmax_product) */
    float *lb = la + T;           /* (T,): softmax_product: base-2 lse_P */

    const int64_t D16 = D / 16 * 16;
    for (int64_t t = 0; t < T; t++) {
        const float *a = dout + t * ld, *c = o + t * ld;
        v16 acc = VSPLAT(0.0f);
        for (int64_t d = 0; d < D16; d += 16) acc += VLOADU(a + d) * VLOADU(c + d);
        float s = hsum(&acc);
        for (int64_t d = D16; d < D; d++) s += a[d] * c[d];
        Dv[t] = s;
        la[t] = (float)(lse[t] * LOG2E);
        if (mode == MF_CONJ_SOFTMAX_PRODUCT) lb[t] = (float)(lse[lse_plane(p) + t] * LOG2E);
        memset(dqx + t * ld, 0, (size_t)D * sizeof(float));
        memset(dqp + t * ld, 0, (size_t)D * sizeof(float));
    }

    for (int64_t jb = 0; jb < nb; jb++) {
        const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
        transpose(KxT, BT, kx + j0 * ld, ld, nc, D);
        transpose(KpT, BT, kp + j0 * ld, ld, nc, D);
        transpose(VT, BT, v + j0 * ld, ld, nc, D);
        for (int64_t d = 0; d < D; d++)
            for (int64_t c = nc; c < BT; c++)
                KxT[d * BT + c] = KpT[d * BT + c] = VT[d * BT + c] = 0.0f;
        pack_rows(Kxs, Dp, kx + j0 * ld, ld, nc, D);
        pack_rows(Kps, Dp, kp + j0 * ld, ld, nc, D);
        memset(dKx, 0, (size_t)(3 * BT * Dp) * sizeof(float)); /* dKx, dKp and dV */

        for (int64_t ib = jb; ib < nb; ib++) {
            const int64_t i0 = ib * BT, nr = min64(BT, T - i0);
            const int diag = ib == jb;
            pack_rows(Qxs, Dp, qx + i0 * ld, ld, nr, D);
            pack_rows(Qps, Dp, qp + i0 * ld, ld, nr, D);
            pack_rows(dOs, Dp, dout + i0 * ld, ld, nr, D);

            for (int64_t r0 = 0; r0 < nr; r0 += MR) {
                pf_step(pf);
                const float *qxr[MR], *qpr[MR], *dor[MR];
                float l2a[MR], l2b[MR], dvr[MR];
                for (int m = 0; m < MR; m++) {
                    const int64_t r = min64(r0 + m, nr - 1);
                    qxr[m] = Qxs + r * Dp;
                    qpr[m] = Qps + r * Dp;
                    dor[m] = dOs + r * Dp;
                    l2a[m] = la[i0 + r];
                    l2b[m] = mode == MF_CONJ_SOFTMAX_PRODUCT ? lb[i0 + r] : 0.0f;
                    dvr[m] = Dv[i0 + r];
                }
                /* key vectors wholly above the diagonal skipped */
#define MF_SCORES(nv)                                                                         \
    bwd_scores(mode, nv, P, GX, GP, qxr, qpr, dor, KxT, KpT, VT, l2a, l2b, dvr, D, r0, diag, \
               c2, scale)
                switch (diag ? min64(NVB, (r0 + MR - 1) / 16 + 1) : NVB) {
                    case 1: MF_SCORES(1); break;
                    case 2: MF_SCORES(2); break;
                    case 3: MF_SCORES(3); break;
                    default: MF_SCORES(4); break;
                }
#undef MF_SCORES
            }

            /* dV += A^T dout_i, dKx += dsX^T qx_i, dKp += dsP^T qp_i: queries r >= c only on
             * the diagonal */
            for (int64_t c0 = 0; c0 < nc; c0 += MR) {
                pf_step(pf);
                const int64_t k0 = diag ? c0 : 0;
                bwd_dkv_block(dV, P, dOs, Dp, c0, k0, nr);
                bwd_dkv_block(dKx, GX, Qxs, Dp, c0, k0, nr);
                bwd_dkv_block(dKp, GP, Qps, Dp, c0, k0, nr);
            }

            /* dqx_i += dsX Kx_j, dqp_i += dsP Kp_j: keys c <= r only on the diagonal */
            for (int64_t r0 = 0; r0 < nr; r0 += MR) {
                pf_step(pf);
                const int64_t kn = diag ? min64(nc, r0 + MR) : nc;
                bwd_dq_rows(dqx + i0 * ld, ld, GX, Kxs, Dp, D, kn, r0, nr);
                bwd_dq_rows(dqp + i0 * ld, ld, GP, Kps, Dp, D, kn, r0, nr);
            }
        }

        unpack_rows(p->dkx + off + j0 * ld, ld, dKx, Dp, nc, D, NULL);
        unpack_rows(p->dkp + off + j0 * ld, ld, dKp, Dp, nc, D, NULL);
        unpack_rows(p->dv + off + j0 * ld, ld, dV, Dp, nc, D, NULL);
    }
}

/* ---- tasks (AVX-512) ----------------------------------------------------------------------- */

/* Forward task t: head bh = t / npair and the query blocks nb-1-pr and pr (pr = t % npair), so
 * every task costs about the same and a static schedule balances (as in attention.c). */
static int64_t fwd_npair(const ConjAttnParams *p) { return (p->nb + 1) / 2; }

/* Rows of task t that the previous task did not touch: its query blocks, and the head's keys
 * and values when the task is the head's first. */
static void fwd_prefetch_plan(const ConjAttnParams *p, Prefetch *pf, int64_t t) {
    pf_init(pf, p->ld, p->D);
    const int64_t npair = fwd_npair(p);
    if (t < p->B * p->H * npair) {
        const int64_t bh = t / npair, pr = t % npair, b = bh / p->H, h = bh % p->H;
        const int64_t off = b * p->T * p->ld + h * p->D, ib1 = p->nb - 1 - pr;
        const int64_t n1 = min64(BT, p->T - ib1 * BT);
        pf_add(pf, p->qx + off + ib1 * BT * p->ld, n1);
        pf_add(pf, p->qp + off + ib1 * BT * p->ld, n1);
        if (pr != ib1) {
            pf_add(pf, p->qx + off + pr * BT * p->ld, BT);
            pf_add(pf, p->qp + off + pr * BT * p->ld, BT);
        }
        if (pr == 0 && 3 * p->T * p->D * (int64_t)sizeof(float) <= PF_MAX_BYTES) {
            pf_add(pf, p->kx + off, p->T);
            pf_add(pf, p->kp + off, p->T);
            pf_add(pf, p->v + off, p->T);
        }
    }
}

INLINE void fwd_task(int mode, const ConjAttnParams *p, float *scr, int64_t t) {
    const int64_t npair = fwd_npair(p), bh = t / npair, pr = t % npair, ib1 = p->nb - 1 - pr;
    Prefetch pf;
    fwd_prefetch_plan(p, &pf, t + 1);
    /* pf_step runs once per MR keys of each score pass and once per MR queries of the PV pass
     * of every key block: 2 passes, or 4 for softmax_product */
    const int64_t passes = mode == MF_CONJ_SOFTMAX_PRODUCT ? 4 : 2;
    pf_plan(&pf, ((ib1 + 1) + (pr != ib1 ? pr + 1 : 0)) * (passes * BT / MR));
    fwd_block(mode, p, scr, &pf, bh / p->H, bh % p->H, ib1);
    if (pr != ib1) fwd_block(mode, p, scr, &pf, bh / p->H, bh % p->H, pr);
}

/* Backward task bh: the whole head; prefetch the next head's inputs and gradient rows. */
INLINE void bwd_head(int mode, const ConjAttnParams *p, float *scr, int64_t bh) {
    Prefetch pf;
    pf_init(&pf, p->ld, p->D);
    if (bh + 1 < p->B * p->H && 12 * p->T * p->D * (int64_t)sizeof(float) <= PF_MAX_BYTES) {
        const int64_t b = (bh + 1) / p->H, h = (bh + 1) % p->H;
        const int64_t off = b * p->T * p->ld + h * p->D;
        const float *rows[12] = {p->o,  p->dout, p->kx,  p->kp,  p->v,   p->qx,
                                 p->qp, p->dqx,  p->dqp, p->dkx, p->dkp, p->dv};
        for (int i = 0; i < 12; i++) pf_add(&pf, rows[i] + off, p->T); /* outputs: fetched now */
    }
    /* pf_step runs twice per MR queries and once per MR keys of every pair of blocks */
    pf_plan(&pf, p->nb * (p->nb + 1) / 2 * (3 * BT / MR));
    bwd_task(mode, p, scr, &pf, bh / p->H, bh % p->H);
}

__attribute__((MF_AVX512)) static int fwd_avx512(const void *params, float *s, int64_t t) {
    const ConjAttnParams *p = params;
    switch (p->mode) {
        case MF_CONJ_SCORE_PRODUCT: fwd_task(MF_CONJ_SCORE_PRODUCT, p, s, t); break;
        case MF_CONJ_SOFTMAX_PRODUCT: fwd_task(MF_CONJ_SOFTMAX_PRODUCT, p, s, t); break;
        default: fwd_task(MF_CONJ_SUM, p, s, t); break;
    }
    return MF_OK;
}

__attribute__((MF_AVX512)) static int bwd_avx512(const void *params, float *s, int64_t bh) {
    const ConjAttnParams *p = params;
    switch (p->mode) {
        case MF_CONJ_SCORE_PRODUCT: bwd_head(MF_CONJ_SCORE_PRODUCT, p, s, bh); break;
        case MF_CONJ_SOFTMAX_PRODUCT: bwd_head(MF_CONJ_SOFTMAX_PRODUCT, p, s, bh); break;
        default: bwd_head(MF_CONJ_SUM, p, s, bh); break;
    }
    return MF_OK;
}

/* ---- portable path: the same tiling on sgemm ---------------------------------------------- */
/* Every product is one sgemm on a BTB x BTB tile read in place (leading dimension H*D); scores
 * in (query, key) layout; the elementwise steps are plain loops. */

/* S (nr, nc) = c2 qx_i kx_j^T, and then, by `second`: 1 S += c2 qp_i kp_j^T (sum);
 * 2 S2 = qp_i kp_j^T with S = qx_i kx_j^T unscaled (score_product: the caller multiplies);
 * 3 S2 = c2 qp_i kp_j^T (softmax_product). */
static int blas_scores(const ConjAttnParams *p, float *S, float *S2, int64_t off, int64_t i0,
                       int64_t nr, int64_t j0, int64_t nc, float c2, int second) {
    const int64_t ld = p->ld, D = p->D;
    const float *qx = p->qx + off + i0 * ld, *kx = p->kx + off + j0 * ld;
    const float *qp = p->qp + off + i0 * ld, *kp = p->kp + off + j0 * ld;
    int st = mf_sgemm(0, 1, nr, nc, D, second == 2 ? 1.0f : c2, qx, ld, kx, ld, 0.0f, S, BTB);
    if (st != MF_OK) return st;
    if (second == 1) return mf_sgemm(0, 1, nr, nc, D, c2, qp, ld, kp, ld, 1.0f, S, BTB);
    return mf_sgemm(0, 1, nr, nc, D, second == 2 ? 1.0f : c2, qp, ld, kp, ld, 0.0f, S2, BTB);
}

static int fwd_blas(const void *params, float *scr, int64_t t) {
    const ConjAttnParams *p = params;
    const int64_t T = p->T, D = p->D, ld = p->ld, mode = p->mode;
    const int64_t npair = fwd_npair(p), bh = t / npair, pr = t % npair;
    const int64_t b = bh / p->H, h = bh % p->H, off = b * T * ld + h * D;
    const float c2 = (float)(p->scale * LOG2E);
    float *S = scr;            /* (BTB, BTB): scores then probabilities [query][key] */
    float *S2 = S + BTB * BTB; /* (BTB, BTB): positional scores (score_product, pass 1) */
    float *O = S2 + BTB * BTB; /* (BTB, D): unnormalised output */
    float *mx = O + BTB * D, *l = mx + BTB, *mxP = l + BTB, *lP = mxP + BTB; /* (BTB,) each */
    for (int half = 0; half < 2; half++) {
        const int64_t ib = half == 0 ? p->nb - 1 - pr : pr;
        if (half == 1 && ib == p->nb - 1 - pr) break;
        const int64_t i0 = ib * BTB, nr = min64(BTB, T - i0);
        float *lse = p->lse + lse_offset(p, bh) + i0;
        memset(O, 0, (size_t)(nr * D) * sizeof(float));
        for (int64_t r = 0; r < nr; r++) {
            mx[r] = mxP[r] = -INFINITY;
            l[r] = lP[r] = 0.0f;
        }
        if (mode == MF_CONJ_SOFTMAX_PRODUCT) {
            for (int64_t jb = 0; jb <= ib; jb++) { /* pass 1: both log-sum-exps */
                const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
                int st = blas_scores(p, S, S2, off, i0, nr, j0, nc, c2, 3);
                if (st != MF_OK) return st;
                for (int64_t r = 0; r < nr; r++) {
                    const int64_t cend = jb == ib ? r + 1 : nc;
                    row_softmax_step(S + r * BTB, cend, nc, mx + r, l + r);
                    row_softmax_step(S2 + r * BTB, cend, nc, mxP + r, lP + r);
                }
            }
            for (int64_t r = 0; r < nr; r++) {
                lse[r] = (float)LN2 * (mx[r] + log2f(l[r]));
                lse[lse_plane(p) + r] = (float)LN2 * (mxP[r] + log2f(lP[r]));
            }
            for (int64_t jb = 0; jb <= ib; jb++) { /* pass 2: O += A V, A lX lP first */
                const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
                int st = blas_scores(p, S, S2, off, i0, nr, j0, nc, c2, 3);
                if (st != MF_OK) return st;
                for (int64_t r = 0; r < nr; r++) {
                    float *s = S + r * BTB;
                    const float *s2 = S2 + r * BTB;
                    const int64_t cend = jb == ib ? r + 1 : nc;
                    for (int64_t c = 0; c < cend; c++)
                        s[c] = exp2_scalar((s[c] - mx[r]) + (s2[c] - mxP[r]));
                    for (int64_t c = cend; c < nc; c++) s[c] = 0.0f;
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
        for (int64_t jb = 0; jb <= ib; jb++) {
            const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
            int st = blas_scores(p, S, S2, off, i0, nr, j0, nc, c2,
                                 mode == MF_CONJ_SCORE_PRODUCT ? 2 : 1);
            if (st != MF_OK) return st;
            for (int64_t r = 0; r < nr; r++) {
                float *s = S + r * BTB, *o = O + r * D;
                const int64_t cend = jb == ib ? r + 1 : nc; /* causal: key c <= query r */
                if (mode == MF_CONJ_SCORE_PRODUCT)
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
            lse[r] = (float)LN2 * (mx[r] + log2f(l[r]));
        }
    }
    return MF_OK;
}

static int bwd_blas(const void *params, float *scr, int64_t bh) {
    const ConjAttnParams *p = params;
    const int64_t T = p->T, D = p->D, ld = p->ld, nb = p->nb, mode = p->mode;
    const int64_t b = bh / p->H, h = bh % p->H, off = b * T * ld + h * D;
    const float *qx = p->qx + off, *kx = p->kx + off, *qp = p->qp + off, *kp = p->kp + off;
    const float *v = p->v + off, *dout = p->dout + off, *o = p->o + off;
    const float *lse = p->lse_in + lse_offset(p, bh);
    float *dqx = p->dqx + off, *dqp = p->dqp + off;
    const float c2 = (float)(p->scale * LOG2E), scale = p->scale;
    float *P = scr;             /* (BTB, BTB) each, [query][key]: A; dA = dout V^T; */
    float *dA = P + BTB * BTB;  /* sX or AX, then dsX; sP or AP, then dsP */
    float *GX = dA + BTB * BTB;
    float *GP = GX + BTB * BTB;
    float *dKx = GP + BTB * BTB, *dKp = dKx + BTB * D, *dV = dKp + BTB * D; /* (BTB, D) each */
    float *Dv = dV + BTB * D, *la = Dv + T, *lb = la + T;                  /* (T,) each */
    for (int64_t t = 0; t < T; t++) {
        const float *a = dout + t * ld, *c = o + t * ld;
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++) s += a[d] * c[d];
        Dv[t] = s;
        la[t] = (float)(lse[t] * LOG2E);
        if (mode == MF_CONJ_SOFTMAX_PRODUCT) lb[t] = (float)(lse[lse_plane(p) + t] * LOG2E);
        memset(dqx + t * ld, 0, (size_t)D * sizeof(float));
        memset(dqp + t * ld, 0, (size_t)D * sizeof(float));
    }
    const int second = mode == MF_CONJ_SUM ? 1 : mode == MF_CONJ_SCORE_PRODUCT ? 2 : 3;
    float *gp = mode == MF_CONJ_SUM ? GX : GP; /* dsP = dsX in sum mode */
    for (int64_t jb = 0; jb < nb; jb++) {
        const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
        memset(dKx, 0, (size_t)(3 * BTB * D) * sizeof(float)); /* dKx, dKp and dV */
        for (int64_t ib = jb; ib < nb; ib++) {
            const int64_t i0 = ib * BTB, nr = min64(BTB, T - i0);
            int st = blas_scores(p, GX, GP, off, i0, nr, j0, nc, c2, second);
            if (st != MF_OK) return st;
            for (int64_t r = 0; r < nr; r++) {
                float *pr = P + r * BTB, *x = GX + r * BTB, *y = GP + r * BTB;
                const float l2 = la[i0 + r];
                const int64_t cend = ib == jb ? r + 1 : nc;
                if (mode == MF_CONJ_SUM) {
                    for (int64_t c = 0; c < cend; c++) pr[c] = exp2_scalar(x[c] - l2);
                } else if (mode == MF_CONJ_SCORE_PRODUCT) {
                    for (int64_t c = 0; c < cend; c++) pr[c] = exp2_scalar(x[c] * y[c] * c2 - l2);
                } else {
                    const float l2p = lb[i0 + r];
                    for (int64_t c = 0; c < cend; c++) {
                        x[c] = exp2_scalar(x[c] - l2);
                        y[c] = exp2_scalar(y[c] - l2p);
                        pr[c] = x[c] * y[c];
                    }
                    for (int64_t c = cend; c < nc; c++) x[c] = y[c] = 0.0f;
                }
                for (int64_t c = cend; c < nc; c++) pr[c] = 0.0f;
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
                if (mode == MF_CONJ_SUM) {
                    for (int64_t c = 0; c < nc; c++) x[c] = pr[c] * (da[c] - dvr) * scale;
                } else if (mode == MF_CONJ_SCORE_PRODUCT) {
                    for (int64_t c = 0; c < nc; c++) {
                        const float ds = pr[c] * (da[c] - dvr) * scale, sx = x[c];
                        x[c] = ds * y[c];
                        y[c] = ds * sx;
                    }
                } else {
                    for (int64_t c = 0; c < nc; c++) {
                        const float ad = pr[c] * da[c];
                        x[c] = (ad - x[c] * dvr) * scale;
                        y[c] = (ad - y[c] * dvr) * scale;
                    }
                }
            }
            st = mf_sgemm(1, 0, nc, D, nr, 1.0f, GX, BTB, qx + i0 * ld, ld, 1.0f, dKx, D);
            if (st == MF_OK)
                st = mf_sgemm(1, 0, nc, D, nr, 1.0f, gp, BTB, qp + i0 * ld, ld, 1.0f, dKp, D);
            if (st == MF_OK)
                st = mf_sgemm(0, 0, nr, D, nc, 1.0f, GX, BTB, kx + j0 * ld, ld, 1.0f,
                              dqx + i0 * ld, ld);
            if (st == MF_OK)
                st = mf_sgemm(0, 0, nr, D, nc, 1.0f, gp, BTB, kp + j0 * ld, ld, 1.0f,
                              dqp + i0 * ld, ld);
            if (st != MF_OK) return st;
        }
        for (int64_t c = 0; c < nc; c++) {
            memcpy(p->dkx + off + (j0 + c) * ld, dKx + c * D, (size_t)D * sizeof(float));
            memcpy(p->dkp + off + (j0 + c) * ld, dKp + c * D, (size_t)D * sizeof(float));
            memcpy(p->dv + off + (j0 + c) * ld, dV + c * D, (size_t)D * sizeof(float));
        }
    }
    return MF_OK;
}

/* ---- entry points ------------------------------------------------------------------------- */

static ConjAttnParams make_params(int64_t B, int64_t T, int64_t H, int64_t D, float scale,
                                  int mode, int64_t block) {
    ConjAttnParams p;
    memset(&p, 0, sizeof p);
    p.B = B;
    p.T = T;
    p.H = H;
    p.D = D;
    p.Dp = (D + 15) / 16 * 16;
    p.nb = (T + block - 1) / block;
    p.ld = H * D;
    p.scale = scale;
    p.mode = mode;
    return p;
}

static int valid_mode(int mode) {
    return mode == MF_CONJ_SCORE_PRODUCT || mode == MF_CONJ_SOFTMAX_PRODUCT ||
           mode == MF_CONJ_SUM;
}

/* floats of one task's scratch on the AVX-512 path (fast) or the sgemm path */
static int64_t fwd_floats(int fast, const ConjAttnParams *p) {
    return fast ? 2 * p->D * BT + BT * BT + 2 * BT * p->Dp + 6 * BT
                : 2 * BTB * BTB + BTB * p->D + 4 * BTB;
}
static int64_t bwd_floats(int fast, const ConjAttnParams *p) {
    return fast ? 3 * p->D * BT + 8 * BT * p->Dp + 3 * BT * BT + 3 * p->T
                : 4 * BTB * BTB + 3 * BTB * p->D + 3 * p->T;
}

int64_t conj_attention_forward_scratch_floats(const MfConjAttentionParams *a) {
    if (check_sizes(a->B, a->T, a->H, a->D, 0.0f) != MF_OK) return 0;
    const ConjAttnParams p = make_params(a->B, a->T, a->H, a->D, a->scale, a->mode, BT);
    return task_scratch_floats(fwd_floats(1, &p), fwd_floats(0, &p));
}

int64_t conj_attention_backward_scratch_floats(const MfConjAttentionParams *a) {
    if (check_sizes(a->B, a->T, a->H, a->D, 0.0f) != MF_OK) return 0;
    const ConjAttnParams p = make_params(a->B, a->T, a->H, a->D, a->scale, a->mode, BT);
    return task_scratch_floats(bwd_floats(1, &p), bwd_floats(0, &p));
}

int conj_attention_forward(const MfConjAttentionParams *a) {
    float *out = a->out, *lse = a->lse;
    const float *qx = a->qx, *kx = a->kx, *qp = a->qp, *kp = a->kp, *v = a->v;
    const int64_t B = a->B, T = a->T, H = a->H, D = a->D;
    const float scale = a->scale;
    const int mode = a->mode;
    if (out == NULL || lse == NULL || qx == NULL || kx == NULL || qp == NULL || kp == NULL ||
        v == NULL || !valid_mode(mode))
        return MF_EINVAL;
    int status = check_sizes(B, T, H, D, scale);
    if (status != MF_OK) return status;
    const int fast = mf_use_avx512();
    ConjAttnParams p = make_params(B, T, H, D, scale, mode, fast ? BT : BTB);
    p.out = out;
    p.lse = lse;
    p.qx = qx;
    p.kx = kx;
    p.qp = qp;
    p.kp = kp;
    p.v = v;
    const int64_t ntask = B * H * fwd_npair(&p);
    const double work = (double)B * H * T * T * D;
    return run_tasks(fast ? fwd_avx512 : fwd_blas, &p, ntask, fwd_floats(fast, &p), work,
                     a->scratch, a->scratch_floats);
}

int conj_attention_backward(const MfConjAttentionParams *a) {
    float *dqx = a->dqx, *dkx = a->dkx, *dqp = a->dqp, *dkp = a->dkp, *dv = a->dv;
    const float *dout = a->dout, *qx = a->qx, *kx = a->kx, *qp = a->qp, *kp = a->kp;
    const float *v = a->v, *out = a->o, *lse = a->lse_in;
    const int64_t B = a->B, T = a->T, H = a->H, D = a->D;
    const float scale = a->scale;
    const int mode = a->mode;
    if (dqx == NULL || dkx == NULL || dqp == NULL || dkp == NULL || dv == NULL ||
        dout == NULL || qx == NULL || kx == NULL || qp == NULL || kp == NULL || v == NULL ||
        out == NULL || lse == NULL || !valid_mode(mode))
        return MF_EINVAL;
    int status = check_sizes(B, T, H, D, scale);
    if (status != MF_OK) return status;
    const int fast = mf_use_avx512();
    ConjAttnParams p = make_params(B, T, H, D, scale, mode, fast ? BT : BTB);
    p.dqx = dqx;
    p.dkx = dkx;
    p.dqp = dqp;
    p.dkp = dkp;
    p.dv = dv;
    p.dout = dout;
    p.qx = qx;
    p.kx = kx;
    p.qp = qp;
    p.kp = kp;
    p.v = v;
    p.o = out;
    p.lse_in = lse;
    const double work = (double)B * H * T * T * D;
    return run_tasks(fast ? bwd_avx512 : bwd_blas, &p, B * H, bwd_floats(fast, &p), work,
                     a->scratch, a->scratch_floats);
}
