/* SiLU, softplus and the SiLU gate (the Mamba block's activations), elementwise.
 *
 * Forward saves nothing: backward recomputes from x (the gate's from y and z). dx, dy and dz
 * are activation gradients (=).
 *   silu:      y = x s, s = sigmoid(x);        dx = dy s (1 + x (1 - s))
 *   softplus:  y = log(1 + e^x) (x <= 20);     dx = dy s
 *              y = x              (x > 20);    dx = dy      (Mamba's / PyTorch's threshold)
 *   silu_gate: out = y silu(z);                dy = dout silu(z), dz = dout y silu'(z)
 *              (Mamba's output gate in one pass each way, the bits of silu and the products)
 * SiLU's sigmoid is simd.h's vsigmoid (the core's one exponential). The kernels
 * (kernels/activation.h) are compiled at 16 floats for AVX-512 (x86/activation_avx512.c, run
 * where the active kernel set is avx512) and as target_clones for AVX-512, AVX2 and baseline
 * x86-64 at 8 (here); every lane computes the same bits on each. softplus is simd.h's
 * vsoftplus (the scans form their steps with it too, to the same bits): max(x, 0) +
 * log1p(exp(-|x|)), vexp_expm1 (Cody-Waite reduction, about 1 ulp) for u = exp(-|x|) in
 * (0, 1], then log1p(u) = u + u^2 Q(u), one polynomial over [0, 1] (vlog1p_unit: no exponent
 * split, no cancellation for small u, no division); its derivative sigmoid(x) = (x > 0 ? 1 :
 * u) / (1 + u) from the same u. The loops are simd.h's MF_VLOOP.
 */
#include <math.h>
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#define MF_VW MF_CLONES_VW
#define MF_ACT_TARGET MF_CLONES
#define MF_ACT_TABLE mf_act_clones
#include "kernels/activation.h"

#define ACT_CHUNK 8192 /* elements per OpenMP work item */

/* run kernel over n elements in ACT_CHUNK pieces on the OpenMP team */
#define RUN_CHUNKS(call)                                                                   \
    do {                                                                                   \
        const int64_t n = p->n;                                                            \
        const MfActKernels *ks = mf_act_kernels(mf_kernels());                             \
        if (n < 1) return MF_EINVAL;                                                       \
        const int64_t chunks = (n + ACT_CHUNK - 1) / ACT_CHUNK;                            \
        _Pragma("omp parallel for schedule(dynamic, 1) if (chunks > 1)")                   \
        for (int64_t c = 0; c < chunks; c++) {                                             \
            const int64_t i0 = c * ACT_CHUNK, len = n - i0 < ACT_CHUNK ? n - i0 : ACT_CHUNK; \
            call;                                                                          \
        }                                                                                  \
        return MF_OK;                                                                      \
    } while (0)

int silu_forward(const MfActivationParams *p) {
    RUN_CHUNKS(ks->silu(p->y + i0, p->x + i0, len));
}

int silu_backward(const MfActivationParams *p) {
    RUN_CHUNKS(ks->silu_grad(p->dx + i0, p->dy + i0, p->x + i0, len));
}

int softplus_forward(const MfActivationParams *p) {
    RUN_CHUNKS(ks->softplus(p->y + i0, p->x + i0, len));
}

int softplus_backward(const MfActivationParams *p) {
    RUN_CHUNKS(ks->softplus_grad(p->dx + i0, p->dy + i0, p->x + i0, len));
}

int silu_gate_forward(const MfSiluGateParams *p) {
    RUN_CHUNKS(ks->silu_gate(p->out + i0, p->y + i0, p->z + i0, len));
}

int silu_gate_backward(const MfSiluGateParams *p) {
    RUN_CHUNKS(ks->silu_gate_grad(p->dy + i0, p->dz + i0, p->dout + i0, p->y + i0, p->z + i0,
                                  len));
}
