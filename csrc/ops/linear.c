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
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/clones.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/scratch.h"
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

/* the weight laid out for mf_gemm_nn, unless it is multiplied by OpenBLAS */
int64_t linear_forward_scratch_floats(const MfLinearParams *p) {
    return p->Cin * p->Cout > MF_LINEAR_BLOCK_WEIGHT ? 0 : mf_gemm_b_floats(p->Cin, p->Cout);
}

int linear_forward(const MfLinearParams *p) {
    float *y = p->y;
    const float *x = p->x, *weight = p->weight, *bias = p->bias;
    const int64_t N = p->N, Cin = p->Cin, Cout = p->Cout;
    if (N < 1 || Cin < 1 || Cout < 1 || p->scratch_floats < linear_forward_scratch_floats(p))
        return MF_EINVAL;
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
    float *wt = p->scratch;
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
    return status;
}

/* The scratch of linear_backward, carved in this order: dbias's block sums (blocks * Cout
 * doubles, with dbias), and when blocked the weight laid out for mf_gemm_nn, the chunks'
 * weight gradients and one pack of mf_gemm_tn per thread; *pack_floats is that pack. */
static int64_t backward_floats(const MfLinearParams *p, int64_t *pack_floats, int threads) {
    const int64_t blocks = row_blocks(p->N), W = p->Cin * p->Cout;
    *pack_floats = mf_scratch_size(mf_gemm_tn_pack_floats(p->Cout, p->Cin));
    int64_t n = p->dbias != NULL ? mf_scratch_size(2 * blocks * p->Cout) : 0;
    if (W <= MF_LINEAR_BLOCK_WEIGHT)
        n += mf_scratch_size(mf_gemm_b_floats(p->Cout, p->Cin)) +
             mf_scratch_size(mf_grad_chunks(blocks, W) * W) + threads * *pack_floats;
    return n;
}

int64_t linear_backward_scratch_floats(const MfLinearParams *p) {
    int64_t pack_floats;
    return backward_floats(p, &pack_floats, mf_max_threads());
}

int linear_backward(const MfLinearParams *p) {
    float *dx = p->dx, *dweight = p->dweight, *dbias = p->dbias;
    const float *dy = p->dy, *x = p->x, *weight = p->weight;
    const int64_t N = p->N, Cin = p->Cin, Cout = p->Cout;
    const int accumulate_dx = p->accumulate_dx;
    if (N < 1 || Cin < 1 || Cout < 1) return MF_EINVAL;
    const int64_t blocks = row_blocks(N), W = Cin * Cout;
    const int blocked = W <= MF_LINEAR_BLOCK_WEIGHT;
    /* unblocked, the loop only sums dbias: a chunk per block */
    const int64_t chunks = blocked ? mf_grad_chunks(blocks, W) : blocks;
    const int fast = mf_use_avx512();
    int64_t pack_floats;
    const int64_t shared = backward_floats(p, &pack_floats, 0);
    const int nt = blocked ? mf_scratch_threads(p->scratch_floats - shared, pack_floats)
                           : mf_max_threads();
    if (nt < 1 || p->scratch_floats < shared) return MF_EINVAL;
    float *at = p->scratch;
    double *part = dbias != NULL ? (double *)mf_scratch_take(&at, 2 * blocks * Cout) : NULL;
    float *wb = blocked ? mf_scratch_take(&at, mf_gemm_b_floats(Cout, Cin)) : NULL;
    float *dw_chunks = blocked ? mf_scratch_take(&at, chunks * W) : NULL;
    float *pack = at;
    int status = MF_OK;
    if (blocked) memset(dw_chunks, 0, (size_t)(chunks * W) * sizeof(float));
    if (blocked) mf_gemm_prepare_b(fast, wb, weight, Cout, Cin, 0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (parallel(N, Cin, Cout))
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
    if (status != MF_OK) return status;
    if (blocked) {
        mf_add_chunks(dweight, dw_chunks, chunks, W, W);
    } else {
        status = mf_sgemm_rows(0, 0, N, Cin, Cout, 1.0f, dy, Cout, weight, Cin,
                               accumulate_dx ? 1.0f : 0.0f, dx, Cin);
        /* dweight (Cout, Cin) += dy^T (Cout, N) . x (N, Cin) */
        if (status == MF_OK)
            status = mf_sgemm_rows(1, 0, Cout, Cin, N, 1.0f, dy, Cout, x, Cin, 1.0f, dweight,
                                   Cin);
        if (status != MF_OK) return status;
    }
    if (dbias != NULL) mf_add_block_sums(dbias, part, blocks, Cout, Cout);
    return status;
}
