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

/* one set: y = f(x) and dx = dy f'(x) over n floats, for SiLU and softplus, and the gate */
typedef struct {
    void (*silu)(float *restrict y, const float *restrict x, int64_t n);
    void (*silu_grad)(float *restrict dx, const float *restrict dy, const float *restrict x,
                      int64_t n);
    void (*softplus)(float *restrict y, const float *restrict x, int64_t n);
    void (*softplus_grad)(float *restrict dx, const float *restrict dy,
                          const float *restrict x, int64_t n);
    /* the SiLU gate: out = y silu(z); dy = dout silu(z), dz = dout y silu'(z) */
    void (*silu_gate)(float *restrict out, const float *restrict y, const float *restrict z,
                      int64_t n);
    void (*silu_gate_grad)(float *restrict dy, float *restrict dz, const float *restrict dout,
                           const float *restrict y, const float *restrict z, int64_t n);
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

/* softplus and its slope: simd.h's vsoftplus */
MF_ACT_TARGET
static void softplus_kernel(float *restrict y, const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; VLOADN(v, x + i); vsoftplus(&v, NULL); VSTOREN(y + i, v););
}

MF_ACT_TARGET
static void softplus_grad_kernel(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, int64_t n) {
    MF_VLOOP(n, vf v; vf s; vf d; VLOADN(v, x + i); VLOADN(d, dy + i); vsoftplus(&v, &s);
             d = d * s; VSTOREN(dx + i, d););
}

/* y silu(z) as silu_kernel's z s times y, the gradients as silu_grad_kernel's on dout y: the
 * bits of the three passes it replaces (silu, then two products) */
MF_ACT_TARGET
static void silu_gate_kernel(float *restrict out, const float *restrict y,
                             const float *restrict z, int64_t n) {
    MF_VLOOP(n, vf a; vf b; VLOADN(a, y + i); VLOADN(b, z + i); vf s = b; vsigmoid(&s);
             a = a * (b * s); VSTOREN(out + i, a););
}

MF_ACT_TARGET
static void silu_gate_grad_kernel(float *restrict dy, float *restrict dz,
                                  const float *restrict dout, const float *restrict y,
                                  const float *restrict z, int64_t n) {
    MF_VLOOP(n, vf g; vf a; vf b; VLOADN(g, dout + i); VLOADN(a, y + i); VLOADN(b, z + i);
             vf s = b; vsigmoid(&s); const vf gy = g * a; g = g * (b * s);
             a = gy * (s * (1.0f + b * (1.0f - s))); VSTOREN(dy + i, g); VSTOREN(dz + i, a););
}

const MfActKernels MF_ACT_TABLE = {silu_kernel, silu_grad_kernel, softplus_kernel,
                                   softplus_grad_kernel, silu_gate_kernel,
                                   silu_gate_grad_kernel};
#endif
