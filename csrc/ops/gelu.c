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
 * give these bits too. The kernels (kernels/gelu.h, shared with mlp.c and the OpenBLAS
 * matrix products) are compiled at 16 floats for AVX-512 (x86/gelu_avx512.c, run where the
 * active kernel set is avx512) and as target_clones for AVX-512, AVX2 and baseline x86-64 at
 * 8 (here); every lane computes the same bits on each.
 */
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#define MF_GELU_TARGET MF_CLONES
#define MF_GELU_TABLE mf_gelu_clones
#include "kernels/gelu.h"

/* elements per OpenMP work item; below two chunks the op runs on one thread */
#define MF_GELU_CHUNK 8192

int gelu_forward(const MfGeluParams *p) {
    const int64_t n = p->n;
    if (n < 1 || (p->exact != 0 && p->exact != 1)) return MF_EINVAL;
    const MfGeluKernels *ks = mf_gelu_kernels(mf_kernels());
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        (p->exact ? ks->gelu_erf : ks->gelu)(p->y + i0, p->x + i0, len);
    }
    return MF_OK;
}

int gelu_backward(const MfGeluParams *p) {
    const int64_t n = p->n;
    if (n < 1 || (p->exact != 0 && p->exact != 1)) return MF_EINVAL;
    const MfGeluKernels *ks = mf_gelu_kernels(mf_kernels());
    const int64_t chunks = (n + MF_GELU_CHUNK - 1) / MF_GELU_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * MF_GELU_CHUNK, len = n - i0 < MF_GELU_CHUNK ? n - i0 : MF_GELU_CHUNK;
        (p->exact ? ks->erf_grad : ks->grad)(NULL, p->dx + i0, p->dy + i0, p->x + i0, len);
    }
    return MF_OK;
}
