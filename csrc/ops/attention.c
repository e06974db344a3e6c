/* Causal softmax attention, tiled like FlashAttention-2.
 *
 *   out[b,i,h] = sum_{j <= i} softmax_j(scale * q_i . k_j) v_j
 *   lse[b,h,i] = log sum_{j <= i} exp(scale * q_i . k_j)
 *
 * Forward saves lse (B, H, T), one float per query row; the caller keeps out. No T x T matrix
 * exists in either direction: scores live in BT x BT tiles of per-thread scratch.
 * Backward recomputes the probabilities of every tile from lse:
 *   P = exp(scale S - lse), Dv_i = dout_i . out_i, dS = scale P (dout V^T - Dv),
 *   dv = P^T dout, dk = dS^T q, dq = dS k.
 * Gradient rule: dq, dk, dv are activation gradients, written (=).
 *
 * Two implementations of the same tiling, chosen per call:
 *  - AVX-512 (the CPUs that have it): every product is one register-tiled microkernel, MR rows
 *    times up to 4 vectors of 16 floats, a k-loop of scalar broadcasts times vector loads.
 *    Forward: one task per (head, pair of query blocks nb-1-p and p), so all tasks cost the
 *    same; scores are kept transposed, S^T[key][query], with the queries of the block packed
 *    as Q^T once, so the online softmax runs down columns on whole vectors of queries; then
 *    O[query] += P^T[key][query] V[key]. Backward: one task per head, which owns that head's
 *    dq rows (no atomics); per key block j it packs K_j^T, V_j^T and K_j, then for query
 *    blocks i >= j builds P and dS in (query, key) layout, accumulates dK_j, dV_j in scratch
 *    and adds into dq in place. On a diagonal block only the vectors and k-ranges under the
 *    causal mask are computed. Each task prefetches the rows the next task will need.
 *    Exponentials are base 2 (scale * log2 e folded into the scores) by a polynomial exp2
 *    kept in vector registers (Cephes exp2f, about 2 ulp).
 *  - portable (other CPUs, or MAPFORMER_KERNELS=blas, which the tests use): each
 *    product is one cblas sgemm on a BTB x BTB tile read in place (leading dimension H*D),
 *    softmax and exponentials in plain loops the compiler vectorises.
 * Both parallelise over tasks with OpenMP (one thread for problems too small to share).
 * Scratch is the caller's, per thread: O(BT * (BT + D)) floats, plus 2T floats in the
 * backward (attention_*_scratch_floats). Sizes are checked again here: MF_EINVAL for D odd
 * or outside [16, 128], any size < 1, or a non-finite scale.
 * The building blocks shared with conj_attention.c live in mapformer/attention_kernels.h. */
#include "mapformer/attention_kernels.h"

typedef struct {
    float *out, *lse;              /* forward: out (B, T, H, D), lse (B, H, T) */
    float *dq, *dk, *dv;           /* backward: (B, T, H, D) each */
    const float *q, *k, *v;        /* (B, T, H, D) */
    const float *dout, *o;         /* backward inputs (B, T, H, D) */
    const float *lse_in;           /* backward input (B, H, T) */
    int64_t B, T, H, D, Dp, nb, ld; /* Dp = D rounded up to 16; nb = blocks of BT; ld = H*D */
    float scale;
} AttnParams;

/* ---- forward ------------------------------------------------------------------------------ */

/* S^T[c][r] = c2 k_c . q_r for keys c0 <= c < c0 + MR and query vectors v >= vlo, -inf above
 * the diagonal when diag; mrun[r] = max(mrun[r], S^T[c][r]) over these keys. kc: key row
 * pointers; rows past nc repeat key nc - 1 and are not stored. */
INLINE void fwd_scores(int vlo, float *ST, float *mrun, const float *const kc[MR],
                       const float *QT, int64_t D, int64_t c0, int64_t nc, int diag, float c2) {
    v16 acc[MR][NVMAX];
    zero_acc(acc);
    mk(acc, vlo, NVB, kc, 1, QT, BT, 0, D);
    for (int v = vlo; v < NVB; v++) {
        v16 mx = VLOAD(mrun + 16 * v);
        for (int m = 0; m < MR; m++) {
            v16 x = acc[m][v] * c2;
            if (diag) {
                vi16 masked = LANES + 16 * v < ISPLAT(c0 + m); /* query r < key c */
                x = VSELECT(masked, VSPLAT(-INFINITY), x);
            }
            if (c0 + m < nc) VSTORE(ST + (c0 + m) * BT + 16 * v, x);
            mx = VSELECT(x > mx, x, mx);
        }
        VSTORE(mrun + 16 * v, mx);
    }
}

/* One query block (rows i0 .. i0+nr of head (b, h)) against key blocks 0 .. ib; pf: the next
 * task's rows to prefetch on the way. */
INLINE void fwd_block(const AttnParams *p, float *scr, Prefetch *pf, int64_t b, int64_t h,
                      int64_t ib) {
    const int64_t T = p->T, D = p->D, Dp = p->Dp, ld = p->ld;
    const int64_t i0 = ib * BT, nr = min64(BT, T - i0);
    const int64_t off = b * T * ld + h * D; /* element (b, 0, h, 0) */
    const float *q = p->q + off, *k = p->k + off, *v = p->v + off;
    const float c2 = (float)(p->scale * LOG2E);
    float *QT = scr;          /* (D, BT): the block's queries transposed, 0 past nr */
    float *ST = QT + D * BT;  /* (BT, BT): scores then probabilities, [key][query] */
    float *O = ST + BT * BT;  /* (BT, Dp): unnormalised output */
    float *Vs = O + BT * Dp;  /* (BT, Dp): the key block's values, 0 past D */
    float *mx = Vs + BT * Dp; /* (BT,): running max of the base-2 scores */
    float *l = mx + BT;       /* (BT,): running sum of exponentials */
    float *alpha = l + BT;    /* (BT,): rescale factor of the current key block */
    float *mrun = alpha + BT; /* (BT,): max including the current key block */

    transpose(QT, BT, q + i0 * ld, ld, nr, D);
    for (int64_t d = 0; d < D; d++)
        for (int64_t r = nr; r < BT; r++) QT[d * BT + r] = 0.0f;
    memset(O, 0, (size_t)(BT * Dp) * sizeof(float));
    for (int64_t r = 0; r < BT; r++) {
        mx[r] = -INFINITY;
        l[r] = 0.0f;
    }

    for (int64_t jb = 0; jb <= ib; jb++) {
        const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
        const int diag = jb == ib;
        const float *kj = k + j0 * ld;

        /* scores and their column maxima */
        memcpy(mrun, mx, BT * sizeof(float));
        for (int64_t c0 = 0; c0 < nc; c0 += MR) {
            pf_step(pf);
            const float *kc[MR];
            for (int m = 0; m < MR; m++) kc[m] = kj + min64(c0 + m, nc - 1) * ld;
            switch (diag ? c0 / 16 : 0) { /* query vectors wholly above the diagonal skipped */
                case 0: fwd_scores(0, ST, mrun, kc, QT, D, c0, nc, diag, c2); break;
                case 1: fwd_scores(1, ST, mrun, kc, QT, D, c0, nc, diag, c2); break;
                case 2: fwd_scores(2, ST, mrun, kc, QT, D, c0, nc, diag, c2); break;
                default: fwd_scores(3, ST, mrun, kc, QT, D, c0, nc, diag, c2); break;
            }
        }

        /* online softmax down each column (query), 16 queries at a time */
        fwd_softmax_cols(ST, mx, l, alpha, mrun, nc, diag);

        /* O = alpha O + P V_j, V_j copied to aligned rows padded to Dp */
        pack_rows(Vs, Dp, v + j0 * ld, ld, nc, D);
        for (int64_t r0 = 0; r0 < nr; r0 += MR) {
            pf_step(pf);
            const int64_t kn = diag ? min64(nc, r0 + MR) : nc; /* keys c <= r */
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

    float *lse = p->lse + (b * p->H + h) * T + i0;
    for (int64_t r = 0; r < nr; r++) {
        lse[r] = (float)LN2 * (mx[r] + log2f(l[r]));
        alpha[r] = 1.0f / l[r];
    }
    unpack_rows(p->out + off + i0 * ld, ld, O, Dp, nr, D, alpha);
}

/* ---- backward ----------------------------------------------------------------------------- */

/* For query rows r0 .. r0+MR of block i against key block j, key vectors w < vhi:
 * P[r][c] = exp2(c2 q_r . k_c - lse2_r) (0 above the diagonal) and
 * dS[r][c] = scale P (dout_r . v_c - Dv_r). Rows past nr are computed on clamped pointers and
 * stored (scratch rows < BT) but never read. */
INLINE void bwd_p_ds(int vhi, float *P, float *dS, const float *const qr[MR],
                     const float *const dor[MR], const float *KT, const float *VT,
                     const float *lse2, const float *Dv, int64_t D, int64_t r0, int diag,
                     float c2, float scale) {
    v16 acc[MR][NVMAX];
    zero_acc(acc);
    mk(acc, 0, vhi, qr, 1, KT, BT, 0, D);
    for (int m = 0; m < MR; m++) {
        for (int w = 0; w < vhi; w++) {
            v16 x = acc[m][w] * c2 - lse2[m];
            exp2v(&x);
            if (diag) {
                vi16 masked = LANES + 16 * w > ISPLAT(r0 + m); /* key c > query r */
                x = (v16)(~masked & (vi16)x);
            }
            VSTORE(P + (r0 + m) * BT + 16 * w, x);
        }
    }
    zero_acc(acc);
    mk(acc, 0, vhi, dor, 1, VT, BT, 0, D);
    for (int m = 0; m < MR; m++)
        for (int w = 0; w < vhi; w++) {
            const float *pr = P + (r0 + m) * BT + 16 * w;
            VSTORE(dS + (r0 + m) * BT + 16 * w, VLOAD(pr) * (acc[m][w] - Dv[m]) * scale);
        }
}

/* Everything of head (b, h); pf: the next head's rows to prefetch on the way. */
INLINE void bwd_task(const AttnParams *p, float *scr, Prefetch *pf, int64_t b, int64_t h) {
    const int64_t T = p->T, D = p->D, Dp = p->Dp, ld = p->ld, nb = p->nb;
    const int64_t off = b * T * ld + h * D;
    const float *q = p->q + off, *k = p->k + off, *v = p->v + off;
    const float *dout = p->dout + off, *o = p->o + off;
    const float *lse = p->lse_in + (b * p->H + h) * T;
    float *dq = p->dq + off;
    const float c2 = (float)(p->scale * LOG2E), scale = p->scale;
    float *KT = scr;          /* (D, BT): key block transposed, 0 past nc */
    float *VT = KT + D * BT;  /* (D, BT): value block transposed, 0 past nc */
    float *Ks = VT + D * BT;  /* (BT, Dp): key block, 0 past D */
    float *dK = Ks + BT * Dp; /* (BT, Dp): dk of the key block */
    float *dV = dK + BT * Dp; /* (BT, Dp): dv of the key block */
    float *Qs = dV + BT * Dp; /* (BT, Dp): query block, 0 past D */
    float *dOs = Qs + BT * Dp; /* (BT, Dp): dout of the query block, 0 past D */
    float *P = dOs + BT * Dp; /* (BT, BT): probabilities [query][key] */
    float *dS = P + BT * BT;  /* (BT, BT): score gradients [query][key] */
    float *Dv = dS + BT * BT; /* (T,): dout_t . out_t */
    float *lse2 = Dv + T;     /* (T,): lse in base 2 */

    const int64_t D16 = D / 16 * 16;
    for (int64_t t = 0; t < T; t++) {
        const float *a = dout + t * ld, *c = o + t * ld;
        v16 acc = VSPLAT(0.0f);
        for (int64_t d = 0; d < D16; d += 16) acc += VLOADU(a + d) * VLOADU(c + d);
        float s = hsum(&acc);
        for (int64_t d = D16; d < D; d++) s += a[d] * c[d];
        Dv[t] = s;
        lse2[t] = (float)(lse[t] * LOG2E);
        memset(dq + t * ld, 0, (size_t)D * sizeof(float));
    }

    for (int64_t jb = 0; jb < nb; jb++) {
        const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
        transpose(KT, BT, k + j0 * ld, ld, nc, D);
        transpose(VT, BT, v + j0 * ld, ld, nc, D);
        for (int64_t d = 0; d < D; d++)
            for (int64_t c = nc; c < BT; c++) KT[d * BT + c] = VT[d * BT + c] = 0.0f;
        pack_rows(Ks, Dp, k + j0 * ld, ld, nc, D);
        memset(dK, 0, (size_t)(2 * BT * Dp) * sizeof(float)); /* dK and dV */

        for (int64_t ib = jb; ib < nb; ib++) {
            const int64_t i0 = ib * BT, nr = min64(BT, T - i0);
            const int diag = ib == jb;
            pack_rows(Qs, Dp, q + i0 * ld, ld, nr, D);
            pack_rows(dOs, Dp, dout + i0 * ld, ld, nr, D);

            for (int64_t r0 = 0; r0 < nr; r0 += MR) {
                pf_step(pf);
                const float *qr[MR], *dor[MR];
                float l2[MR], dvr[MR];
                for (int m = 0; m < MR; m++) {
                    const int64_t r = min64(r0 + m, nr - 1);
                    qr[m] = Qs + r * Dp;
                    dor[m] = dOs + r * Dp;
                    l2[m] = lse2[i0 + r];
                    dvr[m] = Dv[i0 + r];
                }
                /* key vectors wholly above the diagonal skipped */
#define MF_P_DS(nv) bwd_p_ds(nv, P, dS, qr, dor, KT, VT, l2, dvr, D, r0, diag, c2, scale)
                switch (diag ? min64(NVB, (r0 + MR - 1) / 16 + 1) : NVB) {
                    case 1: MF_P_DS(1); break;
                    case 2: MF_P_DS(2); break;
                    case 3: MF_P_DS(3); break;
                    default: MF_P_DS(4); break;
                }
#undef MF_P_DS
            }

            /* dV += P^T dout_i, dK += dS^T q_i: queries r >= c only on the diagonal */
            for (int64_t c0 = 0; c0 < nc; c0 += MR) {
                pf_step(pf);
                const int64_t k0 = diag ? c0 : 0;
                for (int64_t d0 = 0; d0 < Dp; d0 += 16 * NVMAX) {
                    switch (min64(NVMAX, (Dp - d0) / 16)) {
                        case 1:
                            bwd_dkv(1, dV, P, dOs, Dp, d0, c0, k0, nr);
                            bwd_dkv(1, dK, dS, Qs, Dp, d0, c0, k0, nr);
                            break;
                        case 2:
                            bwd_dkv(2, dV, P, dOs, Dp, d0, c0, k0, nr);
                            bwd_dkv(2, dK, dS, Qs, Dp, d0, c0, k0, nr);
                            break;
                        case 3:
                            bwd_dkv(3, dV, P, dOs, Dp, d0, c0, k0, nr);
                            bwd_dkv(3, dK, dS, Qs, Dp, d0, c0, k0, nr);
                            break;
                        default:
                            bwd_dkv(4, dV, P, dOs, Dp, d0, c0, k0, nr);
                            bwd_dkv(4, dK, dS, Qs, Dp, d0, c0, k0, nr);
                            break;
                    }
                }
            }

            /* dq_i += dS K_j: keys c <= r only on the diagonal */
            float *dqi = dq + i0 * ld;
            for (int64_t r0 = 0; r0 < nr; r0 += MR) {
                pf_step(pf);
                const float *dsr[MR];
                for (int m = 0; m < MR; m++) dsr[m] = dS + min64(r0 + m, nr - 1) * BT;
                const int64_t kn = diag ? min64(nc, r0 + MR) : nc;
                for (int64_t d0 = 0; d0 < Dp; d0 += 16 * NVMAX) {
                    switch (min64(NVMAX, (Dp - d0) / 16)) {
                        case 1: bwd_dq(1, dqi, ld, dsr, Ks, Dp, D, d0, kn, r0, nr); break;
                        case 2: bwd_dq(2, dqi, ld, dsr, Ks, Dp, D, d0, kn, r0, nr); break;
                        case 3: bwd_dq(3, dqi, ld, dsr, Ks, Dp, D, d0, kn, r0, nr); break;
                        default: bwd_dq(4, dqi, ld, dsr, Ks, Dp, D, d0, kn, r0, nr); break;
                    }
                }
            }
        }

        unpack_rows(p->dk + off + j0 * ld, ld, dK, Dp, nc, D, NULL);
        unpack_rows(p->dv + off + j0 * ld, ld, dV, Dp, nc, D, NULL);
    }
}

/* ---- tasks --------------------------------------------------------------------------------- */

/* Forward task t: head bh = t / npair and the query blocks nb-1-pr and pr (pr = t % npair), so
 * every task costs about the same (nb + 1 key blocks) and a static schedule balances. */
static int64_t fwd_npair(const AttnParams *p) { return (p->nb + 1) / 2; }

/* Rows of task t that the previous task did not touch: its query blocks, and the head's keys
 * and values when the task is the head's first. */
static void fwd_prefetch_plan(const AttnParams *p, Prefetch *pf, int64_t t) {
    pf_init(pf, p->ld, p->D);
    const int64_t npair = fwd_npair(p);
    if (t < p->B * p->H * npair) {
        const int64_t bh = t / npair, pr = t % npair, b = bh / p->H, h = bh % p->H;
        const int64_t off = b * p->T * p->ld + h * p->D, ib1 = p->nb - 1 - pr;
        pf_add(pf, p->q + off + ib1 * BT * p->ld, min64(BT, p->T - ib1 * BT));
        if (pr != ib1) pf_add(pf, p->q + off + pr * BT * p->ld, BT);
        if (pr == 0 && 2 * p->T * p->D * (int64_t)sizeof(float) <= PF_MAX_BYTES) {
            pf_add(pf, p->k + off, p->T);
            pf_add(pf, p->v + off, p->T);
        }
    }
}

INLINE void fwd_task(const AttnParams *p, float *scr, int64_t t) {
    const int64_t npair = fwd_npair(p), bh = t / npair, pr = t % npair, ib1 = p->nb - 1 - pr;
    Prefetch pf;
    fwd_prefetch_plan(p, &pf, t + 1);
    /* pf_step runs once per MR keys and once per MR queries of every key block */
    pf_plan(&pf, ((ib1 + 1) + (pr != ib1 ? pr + 1 : 0)) * (2 * BT / MR));
    fwd_block(p, scr, &pf, bh / p->H, bh % p->H, ib1);
    if (pr != ib1) fwd_block(p, scr, &pf, bh / p->H, bh % p->H, pr);
}

/* Backward task bh: the whole head; prefetch the next head's inputs. */
INLINE void bwd_head(const AttnParams *p, float *scr, int64_t bh) {
    Prefetch pf;
    pf_init(&pf, p->ld, p->D);
    if (bh + 1 < p->B * p->H && 8 * p->T * p->D * (int64_t)sizeof(float) <= PF_MAX_BYTES) {
        const int64_t b = (bh + 1) / p->H, h = (bh + 1) % p->H;
        const int64_t off = b * p->T * p->ld + h * p->D;
        pf_add(&pf, p->o + off, p->T);
        pf_add(&pf, p->dout + off, p->T);
        pf_add(&pf, p->k + off, p->T);
        pf_add(&pf, p->v + off, p->T);
        pf_add(&pf, p->q + off, p->T);
        pf_add(&pf, p->dq + off, p->T); /* written: fetched now, not on the store */
        pf_add(&pf, p->dk + off, p->T);
        pf_add(&pf, p->dv + off, p->T);
    }
    /* pf_step runs twice per MR queries and once per MR keys of every pair of blocks */
    pf_plan(&pf, p->nb * (p->nb + 1) / 2 * (3 * BT / MR));
    bwd_task(p, scr, &pf, bh / p->H, bh % p->H);
}

/* ---- the AVX-512 instantiation ------------------------------------------------------------ */

__attribute__((MF_AVX512)) static int fwd_avx512(const void *p, float *s, int64_t t) {
    fwd_task((const AttnParams *)p, s, t);
    return MF_OK;
}
__attribute__((MF_AVX512)) static int bwd_avx512(const void *p, float *s, int64_t bh) {
    bwd_head((const AttnParams *)p, s, bh);
    return MF_OK;
}

/* ---- portable path: the same tiling on sgemm ---------------------------------------------- */
/* For CPUs without AVX-512 (and MAPFORMER_KERNELS=blas): every product is one sgemm on
 * a tile, read in place with leading dimension H*D; OpenBLAS picks its own kernel for the CPU.
 * BTB = 32 keeps every call at m n k <= 32 * 32 * 128 = 2^17, under OpenBLAS's threading
 * threshold, so calls from several OpenMP threads never start BLAS threads. Scores are kept
 * in (query, key) layout; softmax and exponentials are plain loops the compiler vectorises. */
static int fwd_blas(const void *params, float *scr, int64_t t) {
    const AttnParams *p = params;
    const int64_t T = p->T, D = p->D, ld = p->ld;
    const int64_t npair = fwd_npair(p), bh = t / npair, pr = t % npair;
    const int64_t b = bh / p->H, h = bh % p->H, off = b * T * ld + h * D;
    const float c2 = (float)(p->scale * LOG2E);
    float *S = scr;            /* (BTB, BTB): scores then probabilities [query][key] */
    float *O = S + BTB * BTB;  /* (BTB, D): unnormalised output */
    float *mx = O + BTB * D, *l = mx + BTB; /* (BTB,) each */
    for (int half = 0; half < 2; half++) {
        const int64_t ib = half == 0 ? p->nb - 1 - pr : pr;
        if (half == 1 && ib == p->nb - 1 - pr) break;
        const int64_t i0 = ib * BTB, nr = min64(BTB, T - i0);
        memset(O, 0, (size_t)(nr * D) * sizeof(float));
        for (int64_t r = 0; r < nr; r++) {
            mx[r] = -INFINITY;
            l[r] = 0.0f;
        }
        for (int64_t jb = 0; jb <= ib; jb++) {
            const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
            int st = mf_sgemm(0, 1, nr, nc, D, c2, p->q + off + i0 * ld, ld,
                              p->k + off + j0 * ld, ld, 0.0f, S, BTB);
            if (st != MF_OK) return st;
            for (int64_t r = 0; r < nr; r++) {
                float *s = S + r * BTB, *o = O + r * D;
                const int64_t cend = jb == ib ? r + 1 : nc; /* causal: key c <= query r */
                const float a = row_softmax_step(s, cend, nc, mx + r, l + r);
                for (int64_t d = 0; d < D; d++) o[d] *= a;
            }
            st = mf_sgemm(0, 0, nr, D, nc, 1.0f, S, BTB, p->v + off + j0 * ld, ld, 1.0f, O, D);
            if (st != MF_OK) return st;
        }
        float *lse = p->lse + bh * T + i0;
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
    const AttnParams *p = params;
    const int64_t T = p->T, D = p->D, ld = p->ld, nb = p->nb;
    const int64_t b = bh / p->H, h = bh % p->H, off = b * T * ld + h * D;
    const float *q = p->q + off, *k = p->k + off, *v = p->v + off;
    const float *dout = p->dout + off, *o = p->o + off, *lse = p->lse_in + bh * T;
    float *dq = p->dq + off;
    const float c2 = (float)(p->scale * LOG2E), scale = p->scale;
    float *P = scr;            /* (BTB, BTB): probabilities [query][key] */
    float *dS = P + BTB * BTB; /* (BTB, BTB): dP, then score gradients */
    float *dK = dS + BTB * BTB, *dV = dK + BTB * D; /* (BTB, D) each */
    float *Dv = dV + BTB * D, *lse2 = Dv + T;       /* (T,) each */
    for (int64_t t = 0; t < T; t++) {
        const float *a = dout + t * ld, *c = o + t * ld;
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++) s += a[d] * c[d];
        Dv[t] = s;
        lse2[t] = (float)(lse[t] * LOG2E);
        memset(dq + t * ld, 0, (size_t)D * sizeof(float));
    }
    for (int64_t jb = 0; jb < nb; jb++) {
        const int64_t j0 = jb * BTB, nc = min64(BTB, T - j0);
        memset(dK, 0, (size_t)(2 * BTB * D) * sizeof(float)); /* dK and dV */
        for (int64_t ib = jb; ib < nb; ib++) {
            const int64_t i0 = ib * BTB, nr = min64(BTB, T - i0);
            int st = mf_sgemm(0, 1, nr, nc, D, c2, q + i0 * ld, ld, k + j0 * ld, ld, 0.0f, P, BTB);
            if (st != MF_OK) return st;
            for (int64_t r = 0; r < nr; r++) {
                float *pr = P + r * BTB;
                const int64_t cend = ib == jb ? r + 1 : nc;
                for (int64_t c = 0; c < cend; c++) pr[c] = exp2_scalar(pr[c] - lse2[i0 + r]);
                for (int64_t c = cend; c < nc; c++) pr[c] = 0.0f;
            }
            st = mf_sgemm(1, 0, nc, D, nr, 1.0f, P, BTB, dout + i0 * ld, ld, 1.0f, dV, D);
            if (st == MF_OK)
                st = mf_sgemm(0, 1, nr, nc, D, 1.0f, dout + i0 * ld, ld, v + j0 * ld, ld, 0.0f,
                              dS, BTB);
            if (st != MF_OK) return st;
            for (int64_t r = 0; r < nr; r++) {
                const float dvr = Dv[i0 + r];
                for (int64_t c = 0; c < nc; c++)
                    dS[r * BTB + c] = P[r * BTB + c] * (dS[r * BTB + c] - dvr) * scale;
            }
            st = mf_sgemm(1, 0, nc, D, nr, 1.0f, dS, BTB, q + i0 * ld, ld, 1.0f, dK, D);
            if (st == MF_OK)
                st = mf_sgemm(0, 0, nr, D, nc, 1.0f, dS, BTB, k + j0 * ld, ld, 1.0f,
                              dq + i0 * ld, ld);
            if (st != MF_OK) return st;
        }
        for (int64_t c = 0; c < nc; c++) {
            memcpy(p->dk + off + (j0 + c) * ld, dK + c * D, (size_t)D * sizeof(float));
            memcpy(p->dv + off + (j0 + c) * ld, dV + c * D, (size_t)D * sizeof(float));
        }
    }
    return MF_OK;
}

/* ---- entry points ------------------------------------------------------------------------- */

static AttnParams make_params(int64_t B, int64_t T, int64_t H, int64_t D, float scale,
                              int64_t block) {
    AttnParams p;
    memset(&p, 0, sizeof p);
    p.B = B;
    p.T = T;
    p.H = H;
    p.D = D;
    p.Dp = (D + 15) / 16 * 16;
    p.nb = (T + block - 1) / block;
    p.ld = H * D;
    p.scale = scale;
    return p;
}

/* floats of one task's scratch on the AVX-512 path (fast) or the sgemm path */
static int64_t fwd_floats(int fast, const AttnParams *p) {
    return fast ? p->D * BT + BT * BT + 2 * BT * p->Dp + 4 * BT : BTB * BTB + BTB * p->D + 2 * BTB;
}
static int64_t bwd_floats(int fast, const AttnParams *p) {
    return fast ? 2 * p->D * BT + 5 * BT * p->Dp + 2 * BT * BT + 2 * p->T
                : 2 * BTB * BTB + 2 * BTB * p->D + 2 * p->T;
}

int64_t attention_forward_scratch_floats(const MfAttentionParams *a) {
    if (check_sizes(a->B, a->T, a->H, a->D, 0.0f) != MF_OK) return 0;
    const AttnParams p = make_params(a->B, a->T, a->H, a->D, a->scale, BT);
    return task_scratch_floats(fwd_floats(1, &p), fwd_floats(0, &p));
}

int64_t attention_backward_scratch_floats(const MfAttentionParams *a) {
    if (check_sizes(a->B, a->T, a->H, a->D, 0.0f) != MF_OK) return 0;
    const AttnParams p = make_params(a->B, a->T, a->H, a->D, a->scale, BT);
    return task_scratch_floats(bwd_floats(1, &p), bwd_floats(0, &p));
}

int attention_forward(const MfAttentionParams *a) {
    float *out = a->out, *lse = a->lse;
    const float *q = a->q, *k = a->k, *v = a->v;
    const int64_t B = a->B, T = a->T, H = a->H, D = a->D;
    const float scale = a->scale;
    if (out == NULL || lse == NULL || q == NULL || k == NULL || v == NULL) return MF_EINVAL;
    int status = check_sizes(B, T, H, D, scale);
    if (status != MF_OK) return status;
    const int fast = mf_use_avx512();
    const double work = (double)B * H * T * T * D;
    AttnParams p = make_params(B, T, H, D, scale, fast ? BT : BTB);
    p.out = out;
    p.lse = lse;
    p.q = q;
    p.k = k;
    p.v = v;
    const int64_t ntask = B * H * fwd_npair(&p);
    return run_tasks(fast ? fwd_avx512 : fwd_blas, &p, ntask, fwd_floats(fast, &p), work,
                     a->scratch, a->scratch_floats);
}

int attention_backward(const MfAttentionParams *a) {
    float *dq = a->dq, *dk = a->dk, *dv = a->dv;
    const float *dout = a->dout, *q = a->q, *k = a->k, *v = a->v, *out = a->o, *lse = a->lse_in;
    const int64_t B = a->B, T = a->T, H = a->H, D = a->D;
    const float scale = a->scale;
    if (dq == NULL || dk == NULL || dv == NULL || dout == NULL || q == NULL || k == NULL ||
        v == NULL || out == NULL || lse == NULL)
        return MF_EINVAL;
    int status = check_sizes(B, T, H, D, scale);
    if (status != MF_OK) return status;
    const int fast = mf_use_avx512();
    const double work = (double)B * H * T * T * D;
    AttnParams p = make_params(B, T, H, D, scale, fast ? BT : BTB);
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    p.dout = dout;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = out;
    p.lse_in = lse;
    return run_tasks(fast ? bwd_avx512 : bwd_blas, &p, B * H, bwd_floats(fast, &p), work,
                     a->scratch, a->scratch_floats);
}
