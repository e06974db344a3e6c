/* Linear layer: y = x weight^T + bias.
 *
 * Forward saves nothing: backward needs the input x, which the caller keeps.
 * Gradient rule: dweight and dbias are parameter gradients, accumulated (+=); dx is an
 * activation gradient, written (=), or accumulated (+=) when accumulate_dx is set (a branch
 * input that also feeds the residual stream).
 *
 * Rows are cut into blocks of MF_LINEAR_ROWS, each block on one OpenMP thread, so that the
 * passes over a block's rows run while they are in that core's cache (as in mlp.c); the
 * products are gemm.c's row-block kernels (the weight laid out for them once per call):
 *   forward, per block:  y = bias + x weight^T
 *   backward, per chunk of blocks (rows.h: mf_grad_chunks), per block in order:
 *                        dx = dy weight [+ dx]
 *                        dW_chunk += dy^T x        (the chunk's own scratch)
 *                        column sums of dy over the block's rows, in double, into the
 *                        block's own scratch row
 *   then:                dW += the chunks' sums, db += the blocks' sums, in order
 * A weight of more than MF_LINEAR_BLOCK_WEIGHT floats (a 2048 x 2048 one took 1.1x the time
 * in 256-row blocks) is multiplied by OpenBLAS over all rows at once, split over the threads
 * by rows (mf_sgemm_rows: forward after a plain bias fill; backward after the block loop,
 * which then only sums dbias).
 * The blocks and chunks depend on the sizes only, so every output has the same bits for any
 * thread count.
 */
#include <stdlib.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/clones.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/threads.h"

/* rows per block: at Cout = 128 a block of y or dy is 128 KB */
#define MF_LINEAR_ROWS 256
/* largest weight (Cout * Cin floats, 1 MB) multiplied block by block */
#define MF_LINEAR_BLOCK_WEIGHT ((int64_t)1 << 18)

/* the blocks run on one thread unless there are at least two and the product is large */
static int64_t row_blocks(int64_t N) { return (N + MF_LINEAR_ROWS - 1) / MF_LINEAR_ROWS; }
static int parallel(int64_t N, int64_t Cin, int64_t Cout) {
    return row_blocks(N) > 1 && N * Cin * Cout >= ((int64_t)1 << 21);
}
static int64_t block_size(int64_t N, int64_t b) {
    const int64_t r0 = b * MF_LINEAR_ROWS;
    return N - r0 < MF_LINEAR_ROWS ? N - r0 : MF_LINEAR_ROWS;
}

int linear_forward(float *y, const float *x, const float *weight, const float *bias, int64_t N,
                   int64_t Cin, int64_t Cout) {
    if (N < 1 || Cin < 1 || Cout < 1) return MF_EINVAL;
    if (Cin * Cout > MF_LINEAR_BLOCK_WEIGHT) { /* bias fill, then one split sgemm */
        if (bias != NULL) {
#pragma omp parallel for schedule(dynamic, 256) if (N * Cout >= (1 << 16))
            for (int64_t n = 0; n < N; n++)
                memcpy(y + n * Cout, bias, (size_t)Cout * sizeof(float));
        }
        return mf_sgemm_rows(0, 1, N, Cout, Cin, 1.0f, x, Cin, weight, Cin,
                             bias != NULL ? 1.0f : 0.0f, y, Cout);
    }
    const int fast = mf_use_avx512();
    float *wt = malloc((size_t)mf_gemm_b_floats(Cin, Cout) * sizeof(float));
    if (wt == NULL) return MF_ENOMEM;
    mf_gemm_prepare_b(fast, wt, weight, Cin, Cout, 1); /* weight^T (Cin, Cout) */
    const int64_t blocks = row_blocks(N);
    const MfGemmOptions with_bias = {.bias = bias};
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (parallel(N, Cin, Cout))
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * MF_LINEAR_ROWS;
        /* y (rows, Cout) = bias + x (rows, Cin) . weight^T (Cin, Cout) */
        mf_record_status(&status, mf_gemm_nn(fast, block_size(N, b), Cout, Cin, x + r0 * Cin, Cin,
                                  wt, y + r0 * Cout, Cout, &with_bias));
    }
    free(wt);
    return status;
}

int linear_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                    const float *weight, int64_t N, int64_t Cin, int64_t Cout, int accumulate_dx) {
    if (N < 1 || Cin < 1 || Cout < 1) return MF_EINVAL;
    const int64_t blocks = row_blocks(N), W = Cin * Cout;
    const int blocked = W <= MF_LINEAR_BLOCK_WEIGHT;
    /* unblocked, the loop only sums dbias: a chunk per block */
    const int64_t chunks = blocked ? mf_grad_chunks(blocks, W) : blocks;
    const int fast = mf_use_avx512();
    const int64_t pack_floats = mf_gemm_tn_pack_floats(Cout, Cin);
    /* scratch first, so that running out of memory leaves every output untouched */
    double *part = dbias != NULL ? malloc((size_t)(blocks * Cout) * sizeof(double)) : NULL;
    float *wb = blocked ? malloc((size_t)mf_gemm_b_floats(Cout, Cin) * sizeof(float)) : NULL;
    float *dw_chunks = blocked ? calloc((size_t)(chunks * W), sizeof(float)) : NULL;
    float *pack = blocked ? malloc((size_t)(mf_max_threads() * pack_floats) * sizeof(float))
                          : NULL;
    int status = MF_OK;
    if ((dbias != NULL && part == NULL) ||
        (blocked && (wb == NULL || dw_chunks == NULL || pack == NULL))) {
        status = MF_ENOMEM;
        goto done;
    }
    if (blocked) mf_gemm_prepare_b(fast, wb, weight, Cout, Cin, 0);
#pragma omp parallel for schedule(dynamic, 1) if (parallel(N, Cin, Cout))
    for (int64_t c = 0; c < chunks; c++) {
        for (int64_t b = c * blocks / chunks; b < (c + 1) * blocks / chunks; b++) {
            const int64_t r0 = b * MF_LINEAR_ROWS, rows = block_size(N, b);
            const float *dyb = dy + r0 * Cout;
            if (blocked) {
                /* dx (rows, Cin) = dy (rows, Cout) . weight (Cout, Cin) [+ dx], prefetching
                 * x's rows for dW's product */
                const MfGemmOptions o = {.accumulate = accumulate_dx,
                                         .prefetch = x + r0 * Cin,
                                         .prefetch_floats = rows * Cin};
                mf_record_status(&status, mf_gemm_nn(fast, rows, Cin, Cout, dyb, Cout, wb,
                                                     dx + r0 * Cin, Cin, &o));
                /* dW_chunk (Cout, Cin) += dy^T (Cout, rows) . x (rows, Cin) */
                float *pk = pack + mf_thread_id() * pack_floats;
                mf_record_status(&status, mf_gemm_tn(fast, Cout, Cin, rows, dyb, Cout, x + r0 * Cin,
                                                     Cin, dw_chunks + c * W, Cin, pk));
            }
            if (part != NULL) mf_column_sums(part + b * Cout, dyb, rows, Cout);
        }
    }
    if (status != MF_OK) goto done;
    if (blocked) {
        mf_add_chunks(dweight, dw_chunks, chunks, W, W);
    } else {
        status = mf_sgemm_rows(0, 0, N, Cin, Cout, 1.0f, dy, Cout, weight, Cin,
                               accumulate_dx ? 1.0f : 0.0f, dx, Cin);
        /* dweight (Cout, Cin) += dy^T (Cout, N) . x (N, Cin) */
        if (status == MF_OK)
            status = mf_sgemm_rows(1, 0, Cout, Cin, N, 1.0f, dy, Cout, x, Cin, 1.0f, dweight,
                                   Cin);
        if (status != MF_OK) goto done;
    }
    if (dbias != NULL) mf_add_block_sums(dbias, part, blocks, Cout, Cout);
done:
    free(part);
    free(wb);
    free(dw_chunks);
    free(pack);
    return status;
}
