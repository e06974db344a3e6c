/* GELU, tanh approximation: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3);
 * or exact (p->exact = 1, PyTorch's nn.GELU() default): y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)),
 * dx = dy (Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi)) (simd.h's vgelu_erf, vgelu_erf_grad).
 *
 * Forward saves nothing: backward recomputes from x.
 * Gradient rule: dx is an activation gradient, written (=).
 *
 * 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e) with e = exp(-2u), so
 *   y  = x / (1 + e)
 *   dx = dy * (s + 2 x s (1 - s) du/dx),  s = 1 / (1 + e),  1 - s = e s,
 *        du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
 * which never forms 1 - tanh (no cancellation for negative x). The math is simd.h's vgelu and
 * vgelu_grad (the core's one exponential), whose bits are the same at every vector width:
 * the matrix-product kernels that apply GELU in their registers (csrc/ops/kernels/gemm.h)
 * give these bits too. The hot loops are compiled for AVX-512, AVX2 and baseline x86-64
 * (target_clones) and picked at load time.
 * mf_gelu_kernel and mf_gelu_grad_kernel are single-threaded loops shared with mlp.c and the
 * OpenBLAS matrix products; the latter also gives gelu(x) from the same exponential, for
 * mlp_backward, which recomputes it rather than keep it from the forward.
 */
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"

/* elements per OpenMP work item; below two chunks the op runs on one thread */
#define MF_GELU_CHUNK 8192

/* y (n,) = gelu(x) through FN (vgelu or vgelu_erf) */
#define GELU_LOOP(FN) \
    MF_VLOOP(n, vf v; VLOADN(v, x + i); FN(&v); VSTOREN(y + i, v););

MF_CLONES
void mf_gelu_kernel(float *restrict y, const float *restrict x, int64_t n) { GELU_LOOP(vgelu) }

MF_CLONES
void mf_gelu_erf_kernel(float *restrict y, const float *restrict x, int64_t n) {
    GELU_LOOP(vgelu_erf)
}

/* out (n,) = d * gelu'(x) (out may be d), and y (n,) = gelu(x) unless y is NULL; GRAD is
 * vgelu_grad or vgelu_erf_grad */
#define GELU_GRAD_LOOP(GRAD)                                            \
    MF_VLOOP(n, vf g; vf dv; vf v; VLOADN(dv, d + i); VLOADN(v, x + i); \
             GRAD(&g, &dv, &v); VSTOREN(out + i, dv);                   \
             if (y != NULL) VSTOREN(y + i, g););

MF_INLINE void gelu_grad_loop(float *y, float *out, const float *d, const float *x,
                              int64_t n) {
    GELU_GRAD_LOOP(vgelu_grad)
}

MF_INLINE void gelu_erf_grad_loop(float *y, float *out, const float *d, const float *x,
                                  int64_t n) {
    GELU_GRAD_LOOP(vgelu_erf_grad)
}

MF_CLONES
void mf_gelu_grad_kernel(float *restrict y, float *d, const float *restrict x, int64_t n) {
    gelu_grad_loop(y, d, d, x, n);
}

MF_CLONES
void mf_gelu_erf_grad_kernel(float *restrict y, float *d, const float *restrict x, int64_t n) {
    gelu_erf_grad_loop(y, d, d, x, n);
}

MF_CLONES
static void gelu_backward_kernel(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, int64_t n) {
    gelu_grad_loop(NULL, dx, dy, x, n);
}

MF_CLONES
static void gelu_erf_backward_kernel(float *restrict dx, const float *restrict dy,
                                     const float *restrict x, int64_t n) {
    gelu_erf_grad_loop(NULL, dx, dy, x, n);
}

int gelu_forward(const MfGeluParams *p) {
    const int64_t n = p->n;
    if (n < 1 || (p->exact != 0 && p->exact != 1)) return MF_EINVAL;
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        if (p->exact)
            mf_gelu_erf_kernel(p->y + i0, p->x + i0, len);
        else
            mf_gelu_kernel(p->y + i0, p->x + i0, len);
    }
    return MF_OK;
}

int gelu_backward(const MfGeluParams *p) {
    const int64_t n = p->n;
    if (n < 1 || (p->exact != 0 && p->exact != 1)) return MF_EINVAL;
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        if (p->exact)
            gelu_erf_backward_kernel(p->dx + i0, p->dy + i0, p->x + i0, len);
        else
            gelu_backward_kernel(p->dx + i0, p->dy + i0, p->x + i0, len);
    }
    return MF_OK;
}
