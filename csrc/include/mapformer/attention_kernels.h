/* Kernels shared by the flash-style attention ops: csrc/ops/attention.c (causal softmax
 * attention) and csrc/ops/conj_attention.c (MapEM's conjunctive attention). Everything here is
 * static (inline), so each op file gets its own copy compiled in its own context.
 *
 *  - AVX-512 building blocks: 16-float vector types and macros, a polynomial exp2 in registers,
 *    16 x 16 in-register transposes, row packing, the MR x (16 NVMAX) register-tile microkernel
 *    `mk`, the software prefetcher of the next task's rows, the online softmax down the columns
 *    of a transposed score tile, and the three products every op's tiles share
 *    (O = alpha O + P^T V, dq += dS K, dK/dV += Y^T X). They are always-inline bodies compiled
 *    only inside each op's AVX-512 entry points (declared with MF_AVX512).
 *  - portable-path helpers: exp2_scalar, sum8 and the online softmax step of a score row,
 *    plain loops the compiler vectorises.
 *  - dispatch (mf_use_avx512, in mapformer/clones.h, picks the path), check_sizes,
 *    per-thread scratch (carved from the caller's) and the OpenMP task loop. */
#ifndef MAPFORMER_ATTENTION_KERNELS_H
#define MAPFORMER_ATTENTION_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"

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
    if (pf->n < PF_RANGES && rows > 0) {
        pf->base[pf->n] = base;
        pf->rows[pf->n++] = rows;
    }
}

/* Spread the rows added so far over `steps` calls of pf_step. */
static inline void pf_plan(Prefetch *pf, int64_t steps) {
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

/* Prefetch whole heads ahead only while they fit comfortably in a core's L2 next to the
 * current one; longer sequences stream through the hardware prefetchers. */
#define PF_MAX_BYTES (1024 * 1024)

/* The online softmax step of one key block, down the columns (queries) of the transposed score
 * tile ST[key][query], 16 queries at a time: with mrun the running max including this block,
 * ST[c][r] = 2^(ST[c][r] - mrun[r]) for keys c < nc (c <= the vector's last query on a
 * diagonal block), alpha[r] = 2^(mx[r] - mrun[r]), l[r] = l[r] alpha[r] + sum_c ST[c][r],
 * mx[r] = mrun[r]. Base-2 scores; -inf entries give 0. */
INLINE void fwd_softmax_cols(float *ST, float *mx, float *l, float *alpha, const float *mrun,
                             int64_t nc, int diag) {
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

/* Each op's AVX-512 entry points carry this attribute: the bodies above are compiled only
 * there. -std=c11 turns floating-point contraction off, and these kernels want fused
 * multiply-adds. */
#define MF_AVX512 \
    target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma"), optimize("fp-contract=fast")

/* ---- portable-path helpers ---------------------------------------------------------------- */
/* The portable paths tile by BTB = 32: every sgemm call stays at m n k <= 32 * 32 * 128 = 2^17,
 * under OpenBLAS's threading threshold, so calls from several OpenMP threads never start BLAS
 * threads. */
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

/* The online softmax step of one row of a (query, key) tile of base-2 scores s: with
 * m = max(*mx, s[c < cend]), s[c] = 2^(s[c] - m) for the causal keys c < cend and 0 for
 * cend <= c < nc, *l = *l a + sum_c s[c], *mx = m; returns a = 2^(*mx before - m), the factor
 * of the row's earlier sums (0 when *mx was -inf). */
static inline float row_softmax_step(float *s, int64_t cend, int64_t nc, float *mx, float *l) {
    float m = *mx;
    for (int64_t c = 0; c < cend; c++) m = s[c] > m ? s[c] : m;
    const float a = *mx == -INFINITY ? 0.0f : exp2_scalar(*mx - m);
    for (int64_t c = 0; c < cend; c++) s[c] = exp2_scalar(s[c] - m);
    for (int64_t c = cend; c < nc; c++) s[c] = 0.0f;
    *l = *l * a + sum8(s, cend);
    *mx = m;
    return a;
}

/* ---- dispatch, sizes, scratch, tasks ------------------------------------------------------ */

static inline int check_sizes(int64_t B, int64_t T, int64_t H, int64_t D, float scale) {
    if (B < 1 || T < 1 || H < 1 || D < 16 || D > 128 || D % 2 != 0 || !isfinite(scale))
        return MF_EINVAL;
    if (B > INT64_MAX / T / H / D || H * D > INT32_MAX) return MF_EINVAL;
    return MF_OK;
}

/* Scratch for tasks that need fast_floats (AVX-512 path) or blas_floats (the sgemm path) per
 * thread: the larger, for mf_max_threads() threads, so that it serves whichever path runs. */
static inline int64_t task_scratch_floats(int64_t fast_floats, int64_t blas_floats) {
    const int64_t per = fast_floats > blas_floats ? fast_floats : blas_floats;
    return mf_max_threads() * mf_scratch_size(per);
}

/* A task: fn(params, scratch, t) for t in [0, ntask). */
typedef int (*TaskFn)(const void *, float *, int64_t);

/* Run fn over tasks [0, ntask) on the OpenMP threads, each with its own nfloat floats of the
 * caller's scratch (scratch_floats in all: as many threads as that serves). Tasks cost about
 * the same and consecutive ones share data: a static schedule.
 * Problems under about a million multiply-adds (work = B H T^2 D < 2e6) run on the calling
 * thread: waking the team would cost more than the work. */
static inline int run_tasks(TaskFn fn, const void *p, int64_t ntask, int64_t nfloat,
                            double work, float *scratch, int64_t scratch_floats) {
    int status = MF_OK;
    const int64_t per = mf_scratch_size(nfloat);
    const int nt = mf_scratch_threads(scratch_floats, per);
    if (nt < 1) return MF_EINVAL;
    const int parallel = ntask > 1 && work > 2e6;
#pragma omp parallel num_threads(nt) if (parallel)
    {
        float *scr = scratch + mf_thread_id() * per;
        int mine = MF_OK;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntask; t++)
            if (mine == MF_OK) mine = fn(p, scr, t);
        if (mine != MF_OK) {
#pragma omp atomic write
            status = mine;
        }
    }
    return status;
}

#endif
