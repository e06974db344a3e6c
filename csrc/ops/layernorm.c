/* LayerNorm over the last axis: y = (x - mean) * rstd * weight + bias, biased variance.
 *
 * Forward saves mean (N,) and rstd (N,) = 1 / sqrt(var + eps) for the backward pass.
 * Gradient rule: dweight and dbias are parameter gradients, accumulated (+=); dx is an
 * activation gradient, written (=), or accumulated (+=) when accumulate_dx is set.
 *
 *   xhat = (x - mean) * rstd,  g = dy * weight
 *   dx   = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
 *   dweight += sum_n dy * xhat,  dbias += sum_n dy
 *
 * One pass over memory each direction: a row (C floats) is read into cache once and every
 * per-row sum is taken from there. Rows are split into at most MF_LN_BLOCKS fixed blocks (a
 * function of N only); in the backward pass each block sums its dweight/dbias contribution
 * into its own double scratch row and the blocks are combined in block order afterwards, so
 * the result is race-free and bit-identical for any thread count (the scratch rows come from
 * the caller: layernorm_backward_scratch_floats). Row sums use 16 float lanes
 * (explicit vectors: no -ffast-math needed, and the same summation order, hence the same bits,
 * in every target clone) combined in double.
 */
#include <math.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"

#define MF_LN_BLOCKS 64

/* 16 float lanes as a GCC/Clang vector: one zmm under AVX-512, two ymm under AVX2, four xmm
 * at baseline. Written with explicit vectors because GCC, left to vectorise a 16-lane array
 * loop with two accumulators, vectorised the outer loop with permutes (4x slower). */
typedef float mf_ln_v16 __attribute__((vector_size(64)));
#define MF_LN_LANES 16
#define MF_LN_LOAD(v, p) memcpy(&(v), (p), sizeof(mf_ln_v16))

/* the 16 lanes of v summed in double, in lane order */
#define MF_LN_HSUM(out, v)                                        \
    do {                                                          \
        float lanes_[MF_LN_LANES];                                \
        memcpy(lanes_, &(v), sizeof lanes_);                      \
        double s_ = 0.0;                                          \
        for (int j_ = 0; j_ < MF_LN_LANES; j_++) s_ += lanes_[j_]; \
        (out) = s_;                                               \
    } while (0)

/* rows [r0, r1) of the forward pass */
MF_CLONES
static void ln_forward_rows(float *restrict y, float *restrict mean, float *restrict rstd,
                            const float *restrict x, const float *restrict weight,
                            const float *restrict bias, int64_t r0, int64_t r1, int64_t C,
                            float eps) {
    const int64_t Cv = C - C % MF_LN_LANES;
    for (int64_t n = r0; n < r1; n++) {
        const float *xr = x + n * C;
        float *yr = y + n * C;
        mf_ln_v16 acc = {0};
        for (int64_t c = 0; c < Cv; c += MF_LN_LANES) {
            mf_ln_v16 xv;
            MF_LN_LOAD(xv, xr + c);
            acc += xv;
        }
        double s;
        MF_LN_HSUM(s, acc);
        for (int64_t c = Cv; c < C; c++) s += xr[c];
        const float m = (float)(s / (double)C);

        mf_ln_v16 acc2 = {0};
        for (int64_t c = 0; c < Cv; c += MF_LN_LANES) {
            mf_ln_v16 xv;
            MF_LN_LOAD(xv, xr + c);
            mf_ln_v16 d = xv - m;
            acc2 += d * d;
        }
        double v;
        MF_LN_HSUM(v, acc2);
        for (int64_t c = Cv; c < C; c++) {
            double d = (double)xr[c] - m;
            v += d * d;
        }
        const float rs = (float)(1.0 / sqrt(v / (double)C + (double)eps));
        for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = rs;
    }
}

int layernorm_forward(const MfLayernormParams *p) {
    float *y = p->y, *mean = p->mean, *rstd = p->rstd;
    const float *x = p->x, *weight = p->weight, *bias = p->bias;
    const int64_t N = p->N, C = p->C;
    const float eps = p->eps;
    if (N < 1 || C < 1 || !(eps > 0.0f) || !isfinite(eps)) return MF_EINVAL;
    const int64_t nb = N < MF_LN_BLOCKS ? N : MF_LN_BLOCKS;
#pragma omp parallel for schedule(dynamic, 1) if (N * C >= (1 << 15))
    for (int64_t b = 0; b < nb; b++)
        ln_forward_rows(y, mean, rstd, x, weight, bias, N * b / nb, N * (b + 1) / nb, C, eps);
    return MF_OK;
}

/* rows [r0, r1) of the backward pass; this block's dweight/dbias sums go to pw, pb (C,) */
MF_CLONES
static void ln_backward_rows(float *restrict dx, double *restrict pw, double *restrict pb,
                             const float *restrict dy, const float *restrict x,
                             const float *restrict mean, const float *restrict rstd,
                             const float *restrict weight, int64_t r0, int64_t r1, int64_t C,
                             int accumulate_dx) {
    const int64_t Cv = C - C % MF_LN_LANES;
    for (int64_t c = 0; c < C; c++) pw[c] = pb[c] = 0.0;
    for (int64_t n = r0; n < r1; n++) {
        const float *dyr = dy + n * C, *xr = x + n * C;
        float *dxr = dx + n * C;
        const float m = mean[n], rs = rstd[n];
        mf_ln_v16 ag = {0}, agx = {0};
        for (int64_t c = 0; c < Cv; c += MF_LN_LANES) {
            mf_ln_v16 xv, dv, wv;
            MF_LN_LOAD(xv, xr + c);
            MF_LN_LOAD(dv, dyr + c);
            MF_LN_LOAD(wv, weight + c);
            mf_ln_v16 xh = (xv - m) * rs;
            mf_ln_v16 g = dv * wv;
            ag += g;
            agx += g * xh;
        }
        double sg, sgx;
        MF_LN_HSUM(sg, ag);
        MF_LN_HSUM(sgx, agx);
        for (int64_t c = Cv; c < C; c++) {
            float xh = (xr[c] - m) * rs;
            float g = dyr[c] * weight[c];
            sg += g;
            sgx += (double)(g * xh);
        }
        const float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
        for (int64_t c = 0; c < C; c++) {
            float xh = (xr[c] - m) * rs;
            float d = rs * (dyr[c] * weight[c] - mg - xh * mgx);
            dxr[c] = accumulate_dx ? dxr[c] + d : d; /* loop-invariant branch: unswitched */
            pw[c] += (double)(dyr[c] * xh);
            pb[c] += (double)dyr[c];
        }
    }
}

/* per block, dweight then dbias partial sums: 2 C doubles */
int64_t layernorm_backward_scratch_floats(const MfLayernormParams *p) {
    const int64_t nb = p->N < MF_LN_BLOCKS ? p->N : MF_LN_BLOCKS;
    return mf_scratch_size(nb * 4 * p->C);
}

int layernorm_backward(const MfLayernormParams *p) {
    float *dx = p->dx, *dweight = p->dweight, *dbias = p->dbias;
    const float *dy = p->dy, *x = p->x, *mean = p->mean_in, *rstd = p->rstd_in, *weight = p->weight;
    const int64_t N = p->N, C = p->C;
    const int accumulate_dx = p->accumulate_dx;
    if (N < 1 || C < 1 || p->scratch_floats < layernorm_backward_scratch_floats(p))
        return MF_EINVAL;
    const int64_t nb = N < MF_LN_BLOCKS ? N : MF_LN_BLOCKS;
    double *part = (double *)p->scratch;
#pragma omp parallel for schedule(dynamic, 1) if (N * C >= (1 << 15))
    for (int64_t b = 0; b < nb; b++) {
        double *pw = part + b * 2 * C;
        ln_backward_rows(dx, pw, pw + C, dy, x, mean, rstd, weight, N * b / nb,
                         N * (b + 1) / nb, C, accumulate_dx);
    }
    for (int64_t c = 0; c < C; c++) {
        double sw = 0.0, sb = 0.0;
        for (int64_t b = 0; b < nb; b++) {
            sw += part[b * 2 * C + c];
            sb += part[b * 2 * C + C + c];
        }
        dweight[c] = (float)((double)dweight[c] + sw);
        dbias[c] = (float)((double)dbias[c] + sb);
    }
    return MF_OK;
}
