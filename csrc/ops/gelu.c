/* GELU, tanh approximation: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 *
 * Forward saves nothing: backward recomputes from x.
 * Gradient rule: dx is an activation gradient, written (=).
 *
 * 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e) with e = exp(-2u), so
 *   y  = x / (1 + e)
 *   dx = dy * (s + 2 x s (1 - s) du/dx),  s = 1 / (1 + e),  1 - s = e s,
 *        du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
 * which never forms 1 - tanh (no cancellation for negative x). Both are simd.h's vgelu and
 * vgelu_grad (the core's one exponential, separate multiplies and adds), applied to whole
 * vectors of MF_VW floats: every lane has the bits a kernel computing vgelu in registers
 * gives, whatever the width or ISA. The loops are compiled for AVX-512, AVX2 and baseline
 * x86-64 (target_clones) and picked at load time.
 * mf_gelu_kernel and mf_gelu_grad_kernel are single-threaded loops shared with mlp.c; the
 * latter also gives gelu(x) from the same exponential, for mlp_backward, which recomputes
 * it rather than keep it from the forward.
 */
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"

/* elements per OpenMP work item; below two chunks the op runs on one thread */
#define MF_GELU_CHUNK 8192

MF_CLONES
void mf_gelu_kernel(float *restrict y, const float *restrict x, int64_t n) {
    const int64_t nv = n - n % MF_VW;
    for (int64_t i = 0; i < nv; i += MF_VW) {
        vf v = VLOADU(x + i);
        vgelu(&v);
        VSTOREU(y + i, v);
    }
    if (nv < n) {
        vf v;
        vload_part(&v, x + nv, n - nv);
        vgelu(&v);
        vstore_part(y + nv, &v, n - nv);
    }
}

MF_CLONES
static void gelu_backward_kernel(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, int64_t n) {
    const int64_t nv = n - n % MF_VW;
    vf g, d, v;
    for (int64_t i = 0; i < nv; i += MF_VW) {
        d = VLOADU(dy + i);
        v = VLOADU(x + i);
        vgelu_grad(&g, &d, &v);
        VSTOREU(dx + i, d);
    }
    if (nv < n) {
        vload_part(&d, dy + nv, n - nv);
        vload_part(&v, x + nv, n - nv);
        vgelu_grad(&g, &d, &v);
        vstore_part(dx + nv, &d, n - nv);
    }
}

MF_CLONES
void mf_gelu_grad_kernel(float *restrict y, float *restrict d, const float *restrict x,
                         int64_t n) {
    const int64_t nv = n - n % MF_VW;
    vf g, dv, v;
    for (int64_t i = 0; i < nv; i += MF_VW) {
        dv = VLOADU(d + i);
        v = VLOADU(x + i);
        vgelu_grad(&g, &dv, &v);
        VSTOREU(d + i, dv);
        VSTOREU(y + i, g);
    }
    if (nv < n) {
        vload_part(&dv, d + nv, n - nv);
        vload_part(&v, x + nv, n - nv);
        vgelu_grad(&g, &dv, &v);
        vstore_part(d + nv, &dv, n - nv);
        vstore_part(y + nv, &g, n - nv);
    }
}

int gelu_forward(const MfGeluParams *p) {
    const int64_t n = p->n;
    if (n < 1) return MF_EINVAL;
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        mf_gelu_kernel(p->y + i0, p->x + i0, len);
    }
    return MF_OK;
}

int gelu_backward(const MfGeluParams *p) {
    const int64_t n = p->n;
    if (n < 1) return MF_EINVAL;
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        gelu_backward_kernel(p->dx + i0, p->dy + i0, p->x + i0, len);
    }
    return MF_OK;
}
