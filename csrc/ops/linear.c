/* Linear layer: y = x weight^T + bias.
 *
 * Forward saves nothing: backward needs the input x, which the caller keeps.
 * Gradient rule: dweight and dbias are parameter gradients, accumulated (+=); dx is an
 * activation gradient, written (=), or accumulated (+=) when accumulate_dx is set (a branch
 * input that also feeds the residual stream).
 *
 * Rows are cut into blocks of MF_LINEAR_ROWS, spread over the OpenMP threads, each block on
 * one thread, so that the passes over a block's rows run while they are in that core's cache
 * (as in mlp.c):
 *   forward, per block:  y = bias (broadcast), then y += x weight^T  (sgemm, beta 1: the bias
 *                        fill replaces the zero fill sgemm does for beta 0, so the add is free)
 *   backward, per block: dx = dy weight  (sgemm, beta 0 or 1)
 *                        column sums of dy over the block's rows, in double, into the
 *                        block's own scratch row
 *   then:                dW += dy^T x    (mf_sgemm_rows: rows of dW over the threads)
 *                        db += the block sums, added in block order
 * Each block's sgemm packs the whole weight again, which is cheap while it fits in L2; a
 * weight of more than MF_LINEAR_BLOCK_WEIGHT floats (a 2048 x 2048 one took 1.1x the time in
 * 256-row blocks) is multiplied in one mf_sgemm_rows call instead (forward: after a plain bias
 * fill; backward: after the block loop, which then only sums dbias).
 * The blocks depend on N only, so db, and y and dx where the weight is blocked, have the same
 * bits for any thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"

/* rows per block: at Cout = 128 a block of y or dy is 128 KB */
#define MF_LINEAR_ROWS 256
/* largest weight (Cout * Cin floats, 1 MB) multiplied block by block */
#define MF_LINEAR_BLOCK_WEIGHT ((int64_t)1 << 18)

/* the blocks run on one thread unless there are at least two and the product is large */
static int64_t row_blocks(int64_t N) { return (N + MF_LINEAR_ROWS - 1) / MF_LINEAR_ROWS; }
static int parallel(int64_t N, int64_t Cin, int64_t Cout) {
    return row_blocks(N) > 1 && N * Cin * Cout >= ((int64_t)1 << 21);
}

int linear_forward(float *y, const float *x, const float *weight, const float *bias, int64_t N,
                   int64_t Cin, int64_t Cout) {
    if (N < 1 || Cin < 1 || Cout < 1) return MF_EINVAL;
    const float beta = bias != NULL ? 1.0f : 0.0f;
    if (Cin * Cout > MF_LINEAR_BLOCK_WEIGHT) { /* bias fill, then one split sgemm */
        if (bias != NULL) {
#pragma omp parallel for schedule(dynamic, 256) if (N * Cout >= (1 << 16))
            for (int64_t n = 0; n < N; n++)
                memcpy(y + n * Cout, bias, (size_t)Cout * sizeof(float));
        }
        return mf_sgemm_rows(0, 1, N, Cout, Cin, 1.0f, x, Cin, weight, Cin, beta, y, Cout);
    }
    const int64_t blocks = row_blocks(N);
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (parallel(N, Cin, Cout))
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * MF_LINEAR_ROWS;
        const int64_t rows = N - r0 < MF_LINEAR_ROWS ? N - r0 : MF_LINEAR_ROWS;
        float *yb = y + r0 * Cout;
        if (bias != NULL) mf_fill_rows(yb, bias, rows, Cout);
        /* y (rows, Cout) = x (rows, Cin) . weight^T (Cin, Cout) [+ y] */
        int st = mf_sgemm(0, 1, rows, Cout, Cin, 1.0f, x + r0 * Cin, Cin, weight, Cin, beta,
                          yb, Cout);
        if (st != MF_OK) {
#pragma omp atomic write
            status = st;
        }
    }
    return status;
}

int linear_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                    const float *weight, int64_t N, int64_t Cin, int64_t Cout, int accumulate_dx) {
    if (N < 1 || Cin < 1 || Cout < 1) return MF_EINVAL;
    const int64_t blocks = row_blocks(N);
    /* scratch first, so that running out of memory leaves every output untouched */
    double *part = NULL;
    if (dbias != NULL) {
        part = malloc((size_t)blocks * (size_t)Cout * sizeof(double));
        if (part == NULL) return MF_ENOMEM;
    }
    const int blocked = Cin * Cout <= MF_LINEAR_BLOCK_WEIGHT;
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (parallel(N, Cin, Cout))
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * MF_LINEAR_ROWS;
        const int64_t rows = N - r0 < MF_LINEAR_ROWS ? N - r0 : MF_LINEAR_ROWS;
        int st = MF_OK;
        /* dx (rows, Cin) = dy (rows, Cout) . weight (Cout, Cin) [+ dx] */
        if (blocked)
            st = mf_sgemm(0, 0, rows, Cin, Cout, 1.0f, dy + r0 * Cout, Cout, weight, Cin, beta,
                          dx + r0 * Cin, Cin);
        if (part != NULL) mf_column_sums(part + b * Cout, dy + r0 * Cout, rows, Cout);
        if (st != MF_OK) {
#pragma omp atomic write
            status = st;
        }
    }
    if (!blocked && status == MF_OK)
        status = mf_sgemm_rows(0, 0, N, Cin, Cout, 1.0f, dy, Cout, weight, Cin, beta, dx, Cin);
    if (status != MF_OK) goto done;
    /* dweight (Cout, Cin) += dy^T (Cout, N) . x (N, Cin) */
    status = mf_sgemm_rows(1, 0, Cout, Cin, N, 1.0f, dy, Cout, x, Cin, 1.0f, dweight, Cin);
    if (status != MF_OK) goto done;
    if (dbias != NULL) {
        for (int64_t c = 0; c < Cout; c++) {
            double s = 0.0;
            for (int64_t b = 0; b < blocks; b++) s += part[b * Cout + c];
            dbias[c] = (float)((double)dbias[c] + s);
        }
    }
done:
    free(part);
    return status;
}
