/* Linear layer on the GPU (csrc/ops/linear.c's math): y = x weight^T + bias.
 *   forward:  y (N, Cout) = x (N, Cin) weight^T + bias          (gemm.cuh's mf_gemm)
 *   backward: dx (N, Cin) = dy weight (=, or += with accumulate_dx);
 *             dweight (Cout, Cin) += dy^T x;  dbias (Cout,) += sum_n dy (mf_add_column_sums:
 *             deterministic).
 * No scratch (the struct's scratch fields are ignored). */
#include "gemm.cuh"

static int linear_valid(const MfLinearParams *p) {
    return p->N >= 1 && p->Cin >= 1 && p->Cout >= 1;
}

extern "C" int linear_forward_cuda(const MfLinearParams *p, cudaStream_t stream) {
    if (!linear_valid(p) || p->y == NULL || p->x == NULL || p->weight == NULL) return MF_EINVAL;
    return mf_gemm<false, true>(p->N, p->Cout, p->Cin, p->x, p->Cin, p->weight, p->Cin, p->y,
                                p->Cout, 0, p->bias, stream);
}

extern "C" int linear_backward_cuda(const MfLinearParams *p, cudaStream_t stream) {
    if (!linear_valid(p) || p->dx == NULL || p->dweight == NULL || p->dy == NULL
        || p->x == NULL || p->weight == NULL)
        return MF_EINVAL;
    int status = mf_gemm<false, false>(p->N, p->Cin, p->Cout, p->dy, p->Cout, p->weight, p->Cin,
                                       p->dx, p->Cin, p->accumulate_dx, NULL, stream);
    if (status != MF_OK) return status;
    status = mf_gemm<true, false>(p->Cout, p->Cin, p->N, p->dy, p->Cout, p->x, p->Cin,
                                  p->dweight, p->Cin, 1, NULL, stream);
    if (status != MF_OK || p->dbias == NULL) return status;
    return mf_add_column_sums(p->dbias, p->dy, p->N, p->Cout, stream);
}
