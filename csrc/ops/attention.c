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
 *  - portable (other CPUs, or MAPFORMER_ATTENTION_KERNEL=blas, which the tests use): each
 *    product is one cblas sgemm on a BTB x BTB tile read in place (leading dimension H*D),
 *    softmax and exponentials in plain loops the compiler vectorises.
 * Both parallelise over tasks with OpenMP (one thread for problems too small to share).
 * Scratch is malloc'ed per thread: O(BT * (BT + D)) floats, plus 2T floats in the backward;
 * MF_ENOMEM when that fails. Sizes are checked again here: MF_EINVAL for D odd or outside
 * [16, 128], any size < 1, or a non-finite scale. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/mapformer.h"

#define BT 64          /* rows of a query block = rows of a key block; a multiple of 16, <= 64 */
#define NVB (BT / 16)  /* vectors of 16 floats across a block */
#define MR 4           /* rows of a register tile; divides BT */
#define NVMAX 4        /* vectors of 16 floats across a register tile */
#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453

/* __may_alias__: scratch and arrays are float buffers read and written through these types. */
typedef float v16 __attribute__((vector_size(64), __may_alias__));
typedef float v16u __attribute__((vector_size(64), __may_alias__, aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(64), __may_alias__));

/* The AVX-512 kernels are always-inline bodies compiled only inside the AVX-512 entry points
 * at the end of their section. Tiny helpers are macros, and vectors are passed by pointer: a
 * function taking or returning a 64-byte vector by value draws -Wpsabi notes when compiled for
 * the baseline target. */
#define INLINE static inline __attribute__((always_inline))
#define VSPLAT(x) ((float)(x) - (v16){0})
#define ISPLAT(x) ((int32_t)(x) + (vi16){0})
#define VLOAD(p) (*(const v16 *)(p))     /* 64-byte aligned (scratch) */
#define VLOADU(p) (*(const v16u *)(p))   /* any float address */
#define VSTORE(p, x) (*(v16 *)(p) = (x))
#define VSTOREU(p, x) (*(v16u *)(p) = (x))
#define VSELECT(mask, a, b) ((v16)(((mask) & (vi16)(a)) | (~(mask) & (vi16)(b))))
#define LANES ((vi16){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* *x = 2^*x for *x <= 127 (the callers' arguments are <= 0 up to rounding), NaN kept, -inf
 * and anything below -126.5 give 0. Cephes exp2f: round to nearest n, 2^f on [-1/2, 1/2] by a
 * degree-6 polynomial (about 2 ulp), 2^n put into the exponent bits. */
INLINE void exp2v(v16 *x) {
    v16 y = *x;
    y = VSELECT(y < VSPLAT(-127.0f), VSPLAT(-127.0f), y);
    v16 t = y + 12582912.0f; /* 1.5 * 2^23: the low mantissa bits of t hold round(y) */
    v16 f = y - (t - 12582912.0f);
    v16 p = VSPLAT(1.535336188319500e-4f);
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    vi16 e = ((vi16)t - 0x4B400000 + 127) << 23; /* 2^round(y); 0.0f for round(y) = -127 */
    *x = p * (v16)e;
}

INLINE float hsum(const v16 *x) {
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += (*x)[l];
    return s;
}

/* dst[c * ldd + r] = src[r * lds + c] for r < nr, c < nc: 16 x 16 blocks transposed in
 * registers (four butterfly stages, each swapping one bit of the row and column index), the
 * ragged edges element by element. */
INLINE void transpose(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t nr,
                      int64_t nc) {
    const vi16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const vi16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const vi16 lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const vi16 hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const vi16 lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const vi16 hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const vi16 lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const vi16 hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    const int64_t nr16 = nr / 16 * 16, nc16 = nc / 16 * 16;
    for (int64_t r0 = 0; r0 < nr16; r0 += 16) {
        for (int64_t c0 = 0; c0 < nc16; c0 += 16) {
            v16 x[16];
            for (int i = 0; i < 16; i++) x[i] = VLOADU(src + (r0 + i) * lds + c0);
#define MF_STAGE(h, lo, hi)                                   \
    for (int i = 0; i < 16; i++) {                            \
        if (i & (h)) continue;                                \
        v16 a = x[i], b = x[i + (h)];                         \
        x[i] = __builtin_shuffle(a, b, lo);                   \
        x[i + (h)] = __builtin_shuffle(a, b, hi);             \
    }
            MF_STAGE(8, lo8, hi8)
            MF_STAGE(4, lo4, hi4)
            MF_STAGE(2, lo2, hi2)
            MF_STAGE(1, lo1, hi1)
#undef MF_STAGE
            for (int i = 0; i < 16; i++) VSTOREU(dst + (c0 + i) * ldd + r0, x[i]);
        }
        for (int64_t r = r0; r < r0 + 16; r++)
            for (int64_t c = nc16; c < nc; c++) dst[c * ldd + r] = src[r * lds + c];
    }
    for (int64_t r = nr16; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) dst[c * ldd + r] = src[r * lds + c];
}

/* dst (n, Dp) = rows (n, D) of stride ld from src, zero past D; dst 64-byte aligned. */
INLINE void pack_rows(float *dst, int64_t Dp, const float *src, int64_t ld, int64_t n,
                      int64_t D) {
    const int64_t D16 = D / 16 * 16;
    for (int64_t r = 0; r < n; r++) {
        const float *s = src + r * ld;
        float *d = dst + r * Dp;
        for (int64_t c = 0; c < D16; c += 16) VSTORE(d + c, VLOADU(s + c));
        for (int64_t c = D16; c < D; c++) d[c] = s[c];
        for (int64_t c = D; c < Dp; c++) d[c] = 0.0f;
    }
}

/* Rows (n, D) of stride ld of dst = src (n, Dp) times scale[r] (or 1 when scale is NULL). */
INLINE void unpack_rows(float *dst, int64_t ld, const float *src, int64_t Dp, int64_t n,
                        int64_t D, const float *scale) {
    const int64_t D16 = D / 16 * 16;
    for (int64_t r = 0; r < n; r++) {
        const float *s = src + r * Dp, f = scale != NULL ? scale[r] : 1.0f;
        float *d = dst + r * ld;
        for (int64_t c = 0; c < D16; c += 16) VSTOREU(d + c, VLOAD(s + c) * f);
        for (int64_t c = D16; c < D; c++) d[c] = s[c] * f;
    }
}

/* The microkernel: acc[m][v] += sum_{k0 <= k < k1} a[m][k * aks] * b[k * ldb + 16 v] for
 * m < MR and vlo <= v < vhi. vlo and vhi are compile-time constants at every call, so acc
 * stays in registers. b is 64-byte aligned with ldb a multiple of 16. */
INLINE void mk(v16 acc[MR][NVMAX], int vlo, int vhi, const float *const a[MR], int64_t aks,
               const float *b, int64_t ldb, int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k++) {
        const float *bk = b + k * ldb;
        v16 bv[NVMAX];
        for (int v = vlo; v < vhi; v++) bv[v] = VLOAD(bk + 16 * v);
        for (int m = 0; m < MR; m++) {
            v16 am = VSPLAT(a[m][k * aks]);
            for (int v = vlo; v < vhi; v++) acc[m][v] += am * bv[v];
        }
    }
}

INLINE void zero_acc(v16 acc[MR][NVMAX]) {
    for (int m = 0; m < MR; m++)
        for (int v = 0; v < NVMAX; v++) acc[m][v] = VSPLAT(0.0f);
}

/* Software prefetch of the next task's rows (D floats every ld) into L2 (not L1, which holds
 * the current tiles), a few rows per call of pf_step from a task's inner loops, so the next
 * task starts on cached data without bursts that fill the line-fill buffers. */
#define PF_RANGES 8
typedef struct {
    const float *base[PF_RANGES];
    int64_t rows[PF_RANGES];
    int n, cur;
    int64_t row, bytes, ld, per_step;
} Prefetch;

static void pf_init(Prefetch *pf, int64_t ld, int64_t D) {
    memset(pf, 0, sizeof *pf);
    pf->ld = ld;
    pf->bytes = D * (int64_t)sizeof(float);
}

static void pf_add(Prefetch *pf, const float *base, int64_t rows) {
    if (pf->n < PF_RANGES && rows > 0) {
        pf->base[pf->n] = base;
        pf->rows[pf->n++] = rows;
    }
}

/* Spread the rows added so far over `steps` calls of pf_step. */
static void pf_plan(Prefetch *pf, int64_t steps) {
    int64_t rows = 0;
    for (int i = 0; i < pf->n; i++) rows += pf->rows[i];
    pf->per_step = steps > 0 ? (rows + steps - 1) / steps : rows;
}

INLINE void pf_step(Prefetch *pf) {
    for (int64_t i = 0; i < pf->per_step && pf->cur < pf->n; i++) {
        const char *row = (const char *)(pf->base[pf->cur] + pf->row * pf->ld);
        for (int64_t b = 0; b < pf->bytes; b += 64) __builtin_prefetch(row + b, 0, 2);
        __builtin_prefetch(row + pf->bytes - 1, 0, 2); /* rows need not be line-aligned */
        if (++pf->row == pf->rows[pf->cur]) {
            pf->cur++;
            pf->row = 0;
        }
    }
}

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

/* O[r][d0 + 16 w] = alpha[r] O[r][d0 + 16 w] + sum_{c < kn} P^T[c][r] V[c][d0 + 16 w] for the
 * queries r0 .. r0+MR and w < nv. */
INLINE void fwd_pv(int nv, float *O, const float *ST, const float *Vs, const float *alpha,
                   int64_t Dp, int64_t d0, int64_t r0, int64_t kn) {
    const float *pr[MR];
    v16 acc[MR][NVMAX];
    for (int m = 0; m < MR; m++) {
        pr[m] = ST + r0 + m;
        for (int w = 0; w < nv; w++)
            acc[m][w] = VLOAD(O + (r0 + m) * Dp + d0 + 16 * w) * alpha[r0 + m];
    }
    mk(acc, 0, nv, pr, BT, Vs + d0, Dp, 0, kn);
    for (int m = 0; m < MR; m++)
        for (int w = 0; w < nv; w++) VSTORE(O + (r0 + m) * Dp + d0 + 16 * w, acc[m][w]);
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
        for (int w = 0; w < NVB; w++) {
            const int64_t cend = diag ? min64(nc, 16 * w + 16) : nc;
            const v16 mnew = VLOAD(mrun + 16 * w);
            v16 a = VLOAD(mx + 16 * w) - mnew, sum = VSPLAT(0.0f);
            exp2v(&a);
            for (int64_t c = 0; c < cend; c++) {
                v16 e = VLOAD(ST + c * BT + 16 * w) - mnew;
                exp2v(&e);
                VSTORE(ST + c * BT + 16 * w, e);
                sum += e;
            }
            VSTORE(l + 16 * w, VLOAD(l + 16 * w) * a + sum);
            VSTORE(mx + 16 * w, mnew);
            VSTORE(alpha + 16 * w, a);
        }

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

/* dq[r][d0 + 16 w] += sum_{c < kn} dS[r][c] K[c][d0 + 16 w] for w < nv, rows r0 .. r0+MR
 * (< nr) of the block whose first dq row is dqr; the vector past D is added lane by lane. */
INLINE void bwd_dq(int nv, float *dqr, int64_t ld, const float *const dsr[MR], const float *Ks,
                   int64_t Dp, int64_t D, int64_t d0, int64_t kn, int64_t r0, int64_t nr) {
    v16 acc[MR][NVMAX];
    zero_acc(acc);
    mk(acc, 0, nv, dsr, 1, Ks + d0, Dp, 0, kn);
    for (int m = 0; m < MR && r0 + m < nr; m++) {
        float *row = dqr + (r0 + m) * ld + d0;
        for (int w = 0; w < nv; w++) {
            if (d0 + 16 * w + 16 <= D) {
                VSTOREU(row + 16 * w, VLOADU(row + 16 * w) + acc[m][w]);
            } else {
                float tail[16] __attribute__((aligned(64)));
                VSTORE(tail, acc[m][w]);
                for (int64_t t = 0; t < D - d0 - 16 * w; t++) row[16 * w + t] += tail[t];
            }
        }
    }
}

/* G[c][d0 + 16 w] += sum_{k0 <= r < nr} Y[r][c] X[r][d0 + 16 w] for keys c0 .. c0+MR and
 * w < nv: dV += P^T dout (Y = P, X = dout) or dK += dS^T q (Y = dS, X = q); G (BT, Dp),
 * X (BT, Dp) packed, Y (BT, BT). */
INLINE void bwd_dkv(int nv, float *G, const float *Y, const float *X, int64_t Dp, int64_t d0,
                    int64_t c0, int64_t k0, int64_t nr) {
    const float *yc[MR];
    v16 acc[MR][NVMAX];
    for (int m = 0; m < MR; m++) {
        yc[m] = Y + c0 + m;
        for (int w = 0; w < nv; w++) acc[m][w] = VLOAD(G + (c0 + m) * Dp + d0 + 16 * w);
    }
    mk(acc, 0, nv, yc, BT, X + d0, Dp, k0, nr);
    for (int m = 0; m < MR; m++)
        for (int w = 0; w < nv; w++) VSTORE(G + (c0 + m) * Dp + d0 + 16 * w, acc[m][w]);
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

/* Prefetch whole heads ahead only while they fit comfortably in a core's L2 next to the
 * current one; longer sequences stream through the hardware prefetchers. */
#define PF_MAX_BYTES (1024 * 1024)

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

typedef int (*TaskFn)(const AttnParams *, float *, int64_t);

/* The bodies above are compiled here only, for AVX-512; -std=c11 turns floating-point
 * contraction off, and these kernels want fused multiply-adds. */
#define MF_AVX512 \
    target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"), optimize("fp-contract=fast")

__attribute__((MF_AVX512)) static int fwd_avx512(const AttnParams *p, float *s, int64_t t) {
    fwd_task(p, s, t);
    return MF_OK;
}
__attribute__((MF_AVX512)) static int bwd_avx512(const AttnParams *p, float *s, int64_t bh) {
    bwd_head(p, s, bh);
    return MF_OK;
}

/* ---- portable path: the same tiling on sgemm ---------------------------------------------- */
/* For CPUs without AVX-512 (and MAPFORMER_ATTENTION_KERNEL=blas): every product is one sgemm on
 * a tile, read in place with leading dimension H*D; OpenBLAS picks its own kernel for the CPU.
 * BTB = 32 keeps every call at m n k <= 32 * 32 * 128 = 2^17, under OpenBLAS's threading
 * threshold, so calls from several OpenMP threads never start BLAS threads. Scores are kept
 * in (query, key) layout; softmax and exponentials are plain loops the compiler vectorises. */
#define BTB 32

/* 2^x as exp2v, for |x| < 1e13 (-inf gives NaN; the callers never pass it): the exponent is
 * clamped as an integer, which keeps the function free of float comparisons, so that loops
 * calling it vectorise. */
static inline float exp2_scalar(float x) {
    float t = x + 12582912.0f, f = x - (t - 12582912.0f);
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    int32_t n = (int32_t)(bits - 0x4B400000u); /* round(x), garbage but clamped when |x| > 2^22 */
    n = n < -127 ? -127 : n;
    n = n > 127 ? 127 : n;
    const uint32_t e = (uint32_t)(n + 127) << 23; /* 2^n; 0.0f for n = -127 */
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

/* Sum of x[0..n) in 8 interleaved partial sums (vectorisable, unlike one running sum). */
static inline float sum8(const float *x, int64_t n) {
    float s[8] = {0};
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int u = 0; u < 8; u++) s[u] += x[c + u];
    float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; c < n; c++) total += x[c];
    return total;
}

static int fwd_blas(const AttnParams *p, float *scr, int64_t t) {
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
                float m = mx[r];
                for (int64_t c = 0; c < cend; c++) m = s[c] > m ? s[c] : m;
                const float a = mx[r] == -INFINITY ? 0.0f : exp2_scalar(mx[r] - m);
                for (int64_t c = 0; c < cend; c++) s[c] = exp2_scalar(s[c] - m);
                for (int64_t c = cend; c < nc; c++) s[c] = 0.0f;
                l[r] = l[r] * a + sum8(s, cend);
                mx[r] = m;
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

static int bwd_blas(const AttnParams *p, float *scr, int64_t bh) {
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

/* 1: the AVX-512 kernels, 0: the sgemm path. MAPFORMER_ATTENTION_KERNEL=blas forces the latter
 * (the tests use it to cover the path other CPUs take). */
static int use_avx512(void) {
    const char *kernel = getenv("MAPFORMER_ATTENTION_KERNEL");
    if (kernel != NULL && strcmp(kernel, "blas") == 0) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int check_sizes(int64_t B, int64_t T, int64_t H, int64_t D, float scale) {
    if (B < 1 || T < 1 || H < 1 || D < 16 || D > 128 || D % 2 != 0 || !isfinite(scale))
        return MF_EINVAL;
    if (B > INT64_MAX / T / H / D || H * D > INT32_MAX) return MF_EINVAL;
    return MF_OK;
}

static void *scratch_alloc(int64_t nfloat) {
    size_t bytes = ((size_t)nfloat * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes);
}

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

/* Run fn over tasks [0, ntask) on the OpenMP threads, each with its own scratch of nfloat
 * floats. Tasks cost about the same and consecutive ones share data: a static schedule.
 * Problems under about a million multiply-adds run on the calling thread: waking the team
 * would cost more than the work. */
static int run_tasks(TaskFn fn, const AttnParams *p, int64_t ntask, int64_t nfloat) {
    int status = MF_OK;
    const int parallel = ntask > 1 && (double)p->B * p->H * p->T * p->T * p->D > 2e6;
#pragma omp parallel if (parallel)
    {
        float *scr = scratch_alloc(nfloat);
        int mine = scr == NULL ? MF_ENOMEM : MF_OK;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntask; t++)
            if (mine == MF_OK) mine = fn(p, scr, t);
        if (mine != MF_OK) {
#pragma omp atomic write
            status = mine;
        }
        free(scr);
    }
    return status;
}

int attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                      int64_t B, int64_t T, int64_t H, int64_t D, float scale) {
    if (out == NULL || lse == NULL || q == NULL || k == NULL || v == NULL) return MF_EINVAL;
    int status = check_sizes(B, T, H, D, scale);
    if (status != MF_OK) return status;
    const int fast = use_avx512();
    AttnParams p = make_params(B, T, H, D, scale, fast ? BT : BTB);
    p.out = out;
    p.lse = lse;
    p.q = q;
    p.k = k;
    p.v = v;
    const int64_t ntask = B * H * fwd_npair(&p);
    if (fast) return run_tasks(fwd_avx512, &p, ntask, D * BT + BT * BT + 2 * BT * p.Dp + 4 * BT);
    return run_tasks(fwd_blas, &p, ntask, BTB * BTB + BTB * D + 2 * BTB);
}

int attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                       const float *k, const float *v, const float *out, const float *lse,
                       int64_t B, int64_t T, int64_t H, int64_t D, float scale) {
    if (dq == NULL || dk == NULL || dv == NULL || dout == NULL || q == NULL || k == NULL ||
        v == NULL || out == NULL || lse == NULL)
        return MF_EINVAL;
    int status = check_sizes(B, T, H, D, scale);
    if (status != MF_OK) return status;
    const int fast = use_avx512();
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
    if (fast)
        return run_tasks(bwd_avx512, &p, B * H, 2 * D * BT + 5 * BT * p.Dp + 2 * BT * BT + 2 * T);
    return run_tasks(bwd_blas, &p, B * H, 2 * BTB * BTB + 2 * BTB * D + 2 * T);
}
