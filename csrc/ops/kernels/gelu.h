/* GELU's kernels (csrc/ops/gelu.c: the method), written once over the SIMD layer: the tanh
 * approximation (simd.h's vgelu, vgelu_grad) and the exact GELU (vgelu_erf, vgelu_erf_grad).
 * They are single-threaded loops, run by gelu.c's ops, by mlp.c's backward (on a row block
 * in cache) and by the BLAS kernel set's products (portable/gemm_blas.c). A kernel-set file
 * defines, then includes this file:
 *   MF_VW           floats per vector (mapformer/simd.h)
 *   MF_GELU_TARGET  the attribute of the kernels (mapformer/clones.h's MF_CLONES, or nothing
 *                   where the file's flags pick the instruction set)
 *   MF_GELU_TABLE   the name of the MfGeluKernels it defines (below)
 * Every lane's arithmetic is the same at every width: every set gives the same bits, and the
 * same as the matrix-product kernels that apply GELU in their registers (kernels/gemm.h). */
#ifndef MAPFORMER_GELU_SETS
#define MAPFORMER_GELU_SETS
#include <stdint.h>

#include "mapformer/cpu.h"

/* one set: y (n,) = gelu(x); and out (n,) = d * gelu'(x) (out may be d) with y (n,) =
 * gelu(x) from the same exponential unless y is NULL; tanh approximation and exact */
typedef struct {
    void (*gelu)(float *restrict y, const float *restrict x, int64_t n);
    void (*gelu_erf)(float *restrict y, const float *restrict x, int64_t n);
    void (*grad)(float *restrict y, float *out, const float *d, const float *restrict x,
                 int64_t n);
    void (*erf_grad)(float *restrict y, float *out, const float *d, const float *restrict x,
                     int64_t n);
} MfGeluKernels;

/* mf_gelu_avx512 (csrc/ops/x86/gelu_avx512.c, 16 floats) where the kernel set `kernels` is
 * avx512; else mf_gelu_clones (csrc/ops/gelu.c, MF_CLONES at MF_CLONES_VW floats) */
#if MF_X86
extern const MfGeluKernels mf_gelu_avx512;
#endif
extern const MfGeluKernels mf_gelu_clones;
static inline const MfGeluKernels *mf_gelu_kernels(int kernels) {
#if MF_X86
    if (kernels == MF_KERNELS_AVX512) return &mf_gelu_avx512;
#endif
    (void)kernels;
    return &mf_gelu_clones;
}
#endif

#ifdef MF_GELU_TABLE
#include "mapformer/simd.h"

/* y (n,) = gelu(x) through FN (vgelu or vgelu_erf) */
#define GELU_LOOP(FN) MF_VLOOP(n, vf v; VLOADN(v, x + i); FN(&v); VSTOREN(y + i, v););

MF_GELU_TARGET
static void gelu_kernel(float *restrict y, const float *restrict x, int64_t n) {
    GELU_LOOP(vgelu)
}

MF_GELU_TARGET
static void gelu_erf_kernel(float *restrict y, const float *restrict x, int64_t n) {
    GELU_LOOP(vgelu_erf)
}

/* out (n,) = d * gelu'(x), y (n,) = gelu(x) unless y is NULL, through GRAD (vgelu_grad or
 * vgelu_erf_grad) */
#define GELU_GRAD_LOOP(GRAD)                                            \
    MF_VLOOP(n, vf g; vf dv; vf v; VLOADN(dv, d + i); VLOADN(v, x + i); \
             GRAD(&g, &dv, &v); VSTOREN(out + i, dv);                   \
             if (y != NULL) VSTOREN(y + i, g););

MF_GELU_TARGET
static void gelu_grad_kernel(float *restrict y, float *out, const float *d,
                             const float *restrict x, int64_t n) {
    GELU_GRAD_LOOP(vgelu_grad)
}

MF_GELU_TARGET
static void gelu_erf_grad_kernel(float *restrict y, float *out, const float *d,
                                 const float *restrict x, int64_t n) {
    GELU_GRAD_LOOP(vgelu_erf_grad)
}

const MfGeluKernels MF_GELU_TABLE = {gelu_kernel, gelu_erf_kernel, gelu_grad_kernel,
                                     gelu_erf_grad_kernel};
#endif
