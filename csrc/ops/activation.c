/* SiLU and softplus (the Mamba block's activations), elementwise.
 *
 * Forward saves nothing: backward recomputes from x. dx is an activation gradient (=).
 *   silu:     y = x s, s = sigmoid(x);        dx = dy s (1 + x (1 - s))
 *   softplus: y = log(1 + e^x) (x <= 20);     dx = dy s
 *             y = x              (x > 20);    dx = dy      (Mamba's / PyTorch's threshold)
 * SiLU's sigmoid is simd.h's vsigmoid (the core's one exponential), compiled for AVX-512,
 * AVX2 and baseline x86-64 (target_clones). softplus is max(x, 0) + log1p(exp(-|x|)) in
 * vector code (simd.h's vexp_nonpositive: Cody-Waite reduction over vexp2; Cephes' logf
 * polynomial with Goldberg's log1p correction: no cancellation for large |x|) and the same
 * sigmoid for its derivative. The loops are simd.h's MF_VLOOP.
 */
#include <math.h>
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#define MF_VW MF_CLONES_VW
#include "mapformer/simd.h"

#define ACT_CHUNK 8192 /* elements per OpenMP work item */
#define SOFTPLUS_THRESHOLD 20.0f

MF_CLONES
static void silu_kernel(float *restrict y, const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; VLOADN(v, x + i); vf s = v; vsigmoid(&s); s = v * s; VSTOREN(y + i, s););
}

MF_CLONES
static void silu_grad_kernel(float *restrict dx, const float *restrict dy,
                             const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; vf d; VLOADN(v, x + i); VLOADN(d, dy + i); vf s = v; vsigmoid(&s);
             d = d * (s * (1.0f + v * (1.0f - s))); VSTOREN(dx + i, d););
}

/* *x = log(*x) for *x in [1, 2]: Cephes logf (w = m 2^e with m in [sqrt(1/2), sqrt(2)), a degree-8
 * polynomial in m - 1, the exponent's log2 in two parts), about 1 ulp; separate multiplies
 * and adds (the same bits on every width) */
MF_INLINE void vlog_1_2(vf *x) {
    const vi bits = (vi)*x;
    vf e = __builtin_convertvector(((bits >> 23) & 0xff) - 126, vf); /* w = m 2^e, m in [1/2, 1) */
    const vf m = (vf)((bits & 0x007fffff) | 0x3f000000);
    const vi small = m < VSPLAT(0.707106781186547524f);
    e = VSELECT(small, e - 1.0f, e);
    const vf f = VSELECT(small, m + m - 1.0f, m - 1.0f), z = f * f;
    vf p = VSPLAT(7.0376836292e-2f);
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    vf y = p * f * z + e * -2.12194440e-4f - 0.5f * z;
    *x = (f + y) + e * 0.693359375f;
}

/* softplus(x) = max(x, 0) + log1p(exp(-|x|)); log1p(u) = log(w) u / (w - 1), w = 1 + u
 * (exact to about an ulp however small u is; u itself where w rounds to 1); x above the
 * threshold: x */
MF_CLONES
static void softplus_kernel(float *restrict y, const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; VLOADN(v, x + i); vf u = VSELECT(v < VSPLAT(0.0f), v, -v);
             vexp_nonpositive(&u);
             const vf w = 1.0f + u; const vi one = w == VSPLAT(1.0f);
             const vf d = VSELECT(one, VSPLAT(1.0f), w - 1.0f); vf l = w; vlog_1_2(&l);
             l = VSELECT(one, u, l * (u / d));
             l = VSELECT(v > VSPLAT(0.0f), v + l, l);
             l = VSELECT(v > VSPLAT(SOFTPLUS_THRESHOLD), v, l); VSTOREN(y + i, l););
}

MF_CLONES
static void softplus_grad_kernel(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; vf d; VLOADN(v, x + i); VLOADN(d, dy + i); vf s = v; vsigmoid(&s);
             s = VSELECT(v > VSPLAT(SOFTPLUS_THRESHOLD), VSPLAT(1.0f), s); d = d * s;
             VSTOREN(dx + i, d););
}

/* run kernel over n elements in ACT_CHUNK pieces on the OpenMP team */
#define RUN_CHUNKS(call)                                                                   \
    do {                                                                                   \
        const int64_t n = p->n;                                                            \
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
    RUN_CHUNKS(silu_kernel(p->y + i0, p->x + i0, len));
}

int silu_backward(const MfActivationParams *p) {
    RUN_CHUNKS(silu_grad_kernel(p->dx + i0, p->dy + i0, p->x + i0, len));
}

int softplus_forward(const MfActivationParams *p) {
    RUN_CHUNKS(softplus_kernel(p->y + i0, p->x + i0, len));
}

int softplus_backward(const MfActivationParams *p) {
    RUN_CHUNKS(softplus_grad_kernel(p->dx + i0, p->dy + i0, p->x + i0, len));
}
