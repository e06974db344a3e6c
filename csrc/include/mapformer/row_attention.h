/* Row-at-a-time softmax attention helpers of the BLAS-blocked attention ops (cope.c,
 * relative.c): a block of query rows gets its scores from sgemm, each row becomes logits and
 * probabilities in passes over whole vectors (rows of scratch padded to round_up), and the
 * products are sgemms again. Include after mapformer/simd.h with MF_VW = MF_CLONES_VW; every
 * helper is compiled per ISA (MF_CLONES, mapformer/clones.h), its bits the same on every
 * kernel set (simd.h's vexp). */
#ifndef MAPFORMER_ROW_ATTENTION_H
#define MAPFORMER_ROW_ATTENTION_H

#include <math.h>
#include <stdint.h>

#include "mapformer/blas.h"
#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#ifndef MF_VW
#error "include mapformer/simd.h (MF_VW = MF_CLONES_VW) first"
#endif

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int64_t round_up(int64_t n) { return (n + MF_VW - 1) / MF_VW * MF_VW; }

/* max of x[0..n) (n a multiple of MF_VW). */
MF_CLONES static float max_array(const float *x, int64_t n) {
    vf m = VSPLAT(-INFINITY);
    for (int64_t j = 0; j < n; j += MF_VW) {
        const vf y = VLOADU(x + j);
        m = VSELECT(y > m, y, m);
    }
    float r = m[0];
    for (int l = 1; l < MF_VW; l++) r = m[l] > r ? m[l] : r;
    return r;
}

/* x[j] = exp(x[j] - m) for j < n (n a multiple of MF_VW); returns their sum (fixed order:
 * lanes, then across). */
MF_CLONES static float exp_sum_array(float *x, int64_t n, float m) {
    vf acc = VSPLAT(0.0f);
    for (int64_t j = 0; j < n; j += MF_VW) {
        vf y = VLOADU(x + j) - m;
        vexp(&y);
        VSTOREU(x + j, y);
        acc += y;
    }
    float sum = 0.0f;
    for (int l = 0; l < MF_VW; l++) sum += acc[l];
    return sum;
}

/* Backward: a -> P = exp(a - lse), dP -> dA = P (dP - Dv), for j < n (a multiple of MF_VW). */
MF_CLONES static void prob_da_array(float *a, float *dp, int64_t n, float lse, float dv) {
    for (int64_t j = 0; j < n; j += MF_VW) {
        vf pr = VLOADU(a + j) - lse;
        vexp(&pr);
        VSTOREU(a + j, pr);
        VSTOREU(dp + j, pr * (VLOADU(dp + j) - dv));
    }
}

/* C (m x n, ldc) = alpha op(A) op(B) + beta C, as mf_sgemm, in pieces of at most GC rows,
 * GC columns and GC depth. OpenBLAS runs a call with m n k <= 65536 * 4 = 64^3 on the
 * calling thread (interface/gemm.c: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD), so the
 * OpenMP threads of this op never wake OpenBLAS's own thread pool: with whole blocks, two
 * OpenMP threads calling the threaded OpenBLAS made the forward 15-60x slower on a 2-core
 * machine. At these sizes OpenBLAS's small-matrix kernels (no packing) take A B and A^T B
 * but not A B^T (sgemm_small_kernel_permit: a row-major A B^T is its "TN" case, refused
 * when m n > 1200), so callers pass B^T as a transposed copy instead. */
#define GC 64
static int gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    for (int64_t i0 = 0; i0 < m; i0 += GC)
        for (int64_t j0 = 0; j0 < n; j0 += GC)
            for (int64_t p0 = 0; p0 < k; p0 += GC) {
                const float *ap = ta ? a + p0 * lda + i0 : a + i0 * lda + p0;
                const float *bp = tb ? b + j0 * ldb + p0 : b + p0 * ldb + j0;
                const int st = mf_sgemm(ta, tb, min64(GC, m - i0), min64(GC, n - j0),
                                        min64(GC, k - p0), alpha, ap, lda, bp, ldb,
                                        p0 == 0 ? beta : 1.0f, c + i0 * ldc + j0, ldc);
                if (st != MF_OK) return st;
            }
    return MF_OK;
}

/* xt (D, n) with row stride ldt = x (n, D) with row stride ld, transposed. */
static void transpose(float *restrict xt, int64_t ldt, const float *restrict x, int64_t ld,
                      int64_t n, int64_t D) {
    for (int64_t t0 = 0; t0 < n; t0 += 16)
        for (int64_t d = 0; d < D; d++)
            for (int64_t t = t0; t < min64(t0 + 16, n); t++) xt[d * ldt + t] = x[t * ld + d];
}

#endif
