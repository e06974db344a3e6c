/* The attention family's kernels (plain and conjunctive attention, mapformer.h), written once
 * over the SIMD layer. A kernel-set file defines, then includes this file:
 *   MF_VW          floats per vector (16, 8 or 4; mapformer/simd.h)
 *   MF_ATTN_BT     rows of a query block = rows of a key block (a multiple of MF_VW and of
 *                  MF_ATTN_MR)
 *   MF_ATTN_MR     rows of a register tile
 *   MF_ATTN_NV     vectors across a register tile (1 to 4): a tile is MR x NV vectors
 *                  of accumulators, and every product of both ops runs on it
 *   MF_ATTN_TABLE  the name of the MfAttnKernels it defines (kernels/attention_sets.h)
 * Everything else is static, so the copies of the sets do not clash.
 *
 * The tiling (FlashAttention-2), per head (b, h), blocks of BT queries and BT keys, under the
 * job's mask (attention_sets.h: query i sees keys j <= max(i, P_b - 1), P_b = 0 when causal):
 * a query block visits the key blocks up to its own or the last one P_b reaches; a pair of
 * blocks is open, the causal diagonal, or cut by P_b (mf_attn_block_mask):
 *  - forward: a task is a head and a pair of query blocks nb-1-p and p (every task costs about
 *    nb + 1 key blocks, so a static schedule balances). The block's queries are packed
 *    transposed once, Q^T (D, BT), and scores kept transposed, S^T[key][query], so the online
 *    softmax runs down columns on whole vectors of queries (no horizontal reductions); then
 *    O[query] += P^T[key][query] V[key]. Score tiles: MR keys x NV query vectors, a k-loop over
 *    D of broadcast key elements times Q^T vectors.
 *  - backward: a task is a head (it owns the head's dq rows, no atomics). Per key block it
 *    packs K^T and V^T; per query block i >= j it builds P and the score gradients in (query,
 *    key) layout (MR queries x NV key vectors), accumulates dK and dV of the key block in
 *    scratch (MR keys x NV vectors of D) and adds dS K into dq in place.
 *  - the products' broadcast operands are read in place, and so are their vector operands (V,
 *    K, q, dout rows) when D is whole vectors; otherwise those are packed, zero-padded.
 *  - on a causal diagonal block only the vectors and k-ranges under the mask are computed;
 *    register tiles that run past the block's last row use clamped rows and are stored in
 *    scratch but never read. A block cut by P_b (at most one key block per query block) is
 *    computed whole, its hidden scores -inf (forward) and probabilities 0 (backward).
 * With a per-pair factor table (plain attention; MfAttnJob.factor), each pair of blocks first
 * gathers its factor tile F into scratch (factor_tile) and the score tiles multiply
 * by it before the mask (forward c2 F s; backward the same scores and dS F): kernels compiled
 * apart (fac, a compile-time constant), so the plain ones are unchanged.
 * Scores are base 2 (c2 = scale log2 e folded in) and exponentials are simd.h's vexp2. Each
 * task prefetches the rows the next task will need into L2, a few rows per tile. */
#ifndef MF_ATTN_BT
#error "define MF_VW, MF_ATTN_BT, MF_ATTN_MR, MF_ATTN_NV and MF_ATTN_TABLE first"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/simd.h"
#include "attention_sets.h"

#define VW MF_VW
#define BT MF_ATTN_BT
#define MR MF_ATTN_MR
#define NV MF_ATTN_NV
#define NVB (BT / VW) /* vectors across a block */

#if BT % VW != 0 || BT % MR != 0 || NV < 1 || NV > 4 || MR < 1
#error "MF_ATTN_BT must be a multiple of MF_VW and of MF_ATTN_MR; MF_ATTN_NV in [1, 4]"
#endif

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* head dim padded to whole vectors */
static inline int64_t padded(int64_t D) { return (D + VW - 1) / VW * VW; }

/* Call CALL(n) with n a compile-time constant equal to the run-time nv in [1, NV]. */
#define NV_AT_MOST(n) ((n) < NV ? (n) : NV)
#define NV_SWITCH(nv, CALL)                 \
    switch (nv) {                           \
        case 1: CALL(1); break;             \
        case 2: CALL(NV_AT_MOST(2)); break; \
        case 3: CALL(NV_AT_MOST(3)); break; \
        default: CALL(NV_AT_MOST(4)); break; \
    }

/* ---- building blocks ----------------------------------------------------------------------- */

/* dst (D, BT) = src rows (nr, D) of stride ld transposed, 0 for the columns past nr */
MF_INLINE void pack_transposed(float *dst, const float *src, int64_t ld, int64_t nr,
                               int64_t D) {
    mf_transpose(dst, BT, src, ld, nr, D);
    if (nr < BT)
        for (int64_t d = 0; d < D; d++) memset(dst + d * BT + nr, 0, (size_t)(BT - nr) * 4);
}

/* dst (n, Dp) = rows (n, D) of stride ld from src, 0 past D; dst aligned */
MF_INLINE void pack_rows(float *dst, int64_t Dp, const float *src, int64_t ld, int64_t n,
                         int64_t D) {
    const int64_t Dv = D / VW * VW;
    for (int64_t r = 0; r < n; r++) {
        const float *s = src + r * ld;
        float *d = dst + r * Dp;
        for (int64_t c = 0; c < Dv; c += VW) VSTORE(d + c, VLOADU(s + c));
        if (Dv < Dp) {
            vf x;
            vload_part(&x, s + Dv, D - Dv);
            VSTORE(d + Dv, x);
        }
    }
}

/* Rows (n, D) of stride ld at src as the vector operand of the products: src itself (stride
 * ld) when D is whole vectors, else packed to pack (n, Dp), 0 past D (stride Dp). */
MF_INLINE const float *vector_rows(float *pack, const float *src, int64_t ld, int64_t n,
                                   int64_t D, int64_t *stride) {
    if (D % VW == 0) {
        *stride = ld;
        return src;
    }
    *stride = padded(D);
    pack_rows(pack, *stride, src, ld, n, D);
    return pack;
}

/* rows (n, D) of stride ld of dst = src (n, Dp) times f[r] (1 when f is NULL) */
MF_INLINE void unpack_rows(float *dst, int64_t ld, const float *src, int64_t Dp, int64_t n,
                           int64_t D, const float *f) {
    const int64_t Dv = D / VW * VW;
    for (int64_t r = 0; r < n; r++) {
        const float *s = src + r * Dp;
        const float fr = f != NULL ? f[r] : 1.0f;
        float *d = dst + r * ld;
        for (int64_t c = 0; c < Dv; c += VW) VSTOREU(d + c, VLOAD(s + c) * fr);
        if (Dv < Dp) {
            const vf x = VLOAD(s + Dv) * fr;
            vstore_part(d + Dv, &x, D - Dv);
        }
    }
}

/* The microkernel: acc[m][v] += sum_{k0 <= k < k1} a[m][k * aks] b[k * ldb + VW v] for m < MR
 * and v < nv (nv a compile-time constant at every call, so acc stays in registers): a's
 * elements broadcast, b's rows loaded as vectors (any float address; the callers' are aligned
 * where the arrays are). Inlined into its callers: with 12 accumulators in 16 registers
 * (AVX2 4 x 3, 6 x 2) the compiler keeps an epilogue constant live across the loop and spills
 * an accumulator on every iteration, and the loop as a function of its own costs more than
 * the spill (benchmarks/attention_tiles.py); the shapes chosen for 16 registers use 8. */
MF_INLINE void mk(vf acc[MR][NV], int nv, const float *const a[MR], int64_t aks,
                  const float *b, int64_t ldb, int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k++) {
        const float *bk = b + k * ldb;
        vf bv[NV];
        for (int v = 0; v < nv; v++) bv[v] = VLOADU(bk + VW * v);
        for (int m = 0; m < MR; m++) {
            const vf am = VSPLAT(a[m][k * aks]);
            for (int v = 0; v < nv; v++) acc[m][v] = VFMA(am, bv[v], acc[m][v]);
        }
    }
}

MF_INLINE void zero_acc(vf acc[MR][NV]) {
    for (int m = 0; m < MR; m++)
        for (int v = 0; v < NV; v++) acc[m][v] = VZERO;
}

/* query (or key) lanes VW w .. VW w + VW-1 that lie above index r: the causal mask of a
 * vector of keys against query r, or of a vector of queries against key r (below) */
#define ABOVE(w, r) (VLANES + (int32_t)(VW * (w)) > ISPLAT(r))
#define BELOW(w, r) (VLANES + (int32_t)(VW * (w)) < ISPLAT(r))

/* Software prefetch of the next task's rows (D floats every ld) into L2 (not L1, which holds
 * the current tiles), a few rows per call of pf_step from a task's tile loops, so that the
 * next task starts on cached data without bursts that fill the line-fill buffers. */
#define PF_RANGES 12
typedef struct {
    const float *base[PF_RANGES];
    int64_t rows[PF_RANGES];
    int n, cur;
    int64_t row, bytes, ld, per_step;
} Prefetch;

static inline void pf_init(Prefetch *pf, int64_t ld, int64_t D) {
    memset(pf, 0, sizeof *pf);
    pf->ld = ld;
    pf->bytes = D * (int64_t)sizeof(float);
}

static inline void pf_add(Prefetch *pf, const float *base, int64_t rows) {
    if (pf->n < PF_RANGES && rows > 0 && base != NULL) {
        pf->base[pf->n] = base;
        pf->rows[pf->n++] = rows;
    }
}

/* spread the rows added so far over `steps` calls of pf_step */
static inline void pf_plan(Prefetch *pf, int64_t steps) {
    int64_t rows = 0;
    for (int i = 0; i < pf->n; i++) rows += pf->rows[i];
    pf->per_step = steps > 0 ? (rows + steps - 1) / steps : rows;
}

MF_INLINE void pf_step(Prefetch *pf) {
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

/* The per-pair factors of a (query, key) tile: F[r * BT + c] = factor[ids[i0 + r'],
 * ids[j0 + c']] for r, c < BT (ids: the task's checked copy of pos_ids[b, :]) with r' = min(r, nr - 1), c' = min(c, nc - 1) (rows and
 * columns past the block repeat its last: finite values where the kernels compute past
 * it); each row gathered from the table's row (vgather), F aligned. */
MF_INLINE void factor_tile(const MfAttnJob *p, const int32_t *ids, float *F, int64_t i0,
                           int64_t nr, int64_t j0, int64_t nc) {
    const int32_t *pq = ids + i0, *pk = ids + j0;
    int32_t keys[BT];
    for (int64_t c = 0; c < BT; c++) keys[c] = pk[min64(c, nc - 1)];
    for (int64_t r = 0; r < BT; r++) {
        const float *row = p->factor + (int64_t)pq[min64(r, nr - 1)] * p->npos;
        for (int64_t c = 0; c < BT; c += VW) {
            vf x;
            vgather(&x, row, keys + c);
            VSTORE(F + r * BT + c, x);
        }
    }
}

/* Prefetch whole heads ahead only while they fit comfortably in a core's L2 next to the
 * current one; longer sequences stream through the hardware prefetchers. */
#define PF_MAX_BYTES (1024 * 1024)

/* ---- forward ------------------------------------------------------------------------------- */

/* What a forward score tile holds (compile-time at every call), with s_a = k_a . q_a and
 * s_b = k_b . q_b:
 *   SC_ONE  c2 s_a                   (plain attention; softmax_product's first pass)
 *   SC_PROD c2 s_a s_b               (score_product)
 *   SC_SUM  c2 (s_a + s_b)           (sum)
 *   SC_EXP  2^((c2 s_a - ma[r]) + (c2 s_b - mb[r]))
 *                                    (softmax_product's second pass: A times lX lP)
 * In SC_EXP each branch's score is shifted by its own row max before the two are added: the
 * exponent carries the rounding of numbers of the size of the scores, not of the log-sum-exps. */
enum { SC_ONE, SC_PROD, SC_SUM, SC_EXP };

/* S^T[c][r] for keys c0 <= c < c0 + MR (rows past nc repeat key nc - 1 and are not stored)
 * (SC_ONE with F, a compile-time NULL or not: c2 F[c][r] s_a, the per-pair factor tile)
 * and the query vectors g0 .. g0+nv of the block; when diag (an MF_BLOCK_ mask), the keys
 * c >= kfree hidden from the queries r < c + koff: -inf, or 0 for SC_EXP (the causal
 * diagonal: koff = kfree = 0). Except for SC_EXP, mrun[r] = max(mrun[r], S^T[c][r]) over
 * these keys; SC_EXP reads ma = mrun and mb = mrun + BT. */
MF_INLINE void fwd_scores(int kind, int nv, int64_t g0, float *ST, float *mrun,
                          const float *const ka[MR], const float *QaT,
                          const float *const kb[MR], const float *QbT, int64_t D, int64_t c0,
                          int64_t nc, int diag, int64_t koff, int64_t kfree, float c2,
                          const float *F) {
    vf acc[MR][NV];
    zero_acc(acc);
    mk(acc, nv, ka, 1, QaT + VW * g0, BT, 0, D);
    if (kind != SC_ONE) {
        /* s_a parked in the tile's own rows of ST (c0 + m < BT: scratch even past nc), so the
         * second product has all the registers (and, in SC_SUM, a sum of its own: one chain
         * through both would round s_b's terms at the size of s_a) */
        for (int m = 0; m < MR; m++)
            for (int v = 0; v < nv; v++) VSTORE(ST + (c0 + m) * BT + VW * (g0 + v), acc[m][v]);
        zero_acc(acc);
    }
    if (kind != SC_ONE) mk(acc, nv, kb, 1, QbT + VW * g0, BT, 0, D);
    for (int v = 0; v < nv; v++) {
        const int64_t col = VW * (g0 + v);
        vf mx = VLOAD(mrun + col), mb = VZERO;
        if (kind == SC_EXP) mb = VLOAD(mrun + BT + col);
        for (int m = 0; m < MR; m++) {
            float *st = ST + (c0 + m) * BT + col;
            vf x;
            if (kind == SC_PROD)
                x = acc[m][v] * VLOAD(st) * c2;
            else if (kind == SC_SUM)
                x = (VLOAD(st) + acc[m][v]) * c2;
            else if (kind == SC_EXP)
                x = (VLOAD(st) * c2 - mx) + (acc[m][v] * c2 - mb);
            else if (F != NULL)
                x = acc[m][v] * VLOAD(F + (c0 + m) * BT + col) * c2;
            else
                x = acc[m][v] * c2;
            /* query r < key c + koff, for keys c >= kfree */
            const vi masked = BELOW(g0 + v, c0 + m < kfree ? 0 : c0 + m + koff);
            if (kind == SC_EXP) {
                vexp2(&x);
                if (diag) x = VAND(~masked, x);
            } else {
                if (diag) x = VSELECT(masked, VSPLAT(-INFINITY), x);
                mx = VMAX(x, mx);
            }
            if (c0 + m < nc) VSTORE(st, x);
        }
        if (kind != SC_EXP) VSTORE(mrun + col, mx);
    }
}

/* Scores of key block [0, nc) (rows of stride ld from ka, kb) against the packed query block's
 * first nqv vectors (those holding its rows: a sequence's last block may be short, and its
 * vectors past them would cost as much as a full block's, a quarter of the forward's work at
 * 400 tokens in blocks of 64): MR keys at a time, on the causal diagonal the query vectors
 * wholly above it skipped, the rest in tiles of NV vectors (diag, koff, kfree: fwd_scores);
 * pf_step once per MR keys.
 * SC_ONE reads only ka and QaT (the callers pass them twice); F: fwd_scores. */
MF_INLINE void fwd_score_block(int kind, float *ST, float *mrun, const float *ka,
                               const float *QaT, const float *kb, const float *QbT, int64_t ld,
                               int64_t D, int64_t nc, int64_t nqv, int diag, int64_t koff,
                               int64_t kfree, float c2, const float *F, Prefetch *pf) {
    for (int64_t c0 = 0; c0 < nc; c0 += MR) {
        pf_step(pf);
        const float *kac[MR], *kbc[MR];
        for (int m = 0; m < MR; m++) {
            kac[m] = ka + min64(c0 + m, nc - 1) * ld;
            kbc[m] = kb + min64(c0 + m, nc - 1) * ld;
        }
        for (int64_t g0 = diag == MF_BLOCK_CAUSAL ? c0 / VW : 0; g0 < nqv; g0 += NV) {
#define MF_SCORES(n) \
    fwd_scores(kind, n, g0, ST, mrun, kac, QaT, kbc, QbT, D, c0, nc, diag, koff, kfree, c2, F)
            NV_SWITCH(min64(NV, nqv - g0), MF_SCORES)
#undef MF_SCORES
        }
    }
}

/* The online softmax step of one key block down the first nqv vectors of columns (queries) of
 * S^T, VW queries at a time: with mrun the running max including this block,
 * S^T[c][r] = 2^(S^T[c][r] - mrun[r]) for keys c < nc (on a causal diagonal block, those up to the vector's last query's tile),
 * alpha[r] = 2^(mx[r] - mrun[r]), l[r] = l[r] alpha[r] + sum_c S^T[c][r], mx[r] = mrun[r].
 * -inf scores give 0. */
MF_INLINE void fwd_softmax_cols(float *ST, float *mx, float *l, float *alpha,
                                const float *mrun, int64_t nc, int64_t nqv, int diag) {
    for (int64_t w = 0; w < nqv; w++) {
        /* on the causal diagonal, the keys up to the end of the last register tile of queries
         * that reaches into this vector: those fwd_pv reads (the ones past a query are 0) */
        const int64_t cend =
            diag == MF_BLOCK_CAUSAL ? min64(nc, ((VW * w + VW - 1) / MR + 1) * MR) : nc;
        const vf mnew = VLOAD(mrun + VW * w);
        vf a = VLOAD(mx + VW * w) - mnew, sum = VZERO;
        vexp2(&a);
        for (int64_t c = 0; c < cend; c++) {
            vf e = VLOAD(ST + c * BT + VW * w) - mnew;
            vexp2(&e);
            VSTORE(ST + c * BT + VW * w, e);
            sum += e;
        }
        VSTORE(l + VW * w, VLOAD(l + VW * w) * a + sum);
        VSTORE(mx + VW * w, mnew);
        VSTORE(alpha + VW * w, a);
    }
}

/* O[r][d0 + VW v] = alpha[r] O[r][d0 + VW v] + sum_{c < kn} P^T[c][r] V[c][d0 + VW v] for the
 * queries r0 .. r0+MR and v < nv; V rows of stride ldv */
MF_INLINE void fwd_pv(int nv, float *O, const float *ST, const float *V, int64_t ldv,
                      const float *alpha, int64_t Dp, int64_t d0, int64_t r0, int64_t kn) {
    const float *pr[MR];
    vf acc[MR][NV];
    for (int m = 0; m < MR; m++) {
        pr[m] = ST + r0 + m;
        for (int v = 0; v < nv; v++)
            acc[m][v] = VLOAD(O + (r0 + m) * Dp + d0 + VW * v) * alpha[r0 + m];
    }
    mk(acc, nv, pr, BT, V + d0, ldv, 0, kn);
    for (int m = 0; m < MR; m++)
        for (int v = 0; v < nv; v++) VSTORE(O + (r0 + m) * Dp + d0 + VW * v, acc[m][v]);
}

/* O = alpha O + P V for the query rows < nr (keys c <= r on a causal diagonal block); V's
 * rows (nc, stride ld) read in place, or packed to Vs when D is not whole vectors. pf_step
 * once per MR queries. */
MF_INLINE void fwd_pv_block(float *O, const float *ST, float *Vs, const float *alpha,
                            const float *v, int64_t ld, int64_t D, int64_t Dp, int64_t nr,
                            int64_t nc, int diag, Prefetch *pf) {
    int64_t ldv;
    const float *V = vector_rows(Vs, v, ld, nc, D, &ldv);
    for (int64_t r0 = 0; r0 < nr; r0 += MR) {
        pf_step(pf);
        const int64_t kn = diag == MF_BLOCK_CAUSAL ? min64(nc, r0 + MR) : nc;
        for (int64_t d0 = 0; d0 < Dp; d0 += VW * NV) {
#define MF_PV(n) fwd_pv(n, O, ST, V, ldv, alpha, Dp, d0, r0, kn)
            NV_SWITCH(min64(NV, (Dp - d0) / VW), MF_PV)
#undef MF_PV
        }
    }
}

/* lse from the base-2 running max m and sum l: (m + log2 l) scale / c2, in double */
static inline float lse_of(const MfAttnJob *p, float m, float l) {
    return (float)(((double)m + log2((double)l)) * p->to_lse);
}

/* Scratch layouts (fwd_layout, bwd_layout): n floats taken so far from base; a buffer a kind
 * does not use takes none and is NULL, as is every buffer when base is NULL (sizing only). */
#define MF_TAKE(ptr, count, used)                          \
    do {                                                   \
        (ptr) = (used) && base != NULL ? base + n : NULL; \
        n += (used) ? (count) : 0;                         \
    } while (0)

/* the forward's scratch, by kind */
typedef struct {
    float *QxT, *QpT, *ST, *O, *Vs, *mx, *l, *alpha, *mrun, *mxP, *lP, *F, *G;
    int32_t *ids;
} FwdScratch;

static int64_t fwd_layout(const MfAttnJob *p, float *base, FwdScratch *s) {
    const int64_t D = p->D, Dp = padded(D), T = p->T;
    const int two = p->kind != MF_ATTN_PLAIN;
    int64_t n = 0;
    MF_TAKE(s->QxT, D * BT, 1);   /* (D, BT): content queries of the block transposed, 0 past nr */
    MF_TAKE(s->QpT, D * BT, two); /* (D, BT): positional queries likewise */
    MF_TAKE(s->ST, BT * BT, 1);   /* (BT, BT): scores, then probabilities, [key][query] */
    MF_TAKE(s->O, BT * Dp, 1);    /* (BT, Dp): unnormalised output */
    MF_TAKE(s->Vs, BT * Dp, D % VW); /* (BT, Dp): the key block's values, 0 past D */
    MF_TAKE(s->mx, BT, 1);        /* (BT,) each: running max of the base-2 scores (X branch), */
    MF_TAKE(s->l, BT, 1);         /* running sum, */
    MF_TAKE(s->alpha, BT, 1);     /* this key block's rescale factor, */
    MF_TAKE(s->mrun, BT, 1);      /* max including this key block, */
    MF_TAKE(s->mxP, BT, 1);       /* the P branch's max (softmax_product: mrun + BT), */
    MF_TAKE(s->lP, BT, 1);        /* and its sum */
    MF_TAKE(s->F, BT * BT, p->factor != NULL); /* (BT, BT): per-pair factors [key][query], */
    MF_TAKE(s->G, BT * BT, p->factor != NULL); /* gathered [query][key] first */
    float *ids;
    MF_TAKE(ids, T, p->factor != NULL); /* (T,) int32: the task's checked copy of pos_ids */
    s->ids = (int32_t *)ids;
    return n;
}

static int64_t fwd_floats(const MfAttnJob *p) {
    FwdScratch s;
    return fwd_layout(p, NULL, &s);
}

static int64_t fwd_blocks(const MfAttnJob *p) { return (p->T + BT - 1) / BT; }
static int64_t fwd_npair(const MfAttnJob *p) { return (fwd_blocks(p) + 1) / 2; }
static int64_t fwd_tasks(const MfAttnJob *p) { return p->B * p->H * fwd_npair(p); }

/* One query block (rows i0 .. i0+nr of head (b, h)) against the key blocks it sees (0 .. ib,
 * or further when the mask's P_b reaches further), in `kind` and with the per-pair factor
 * when fac (plain attention only; both compile-time constants at every call). */
MF_INLINE void fwd_block(int kind, int fac, const MfAttnJob *p, const FwdScratch *s, Prefetch *pf,
                         int64_t b, int64_t h, int64_t ib, int64_t P) {
    const int64_t T = p->T, D = p->D, Dp = padded(D), ld = p->ld;
    const int64_t i0 = ib * BT, nr = min64(BT, T - i0), nqv = (nr + VW - 1) / VW;
    const int64_t off = b * T * ld + h * D; /* element (b, 0, h, 0) */
    const int two = kind != MF_ATTN_PLAIN;
    const float *qx = p->qx + off, *kx = p->kx + off, *v = p->v + off;
    const float *qp = two ? p->qp + off : NULL, *kp = two ? p->kp + off : NULL;
    const float c2 = p->c2;
    float *ST = s->ST, *O = s->O, *mx = s->mx, *l = s->l, *alpha = s->alpha, *mrun = s->mrun;
    float *mxP = s->mxP, *lP = s->lP;

    pack_transposed(s->QxT, qx + i0 * ld, ld, nr, D);
    if (two) pack_transposed(s->QpT, qp + i0 * ld, ld, nr, D);
    memset(O, 0, (size_t)(BT * Dp) * sizeof(float));
    for (int64_t r = 0; r < BT; r++) {
        mx[r] = mxP[r] = -INFINITY;
        l[r] = lP[r] = 0.0f;
    }
    float *lse = p->lse + (b * p->H + h) * T + i0;
    const int64_t jlast = mf_attn_last_key_block(ib, BT, T, P);

    if (kind == MF_CONJ_SOFTMAX_PRODUCT) {
        /* pass 1: the log-sum-exp of each branch (the exponentials in ST are discarded) */
        for (int64_t jb = 0; jb <= jlast; jb++) {
            const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
            const int diag = mf_attn_block_mask(i0, j0, nc, P);
            memcpy(mrun, mx, BT * sizeof(float));
            fwd_score_block(SC_ONE, ST, mrun, kx + j0 * ld, s->QxT, kx + j0 * ld, s->QxT,
                            ld, D, nc, nqv, diag, j0 - i0, P - j0, c2, NULL, pf);
            fwd_softmax_cols(ST, mx, l, alpha, mrun, nc, nqv, diag);
            memcpy(mrun, mxP, BT * sizeof(float));
            fwd_score_block(SC_ONE, ST, mrun, kp + j0 * ld, s->QpT, kp + j0 * ld, s->QpT,
                            ld, D, nc, nqv, diag, j0 - i0, P - j0, c2, NULL, pf);
            fwd_softmax_cols(ST, mxP, lP, alpha, mrun, nc, nqv, diag);
        }
        /* pass 2: O += A' V with A' = 2^((c2 sX - mx) + (c2 sP - mxP)) = A lX lP, no
         * rescaling (alpha = 1); fwd_scores reads mx, mxP as mrun, mrun + BT */
        const int64_t plane = p->B * p->H * T;
        for (int64_t r = 0; r < BT; r++) {
            if (r < nr) {
                lse[r] = lse_of(p, mx[r], l[r]);
                lse[plane + r] = lse_of(p, mxP[r], lP[r]);
            }
            alpha[r] = 1.0f;
        }
        memcpy(mrun, mx, BT * sizeof(float));
        for (int64_t jb = 0; jb <= jlast; jb++) {
            const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
            const int diag = mf_attn_block_mask(i0, j0, nc, P);
            fwd_score_block(SC_EXP, ST, mrun, kx + j0 * ld, s->QxT, kp + j0 * ld, s->QpT, ld, D,
                            nc, nqv, diag, j0 - i0, P - j0, c2, NULL, pf);
            fwd_pv_block(O, ST, s->Vs, alpha, v + j0 * ld, ld, D, Dp, nr, nc, diag, pf);
        }
        for (int64_t r = 0; r < nr; r++) l[r] = 1.0f / (l[r] * lP[r]);
        unpack_rows(p->out + off + i0 * ld, ld, O, Dp, nr, D, l);
        return;
    }

    const int sc = kind == MF_ATTN_PLAIN           ? SC_ONE
                   : kind == MF_CONJ_SCORE_PRODUCT ? SC_PROD
                                                   : SC_SUM;
    for (int64_t jb = 0; jb <= jlast; jb++) {
        const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
        const int diag = mf_attn_block_mask(i0, j0, nc, P);
        memcpy(mrun, mx, BT * sizeof(float));
        if (fac) { /* gathered along the table's rows, then turned to [key][query] */
            factor_tile(p, s->ids, s->G, i0, nr, j0, nc);
            mf_transpose(s->F, BT, s->G, BT, BT, BT);
        }
        fwd_score_block(sc, ST, mrun, kx + j0 * ld, s->QxT, (two ? kp : kx) + j0 * ld,
                        two ? s->QpT : s->QxT, ld, D, nc, nqv, diag, j0 - i0, P - j0, c2,
                        fac ? s->F : NULL, pf);
        fwd_softmax_cols(ST, mx, l, alpha, mrun, nc, nqv, diag);
        fwd_pv_block(O, ST, s->Vs, alpha, v + j0 * ld, ld, D, Dp, nr, nc, diag, pf);
    }
    for (int64_t r = 0; r < nr; r++) {
        lse[r] = lse_of(p, mx[r], l[r]);
        alpha[r] = 1.0f / l[r];
    }
    unpack_rows(p->out + off + i0 * ld, ld, O, Dp, nr, D, alpha);
}

/* Rows of forward task t that the previous task did not touch: its query blocks, and the
 * head's keys and values when the task is the head's first. */
static void fwd_prefetch_plan(const MfAttnJob *p, Prefetch *pf, int64_t t) {
    pf_init(pf, p->ld, p->D);
    if (t >= fwd_tasks(p)) return;
    const int64_t npair = fwd_npair(p), T = p->T, ld = p->ld;
    const int64_t bh = t / npair, pr = t % npair, b = bh / p->H, h = bh % p->H;
    const int64_t off = b * T * ld + h * p->D, ib1 = fwd_blocks(p) - 1 - pr;
    const int two = p->kind != MF_ATTN_PLAIN;
    const int64_t n1 = min64(BT, T - ib1 * BT);
    pf_add(pf, p->qx + off + ib1 * BT * ld, n1);
    if (two) pf_add(pf, p->qp + off + ib1 * BT * ld, n1);
    if (pr != ib1) {
        pf_add(pf, p->qx + off + pr * BT * ld, BT);
        if (two) pf_add(pf, p->qp + off + pr * BT * ld, BT);
    }
    if (pr == 0 && (2 + two) * T * p->D * (int64_t)sizeof(float) <= PF_MAX_BYTES) {
        pf_add(pf, p->kx + off, T);
        if (two) pf_add(pf, p->kp + off, T);
        pf_add(pf, p->v + off, T);
    }
}

MF_INLINE int fwd_task(int kind, int fac, const MfAttnJob *p, float *scr, int64_t t) {
    const int64_t npair = fwd_npair(p), bh = t / npair, pr = t % npair;
    const int64_t ib1 = fwd_blocks(p) - 1 - pr;
    FwdScratch s;
    fwd_layout(p, scr, &s);
    if (fac && mf_attn_copy_ids(p, bh / p->H, s.ids) != MF_OK) return MF_EINDEX;
    Prefetch pf;
    fwd_prefetch_plan(p, &pf, t + 1);
    /* pf_step runs once per MR keys of each score pass and once per MR queries of the PV
     * pass of every key block: 2 passes, or 4 for softmax_product */
    const int64_t passes = kind == MF_CONJ_SOFTMAX_PRODUCT ? 4 : 2;
    const int64_t P = mf_attn_prefix(p, bh / p->H);
    if (P < 0) return MF_EINDEX;
    const int64_t blocks = mf_attn_last_key_block(ib1, BT, p->T, P) + 1 +
                           (pr != ib1 ? mf_attn_last_key_block(pr, BT, p->T, P) + 1 : 0);
    pf_plan(&pf, blocks * (passes * BT / MR));
    fwd_block(kind, fac, p, &s, &pf, bh / p->H, bh % p->H, ib1, P);
    if (pr != ib1) fwd_block(kind, fac, p, &s, &pf, bh / p->H, bh % p->H, pr, P);
    return MF_OK;
}

/* plain attention with the per-pair factor, a function of its own (noinline), so that the
 * plain kernels' code is laid out as without it */
static __attribute__((noinline)) int fwd_factor_task(const MfAttnJob *p, float *scr,
                                                     int64_t t) {
    return fwd_task(MF_ATTN_PLAIN, 1, p, scr, t);
}

static int fwd_entry(const MfAttnJob *p, float *scr, int64_t t) {
    switch (p->kind) {
        case MF_ATTN_PLAIN:
            return p->factor != NULL ? fwd_factor_task(p, scr, t)
                                     : fwd_task(MF_ATTN_PLAIN, 0, p, scr, t);
        case MF_CONJ_SCORE_PRODUCT: return fwd_task(MF_CONJ_SCORE_PRODUCT, 0, p, scr, t);
        case MF_CONJ_SOFTMAX_PRODUCT: return fwd_task(MF_CONJ_SOFTMAX_PRODUCT, 0, p, scr, t);
        default: return fwd_task(MF_CONJ_SUM, 0, p, scr, t);
    }
}

/* ---- backward ------------------------------------------------------------------------------ */

/* For query rows r0 .. r0+MR of block i against the key vectors g0 .. g0+nv of block j, in
 * `kind`: P[r][c] = A_rc (when diag, an MF_BLOCK_ mask, 0 for the keys c > lim[m], the last
 * key row r0 + m sees), GX[r][c] = dsX_rc, GP[r][c] = dsP_rc (GP is
 * GX in sum mode; unused in plain attention, whose dS is GX). la, lb: the rows' base-2 lse as
 * float pairs, la[m] + la[MR + m] (lb: softmax_product's P branch; see split_lse); dvr: Dv of
 * the rows; F (plain attention, a compile-time NULL or not): the per-pair factor tile
 * [query][key], the scores F s and dS F. Rows past nr are computed on clamped pointers and
 * stored (scratch rows < BT) but never read. */
MF_INLINE void bwd_scores(int kind, int nv, int64_t g0, float *P, float *GX, float *GP,
                          const float *const qxr[MR], const float *const qpr[MR],
                          const float *const dor[MR], const float *KxT, const float *KpT,
                          const float *VT, const float *la, const float *lb, const float *dvr,
                          const int64_t lim[MR], int64_t D, int64_t r0, int diag, float c2,
                          float scale, const float *F) {
    const int64_t c = VW * g0; /* the tile's first key */
    vf acc[MR][NV];
    zero_acc(acc);
    mk(acc, nv, qxr, 1, KxT + c, BT, 0, D);
    if (kind != MF_ATTN_PLAIN) {
        /* GX = sX (score_product, sum) or AX (softmax_product); then acc = sP */
        for (int m = 0; m < MR; m++) {
            for (int v = 0; v < nv; v++) {
                vf x = acc[m][v];
                if (kind == MF_CONJ_SOFTMAX_PRODUCT) {
                    x = (x * c2 - la[m]) - la[MR + m];
                    vexp2(&x);
                    if (diag) x = VAND(~ABOVE(g0 + v, lim[m]), x); /* key c > lim */
                }
                VSTORE(GX + (r0 + m) * BT + c + VW * v, x);
            }
        }
        zero_acc(acc);
        mk(acc, nv, qpr, 1, KpT + c, BT, 0, D);
    }
    /* P = A; GP = sP (score_product) or AP (softmax_product) */
    for (int m = 0; m < MR; m++) {
        for (int v = 0; v < nv; v++) {
            const int64_t e = (r0 + m) * BT + c + VW * v;
            const vi masked = ABOVE(g0 + v, lim[m]); /* key c > lim */
            vf a = acc[m][v];
            if (kind == MF_CONJ_SOFTMAX_PRODUCT) {
                a = (a * c2 - lb[m]) - lb[MR + m];
                vexp2(&a);
                if (diag) a = VAND(~masked, a);
                VSTORE(GP + e, a);
                a *= VLOAD(GX + e);
            } else {
                if (kind == MF_CONJ_SCORE_PRODUCT) {
                    VSTORE(GP + e, a);
                    a = (VLOAD(GX + e) * a * c2 - la[m]) - la[MR + m];
                } else if (kind == MF_CONJ_SUM) {
                    a = ((VLOAD(GX + e) + a) * c2 - la[m]) - la[MR + m];
                } else if (F != NULL) {
                    a = (a * VLOAD(F + e) * c2 - la[m]) - la[MR + m];
                } else {
                    a = (a * c2 - la[m]) - la[MR + m];
                }
                vexp2(&a);
                if (diag) a = VAND(~masked, a);
            }
            VSTORE(P + e, a);
        }
    }
    /* acc = dA = dout V^T; the score gradients */
    zero_acc(acc);
    mk(acc, nv, dor, 1, VT + c, BT, 0, D);
    for (int m = 0; m < MR; m++) {
        for (int v = 0; v < nv; v++) {
            const int64_t e = (r0 + m) * BT + c + VW * v;
            const vf a = VLOAD(P + e);
            if (kind == MF_ATTN_PLAIN && F != NULL) {
                VSTORE(GX + e, a * (acc[m][v] - dvr[m]) * scale * VLOAD(F + e));
            } else if (kind == MF_ATTN_PLAIN || kind == MF_CONJ_SUM) {
                VSTORE(GX + e, a * (acc[m][v] - dvr[m]) * scale);
            } else if (kind == MF_CONJ_SCORE_PRODUCT) {
                const vf ds = a * (acc[m][v] - dvr[m]) * scale, sx = VLOAD(GX + e);
                VSTORE(GX + e, ds * VLOAD(GP + e));
                VSTORE(GP + e, ds * sx);
            } else {
                const vf ad = a * acc[m][v];
                VSTORE(GX + e, (ad - VLOAD(GX + e) * dvr[m]) * scale);
                VSTORE(GP + e, (ad - VLOAD(GP + e) * dvr[m]) * scale);
            }
        }
    }
}

/* G[c][d0 + VW v] += sum_{k0 <= r < nr} Y[r][c] X[r][d0 + VW v] for keys c0 .. c0+MR and
 * v < nv: dV += P^T dout (Y = P, X = dout) or dK += dS^T q (Y = dS, X = q); G (BT, Dp),
 * X rows of stride ldx, Y (BT, BT) */
MF_INLINE void bwd_dkv(int nv, float *G, const float *Y, const float *X, int64_t ldx,
                       int64_t Dp, int64_t d0, int64_t c0, int64_t k0, int64_t nr) {
    const float *yc[MR];
    vf acc[MR][NV];
    for (int m = 0; m < MR; m++) {
        yc[m] = Y + c0 + m;
        for (int v = 0; v < nv; v++) acc[m][v] = VLOAD(G + (c0 + m) * Dp + d0 + VW * v);
    }
    mk(acc, nv, yc, BT, X + d0, ldx, k0, nr);
    for (int m = 0; m < MR; m++)
        for (int v = 0; v < nv; v++) VSTORE(G + (c0 + m) * Dp + d0 + VW * v, acc[m][v]);
}

/* G[c] += sum_r Y[r][c] X[r] over the block's queries r (r >= c on a diagonal block) for the
 * keys c0 .. c0+MR, every vector of Dp */
MF_INLINE void bwd_dkv_rows(float *G, const float *Y, const float *X, int64_t ldx, int64_t Dp,
                            int64_t c0, int64_t k0, int64_t nr) {
    for (int64_t d0 = 0; d0 < Dp; d0 += VW * NV) {
#define MF_DKV(n) bwd_dkv(n, G, Y, X, ldx, Dp, d0, c0, k0, nr)
        NV_SWITCH(min64(NV, (Dp - d0) / VW), MF_DKV)
#undef MF_DKV
    }
}

/* dq[r][d0 + VW v] += sum_{c < kn} dS[r][c] K[c][d0 + VW v] for v < nv, rows r0 .. r0+MR
 * (< nr) of the block whose first dq row is dqr; the vector past D is added lane by lane */
MF_INLINE void bwd_dq(int nv, float *dqr, int64_t ld, const float *const dsr[MR],
                      const float *K, int64_t ldk, int64_t D, int64_t d0, int64_t kn,
                      int64_t r0, int64_t nr) {
    vf acc[MR][NV];
    zero_acc(acc);
    mk(acc, nv, dsr, 1, K + d0, ldk, 0, kn);
    for (int m = 0; m < MR && r0 + m < nr; m++) {
        float *row = dqr + (r0 + m) * ld + d0;
        for (int v = 0; v < nv; v++) {
            if (d0 + VW * v + VW <= D) {
                VSTOREU(row + VW * v, VLOADU(row + VW * v) + acc[m][v]);
            } else {
                vf x;
                vload_part(&x, row + VW * v, D - d0 - VW * v);
                x += acc[m][v];
                vstore_part(row + VW * v, &x, D - d0 - VW * v);
            }
        }
    }
}

/* dq rows r0 .. r0+MR (< nr) of the block += G[r][c < kn] K[c] (K rows of stride ldk), every
 * vector of Dp */
MF_INLINE void bwd_dq_rows(float *dqi, int64_t ld, const float *G, const float *K, int64_t ldk,
                           int64_t Dp, int64_t D, int64_t kn, int64_t r0, int64_t nr) {
    const float *gr[MR];
    for (int m = 0; m < MR; m++) gr[m] = G + min64(r0 + m, nr - 1) * BT;
    for (int64_t d0 = 0; d0 < Dp; d0 += VW * NV) {
#define MF_DQ(n) bwd_dq(n, dqi, ld, gr, K, ldk, D, d0, kn, r0, nr)
        NV_SWITCH(min64(NV, (Dp - d0) / VW), MF_DQ)
#undef MF_DQ
    }
}

/* the backward's scratch, by kind (NULL: not used by that kind) */
typedef struct {
    float *KxT, *KpT, *VT, *Kxs, *Kps, *dKx, *dKp, *dV, *Qxs, *Qps, *dOs, *P, *GX, *GP;
    float *Dv, *la, *lb, *F;
    int32_t *ids;
} BwdScratch;

static int64_t bwd_layout(const MfAttnJob *p, float *base, BwdScratch *s) {
    const int64_t D = p->D, Dp = padded(D), T = p->T;
    const int two = p->kind != MF_ATTN_PLAIN;
    const int gp = two && p->kind != MF_CONJ_SUM; /* a separate dsP */
    int64_t n = 0;
    MF_TAKE(s->KxT, D * BT, 1);  /* (D, BT): content keys of the block transposed, 0 past nc */
    MF_TAKE(s->KpT, D * BT, two); /* (D, BT): positional keys likewise */
    MF_TAKE(s->VT, D * BT, 1);   /* (D, BT): values likewise */
    const int pack = D % VW != 0; /* rows packed for vector loads (else read in place) */
    MF_TAKE(s->Kxs, BT * Dp, pack); /* (BT, Dp): content keys, 0 past D */
    MF_TAKE(s->Kps, BT * Dp, pack && two); /* (BT, Dp): positional keys */
    MF_TAKE(s->dKx, BT * Dp, 1); /* (BT, Dp) each: dkx, dkp, dv of the key block */
    MF_TAKE(s->dKp, BT * Dp, two);
    MF_TAKE(s->dV, BT * Dp, 1);
    MF_TAKE(s->Qxs, BT * Dp, pack); /* (BT, Dp) each: qx, qp, dout of the query block */
    MF_TAKE(s->Qps, BT * Dp, pack && two);
    MF_TAKE(s->dOs, BT * Dp, pack);
    MF_TAKE(s->P, BT * BT, 1);   /* (BT, BT) each, [query][key]: A, dsX, dsP */
    MF_TAKE(s->GX, BT * BT, 1);
    MF_TAKE(s->GP, BT * BT, gp);
    MF_TAKE(s->F, BT * BT, p->factor != NULL); /* (BT, BT): per-pair factors [query][key] */
    MF_TAKE(s->Dv, T, 1);        /* (T,): dout_t . out_t */
    MF_TAKE(s->la, 2 * T, 1);    /* (2, T): base-2 lse, split_lse (lse_X for softmax_product) */
    MF_TAKE(s->lb, 2 * T, p->kind == MF_CONJ_SOFTMAX_PRODUCT); /* (2, T): base-2 lse_P */
    float *ids;
    MF_TAKE(ids, T, p->factor != NULL); /* (T,) int32: the task's checked copy of pos_ids */
    s->ids = (int32_t *)ids;
#undef MF_TAKE
    if (two && !gp) s->GP = s->GX; /* sum: dsP = dsX */
    return n;
}

static int64_t bwd_floats(const MfAttnJob *p) {
    BwdScratch s;
    return bwd_layout(p, NULL, &s);
}

/* Everything of head (b, h) in `kind`, with the per-pair factor when fac (both compile-time);
 * pf: the next head's rows to prefetch */
MF_INLINE void bwd_task(int kind, int fac, const MfAttnJob *p, const BwdScratch *s, Prefetch *pf,
                        int64_t b, int64_t h, int64_t P) {
    const int64_t T = p->T, D = p->D, Dp = padded(D), ld = p->ld, nb = (T + BT - 1) / BT;
    const int64_t off = b * T * ld + h * D, bh = b * p->H + h;
    const int two = kind != MF_ATTN_PLAIN;
    const float *qx = p->qx + off, *kx = p->kx + off, *v = p->v + off;
    const float *qp = two ? p->qp + off : NULL, *kp = two ? p->kp + off : NULL;
    const float *dout = p->dout + off, *o = p->o + off;
    const float *lse = p->lse_in + bh * T;
    float *dqx = p->dqx + off, *dqp = two ? p->dqp + off : NULL;
    const float c2 = p->c2, scale = p->scale;
    const double to2 = 1.0 / p->to_lse; /* lse to base 2: c2 / scale */
    float *Dv = s->Dv, *la = s->la, *lb = s->lb;

    const int64_t Dv8 = D / VW * VW;
    for (int64_t t = 0; t < T; t++) {
        const float *a = dout + t * ld, *c = o + t * ld;
        vf acc = VZERO;
        for (int64_t d = 0; d < Dv8; d += VW) acc = VFMA(VLOADU(a + d), VLOADU(c + d), acc);
        float sum = vhsum(&acc);
        for (int64_t d = Dv8; d < D; d++) sum += a[d] * c[d];
        Dv[t] = sum;
        split_lse(lse[t], to2, la + t, la + T + t);
        if (kind == MF_CONJ_SOFTMAX_PRODUCT)
            split_lse(lse[p->B * p->H * T + t], to2, lb + t, lb + T + t);
        memset(dqx + t * ld, 0, (size_t)D * sizeof(float));
        if (two) memset(dqp + t * ld, 0, (size_t)D * sizeof(float));
    }

    for (int64_t jb = 0; jb < nb; jb++) {
        const int64_t j0 = jb * BT, nc = min64(BT, T - j0);
        pack_transposed(s->KxT, kx + j0 * ld, ld, nc, D);
        if (two) pack_transposed(s->KpT, kp + j0 * ld, ld, nc, D);
        pack_transposed(s->VT, v + j0 * ld, ld, nc, D);
        int64_t ldkx, ldkp = 0, ldqx, ldqp = 0, lddo;
        const float *Kx = vector_rows(s->Kxs, kx + j0 * ld, ld, nc, D, &ldkx);
        const float *Kp = two ? vector_rows(s->Kps, kp + j0 * ld, ld, nc, D, &ldkp) : NULL;
        memset(s->dKx, 0, (size_t)(BT * Dp) * sizeof(float));
        if (two) memset(s->dKp, 0, (size_t)(BT * Dp) * sizeof(float));
        memset(s->dV, 0, (size_t)(BT * Dp) * sizeof(float));

        for (int64_t ib = mf_attn_first_query_block(jb, BT, P); ib < nb; ib++) {
            const int64_t i0 = ib * BT, nr = min64(BT, T - i0);
            const int diag = mf_attn_block_mask(i0, j0, nc, P);
            const float *Qx = vector_rows(s->Qxs, qx + i0 * ld, ld, nr, D, &ldqx);
            const float *Qp = two ? vector_rows(s->Qps, qp + i0 * ld, ld, nr, D, &ldqp) : NULL;
            const float *dO = vector_rows(s->dOs, dout + i0 * ld, ld, nr, D, &lddo);
            if (fac) factor_tile(p, s->ids, s->F, i0, nr, j0, nc);

            for (int64_t r0 = 0; r0 < nr; r0 += MR) {
                pf_step(pf);
                const float *qxr[MR], *qpr[MR], *dor[MR];
                float l2a[2 * MR], l2b[2 * MR], dvr[MR];
                int64_t lim[MR]; /* the last key of the block row r0 + m sees */
                for (int m = 0; m < MR; m++) {
                    const int64_t r = min64(r0 + m, nr - 1);
                    lim[m] = r0 + m + i0 - j0 > P - 1 - j0 ? r0 + m + i0 - j0 : P - 1 - j0;
                    qxr[m] = qx + (i0 + r) * ld; /* broadcast operands: in place */
                    qpr[m] = two ? qp + (i0 + r) * ld : NULL;
                    dor[m] = dout + (i0 + r) * ld;
                    l2a[m] = la[i0 + r];
                    l2a[MR + m] = la[T + i0 + r];
                    l2b[m] = kind == MF_CONJ_SOFTMAX_PRODUCT ? lb[i0 + r] : 0.0f;
                    l2b[MR + m] = kind == MF_CONJ_SOFTMAX_PRODUCT ? lb[T + i0 + r] : 0.0f;
                    dvr[m] = Dv[i0 + r];
                }
                /* key vectors wholly above the causal diagonal skipped */
                const int64_t vhi =
                    diag == MF_BLOCK_CAUSAL ? min64(NVB, (r0 + MR - 1) / VW + 1) : NVB;
                for (int64_t g0 = 0; g0 < vhi; g0 += NV) {
#define MF_SCORES(n)                                                                         \
    bwd_scores(kind, n, g0, s->P, s->GX, s->GP, qxr, qpr, dor, s->KxT, s->KpT, s->VT, l2a, \
               l2b, dvr, lim, D, r0, diag, c2, scale, fac ? s->F : NULL)
                    NV_SWITCH(min64(NV, vhi - g0), MF_SCORES)
#undef MF_SCORES
                }
            }

            /* dV += A^T dout_i, dKx += dsX^T qx_i, dKp += dsP^T qp_i: queries r >= c only on
             * the causal diagonal */
            for (int64_t c0 = 0; c0 < nc; c0 += MR) {
                pf_step(pf);
                const int64_t k0 = diag == MF_BLOCK_CAUSAL ? c0 : 0;
                bwd_dkv_rows(s->dV, s->P, dO, lddo, Dp, c0, k0, nr);
                bwd_dkv_rows(s->dKx, s->GX, Qx, ldqx, Dp, c0, k0, nr);
                if (two) bwd_dkv_rows(s->dKp, s->GP, Qp, ldqp, Dp, c0, k0, nr);
            }

            /* dqx_i += dsX Kx_j, dqp_i += dsP Kp_j: keys c <= r only on the causal diagonal */
            for (int64_t r0 = 0; r0 < nr; r0 += MR) {
                pf_step(pf);
                const int64_t kn = diag == MF_BLOCK_CAUSAL ? min64(nc, r0 + MR) : nc;
                bwd_dq_rows(dqx + i0 * ld, ld, s->GX, Kx, ldkx, Dp, D, kn, r0, nr);
                if (two) bwd_dq_rows(dqp + i0 * ld, ld, s->GP, Kp, ldkp, Dp, D, kn, r0, nr);
            }
        }

        unpack_rows(p->dkx + off + j0 * ld, ld, s->dKx, Dp, nc, D, NULL);
        if (two) unpack_rows(p->dkp + off + j0 * ld, ld, s->dKp, Dp, nc, D, NULL);
        unpack_rows(p->dv + off + j0 * ld, ld, s->dV, Dp, nc, D, NULL);
    }
}

/* Backward task bh: the whole head; prefetch the next head's inputs and gradient rows (the
 * outputs are fetched now, not on the store). */
MF_INLINE int bwd_head(int kind, int fac, const MfAttnJob *p, float *scr, int64_t bh) {
    BwdScratch s;
    bwd_layout(p, scr, &s);
    if (fac && mf_attn_copy_ids(p, bh / p->H, s.ids) != MF_OK) return MF_EINDEX;
    const int64_t P = mf_attn_prefix(p, bh / p->H);
    if (P < 0) return MF_EINDEX;
    const int two = kind != MF_ATTN_PLAIN;
    const int64_t nrows = two ? 12 : 8, nb = (p->T + BT - 1) / BT;
    Prefetch pf;
    pf_init(&pf, p->ld, p->D);
    if (bh + 1 < p->B * p->H && nrows * p->T * p->D * (int64_t)sizeof(float) <= PF_MAX_BYTES) {
        const int64_t b = (bh + 1) / p->H, h = (bh + 1) % p->H;
        const int64_t off = b * p->T * p->ld + h * p->D;
        const float *rows[12] = {p->o,  p->dout, p->kx, p->v,   p->qx,  p->dqx,
                                 p->dkx, p->dv,   p->kp, p->qp, p->dqp, p->dkp};
        for (int i = 0; i < nrows; i++) pf_add(&pf, rows[i] + off, p->T);
    }
    /* pf_step runs twice per MR queries and once per MR keys of every pair of blocks */
    pf_plan(&pf, nb * (nb + 1) / 2 * (3 * BT / MR));
    bwd_task(kind, fac, p, &s, &pf, bh / p->H, bh % p->H, P);
    return MF_OK;
}

/* as fwd_factor_task */
static __attribute__((noinline)) int bwd_factor_head(const MfAttnJob *p, float *scr,
                                                     int64_t bh) {
    return bwd_head(MF_ATTN_PLAIN, 1, p, scr, bh);
}

static int bwd_entry(const MfAttnJob *p, float *scr, int64_t bh) {
    switch (p->kind) {
        case MF_ATTN_PLAIN:
            return p->factor != NULL ? bwd_factor_head(p, scr, bh)
                                     : bwd_head(MF_ATTN_PLAIN, 0, p, scr, bh);
        case MF_CONJ_SCORE_PRODUCT: return bwd_head(MF_CONJ_SCORE_PRODUCT, 0, p, scr, bh);
        case MF_CONJ_SOFTMAX_PRODUCT: return bwd_head(MF_CONJ_SOFTMAX_PRODUCT, 0, p, scr, bh);
        default: return bwd_head(MF_CONJ_SUM, 0, p, scr, bh);
    }
}

const MfAttnKernels MF_ATTN_TABLE = {fwd_tasks, fwd_floats, bwd_floats, fwd_entry, bwd_entry};

#undef VW
#undef BT
#undef MR
#undef NV
#undef NVB
