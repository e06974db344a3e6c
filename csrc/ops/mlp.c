/* MLP: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj (MfMlpParams, mapformer/params.h), the
 * transformer block's feed-forward branch (F = mlp_ratio * C hidden units), fused in row
 * blocks. gelu is the tanh approximation, or with p->exact = 1 the exact x Phi(x) (gelu.c's
 * kernels, kernels/gelu.h, and simd.h's vgelu/vgelu_erf: the same passes either way).
 *
 * Forward saves only h = x w_fc^T + b_fc (the pre-activation); backward recomputes
 * g = gelu(h) (the input of w_proj, for its gradient) in the same pass as gelu'(h), from the
 * same exponential. Gradient rule: dw_fc, db_fc, dw_proj, db_proj are parameter gradients,
 * accumulated (+=); dx is an activation gradient, written (=).
 *
 * The rows are cut into blocks of mf_row_block(kernels) rows (rows.h: the same blocks as
 * linear.c's on each kernel set), each block on one OpenMP thread. A block's g and dh
 * (R x F floats) live in that thread's own scratch, in its core's cache, from the product
 * that writes them to the products that read them: of the (N, F) arrays only h goes to
 * memory (written forward, read backward), where separate linear and gelu ops would also
 * write and read g, dg and dh. The products are gemm.c's row-block kernels of the active
 * kernel set (mf_kernels(), read once per call), the weights laid out for them once per
 * call:
 *   forward, per block:  h = b_fc + x w_fc^T, and g = gelu(h) from the same registers
 *                        (h's stores non-temporal: the backward reads it next)
 *                        y = b_proj + g w_proj^T
 *   backward, per chunk of blocks (rows.h: mf_grad_chunks), per block in order:
 *                        dh = dy w_proj
 *                        g = gelu(h), dh *= gelu'(h)   (kernels/gelu.h, the set's)
 *                        dx = dh w_fc
 *                        dw_proj_chunk += dy^T g, dw_fc_chunk += dh^T x  (the chunk's own
 *                        scratch, written by its first block)
 *                        column sums of dh and of dy over the block's rows, in double,
 *                        into the block's own scratch rows
 *   then:                dw_proj, dw_fc += the chunks' sums; db_fc, db_proj += the blocks'
 *                        sums, added in order
 * The blocks and chunks depend on N, C and F only, so every output has the same bits for any
 * thread count; and each number is the bits linear_forward/backward and gelu_forward/backward
 * compute on the same kernel set, which cut the rows into the same blocks and chunks.
 *
 * Scratch (mlp_forward_scratch_floats, mlp_backward_scratch_floats), each part starting on a
 * 64-byte boundary:
 *   forward:   w_fc^T and w_proj^T prepared; per thread, a block of g
 *   backward:  the blocks' sums of dh and dy (blocks x (F + C) doubles); w_proj and w_fc
 *              prepared; the chunks' weight-gradient sums (chunks x 2 F C); per thread, a
 *              block of g, a block of dh and the weight-gradient product's pack
 */
#include <stddef.h>

#include "kernels/gelu.h"
#include "mapformer/cpu.h"
#include "mapformer/gemm.h"
#include "mapformer/mapformer.h"
#include "mapformer/rows.h"
#include "mapformer/threads.h"

static int valid(const MfMlpParams *p) {
    return p->N >= 1 && p->C >= 1 && p->F >= 1 && (p->exact == 0 || p->exact == 1);
}
/* floats rounded up to a 64-byte multiple */
static int64_t aligned(int64_t floats) { return (floats + 15) / 16 * 16; }
static int64_t row_blocks(int64_t N, int64_t R) { return (N + R - 1) / R; }

/* How many threads a scratch of `have` floats serves (at most mf_max_threads()), given its
 * fixed part and the floats per thread; 0 when it serves none (or is missing). */
static int threads_served(const float *scratch, int64_t have, int64_t fixed,
                          int64_t per_thread) {
    if (have < fixed + per_thread || (fixed + per_thread > 0 && scratch == NULL)) return 0;
    const int64_t served = per_thread > 0 ? (have - fixed) / per_thread : mf_max_threads();
    return served < mf_max_threads() ? (int)served : mf_max_threads();
}

/* forward scratch: w_fc^T, w_proj^T; per thread g */
typedef struct {
    int64_t R, fc, proj, fixed, per_thread;
} ForwardScratch;

static ForwardScratch forward_scratch(int kernels, const MfMlpParams *p) {
    ForwardScratch s;
    s.R = mf_row_block(kernels);
    s.fc = 0;
    s.proj = aligned(mf_gemm_b_floats(kernels, p->C, p->F));
    s.fixed = s.proj + aligned(mf_gemm_b_floats(kernels, p->F, p->C));
    s.per_thread = aligned(s.R * p->F);
    return s;
}

int64_t mlp_forward_scratch_floats(const MfMlpParams *p) {
    if (!valid(p)) return 0;
    const ForwardScratch s = forward_scratch(mf_kernels(), p);
    return s.fixed + mf_max_threads() * s.per_thread;
}

int mlp_forward(const MfMlpParams *p) {
    if (!valid(p)) return MF_EINVAL;
    const int64_t N = p->N, C = p->C, F = p->F;
    const int kernels = mf_kernels();
    const ForwardScratch s = forward_scratch(kernels, p);
    const int64_t R = s.R, blocks = row_blocks(N, R);
    const int threads = threads_served(p->scratch, p->scratch_floats, s.fixed, s.per_thread);
    if (threads < 1) return MF_EINVAL;
    /* w_fc^T (C, F), then w_proj^T (F, C), laid out for mf_gemm_nn */
    float *w_fc_t = p->scratch + s.fc, *w_proj_t = p->scratch + s.proj;
    float *g = p->scratch + s.fixed;
    mf_gemm_prepare_b(kernels, w_fc_t, p->w_fc, C, F, 1);
    mf_gemm_prepare_b(kernels, w_proj_t, p->w_proj, F, C, 1);
    const MfGemmOptions proj = {.bias = p->b_proj};
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (blocks > 1)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t r0 = b * R, rows = N - r0 < R ? N - r0 : R;
        float *gb = g + mf_thread_id() * s.per_thread;
        /* h (rows, F) = b_fc + x (rows, C) . w_fc^T (C, F), and g = gelu(h) (exact or not)
         * from the same registers; h is next read by the backward, so it streams past the
         * cache */
        const MfGemmOptions fc = {.bias = p->b_fc, .gelu = gb, .gelu_exact = p->exact,
                                  .stream = 1};
        mf_record_status(&status, mf_gemm_nn(kernels, rows, F, C, p->x + r0 * C, C, w_fc_t,
                                             p->h + r0 * F, F, &fc));
        /* y (rows, C) = b_proj + g (rows, F) . w_proj^T (F, C) */
        mf_record_status(&status, mf_gemm_nn(kernels, rows, C, F, gb, F, w_proj_t,
                                             p->y + r0 * C, C, &proj));
    }
    return status;
}

/* backward scratch: the blocks' bias sums, w_proj and w_fc prepared, the chunks' weight
 * gradients; per thread g, dh and the pack */
typedef struct {
    int64_t R, blocks, chunks, W;
    int64_t part, proj, fc, dw, fixed;
    int64_t g, dh, pack, per_thread; /* offsets in a thread's part, and its size */
} BackwardScratch;

static BackwardScratch backward_scratch(int kernels, const MfMlpParams *p) {
    BackwardScratch s;
    const int64_t C = p->C, F = p->F;
    s.R = mf_row_block(kernels);
    s.blocks = row_blocks(p->N, s.R);
    s.W = C * F;
    s.chunks = mf_grad_chunks(s.blocks, 2 * s.W);
    s.part = 0;
    s.proj = aligned(2 * s.blocks * (F + C));
    s.fc = s.proj + aligned(mf_gemm_b_floats(kernels, C, F));
    s.dw = s.fc + aligned(mf_gemm_b_floats(kernels, F, C));
    s.fixed = s.dw + aligned(s.chunks * 2 * s.W);
    const int64_t pack_proj = mf_gemm_tn_pack_floats(kernels, C, F);
    const int64_t pack_fc = mf_gemm_tn_pack_floats(kernels, F, C);
    s.g = 0;
    s.dh = aligned(s.R * F);
    s.pack = 2 * s.dh;
    s.per_thread = s.pack + aligned(pack_proj > pack_fc ? pack_proj : pack_fc);
    return s;
}

int64_t mlp_backward_scratch_floats(const MfMlpParams *p) {
    if (!valid(p)) return 0;
    const BackwardScratch s = backward_scratch(mf_kernels(), p);
    return s.fixed + mf_max_threads() * s.per_thread;
}

int mlp_backward(const MfMlpParams *p) {
    if (!valid(p)) return MF_EINVAL;
    const int64_t N = p->N, C = p->C, F = p->F;
    const int kernels = mf_kernels();
    const MfGeluKernels *gk = mf_gelu_kernels(kernels);
    const BackwardScratch s = backward_scratch(kernels, p);
    const int threads = threads_served(p->scratch, p->scratch_floats, s.fixed, s.per_thread);
    if (threads < 1) return MF_EINVAL;
    const int64_t R = s.R, blocks = s.blocks, chunks = s.chunks, W = s.W;
    /* per block, F sums of dh then C sums of dy; per chunk, dw_proj's sums then dw_fc's */
    double *part = (double *)(p->scratch + s.part);
    float *w_proj_b = p->scratch + s.proj, *w_fc_b = p->scratch + s.fc;
    float *dw_chunks = p->scratch + s.dw;
    /* w_proj (C, F), then w_fc (F, C), laid out for mf_gemm_nn */
    mf_gemm_prepare_b(kernels, w_proj_b, p->w_proj, C, F, 0);
    mf_gemm_prepare_b(kernels, w_fc_b, p->w_fc, F, C, 0);
    int status = MF_OK;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        float *dw_proj_c = dw_chunks + c * 2 * W, *dw_fc_c = dw_proj_c + W;
        float *mine = p->scratch + s.fixed + mf_thread_id() * s.per_thread;
        float *gb = mine + s.g, *dhb = mine + s.dh, *pack = mine + s.pack;
        const int64_t b0 = c * blocks / chunks;
        for (int64_t b = b0; b < (c + 1) * blocks / chunks; b++) {
            const int64_t r0 = b * R, rows = N - r0 < R ? N - r0 : R;
            const float *dyb = p->dy + r0 * C, *hb = p->h_in + r0 * F, *xb = p->x + r0 * C;
            /* dh (rows, F) = dy (rows, C) . w_proj (C, F), prefetching h's rows for gelu' */
            const MfGemmOptions to_dh = {.prefetch = hb, .prefetch_floats = rows * F};
            mf_record_status(&status, mf_gemm_nn(kernels, rows, F, C, dyb, C, w_proj_b, dhb,
                                                 F, &to_dh));
            (p->exact ? gk->erf_grad : gk->grad)(gb, dhb, dhb, hb, rows * F);
            /* dx (rows, C) = dh (rows, F) . w_fc (F, C), prefetching x's rows for dw_fc */
            const MfGemmOptions to_dx = {.prefetch = xb, .prefetch_floats = rows * C};
            mf_record_status(&status, mf_gemm_nn(kernels, rows, C, F, dhb, F, w_fc_b,
                                                 p->dx + r0 * C, C, &to_dx));
            /* dw_proj (C, F) [+]= dy^T (C, rows) . g (rows, F); dw_fc (F, C) [+]= dh^T
             * (F, rows) . x (rows, C): written by the chunk's first block */
            mf_record_status(&status, mf_gemm_tn(kernels, C, F, rows, dyb, C, gb, F,
                                                 dw_proj_c, F, b > b0, pack));
            mf_record_status(&status, mf_gemm_tn(kernels, F, C, rows, dhb, F, xb, C, dw_fc_c,
                                                 C, b > b0, pack));
            mf_column_sums(part + b * (F + C), dhb, rows, F);
            mf_column_sums(part + b * (F + C) + F, dyb, rows, C);
        }
    }
    if (status != MF_OK) return status;
    mf_add_chunks(p->dw_proj, dw_chunks, chunks, 2 * W, W);
    mf_add_chunks(p->dw_fc, dw_chunks + W, chunks, 2 * W, W);
    mf_add_block_sums(p->db_fc, part, blocks, F + C, F);
    mf_add_block_sums(p->db_proj, part + F, blocks, F + C, C);
    return MF_OK;
}
