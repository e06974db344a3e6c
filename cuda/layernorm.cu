/* LayerNorm on the GPU over the last axis (the math of csrc/ops/layernorm.c):
 *   forward: mean, rstd = 1 / sqrt(var + eps) (biased variance, two passes over the row),
 *            y = (x - mean) rstd weight + bias; mean and rstd saved;
 *   backward: xhat = (x - mean) rstd, g = dy weight,
 *            dx = rstd (g - mean_c(g) - xhat mean_c(g xhat)) (= or += with accumulate_dx),
 *            dweight += sum_n dy xhat, dbias += sum_n dy.
 * One block of 128 threads per row (rows in a grid-stride loop), per-row sums by a fixed
 * shared-memory tree. dweight and dbias: a second kernel, double column sums over the N rows
 * (mf_column_sums2: 32 row lanes per column, then a fixed tree; deterministic, no atomics). */
#include "common.cuh"

#define LN_THREADS 128

__global__ void layernorm_forward_kernel(MfLayernormParams p) {
    __shared__ float buf[LN_THREADS];
    const int64_t C = p.C;
    for (int64_t row = blockIdx.x; row < p.N; row += gridDim.x) {
        const float *x = p.x + row * C;
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += x[c];
        const float mean = mf_block_reduce(s, buf, MfSum()) / (float)C;
        float q = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            const float d = x[c] - mean;
            q += d * d;
        }
        const float var = mf_block_reduce(q, buf, MfSum()) / (float)C;
        const float rstd = 1.0f / sqrtf(var + p.eps);
        float *y = p.y + row * C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            y[c] = (x[c] - mean) * rstd * p.weight[c] + p.bias[c];
        if (threadIdx.x == 0) {
            p.mean[row] = mean;
            p.rstd[row] = rstd;
        }
    }
}

__global__ void layernorm_backward_dx_kernel(MfLayernormParams p) {
    __shared__ float buf[LN_THREADS];
    const int64_t C = p.C;
    for (int64_t row = blockIdx.x; row < p.N; row += gridDim.x) {
        const float *x = p.x + row * C, *dy = p.dy + row * C;
        const float mean = p.mean_in[row], rstd = p.rstd_in[row];
        float sg = 0.0f, sgx = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            const float g = dy[c] * p.weight[c];
            sg += g;
            sgx += g * ((x[c] - mean) * rstd);
        }
        const float mg = mf_block_reduce(sg, buf, MfSum()) / (float)C;
        const float mgx = mf_block_reduce(sgx, buf, MfSum()) / (float)C;
        float *dx = p.dx + row * C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            const float xhat = (x[c] - mean) * rstd;
            const float d = rstd * (dy[c] * p.weight[c] - mg - xhat * mgx);
            dx[c] = p.accumulate_dx ? dx[c] + d : d;
        }
    }
}

MF_COLUMN_KERNEL void layernorm_backward_params_kernel(MfLayernormParams p) {
    mf_column_sums2(
        p.N, p.C,
        [&](int64_t n, int64_t c, double &dw, double &db) {
            const float dy = p.dy[n * p.C + c];
            const float xhat = (p.x[n * p.C + c] - p.mean_in[n]) * p.rstd_in[n];
            dw += (double)(dy * xhat);
            db += (double)dy;
        },
        [&](int64_t c, double dw, double db) {
            p.dweight[c] = (float)((double)p.dweight[c] + dw);
            p.dbias[c] = (float)((double)p.dbias[c] + db);
        });
}

static unsigned ln_rows(int64_t N) { return N < MF_MAX_GRID ? (unsigned)N : MF_MAX_GRID; }

extern "C" int layernorm_forward_cuda(const MfLayernormParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->C < 1 || !(p->eps > 0.0f) || !isfinite(p->eps)) return MF_EINVAL;
    return MF_LAUNCH(layernorm_forward_kernel, dim3(ln_rows(p->N)), dim3(LN_THREADS), 0, stream,
                     *p);
}

extern "C" int layernorm_backward_cuda(const MfLayernormParams *p, cudaStream_t stream) {
    if (p->N < 1 || p->C < 1) return MF_EINVAL;
    int status = MF_LAUNCH(layernorm_backward_dx_kernel, dim3(ln_rows(p->N)), dim3(LN_THREADS),
                           0, stream, *p);
    if (status != MF_OK) return status;
    return MF_LAUNCH(layernorm_backward_params_kernel, mf_column_grid(p->C), mf_column_block(),
                     0, stream, *p);
}
