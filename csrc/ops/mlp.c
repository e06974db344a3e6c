/* MLP: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj, the transformer block's feed-forward
 * branch (F = mlp_ratio * C hidden units), fused in row blocks.
 *
 * Forward saves only h = x w_fc^T + b_fc (the pre-activation); backward recomputes
 * g = gelu(h) (the input of w_proj, for its gradient) in the same pass as gelu'(h), from the
 * same exponential. Gradient rule: dw_fc, db_fc, dw_proj, db_proj are parameter gradients,
 * accumulated (+=); dx is an activation gradient, written (=).
 *
 * The rows are cut into blocks of MF_MLP_ROWS, each block on one OpenMP thread. A block's
 * g and dh (MF_MLP_ROWS x F floats, 512 KB each at F = 512) live in that thread's own
 * scratch, in its core's L2 cache, from the product that writes them to the products that
 * read them: of the (N, F) arrays only h goes to memory (written forward, read backward),
 * where separate linear and gelu ops would also write and read g, dg and dh. The products
 * are gemm.c's row-block kernels (the weights laid out for them once per call):
 *   forward, per block:  h = b_fc + x w_fc^T, and g = gelu(h) from the same registers
 *                        (h's stores non-temporal: the backward reads it next)
 *                        y = b_proj + g w_proj^T
 *   backward, per chunk of blocks (rows.h: mf_grad_chunks), per block in order:
 *                        dh = dy w_proj
 *                        g = gelu(h), dh *= gelu'(h)              (gelu.c's kernel)
 *                        dx = dh w_fc
 *                        dw_proj_chunk += dy^T g, dw_fc_chunk += dh^T x  (the chunk's own
 *                        scratch)
 *                        column sums of dh and of dy over the block's rows, in double,
 *                        into the block's own scratch rows
 *   then:                dw_proj, dw_fc += the chunks' sums; db_fc, db_proj += the blocks'
 *                        sums, added in order
 * The blocks and chunks depend on N, C and F only, so every output has the same bits for any
 * thread count. Each number is the one linear_forward/backward and gelu_forward/backward
 * compute, up to float32 rounding in the products' order.
 */
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

/* rows per block: a block's g and dh are 512 KB each at F = 512, in the 2 MB L2 beside the
 * weights' panels */
#define MF_MLP_ROWS 256


/* w_fc^T (C, F), then w_proj^T (F, C), laid out for mf_gemm_nn; then a block of g per thread */
static int64_t forward_shared(const MfMlpParams *p) {
    return mf_scratch_size(mf_gemm_b_floats(p->C, p->F) + mf_gemm_b_floats(p->F, p->C));
}
static int64_t forward_per_thread(const MfMlpParams *p) {
    return mf_scratch_size(MF_MLP_ROWS * p->F);
}

int64_t mlp_forward_scratch_floats(const MfMlpParams *p) {
    return forward_shared(p) + mf_max_threads() * forward_per_thread(p);
}

int mlp_forward(const MfMlpParams *p) {
    float *y = p->y, *h = p->h;
    const float *x = p->x, *w_fc = p->w_fc, *b_fc = p->b_fc, *w_proj = p->w_proj;
    const float *b_proj = p->b_proj;
    const int64_t N = p->N, C = p->C, F = p->F;
    if (N < 1 || C < 1 || F < 1) return MF_EINVAL;
    const int64_t R = MF_MLP_ROWS, blocks = (N + R - 1) / R;
    const int fast = mf_use_avx512();
    const int64_t fc_floats = mf_gemm_b_floats(C, F), per = forward_per_thread(p);
    const int nt = mf_scratch_threads(p->scratch_floats - forward_shared(p), per);
    if (nt < 1) return MF_EINVAL;
    float *wt = p->scratch, *g = p->scratch + forward_shared(p);
    int status = MF_OK;
    const float *w_fc_t = wt, *w_proj_t = wt + fc_floats;
    mf_gemm_prepare_b(fast, wt, w_fc, C, F, 1);
    mf_gemm_prepare_b(fast, wt + fc_floats, w_proj, F, C, 1);
    const MfGemmOptions proj = {.bias = b_proj};
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (blocks > 1)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * R;
        const int64_t rows = N - r0 < R ? N - r0 : R;
        float *gb = g + mf_thread_id() * per;
        /* h (rows, F) = b_fc + x (rows, C) . w_fc^T (C, F), and g = gelu(h) from the same
         * registers; h is next read by the backward, so it streams past the cache */
        const MfGemmOptions fc = {.bias = b_fc, .gelu = gb, .stream = 1};
        mf_record_status(&status, mf_gemm_nn(fast, rows, F, C, x + r0 * C, C, w_fc_t, h + r0 * F, F,
                                  &fc));
        /* y (rows, C) = b_proj + g (rows, F) . w_proj^T (F, C) */
        mf_record_status(&status, mf_gemm_nn(fast, rows, C, F, gb, F, w_proj_t, y + r0 * C, C,
                                  &proj));
    }
    return status;
}

/* The scratch of mlp_backward, carved in this order: per block, F sums of dh then C sums of
 * dy (doubles); w_proj (C, F) then w_fc (F, C) laid out for mf_gemm_nn; per chunk, dw_proj's
 * sums then dw_fc's; then per thread a block of g, a block of dh and the weight-gradient
 * product's pack (*per_thread floats). */
static int64_t backward_shared(const MfMlpParams *p, int64_t *per_thread) {
    const int64_t R = MF_MLP_ROWS, blocks = (p->N + R - 1) / R, W = p->C * p->F;
    const int64_t wide = p->F > p->C ? p->F : p->C;
    *per_thread = mf_scratch_size(2 * R * p->F + mf_gemm_tn_pack_floats(wide, wide));
    return mf_scratch_size(2 * blocks * (p->F + p->C)) +
           mf_scratch_size(mf_gemm_b_floats(p->C, p->F) + mf_gemm_b_floats(p->F, p->C)) +
           mf_scratch_size(mf_grad_chunks(blocks, 2 * W) * 2 * W);
}

int64_t mlp_backward_scratch_floats(const MfMlpParams *p) {
    int64_t per_thread;
    const int64_t shared = backward_shared(p, &per_thread);
    return shared + mf_max_threads() * per_thread;
}

int mlp_backward(const MfMlpParams *p) {
    float *dx = p->dx, *dw_fc = p->dw_fc, *db_fc = p->db_fc, *dw_proj = p->dw_proj;
    float *db_proj = p->db_proj;
    const float *dy = p->dy, *h = p->h_in, *x = p->x, *w_fc = p->w_fc, *w_proj = p->w_proj;
    const int64_t N = p->N, C = p->C, F = p->F;
    if (N < 1 || C < 1 || F < 1) return MF_EINVAL;
    const int64_t R = MF_MLP_ROWS, blocks = (N + R - 1) / R, W = C * F;
    const int64_t chunks = mf_grad_chunks(blocks, 2 * W);
    const int fast = mf_use_avx512();
    const int64_t proj_floats = mf_gemm_b_floats(C, F);
    int64_t thread_floats;
    const int64_t shared = backward_shared(p, &thread_floats);
    const int nt = mf_scratch_threads(p->scratch_floats - shared, thread_floats);
    if (nt < 1) return MF_EINVAL;
    float *at = p->scratch;
    double *part = (double *)mf_scratch_take(&at, 2 * blocks * (F + C));
    float *wb = mf_scratch_take(&at, proj_floats + mf_gemm_b_floats(F, C));
    float *dw_chunks = mf_scratch_take(&at, chunks * 2 * W);
    float *scratch = p->scratch + shared;
    int status = MF_OK;
    memset(dw_chunks, 0, (size_t)(chunks * 2 * W) * sizeof(float));
    /* w_proj (C, F), then w_fc (F, C), laid out for mf_gemm_nn */
    const float *w_proj_b = wb, *w_fc_b = wb + proj_floats;
    mf_gemm_prepare_b(fast, wb, w_proj, C, F, 0);
    mf_gemm_prepare_b(fast, wb + proj_floats, w_fc, F, C, 0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        float *dw_proj_c = dw_chunks + c * 2 * W, *dw_fc_c = dw_proj_c + W;
        float *gb = scratch + mf_thread_id() * thread_floats, *dhb = gb + R * F;
        float *pack = dhb + R * F;
        for (int64_t b = c * blocks / chunks; b < (c + 1) * blocks / chunks; b++) {
            const int64_t r0 = b * R;
            const int64_t rows = N - r0 < R ? N - r0 : R;
            const float *dyb = dy + r0 * C;
            /* dh (rows, F) = dy (rows, C) . w_proj (C, F), prefetching h's rows for gelu' */
            const MfGemmOptions to_dh = {.prefetch = h + r0 * F, .prefetch_floats = rows * F};
            mf_record_status(&status,
                             mf_gemm_nn(fast, rows, F, C, dyb, C, w_proj_b, dhb, F, &to_dh));
            mf_gelu_grad_kernel(gb, dhb, h + r0 * F, rows * F);
            /* dx (rows, C) = dh (rows, F) . w_fc (F, C), prefetching x's rows for dw_fc */
            const MfGemmOptions to_dx = {.prefetch = x + r0 * C, .prefetch_floats = rows * C};
            mf_record_status(&status, mf_gemm_nn(fast, rows, C, F, dhb, F, w_fc_b, dx + r0 * C, C,
                                      &to_dx));
            /* dw_proj (C, F) += dy^T (C, rows) . g (rows, F) */
            mf_record_status(&status, mf_gemm_tn(fast, C, F, rows, dyb, C, gb, F, dw_proj_c, F,
                                      pack));
            /* dw_fc (F, C) += dh^T (F, rows) . x (rows, C) */
            mf_record_status(&status, mf_gemm_tn(fast, F, C, rows, dhb, F, x + r0 * C, C, dw_fc_c,
                                      C, pack));
            mf_column_sums(part + b * (F + C), dhb, rows, F);
            mf_column_sums(part + b * (F + C) + F, dyb, rows, C);
        }
    }
    if (status != MF_OK) return status;
    mf_add_chunks(dw_proj, dw_chunks, chunks, 2 * W, W);
    mf_add_chunks(dw_fc, dw_chunks + W, chunks, 2 * W, W);
    mf_add_block_sums(db_fc, part, blocks, F + C, F);
    mf_add_block_sums(db_proj, part + F, blocks, F + C, C);
    return status;
}
