/* Row-block matrix products for linear.c and mlp.c (see mapformer/gemm.h).
 *
 * The model's products have one small side: a block of 256 activation rows times a weight of
 * at most 512 x 512. OpenBLAS packs both operands into its own layout on every call, and at
 * these shapes the packing (and the separate pass that zero-fills or scales C for beta) took
 * about a fifth of a training step. The kernel here:
 *   c tile (8 rows x 32 columns, 16 zmm accumulators) = init + sum_k a(r, k) b(k, 0:32)
 * broadcasts a(r, k) from the block's rows where they lie and loads b from column panels
 * (k x 32, contiguous) that the op lays out once per call from the weight; the accumulators
 * start from zero, the bias row or c, so no fill pass runs before the product. Column tails
 * use masked loads and stores of c, row tails tiles of fewer rows.
 * The weight-gradient product a^T b reads a's columns and b's rows, which are both
 * activations: per TN_ROWS rows, a is copied into panels of 8 columns (k-major) and b into
 * the panels above, so that the tile reads both in order.
 * Each tile sums over k in order with one rounding per fused multiply-add, so a result
 * depends on the sizes only, never on the thread count.
 */
#include <stdint.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define MF_GEMM_KERNEL 1
#include <immintrin.h>
#endif

#define TILE_ROWS 8
#define TILE_COLS 32
/* rows of a and b packed at a time by mf_gemm_tn */
#define TN_ROWS 256

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

int64_t mf_gemm_b_floats(int64_t k, int64_t n) { return k * round_up(n, TILE_COLS); }

int64_t mf_gemm_tn_pack_floats(int64_t m, int64_t n) {
    return (round_up(m, TILE_ROWS) + round_up(n, TILE_COLS)) * TN_ROWS;
}

#ifdef MF_GEMM_KERNEL
#define GEMM_TARGET __attribute__((target("avx512f")))

/* the mask of the first `cols` of 16 lanes (all for cols >= 16, none for cols <= 0) */
static __mmask16 col_mask(int64_t cols) {
    return (__mmask16)(cols >= 16 ? 0xFFFF : cols > 0 ? (1u << cols) - 1 : 0);
}

/* out = b (k, n) in column panels: out[j * k * 32 + kk * 32 + c] = b[kk, 32 j + c], with b's
 * element (kk, col) at w[kk * rs + col * cs], zero beyond column n */
GEMM_TARGET static void pack_panels(float *out, const float *w, int64_t k, int64_t n,
                                    int64_t rs, int64_t cs) {
    for (int64_t j = 0; j < n; j += TILE_COLS) {
        const int64_t cols = n - j < TILE_COLS ? n - j : TILE_COLS;
        const __mmask16 m0 = col_mask(cols), m1 = col_mask(cols - 16);
        float *panel = out + j * k;
        for (int64_t kk = 0; kk < k; kk++) {
            float *dst = panel + kk * TILE_COLS;
            if (cs == 1) {
                const float *src = w + kk * rs + j;
                _mm512_storeu_ps(dst, _mm512_maskz_loadu_ps(m0, src));
                _mm512_storeu_ps(dst + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            } else {
                for (int64_t c = 0; c < TILE_COLS; c++)
                    dst[c] = c < cols ? w[kk * rs + (j + c) * cs] : 0.0f;
            }
        }
    }
}

/* pa = a's columns 8t .. 8t+7 (of m) over k rows in panels, k-major:
 * pa[t * 8 k + kk * 8 + r] = a[kk, 8 t + r] */
GEMM_TARGET static void pack_columns(float *pa, const float *a, int64_t lda, int64_t m,
                                     int64_t k) {
    for (int64_t t = 0; t * TILE_ROWS < m; t++) {
        const int64_t c0 = t * TILE_ROWS, w = m - c0 < TILE_ROWS ? m - c0 : TILE_ROWS;
        float *panel = pa + t * TILE_ROWS * k;
        if (w == TILE_ROWS) {
            for (int64_t kk = 0; kk < k; kk++)
                _mm256_storeu_ps(panel + kk * TILE_ROWS, _mm256_loadu_ps(a + kk * lda + c0));
        } else {
            for (int64_t kk = 0; kk < k; kk++)
                for (int64_t r = 0; r < w; r++) panel[kk * TILE_ROWS + r] = a[kk * lda + c0 + r];
        }
    }
}

/* gelu(x), GELU's tanh approximation: the operations of gelu.c's mf_gelu_kernel (and of
 * fastmath.h's mf_expf) in its order, one rounding each, so the same bits */
GEMM_TARGET __attribute__((always_inline)) static inline __m512 gelu16(__m512 x) {
#define V(c) _mm512_set1_ps(c)
    const __m512 u = _mm512_mul_ps(
        V(0.7978845608028654f),
        _mm512_add_ps(x, _mm512_mul_ps(_mm512_mul_ps(V(0.044715f), _mm512_mul_ps(x, x)), x)));
    /* mf_expf(-2u): clamp as integers, 2^n by the 1.5 * 2^23 trick, Cephes' polynomial */
    __m512i zi = _mm512_castps_si512(_mm512_mul_ps(V(-2.0f), u));
    zi = _mm512_min_epi32(zi, _mm512_set1_epi32(0x42B00000));
    zi = _mm512_min_epu32(zi, _mm512_set1_epi32((int)0xC2AE0000u));
    const __m512 z = _mm512_castsi512_ps(zi);
    const __m512 t = _mm512_add_ps(_mm512_mul_ps(z, V(1.44269504088896341f)), V(12582912.0f));
    const __m512 nn = _mm512_sub_ps(t, V(12582912.0f));
    __m512 r = _mm512_sub_ps(z, _mm512_mul_ps(nn, V(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(nn, V(-2.12194440e-4f)));
    __m512 p = V(1.9875691500e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), V(1.3981999507e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), V(8.3334519073e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), V(4.1665795894e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), V(1.6666665459e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), V(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), V(1.0f));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B400000)),
                         _mm512_set1_epi32(127)),
        23);
    const __m512 ez = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    return _mm512_mul_ps(x, _mm512_div_ps(V(1.0f), _mm512_add_ps(V(1.0f), ez)));
#undef V
}

/* c's tile row halves: masked (a column tail) or not (MASKED is a constant after inlining;
 * masks held through the k loop cost more than plain loads) */
#define LOAD(p, m) (MASKED ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p))
#define STORE(p, m, v) (MASKED ? _mm512_mask_storeu_ps(p, m, v) : _mm512_storeu_ps(p, v))

/* One tile of R rows (R <= TILE_ROWS) and the columns in masks m0 (0:16) and m1 (16:32):
 *   c[r, :] = init[r, :] + sum_k a[r * ars + k * aks] b[k * 32 + :]
 * and g[r, :] = gelu(c[r, :]) where g != NULL; stream: c's stores are non-temporal (full
 * tiles only; the caller checks the alignment). R and MASKED are constants after inlining,
 * so the accumulators stay in registers. */
GEMM_TARGET __attribute__((always_inline)) static inline void
tile(const int R, const int MASKED, int64_t K, const float *a, int64_t ars, int64_t aks,
     const float *b, float *c, int64_t ldc, const float *bias, int accumulate, float *g,
     int stream, __mmask16 m0, __mmask16 m1) {
    __m512 acc0[TILE_ROWS], acc1[TILE_ROWS];
    for (int r = 0; r < R; r++) {
        if (accumulate) {
            acc0[r] = LOAD(c + r * ldc, m0);
            acc1[r] = LOAD(c + r * ldc + 16, m1);
        } else if (bias != NULL) {
            acc0[r] = LOAD(bias, m0);
            acc1[r] = LOAD(bias + 16, m1);
        } else {
            acc0[r] = _mm512_setzero_ps();
            acc1[r] = _mm512_setzero_ps();
        }
    }
    for (int64_t k = 0; k < K; k++) {
        const __m512 b0 = _mm512_loadu_ps(b + k * TILE_COLS);
        const __m512 b1 = _mm512_loadu_ps(b + k * TILE_COLS + 16);
        for (int r = 0; r < R; r++) {
            const __m512 ar = _mm512_set1_ps(a[r * ars + k * aks]);
            acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        if (!MASKED && stream) {
            _mm512_stream_ps(c + r * ldc, acc0[r]);
            _mm512_stream_ps(c + r * ldc + 16, acc1[r]);
        } else {
            STORE(c + r * ldc, m0, acc0[r]);
            STORE(c + r * ldc + 16, m1, acc1[r]);
        }
        if (g != NULL) {
            STORE(g + r * ldc, m0, gelu16(acc0[r]));
            STORE(g + r * ldc + 16, m1, gelu16(acc1[r]));
        }
    }
}
#undef LOAD
#undef STORE

/* c (m, n) = init + a b, with b in column panels: panels outer (a panel, K x 32, is reused by
 * every row tile), row tiles inner. Row tile t starts at a + t * tile_stride. The options
 * are mf_gemm_nn's; the prefetched lines are spread over the tiles, a share each, so that
 * their loads overlap the products instead of stalling the caller's next pass. */
GEMM_TARGET static void kernel(int64_t m, int64_t n, int64_t K, const float *a,
                               int64_t tile_stride, int64_t ars, int64_t aks, const float *b,
                               float *c, int64_t ldc, const MfGemmOptions *o) {
    const float *pf = o->prefetch;
    const int64_t lines = pf != NULL ? (o->prefetch_floats + 15) / 16 : 0;
    const int64_t tiles = round_up(n, TILE_COLS) / TILE_COLS * (round_up(m, TILE_ROWS) / TILE_ROWS);
    /* non-temporal stores need 64-byte aligned rows */
    const int stream = o->stream && (uintptr_t)c % 64 == 0 && ldc % 16 == 0;
    int64_t t = 0;
    for (int64_t j = 0; j < n; j += TILE_COLS) {
        const int64_t cols = n - j < TILE_COLS ? n - j : TILE_COLS;
        const __mmask16 m0 = col_mask(cols), m1 = col_mask(cols - 16);
        const float *bj = b + j * K, *biasj = o->bias != NULL ? o->bias + j : NULL;
        for (int64_t i = 0; i < m; i += TILE_ROWS) {
            const float *ai = a + i / TILE_ROWS * tile_stride;
            float *ci = c + i * ldc + j, *gi = o->gelu != NULL ? o->gelu + i * ldc + j : NULL;
            const int64_t rows = m - i < TILE_ROWS ? m - i : TILE_ROWS;
            for (int64_t l = t * lines / tiles; l < (t + 1) * lines / tiles; l++)
                _mm_prefetch((const char *)(pf + 16 * l), _MM_HINT_T1);
            t++;
            if (rows == TILE_ROWS && cols == TILE_COLS) { /* the bulk of the work */
                tile(TILE_ROWS, 0, K, ai, ars, aks, bj, ci, ldc, biasj, o->accumulate, gi,
                     stream, m0, m1);
                continue;
            }
            switch (rows) {
#define MF_TILE(R)                                                                            \
    case R:                                                                                   \
        tile(R, 1, K, ai, ars, aks, bj, ci, ldc, biasj, o->accumulate, gi, 0, m0, m1);       \
        break;
                MF_TILE(8) MF_TILE(7) MF_TILE(6) MF_TILE(5) MF_TILE(4) MF_TILE(3) MF_TILE(2)
                MF_TILE(1)
#undef MF_TILE
            }
        }
    }
    if (stream) _mm_sfence(); /* the streamed stores are visible before the op returns */
}
#endif

void mf_gemm_prepare_b(int fast, float *out, const float *w, int64_t k, int64_t n,
                       int transposed) {
    const int64_t rs = transposed ? 1 : n, cs = transposed ? k : 1;
#ifdef MF_GEMM_KERNEL
    if (fast) {
        pack_panels(out, w, k, n, rs, cs);
        return;
    }
#else
    (void)fast;
#endif
    for (int64_t kk = 0; kk < k; kk++)
        for (int64_t c = 0; c < n; c++) out[kk * n + c] = w[kk * rs + c * cs];
}

int mf_gemm_nn(int fast, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, float *c, int64_t ldc, const MfGemmOptions *opt) {
    const MfGemmOptions none = {0};
    const MfGemmOptions *o = opt != NULL ? opt : &none;
#ifdef MF_GEMM_KERNEL
    if (fast) {
        kernel(m, n, k, a, TILE_ROWS * lda, lda, 1, b, c, ldc, o);
        return MF_OK;
    }
#else
    (void)fast;
#endif
    if (!o->accumulate && o->bias != NULL)
        for (int64_t r = 0; r < m; r++)
            memcpy(c + r * ldc, o->bias, (size_t)n * sizeof(float));
    const float beta = o->accumulate || o->bias != NULL ? 1.0f : 0.0f;
    int status = mf_sgemm(0, 0, m, n, k, 1.0f, a, lda, b, n, beta, c, ldc);
    if (status == MF_OK && o->gelu != NULL)
        for (int64_t r = 0; r < m; r++) mf_gelu_kernel(o->gelu + r * ldc, c + r * ldc, n);
    return status;
}

int mf_gemm_tn(int fast, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
               const float *b, int64_t ldb, float *c, int64_t ldc, float *pack) {
#ifdef MF_GEMM_KERNEL
    if (fast) {
        /* TN_ROWS rows of a and b at a time (the sums still run over k in order): a's panel t
         * holds its columns 8t .. 8t+7 (pack_columns); b as mf_gemm_prepare_b lays it out */
        float *pa = pack, *pb = pack + round_up(m, TILE_ROWS) * TN_ROWS;
        for (int64_t k0 = 0; k0 < k; k0 += TN_ROWS) {
            const int64_t kn = k - k0 < TN_ROWS ? k - k0 : TN_ROWS;
            pack_columns(pa, a + k0 * lda, lda, m, kn);
            pack_panels(pb, b + k0 * ldb, kn, n, ldb, 1);
            const MfGemmOptions accumulate = {.accumulate = 1};
            kernel(m, n, kn, pa, TILE_ROWS * kn, 1, TILE_ROWS, pb, c, ldc, &accumulate);
        }
        return MF_OK;
    }
#else
    (void)fast;
#endif
    (void)pack;
    return mf_sgemm(1, 0, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
}
