/* MLP: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj, the transformer block's feed-forward
 * branch (F = mlp_ratio * C hidden units), fused in row blocks.
 *
 * Forward saves h = x w_fc^T + b_fc (the pre-activation, for gelu') and g = gelu(h) (the
 * input of w_proj, for its gradient). Gradient rule: dw_fc, db_fc, dw_proj, db_proj are
 * parameter gradients, accumulated (+=); dx is an activation gradient, written (=).
 *
 * The rows are cut into blocks (block_rows: 256 at the default sizes), spread over the
 * OpenMP threads, each block on one thread. A block's slices of h, g and dh (256 x F floats
 * each at the default sizes) stay in that core's L2 cache from the product that writes them
 * to the GELU and the product that reads them, where separate linear and gelu ops send each
 * (N, F) array to memory and back. Measured: on a quiet 2-core machine the op is on par with
 * the separate ops (the products dominate); on a loaded one it was 0.78x (forward) and 0.91x
 * (backward).
 *
 *   forward, per block:  h = b_fc (broadcast); h += x w_fc^T      (sgemm, beta 1)
 *                        g = gelu(h)                              (gelu.c's kernel)
 *                        y = b_proj (broadcast); y += g w_proj^T  (sgemm, beta 1)
 *   backward, per block: dh = dy w_proj                           (sgemm)
 *                        dh *= gelu'(h)                           (gelu.c's kernel)
 *                        dx = dh w_fc                             (sgemm)
 *                        column sums of dh and of dy over the block's rows, in double,
 *                        into the block's own scratch rows
 *   then, over all rows: dw_proj += dy^T g, dw_fc += dh^T x       (mf_sgemm_rows)
 *                        db_fc, db_proj += the block sums, added in block order
 * The blocks depend on N, C and F only, so y, h, g, dx and the bias gradients have the same
 * bits for any thread count; the weight gradients are split over the threads by rows as in
 * linear_backward. Each number is the one linear_forward/backward and gelu_forward/backward
 * compute, up to float32 rounding in the sgemm's blocking.
 */
#include <stdlib.h>

#include "mapformer/blas.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"

/* rows per block: a block's h and g (forward) or dh (backward) are 512 KB each at F = 512,
 * which fits the 2 MB L2 beside the packed weights; measured on the loaded 2-vCPU machine,
 * 256 rows ran the MLP forward in 0.78x and backward in 0.91x the time of separate linear
 * and gelu ops (128 rows: 0.95x and 0.96x; 512 rows: 0.85x and 0.92x) */
#define MF_MLP_ROWS 256

/* Rows per block for N rows and C x F weights: MF_MLP_ROWS up to C * F = 2^16 floats (the
 * model's default 128 x 512), then in proportion to the weights, so that the sgemm's packing
 * of the weights, done once per block, stays a small part of the block's work; but at most
 * N / 8 rows (and at least MF_MLP_ROWS), so that the threads still share 8 or more blocks.
 * With 256-row blocks, C = 512 (N = 16384) took 1.10x the time of the separate linear and
 * gelu ops; with these blocks, 1.00x forward and 1.02x backward, and C = 256 0.95x and 0.99x
 * (benchmarks/bench_ops.py --families mlp --mlp-rows 16384 --mlp-width C).
 * A function of the sizes only: the bits do not depend on the thread count. */
static int64_t block_rows(int64_t N, int64_t C, int64_t F) {
    const int64_t scale = C * F >> 16;
    int64_t rows = scale > 1 ? MF_MLP_ROWS * scale : MF_MLP_ROWS;
    const int64_t eighth = (N + 7) / 8;
    if (rows > eighth) rows = eighth > MF_MLP_ROWS ? eighth : MF_MLP_ROWS;
    return rows;
}

int mlp_forward(float *y, float *h, float *g, const float *x, const float *w_fc,
                const float *b_fc, const float *w_proj, const float *b_proj, int64_t N,
                int64_t C, int64_t F) {
    if (N < 1 || C < 1 || F < 1) return MF_EINVAL;
    const int64_t R = block_rows(N, C, F), blocks = (N + R - 1) / R;
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * R;
        const int64_t rows = N - r0 < R ? N - r0 : R;
        float *hb = h + r0 * F, *gb = g + r0 * F, *yb = y + r0 * C;
        mf_fill_rows(hb, b_fc, rows, F);
        /* h (rows, F) += x (rows, C) . w_fc^T (C, F) */
        int st = mf_sgemm(0, 1, rows, F, C, 1.0f, x + r0 * C, C, w_fc, C, 1.0f, hb, F);
        mf_gelu_kernel(gb, hb, rows * F);
        mf_fill_rows(yb, b_proj, rows, C);
        /* y (rows, C) += g (rows, F) . w_proj^T (F, C) */
        if (st == MF_OK) st = mf_sgemm(0, 1, rows, C, F, 1.0f, gb, F, w_proj, F, 1.0f, yb, C);
        if (st != MF_OK) {
#pragma omp atomic write
            status = st;
        }
    }
    return status;
}

int mlp_backward(float *dx, float *dw_fc, float *db_fc, float *dw_proj, float *db_proj,
                 float *dh, const float *dy, const float *h, const float *g, const float *x,
                 const float *w_fc, const float *w_proj, int64_t N, int64_t C, int64_t F) {
    if (N < 1 || C < 1 || F < 1) return MF_EINVAL;
    const int64_t R = block_rows(N, C, F), blocks = (N + R - 1) / R;
    /* scratch first, so that running out of memory leaves every output untouched:
     * per block, F sums of dh then C sums of dy */
    double *part = malloc((size_t)blocks * (size_t)(F + C) * sizeof(double));
    if (part == NULL) return MF_ENOMEM;
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (blocks > 1)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * R;
        const int64_t rows = N - r0 < R ? N - r0 : R;
        const float *dyb = dy + r0 * C;
        float *dhb = dh + r0 * F;
        /* dh (rows, F) = dy (rows, C) . w_proj (C, F) */
        int st = mf_sgemm(0, 0, rows, F, C, 1.0f, dyb, C, w_proj, F, 0.0f, dhb, F);
        if (st == MF_OK) {
            mf_gelu_grad_kernel(dhb, h + r0 * F, rows * F);
            /* dx (rows, C) = dh (rows, F) . w_fc (F, C) */
            st = mf_sgemm(0, 0, rows, C, F, 1.0f, dhb, F, w_fc, C, 0.0f, dx + r0 * C, C);
            mf_column_sums(part + b * (F + C), dhb, rows, F);
            mf_column_sums(part + b * (F + C) + F, dyb, rows, C);
        }
        if (st != MF_OK) {
#pragma omp atomic write
            status = st;
        }
    }
    if (status != MF_OK) goto done;
    /* dw_proj (C, F) += dy^T (C, N) . g (N, F) */
    status = mf_sgemm_rows(1, 0, C, F, N, 1.0f, dy, C, g, F, 1.0f, dw_proj, F);
    if (status != MF_OK) goto done;
    /* dw_fc (F, C) += dh^T (F, N) . x (N, C) */
    status = mf_sgemm_rows(1, 0, F, C, N, 1.0f, dh, F, x, C, 1.0f, dw_fc, C);
    if (status != MF_OK) goto done;
    for (int64_t c = 0; c < F + C; c++) {
        double s = 0.0;
        for (int64_t b = 0; b < blocks; b++) s += part[b * (F + C) + c];
        float *d = c < F ? db_fc + c : db_proj + (c - F);
        *d = (float)((double)*d + s);
    }
done:
    free(part);
    return status;
}
