/* The row-block matrix products of linear.c and mlp.c (mapformer/gemm.h), written once over
 * the SIMD layer (mapformer/simd.h) and compiled once per kernel set. A kernel file defines
 *   MF_VW            the vector width in floats (16, 8 or 4)
 *   MF_GEMM_ROWS     rows of the register tile (MR)
 *   MF_GEMM_VECS     vectors across the register tile (NR = MF_GEMM_VECS * MF_VW columns)
 *   MF_GEMM_SUFFIX   the suffix of its exported functions (avx512, avx2, vec)
 * and optionally MF_GEMM_KC (k per pass over c) and MF_GEMM_TN_ROWS (rows packed at a time by
 * the weight-gradient product), then includes this file.
 *
 * The model's products have one small side: a block of activation rows times a weight of at
 * most 512 x 512. OpenBLAS packs both operands into its own layout on every call, and at these
 * shapes the packing (and the separate pass that zero-fills or scales c for beta) costs a
 * large share of the product. The kernel here:
 *   c tile (MR rows x NR columns, MR * MF_GEMM_VECS vector accumulators)
 *       = init + sum_k a(r, k) b(k, 0:NR)
 * broadcasts a(r, k) from the block's rows where they lie and loads b from column panels
 * (k x NR, contiguous) that the op lays out once per call from the weight; the bias row or c
 * is added to the accumulators at the end, so no fill pass runs before the product, and the
 * GELU of the result can be taken from the registers (vgelu or vgelu_erf: the bits of gelu.c's
 * kernels).
 * k is cut into passes of MF_GEMM_KC, so that a pass's panel stays in L1; a later pass adds
 * its sum to the c the earlier one stored. While a tile runs, the next tile's rows of a (on
 * the first panel, their first pass from memory) and its lines of c are prefetched: a's rows
 * are too short for the hardware's stream prefetch (measured on Zen 3: up to 11% on the
 * linears at 32768 rows, neutral at 4096).
 * Row tails run tiles of fewer rows, column tails tiles of fewer vectors, and where the last
 * vector is in part past the columns, on a copy of the tile's rows padded to whole vectors:
 * at the vocabulary's widths (AVX2, 4096 rows of 128, one thread) 36 columns took 4-6% more
 * than 40 (0.57 against 0.54 ms), where simd.h's lane-by-lane partial loads and stores in the
 * tile took 6-8% more.
 * The weight-gradient product a^T b reads a's columns and b's rows, which are both
 * activations: per MF_GEMM_TN_ROWS rows, a is copied into panels of MR columns (k-major) and
 * b into panels as above, so that the tile reads both in order; the smaller side is packed
 * whole (it stays in L2), the other one panel at a time (it stays in L1).
 * Each c element is its init plus the sums of the products over k in order (one rounding per
 * fused multiply-add, VFMA), a sum per pass, so a result depends on the sizes only, never on
 * the thread count.
 */
#include <stdint.h>
#include <string.h>

#include "gemm_sets.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"
#include "mapformer/simd.h"

#if !defined(MF_GEMM_ROWS) || !defined(MF_GEMM_VECS) || !defined(MF_GEMM_SUFFIX)
#error "define MF_VW, MF_GEMM_ROWS, MF_GEMM_VECS and MF_GEMM_SUFFIX before including gemm.h"
#endif
#if MF_GEMM_ROWS < 1 || MF_GEMM_ROWS > 8 || MF_GEMM_VECS < 1 || MF_GEMM_VECS > 4
#error "the register tile is 1 to 8 rows by 1 to 4 vectors"
#endif
#ifndef MF_GEMM_KC
#define MF_GEMM_KC 256
#endif
#ifndef MF_GEMM_TN_ROWS
#define MF_GEMM_TN_ROWS 256
#endif

_Static_assert(MF_GEMM_TN_ROWS % 16 == 0, "packs start 64-byte aligned");

#define MR MF_GEMM_ROWS
#define NV MF_GEMM_VECS
#define NR (MF_GEMM_VECS * MF_VW)
/* a's panels in mf_gemm_tn: MR columns, stored MRP apart (a multiple of 4 floats: one copy
 * of MRP floats, a row of the panel, is a few whole vector moves) */
#define MRP ((MR + 3) / 4 * 4)
#define GEMM_CAT2(name, sfx) name##_##sfx
#define GEMM_CAT(name, sfx) GEMM_CAT2(name, sfx)
#define GEMM_FN(name) GEMM_CAT(name, MF_GEMM_SUFFIX)

static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

int64_t GEMM_FN(mf_gemm_b_floats)(int64_t k, int64_t n) { return k * round_up(n, NR); }

/* a's columns packed at a time by mf_gemm_tn when b's side is packed whole: a few row tiles,
 * so that each line of a's rows is read once for all of them */
#define TN_COLS (8 * MR)

/* mf_gemm_tn computes c^T = b^T a (then added to c transposed) where b is narrower than a
 * panel and a is wider: c's n columns would fill a fraction of each tile's vectors, c^T's
 * m columns fill whole tiles (Mamba's dt_proj, 8 -> 256 with bias, at 32768 rows, AVX-512,
 * one thread: linear_backward 8.9 ms with c's tiles of one vector half used, 7.3 ms so) */
static inline int tn_transposed(int64_t m, int64_t n) { return n < NR && m > n; }

int64_t GEMM_FN(mf_gemm_tn_pack_floats)(int64_t m, int64_t n) {
    /* mf_gemm_tn: the smaller side whole, a panel (b) or TN_COLS columns (a) of the other;
     * transposed, b's columns whole, a panel of a's and c^T */
    if (tn_transposed(m, n))
        return (round_up(n, MR) / MR * MRP + NR) * MF_GEMM_TN_ROWS + n * m;
    return (m <= n ? round_up(m, MR) / MR * MRP + NR : round_up(n, NR) + TN_COLS / MR * MRP) *
           MF_GEMM_TN_ROWS;
}

/* out = b (k, n) in column panels: out[j * k + kk * NR + c] = b[kk, j + c] for the panel of
 * columns j .. j + NR - 1, zero beyond column n. b's element (kk, col) is w[kk * rs + col]
 * (cs = 1: rows of b contiguous) or w[col * cs + kk] (rs = 1: columns of b contiguous, the
 * transposed weight, copied by register transposes). */
static void pack_panels(float *out, const float *w, int64_t k, int64_t n, int64_t rs,
                        int64_t cs) {
    for (int64_t j = 0; j < n; j += NR) {
        const int64_t cols = min64(n - j, NR);
        float *panel = out + j * k;
        if (cs != 1) {
            if (cols < NR) memset(panel, 0, (size_t)(k * NR) * sizeof(float));
            mf_transpose(panel, NR, w + j * cs, cs, cols, k);
        } else if (cols == NR) {
            for (int64_t kk = 0; kk < k; kk++)
                for (int v = 0; v < NV; v++)
                    VSTOREU(panel + kk * NR + v * MF_VW, VLOADU(w + kk * rs + j + v * MF_VW));
        } else {
            for (int64_t kk = 0; kk < k; kk++)
                for (int64_t col = 0; col < NR; col++)
                    panel[kk * NR + col] = col < cols ? w[kk * rs + j + col] : 0.0f;
        }
    }
}

/* pa = a's columns 0 .. m - 1 in panels of MR over its k rows, k-major, MRP floats a row:
 * pa[c0 / MR * MRP * k + kk * MRP + r] = a[kk, c0 + r] for the panel of columns c0 ..
 * c0 + MR - 1. a's rows hold at least `avail` >= m columns from a. In groups of 16 rows of a,
 * which stay in L1 while every panel takes its part (a's rows lie a power of two apart at the
 * model's widths, as do the panels: a whole column of lines, or one line of every panel,
 * would not stay in L1). Where a row has MRP floats from column c0, they are copied as one
 * block (the floats past MR are never read). */
static void pack_columns(float *pa, const float *a, int64_t lda, int64_t m, int64_t avail,
                         int64_t k) {
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
        const int64_t k1 = min64(k0 + 16, k);
        for (int64_t c0 = 0; c0 < m; c0 += MR) {
            const int64_t w = min64(m - c0, MR);
            const float *src = a + k0 * lda + c0;
            float *dst = pa + c0 / MR * MRP * k + k0 * MRP;
            if (c0 + MRP <= avail) {
                for (int64_t kk = k0; kk < k1; kk++, src += lda, dst += MRP)
                    memcpy(dst, src, MRP * sizeof(float));
            } else {
                for (int64_t kk = k0; kk < k1; kk++, src += lda, dst += MRP)
                    for (int64_t r = 0; r < w; r++) dst[r] = src[r];
            }
        }
    }
}

enum { INIT_ZERO, INIT_BIAS, INIT_C };

/* One tile of R rows (R <= MR) and V vectors (V <= NV):
 *   c[r, :] = init[r, :] + (sum_k a[r * ars + k * aks] b[k * NR + :])
 * with init zero, the bias row or c itself, added once to the sum of the products (which
 * starts from zero: a start much larger than the products would cost every product's
 * rounding its precision); and g[r, :] = gelu(c[r, :]) where g != NULL (row stride ldg;
 * the exact GELU, vgelu_erf, where exact).
 * stream: c's stores are non-temporal (the caller checks the alignment).
 * R and V are constants after inlining, so the accumulators stay in registers. */
MF_INLINE void tile(const int R, const int V, int64_t K, const float *a, int64_t ars,
                    int64_t aks, const float *b, float *c, int64_t ldc, const float *bias,
                    int init, float *g, int64_t ldg, int exact, int stream) {
    vf acc[MR][NV];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = VZERO;
    for (int64_t k = 0; k < K; k++) {
        vf bk[NV];
        for (int v = 0; v < V; v++) bk[v] = VLOADU(b + k * NR + v * MF_VW);
        for (int r = 0; r < R; r++) {
            const vf ar = VSPLAT(a[r * ars + k * aks]);
            for (int v = 0; v < V; v++) acc[r][v] = VFMA(ar, bk[v], acc[r][v]);
        }
    }
    if (init != INIT_ZERO)
        for (int r = 0; r < R; r++)
            for (int v = 0; v < V; v++)
                acc[r][v] = VLOADU(init == INIT_C ? c + r * ldc + v * MF_VW : bias + v * MF_VW) +
                            acc[r][v];
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < V; v++) {
            float *dst = c + r * ldc + v * MF_VW;
            if (stream)
                vstream(dst, &acc[r][v]);
            else
                VSTOREU(dst, acc[r][v]);
        }
        if (g != NULL) {
            for (int v = 0; v < V; v++) {
                if (exact)
                    vgelu_erf(&acc[r][v]);
                else
                    vgelu(&acc[r][v]);
                VSTOREU(g + r * ldg + v * MF_VW, acc[r][v]);
            }
        }
    }
}

#define TILE_ARGS K, a, ars, aks, b, c, ldc, bias, init, g, ldg, exact, 0
#define EDGE_V(R, V)             \
    case (R) * 8 + (V):          \
        tile(R, V, TILE_ARGS);   \
        break;
#if NV == 1
#define EDGE_R(R) EDGE_V(R, 1)
#elif NV == 2
#define EDGE_R(R) EDGE_V(R, 1) EDGE_V(R, 2)
#elif NV == 3
#define EDGE_R(R) EDGE_V(R, 1) EDGE_V(R, 2) EDGE_V(R, 3)
#else
#define EDGE_R(R) EDGE_V(R, 1) EDGE_V(R, 2) EDGE_V(R, 3) EDGE_V(R, 4)
#endif

/* A tile at a row edge, or a column tail's tile of whole vectors: `rows` rows, `vecs`
 * vectors; plain stores. */
static void edge_tile(int64_t rows, int64_t vecs, int64_t K, const float *a, int64_t ars,
                      int64_t aks, const float *b, float *c, int64_t ldc, const float *bias,
                      int init, float *g, int64_t ldg, int exact) {
    switch (rows * 8 + vecs) {
        EDGE_R(1)
#if MR >= 2
        EDGE_R(2)
#endif
#if MR >= 3
        EDGE_R(3)
#endif
#if MR >= 4
        EDGE_R(4)
#endif
#if MR >= 5
        EDGE_R(5)
#endif
#if MR >= 6
        EDGE_R(6)
#endif
#if MR >= 7
        EDGE_R(7)
#endif
#if MR >= 8
        EDGE_R(8)
#endif
        default: break;
    }
}
#undef EDGE_R
#undef EDGE_V
#undef TILE_ARGS

/* A column tail's tile whose last vector is in part past c's columns (`cols` of them): the
 * tile runs on a copy of its rows padded to whole vectors (the init copied in, the results
 * copied out), so that nothing past the columns is read or written. */
static void padded_tile(int64_t rows, int64_t cols, int64_t K, const float *a, int64_t ars,
                        int64_t aks, const float *b, float *c, int64_t ldc, const float *bias,
                        int init, float *g, int exact) {
    float pc[MR * NR] __attribute__((aligned(64))) = {0};
    float pg[MR * NR] __attribute__((aligned(64)));
    for (int64_t r = 0; r < rows && init != INIT_ZERO; r++)
        memcpy(pc + r * NR, init == INIT_C ? c + r * ldc : bias, (size_t)cols * sizeof(float));
    edge_tile(rows, (cols + MF_VW - 1) / MF_VW, K, a, ars, aks, b, pc, NR, NULL,
              init == INIT_ZERO ? INIT_ZERO : INIT_C, g != NULL ? pg : NULL, NR, exact);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(c + r * ldc, pc + r * NR, (size_t)cols * sizeof(float));
        if (g != NULL) memcpy(g + r * ldc, pg + r * NR, (size_t)cols * sizeof(float));
    }
}

/* c (m, n) = init + a b, with b in column panels (b + j * K is the panel of columns j ..),
 * in passes of MF_GEMM_KC over k; in a pass, panels outer (a panel, kc x NR, stays in L1 for
 * every row tile), row tiles inner. Row tile t starts at a + t * tile_stride, and its element
 * (r, k) is at r * ars + k * aks. The options are mf_gemm_nn's; the prefetched lines are
 * spread over the tiles, a share each, so that their loads overlap the products instead of
 * stalling the caller's next pass. */
static void kernel(int64_t m, int64_t n, int64_t K, const float *a, int64_t tile_stride,
                   int64_t ars, int64_t aks, const float *b, float *c, int64_t ldc,
                   const MfGemmOptions *o) {
    const float *pf = o->prefetch;
    const int64_t lines = pf != NULL ? (o->prefetch_floats + 15) / 16 : 0;
    const int64_t passes = (K + MF_GEMM_KC - 1) / MF_GEMM_KC;
    const int64_t tiles = passes * (round_up(n, NR) / NR) * (round_up(m, MR) / MR);
    /* non-temporal stores need rows aligned to the vector */
    const int stream = o->stream && (uintptr_t)c % (4 * MF_VW) == 0 && ldc % MF_VW == 0;
    int64_t t = 0;
    for (int64_t k0 = 0; k0 < K; k0 += MF_GEMM_KC) {
        const int64_t kc = min64(MF_GEMM_KC, K - k0);
        const int final = k0 + kc == K;
        const int init = k0 > 0 || o->accumulate ? INIT_C : o->bias != NULL ? INIT_BIAS
                                                                              : INIT_ZERO;
        float *gelu = final ? o->gelu : NULL;
        const int ex = o->gelu_exact;
        const int st = final && stream;
        for (int64_t j = 0; j < n; j += NR) {
            const int64_t cols = min64(n - j, NR), vecs = (cols + MF_VW - 1) / MF_VW;
            const float *bj = b + j * K + k0 * NR;
            const float *biasj = o->bias != NULL ? o->bias + j : NULL;
            for (int64_t i = 0; i < m; i += MR) {
                const float *ai = a + i / MR * tile_stride + k0 * aks;
                float *ci = c + i * ldc + j, *gi = gelu != NULL ? gelu + i * ldc + j : NULL;
                const int64_t rows = min64(m - i, MR);
                for (int64_t l = t * lines / tiles; l < (t + 1) * lines / tiles; l++)
                    __builtin_prefetch(pf + 16 * l, 0, 2);
                t++;
                /* the first panel is the first pass over a's rows (from memory, in rows too
                 * short for the hardware's stream prefetch): the next tile's rows are
                 * prefetched while this one is multiplied */
                if (j == 0 && aks == 1 && i + MR < m) {
                    const float *next = ai + tile_stride;
                    for (int64_t r = 0; r < min64(m - i - MR, MR); r++)
                        for (int64_t l = 0; l < kc; l += 16)
                            __builtin_prefetch(next + r * ars + l, 0, 3);
                }
                /* the next tile's lines of c, about to be written (and read, when
                 * accumulating): their fetch overlaps this tile's products (not where c
                 * streams past the cache) */
                if (!st && i + MR < m)
                    for (int64_t r = 0; r < min64(m - i - MR, MR); r++)
                        for (int64_t l = 0; l < cols; l += 16)
                            __builtin_prefetch(ci + (MR + r) * ldc + l, 1, 3);
                if (rows == MR && cols == NR) /* the bulk of the work */
                    tile(MR, NV, kc, ai, ars, aks, bj, ci, ldc, biasj, init, gi, ldc, ex, st);
                else if (cols % MF_VW == 0)
                    edge_tile(rows, vecs, kc, ai, ars, aks, bj, ci, ldc, biasj, init, gi, ldc,
                              ex);
                else
                    padded_tile(rows, cols, kc, ai, ars, aks, bj, ci, ldc, biasj, init, gi, ex);
            }
        }
    }
    if (stream) vstream_fence(); /* the streamed stores are visible before the op returns */
}

int GEMM_FN(mf_gemm_prepare_b)(float *out, const float *w, int64_t k, int64_t n,
                               int transposed) {
    if (transposed)
        pack_panels(out, w, k, n, 1, k); /* w (n, k): b's column col is w's row col */
    else
        pack_panels(out, w, k, n, n, 1);
    return MF_OK;
}

int GEMM_FN(mf_gemm_nn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, float *c, int64_t ldc, const MfGemmOptions *o) {
    kernel(m, n, k, a, MR * lda, lda, 1, b, c, ldc, o);
    return MF_OK;
}

int GEMM_FN(mf_gemm_tn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                        float *pack) {
    /* MF_GEMM_TN_ROWS rows of a and b at a time (a sum each, added to c in order). Of a's
     * columns in panels of MR (pack_columns) and b's in panels of NR (pack_panels), the
     * smaller side is packed whole and stays in L2, the other one panel (or TN_COLS of a's
     * columns) at a time, which stays in L1 (L2) while the tiles sweep the whole side. pb (and in the second case pa)
     * starts at a multiple of MF_VW floats, 64-byte aligned when pack is. */
    if (tn_transposed(m, n)) {
        /* ct (n, m) = b^T a over a pass of rows (one pass of the kernel over k: a sum each,
         * as below), then c = [c +] ct^T: each c element the same sum of the same products,
         * added to c as the kernel adds it */
        const int64_t step = min64(MF_GEMM_TN_ROWS, MF_GEMM_KC);
        float *pa = pack, *pb = pack + round_up(n, MR) / MR * MRP * MF_GEMM_TN_ROWS;
        float *ct = pb + NR * MF_GEMM_TN_ROWS;
        const MfGemmOptions none = {0};
        for (int64_t k0 = 0; k0 < k; k0 += step) {
            const int64_t kn = min64(k - k0, step);
            const float *ak = a + k0 * lda, *bk = b + k0 * ldb;
            pack_columns(pa, bk, ldb, n, n, kn);
            for (int64_t j = 0; j < m; j += NR) {
                const int64_t cols = min64(m - j, NR);
                pack_panels(pb, ak + j, kn, cols, lda, 1);
                kernel(n, cols, kn, pa, MRP * kn, 1, MRP, pb, ct + j, m, &none);
            }
            const int add = accumulate || k0 > 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t jj = 0; jj < n; jj++)
                    c[i * ldc + jj] = add ? c[i * ldc + jj] + ct[jj * m + i] : ct[jj * m + i];
        }
        return MF_OK;
    }
    for (int64_t k0 = 0; k0 < k; k0 += MF_GEMM_TN_ROWS) {
        const int64_t kn = min64(k - k0, MF_GEMM_TN_ROWS);
        const MfGemmOptions o = {.accumulate = accumulate || k0 > 0};
        const float *ak = a + k0 * lda, *bk = b + k0 * ldb;
        if (m <= n) {
            float *pa = pack, *pb = pack + round_up(m, MR) / MR * MRP * MF_GEMM_TN_ROWS;
            pack_columns(pa, ak, lda, m, m, kn);
            for (int64_t j = 0; j < n; j += NR) {
                const int64_t cols = min64(n - j, NR);
                pack_panels(pb, bk + j, kn, cols, ldb, 1);
                kernel(m, cols, kn, pa, MRP * kn, 1, MRP, pb, c + j, ldc, &o);
            }
        } else {
            float *pb = pack, *pa = pack + round_up(n, NR) * MF_GEMM_TN_ROWS;
            pack_panels(pb, bk, kn, n, ldb, 1);
            for (int64_t i = 0; i < m; i += TN_COLS) {
                const int64_t cols = min64(m - i, TN_COLS);
                pack_columns(pa, ak + i, lda, cols, m - i, kn);
                kernel(cols, n, kn, pa, MRP * kn, 1, MRP, pb, c + i * ldc, ldc, &o);
            }
        }
    }
    return MF_OK;
}
