/* Linear layer: y = x weight^T + bias (MfLinearParams, mapformer/params.h).
 *
 * Forward saves nothing: backward needs the input x, which the caller keeps.
 * Gradient rule: dweight and dbias are parameter gradients, accumulated (+=); dx is an
 * activation gradient, written (=), or accumulated (+=) when accumulate_dx is set (a branch
 * input that also feeds the residual stream).
 *
 * Rows are cut into blocks of mf_row_block(kernels) rows (rows.h: the same blocks as mlp.c's
 * on each kernel set), each block on one OpenMP thread, so that the passes over a block's
 * rows run while they are in that core's cache; the
 * products are gemm.c's row-block kernels of the active kernel set (mf_kernels(), read once
 * per call), the weight laid out for them once per call in the caller's scratch:
 *   forward, per block:  y = bias + x weight^T (non-temporal stores for a large y: rows.h's
 *                        MF_STREAM_FLOATS, as for a large dx written, not accumulated)
 *   backward, per chunk of blocks (rows.h: mf_grad_chunks), per block in order:
 *                        dx = dy weight [+ dx]
 *                        dW_chunk += dy^T x        (the chunk's own scratch, written
 *                                                   by its first block)
 *                        column sums of dy over the block's rows, in double, into the
 *                        block's own scratch row
 *   then:                dW += the chunks' sums, db += the blocks' sums, in order
 * A weight of more than MF_LINEAR_BLOCK_WEIGHT floats (a 2048 x 2048 one took 1.1x the time
 * in 256-row blocks) is multiplied by OpenBLAS over all rows at once, on every kernel set,
 * split over the threads by rows (mf_sgemm_rows: forward after a plain bias fill; backward
 * after the block loop, which then only sums dbias).
 * The blocks and chunks depend on the sizes only, so every output has the same bits for any
 * thread count.
 *
 * Scratch (linear_forward_scratch_floats, linear_backward_scratch_floats), each part starting
 * on a 64-byte boundary:
 *   forward:   the prepared weight^T (none for a large weight)
 *   backward:  the blocks' dbias sums (blocks x Cout doubles, when dbias is given); for a
 *              weight multiplied block by block, the prepared weight, the chunks' dW sums
 *              (chunks x Cout x Cin) and, per thread, the weight-gradient product's pack
 */
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/cpu.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/threads.h"

/* largest weight (Cout * Cin floats, 1 MB) multiplied block by block */
#define MF_LINEAR_BLOCK_WEIGHT ((int64_t)1 << 18)

/* the blocks (of R rows) run on one thread unless there are at least two and the product is
 * large */
static int64_t row_blocks(int64_t N, int64_t R) { return (N + R - 1) / R; }
static int parallel(int64_t N, int64_t R, int64_t Cin, int64_t Cout) {
    return row_blocks(N, R) > 1 && N * Cin * Cout >= ((int64_t)1 << 21);
}
static int64_t block_size(int64_t N, int64_t R, int64_t b) {
    return N - b * R < R ? N - b * R : R;
}
static int blocked(const MfLinearParams *p) { return p->Cin * p->Cout <= MF_LINEAR_BLOCK_WEIGHT; }
static int valid(const MfLinearParams *p) { return p->N >= 1 && p->Cin >= 1 && p->Cout >= 1; }
/* floats rounded up to a 64-byte multiple */
static int64_t aligned(int64_t floats) { return (floats + 15) / 16 * 16; }

static int64_t forward_floats(int kernels, const MfLinearParams *p) {
    return blocked(p) ? aligned(mf_gemm_b_floats(kernels, p->Cin, p->Cout)) : 0;
}

int64_t linear_forward_scratch_floats(const MfLinearParams *p) {
    return valid(p) ? forward_floats(mf_kernels(), p) : 0;
}

int linear_forward(const MfLinearParams *p) {
    if (!valid(p)) return MF_EINVAL;
    const int64_t N = p->N, Cin = p->Cin, Cout = p->Cout;
    const int kernels = mf_kernels();
    const int64_t need = forward_floats(kernels, p);
    if (p->scratch_floats < need || (need > 0 && p->scratch == NULL)) return MF_EINVAL;
    if (!blocked(p)) { /* bias fill, then one split sgemm */
        if (p->bias != NULL) {
#pragma omp parallel for schedule(dynamic, 256) if (N * Cout >= (1 << 16))
            for (int64_t n = 0; n < N; n++)
                memcpy(p->y + n * Cout, p->bias, (size_t)Cout * sizeof(float));
        }
        return mf_sgemm_rows(0, 1, N, Cout, Cin, 1.0f, p->x, Cin, p->weight, Cin,
                             p->bias != NULL ? 1.0f : 0.0f, p->y, Cout);
    }
    float *wt = p->scratch;
    mf_gemm_prepare_b(kernels, wt, p->weight, Cin, Cout, 1); /* weight^T (Cin, Cout) */
    const int64_t R = mf_row_block(kernels), blocks = row_blocks(N, R);
    const MfGemmOptions with_bias = {.bias = p->bias, .stream = N * Cout >= MF_STREAM_FLOATS};
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (parallel(N, R, Cin, Cout))
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * R;
        /* y (rows, Cout) = bias + x (rows, Cin) . weight^T (Cin, Cout) */
        mf_record_status(&status, mf_gemm_nn(kernels, block_size(N, R, b), Cout, Cin,
                                             p->x + r0 * Cin, Cin, wt, p->y + r0 * Cout, Cout,
                                             &with_bias));
    }
    return status;
}

/* The backward's scratch: its parts' offsets and the floats per thread */
typedef struct {
    int64_t R, blocks, chunks, W;
    int64_t part, wb, dw, pack; /* offsets in floats */
    int64_t fixed, per_thread;  /* floats before the threads' packs, and per thread */
} BackwardScratch;

static BackwardScratch backward_scratch(int kernels, const MfLinearParams *p) {
    BackwardScratch s = {0};
    s.R = mf_row_block(kernels);
    s.blocks = row_blocks(p->N, s.R);
    s.W = p->Cin * p->Cout;
    /* unblocked, the loop only sums dbias: a chunk per block */
    s.chunks = blocked(p) ? mf_grad_chunks(s.blocks, s.W) : s.blocks;
    s.part = 0;
    s.wb = s.part + (p->dbias != NULL ? aligned(2 * s.blocks * p->Cout) : 0);
    if (blocked(p)) {
        s.dw = s.wb + aligned(mf_gemm_b_floats(kernels, p->Cout, p->Cin));
        s.pack = s.dw + aligned(s.chunks * s.W);
        s.per_thread = aligned(mf_gemm_tn_pack_floats(kernels, p->Cout, p->Cin));
    } else {
        s.dw = s.pack = s.wb;
    }
    s.fixed = s.pack;
    return s;
}

int64_t linear_backward_scratch_floats(const MfLinearParams *p) {
    if (!valid(p)) return 0;
    const BackwardScratch s = backward_scratch(mf_kernels(), p);
    return s.fixed + mf_max_threads() * s.per_thread;
}

int linear_backward(const MfLinearParams *p) {
    if (!valid(p)) return MF_EINVAL;
    const int64_t N = p->N, Cin = p->Cin, Cout = p->Cout;
    const int kernels = mf_kernels();
    const BackwardScratch s = backward_scratch(kernels, p);
    /* as many threads as the scratch serves */
    int threads = mf_max_threads();
    if (s.per_thread > 0 && p->scratch_floats >= s.fixed) {
        const int64_t served = (p->scratch_floats - s.fixed) / s.per_thread;
        if (served < threads) threads = (int)served;
    }
    if (p->scratch_floats < s.fixed + s.per_thread || threads < 1 ||
        (s.fixed + s.per_thread > 0 && p->scratch == NULL))
        return MF_EINVAL;
    const int64_t R = s.R, blocks = s.blocks, chunks = s.chunks, W = s.W;
    double *part = p->dbias != NULL ? (double *)(p->scratch + s.part) : NULL;
    float *wb = p->scratch + s.wb, *dw_chunks = p->scratch + s.dw;
    float *pack = p->scratch + s.pack;
    if (blocked(p)) mf_gemm_prepare_b(kernels, wb, p->weight, Cout, Cin, 0);
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) \
    if (parallel(N, R, Cin, Cout))
    for (int64_t c = 0; c < chunks; c++) {
        float *dw_c = dw_chunks + c * W;
        const int64_t b0 = c * blocks / chunks;
        for (int64_t b = b0; b < (c + 1) * blocks / chunks; b++) {
            const int64_t r0 = b * R, rows = block_size(N, R, b);
            const float *dyb = p->dy + r0 * Cout, *xb = p->x + r0 * Cin;
            if (blocked(p)) {
                /* dx (rows, Cin) = dy (rows, Cout) . weight (Cout, Cin) [+ dx], prefetching
                 * x's rows for dW's product */
                const MfGemmOptions o = {.accumulate = p->accumulate_dx,
                                         .stream = !p->accumulate_dx &&
                                                   N * Cin >= MF_STREAM_FLOATS,
                                         .prefetch = xb,
                                         .prefetch_floats = rows * Cin};
                mf_record_status(&status, mf_gemm_nn(kernels, rows, Cin, Cout, dyb, Cout, wb,
                                                     p->dx + r0 * Cin, Cin, &o));
                /* dW_chunk (Cout, Cin) [+]= dy^T (Cout, rows) . x (rows, Cin), from the
                 * chunk's first block */
                float *pk = pack + mf_thread_id() * s.per_thread;
                mf_record_status(&status, mf_gemm_tn(kernels, Cout, Cin, rows, dyb, Cout, xb,
                                                     Cin, dw_c, Cin, b > b0, pk));
            }
            if (part != NULL) mf_column_sums(part + b * Cout, dyb, rows, Cout);
        }
    }
    if (status != MF_OK) return status;
    if (blocked(p)) {
        mf_add_chunks(p->dweight, dw_chunks, chunks, W, W);
    } else {
        status = mf_sgemm_rows(0, 0, N, Cin, Cout, 1.0f, p->dy, Cout, p->weight, Cin,
                               p->accumulate_dx ? 1.0f : 0.0f, p->dx, Cin);
        /* dweight (Cout, Cin) += dy^T (Cout, N) . x (N, Cin) */
        if (status == MF_OK)
            status = mf_sgemm_rows(1, 0, Cout, Cin, N, 1.0f, p->dy, Cout, p->x, Cin, 1.0f,
                                   p->dweight, Cin);
        if (status != MF_OK) return status;
    }
    if (part != NULL) mf_add_block_sums(p->dbias, part, blocks, Cout, Cout);
    return MF_OK;
}
