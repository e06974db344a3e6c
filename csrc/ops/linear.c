/* Linear layer: y = x weight^T + bias.
 *
 * Forward saves nothing: backward needs the input x, which the caller keeps.
 * Gradient rule: dweight and dbias are parameter gradients, accumulated (+=); dx is an
 * activation gradient, written (=), or accumulated (+=) when accumulate_dx is set (a branch
 * input that also feeds the residual stream).
 *
 * The three products go through mf_sgemm_rows (rows of the result split over the threads).
 *
 *   forward:  y  = bias (broadcast), then y += x weight^T   (one sgemm with beta = 1: the bias
 *             fill replaces the zero fill sgemm would do for beta = 0, so the add is free)
 *   backward: dx  = dy weight          (sgemm, beta 0 or 1)
 *             dW += dy^T x             (sgemm, beta 1)
 *             db += sum_n dy[n, :]     (rows cut into at most MF_LINEAR_DB_BLOCKS blocks, a
 *                                       function of N only; each block sums its rows in double
 *                                       into its own scratch row, read in contiguous order, and
 *                                       the blocks are combined in block order: race-free and
 *                                       the same bits for any thread count)
 */
#include <stdlib.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/mapformer.h"

/* Row blocks of the dbias reduction (scratch: blocks * Cout doubles). */
#define MF_LINEAR_DB_BLOCKS 64

int linear_forward(float *y, const float *x, const float *weight, const float *bias, int64_t N,
                   int64_t Cin, int64_t Cout) {
    if (N < 1 || Cin < 1 || Cout < 1) return MF_EINVAL;
    if (bias != NULL) {
#pragma omp parallel for schedule(dynamic, 256) if (N * Cout >= (1 << 16))
        for (int64_t n = 0; n < N; n++) memcpy(y + n * Cout, bias, (size_t)Cout * sizeof(float));
    }
    /* y (N, Cout) = x (N, Cin) . weight^T (Cin, Cout) [+ y] */
    return mf_sgemm_rows(0, 1, N, Cout, Cin, 1.0f, x, Cin, weight, Cin,
                         bias != NULL ? 1.0f : 0.0f, y, Cout);
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MF_LINEAR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MF_LINEAR_CLONES
#endif

/* part (Cout,) = sum of dy rows [r0, r1), in double, in row order */
MF_LINEAR_CLONES
static void row_block_sums(double *restrict part, const float *restrict dy, int64_t r0,
                           int64_t r1, int64_t Cout) {
    for (int64_t c = 0; c < Cout; c++) part[c] = 0.0;
    for (int64_t n = r0; n < r1; n++) {
        const float *row = dy + n * Cout;
        for (int64_t c = 0; c < Cout; c++) part[c] += (double)row[c];
    }
}

int linear_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                    const float *weight, int64_t N, int64_t Cin, int64_t Cout, int accumulate_dx) {
    if (N < 1 || Cin < 1 || Cout < 1) return MF_EINVAL;
    /* scratch first, so that running out of memory leaves every output untouched */
    const int64_t nb = N < MF_LINEAR_DB_BLOCKS ? N : MF_LINEAR_DB_BLOCKS;
    double *part = NULL;
    if (dbias != NULL) {
        part = malloc((size_t)nb * (size_t)Cout * sizeof(double));
        if (part == NULL) return MF_ENOMEM;
    }
    int status;
    /* dx (N, Cin) = dy (N, Cout) . weight (Cout, Cin) [+ dx] */
    status = mf_sgemm_rows(0, 0, N, Cin, Cout, 1.0f, dy, Cout, weight, Cin,
                      accumulate_dx ? 1.0f : 0.0f, dx, Cin);
    if (status != MF_OK) goto done;
    /* dweight (Cout, Cin) += dy^T (Cout, N) . x (N, Cin) */
    status = mf_sgemm_rows(1, 0, Cout, Cin, N, 1.0f, dy, Cout, x, Cin, 1.0f, dweight, Cin);
    if (status != MF_OK) goto done;
    if (dbias != NULL) {
#pragma omp parallel for schedule(dynamic, 1) if (N * Cout >= (1 << 16))
        for (int64_t b = 0; b < nb; b++)
            row_block_sums(part + b * Cout, dy, N * b / nb, N * (b + 1) / nb, Cout);
        for (int64_t c = 0; c < Cout; c++) {
            double s = 0.0;
            for (int64_t b = 0; b < nb; b++) s += part[b * Cout + c];
            dbias[c] = (float)((double)dbias[c] + s);
        }
    }
done:
    free(part);
    return status;
}
