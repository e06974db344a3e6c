/* GELU, tanh approximation: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 *
 * Forward saves nothing: backward recomputes from x.
 * Gradient rule: dx is an activation gradient, written (=).
 *
 * 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e) with e = exp(-2u), so
 *   y  = x / (1 + e)
 *   dx = dy * (s + 2 x s (1 - s) du/dx),  s = 1 / (1 + e),  1 - s = e s,
 *        du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
 * which never forms 1 - tanh (no cancellation for negative x). exp is mf_expf below: a
 * branch-free Cephes-style polynomial (about 1 ulp on its clamped range) that GCC vectorises
 * without -ffast-math; tanhf/expf from libm would not vectorise. The hot loops are compiled
 * for AVX-512, AVX2 and baseline x86-64 (target_clones) and picked at load time.
 * mf_gelu_kernel and mf_gelu_grad_kernel are single-threaded loops shared with mlp.c; the
 * latter also gives gelu(x) from the same exponential, for mlp_backward, which recomputes
 * it rather than keep it from the forward.
 */
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/fastmath.h"
#include "mapformer/mapformer.h"

/* elements per OpenMP work item; below two chunks the op runs on one thread */
#define MF_GELU_CHUNK 8192

#define MF_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define MF_GELU_A 0.044715f


/* gelu'(x), and gelu(x) = x s into *y */
static inline float gelu_grad(float xi, float *y) {
    float x2 = xi * xi;
    float u = MF_GELU_K * (xi + MF_GELU_A * x2 * xi);
    float e = mf_expf(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float du = MF_GELU_K * (1.0f + 3.0f * MF_GELU_A * x2);
    *y = xi * s;
    return s + 2.0f * xi * (e * s) * s * du;
}

MF_CLONES
void mf_gelu_kernel(float *restrict y, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        /* the operations of gelu_grad, in its order: the same bits as its y */
        float u = MF_GELU_K * (xi + MF_GELU_A * (xi * xi) * xi);
        y[i] = xi * (1.0f / (1.0f + mf_expf(-2.0f * u)));
    }
}

MF_CLONES
static void gelu_backward_kernel(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float y;
        dx[i] = dy[i] * gelu_grad(x[i], &y);
    }
}

MF_CLONES
void mf_gelu_grad_kernel(float *restrict y, float *restrict d, const float *restrict x,
                         int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] *= gelu_grad(x[i], &y[i]);
}

int gelu_forward(float *y, const float *x, int64_t n) {
    if (n < 1) return MF_EINVAL;
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        mf_gelu_kernel(y + i0, x + i0, len);
    }
    return MF_OK;
}

int gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    if (n < 1) return MF_EINVAL;
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        gelu_backward_kernel(dx + i0, dy + i0, x + i0, len);
    }
    return MF_OK;
}
