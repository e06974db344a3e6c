/* The activations' kernels (csrc/ops/activation.c: the method), written once over the SIMD
 * layer. A kernel-set file defines, then includes this file:
 *   MF_VW          floats per vector (mapformer/simd.h)
 *   MF_ACT_TARGET  the attribute of the kernels (mapformer/clones.h's MF_CLONES, or nothing
 *                  where the file's flags pick the instruction set)
 *   MF_ACT_TABLE   the name of the MfActKernels it defines (below)
 * Every lane's arithmetic is the same at every width: every set gives the same bits. */
#ifndef MAPFORMER_ACTIVATION_SETS
#define MAPFORMER_ACTIVATION_SETS
#include <stdint.h>

#include "mapformer/cpu.h"

/* one set: y = f(x) and dx = dy f'(x) over n floats, for SiLU and softplus */
typedef struct {
    void (*silu)(float *restrict y, const float *restrict x, int64_t n);
    void (*silu_grad)(float *restrict dx, const float *restrict dy, const float *restrict x,
                      int64_t n);
    void (*softplus)(float *restrict y, const float *restrict x, int64_t n);
    void (*softplus_grad)(float *restrict dx, const float *restrict dy,
                          const float *restrict x, int64_t n);
} MfActKernels;

/* mf_act_avx512 (csrc/ops/x86/activation_avx512.c, 16 floats) where the active kernel set
 * is avx512; else mf_act_clones (csrc/ops/activation.c, MF_CLONES at MF_CLONES_VW floats) */
#if MF_X86
extern const MfActKernels mf_act_avx512;
#endif
extern const MfActKernels mf_act_clones;
static inline const MfActKernels *mf_act_kernels(int kernels) {
#if MF_X86
    if (kernels == MF_KERNELS_AVX512) return &mf_act_avx512;
#endif
    (void)kernels;
    return &mf_act_clones;
}
#endif

#ifdef MF_ACT_TABLE
#include "mapformer/simd.h"

#define SOFTPLUS_THRESHOLD 20.0f

MF_ACT_TARGET
static void silu_kernel(float *restrict y, const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; VLOADN(v, x + i); vf s = v; vsigmoid(&s); s = v * s; VSTOREN(y + i, s););
}

MF_ACT_TARGET
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
MF_ACT_TARGET
static void softplus_kernel(float *restrict y, const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; VLOADN(v, x + i); vf u = VSELECT(v < VSPLAT(0.0f), v, -v);
             vexp_nonpositive(&u);
             const vf w = 1.0f + u; const vi one = w == VSPLAT(1.0f);
             const vf d = VSELECT(one, VSPLAT(1.0f), w - 1.0f); vf l = w; vlog_1_2(&l);
             l = VSELECT(one, u, l * (u / d));
             l = VSELECT(v > VSPLAT(0.0f), v + l, l);
             l = VSELECT(v > VSPLAT(SOFTPLUS_THRESHOLD), v, l); VSTOREN(y + i, l););
}

MF_ACT_TARGET
static void softplus_grad_kernel(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; vf d; VLOADN(v, x + i); VLOADN(d, dy + i); vf s = v; vsigmoid(&s);
             s = VSELECT(v > VSPLAT(SOFTPLUS_THRESHOLD), VSPLAT(1.0f), s); d = d * s;
             VSTOREN(dx + i, d););
}

const MfActKernels MF_ACT_TABLE = {silu_kernel, silu_grad_kernel, softplus_kernel,
                                   softplus_grad_kernel};
#endif
