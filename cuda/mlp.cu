/* The transformer MLP on the GPU (csrc/ops/mlp.c's math): h = x w_fc^T + b_fc,
 * y = gelu(h) w_proj^T + b_proj (gelu exact or tanh as MfGeluParams'); h saved.
 *   backward: g = gelu(h) (recomputed), dw_proj += dy^T g, db_proj += sum_n dy,
 *             dh = (dy w_proj) gelu'(h), dw_fc += dh^T x, db_fc += sum_n dh, dx = dh w_fc (=).
 * Built from the kernels of gemm.cuh and gelu.cu. Scratch (device, caller's): g (N, F) in the
 * forward; g and dh (N, F each) in the backward. */
#include "gemm.cuh"

extern "C" int gelu_forward_cuda(const MfGeluParams *p, cudaStream_t stream);
extern "C" int gelu_backward_cuda(const MfGeluParams *p, cudaStream_t stream);

static int mlp_valid(const MfMlpParams *p) {
    return p->N >= 1 && p->C >= 1 && p->F >= 1 && (p->exact == 0 || p->exact == 1);
}

extern "C" int64_t mlp_forward_cuda_scratch_floats(const MfMlpParams *p) {
    return mlp_valid(p) ? p->N * p->F : 0;
}

extern "C" int64_t mlp_backward_cuda_scratch_floats(const MfMlpParams *p) {
    return mlp_valid(p) ? 2 * p->N * p->F : 0;
}

extern "C" int mlp_forward_cuda(const MfMlpParams *p, cudaStream_t stream) {
    if (!mlp_valid(p) || p->scratch == NULL
        || p->scratch_floats < mlp_forward_cuda_scratch_floats(p))
        return MF_EINVAL;
    const int64_t N = p->N, C = p->C, F = p->F;
    float *g = p->scratch;
    int status = mf_gemm<false, true>(N, F, C, p->x, C, p->w_fc, C, p->h, F, 0, p->b_fc, stream);
    if (status != MF_OK) return status;
    MfGeluParams gp = {};
    gp.y = g;
    gp.x = p->h;
    gp.n = N * F;
    gp.exact = p->exact;
    if ((status = gelu_forward_cuda(&gp, stream)) != MF_OK) return status;
    return mf_gemm<false, true>(N, C, F, g, F, p->w_proj, F, p->y, C, 0, p->b_proj, stream);
}

extern "C" int mlp_backward_cuda(const MfMlpParams *p, cudaStream_t stream) {
    if (!mlp_valid(p) || p->scratch == NULL
        || p->scratch_floats < mlp_backward_cuda_scratch_floats(p))
        return MF_EINVAL;
    const int64_t N = p->N, C = p->C, F = p->F;
    float *g = p->scratch, *dh = p->scratch + N * F;
    MfGeluParams gp = {};
    gp.y = g;
    gp.x = p->h_in;
    gp.n = N * F;
    gp.exact = p->exact;
    int status = gelu_forward_cuda(&gp, stream);
    if (status != MF_OK) return status;
    /* dw_proj (C, F) += dy^T g; db_proj += sum_n dy */
    if ((status = mf_gemm<true, false>(C, F, N, p->dy, C, g, F, p->dw_proj, F, 1, NULL, stream))
        != MF_OK)
        return status;
    if ((status = mf_add_column_sums(p->db_proj, p->dy, N, C, stream)) != MF_OK) return status;
    /* dh = (dy w_proj) gelu'(h): dg (N, F) into dh, then gelu's backward in place */
    if ((status = mf_gemm<false, false>(N, F, C, p->dy, C, p->w_proj, F, dh, F, 0, NULL, stream))
        != MF_OK)
        return status;
    gp = MfGeluParams{};
    gp.dx = dh;
    gp.dy = dh;
    gp.x = p->h_in;
    gp.n = N * F;
    gp.exact = p->exact;
    if ((status = gelu_backward_cuda(&gp, stream)) != MF_OK) return status;
    /* dw_fc (F, C) += dh^T x; db_fc += sum_n dh; dx (N, C) = dh w_fc */
    if ((status = mf_gemm<true, false>(F, C, N, dh, F, p->x, C, p->dw_fc, C, 1, NULL, stream))
        != MF_OK)
        return status;
    if ((status = mf_add_column_sums(p->db_fc, dh, N, F, stream)) != MF_OK) return status;
    return mf_gemm<false, false>(N, C, F, dh, F, p->w_fc, C, p->dx, C, 0, NULL, stream);
}
