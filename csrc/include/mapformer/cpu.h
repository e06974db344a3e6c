/* Kernel sets and the CPU level, detected once.
 *
 * The ops with hand-written kernels (linear and MLP products, attention, conjunctive
 * attention) have one implementation per kernel set:
 *   MF_KERNELS_AVX512    csrc/ops/x86/<family>_avx512.c: the SIMD layer at 16 floats
 *   MF_KERNELS_AVX2      csrc/ops/x86/<family>_avx2.c: the SIMD layer at 8 floats, with FMA
 *   MF_KERNELS_PORTABLE  csrc/ops/portable/<family>_vec.c: the SIMD layer at 4 floats (SSE2 on
 *                        x86-64, NEON on aarch64), built on every platform
 *   MF_KERNELS_BLAS      csrc/ops/portable/<family>_blas.c: the same tiling on OpenBLAS's
 *                        sgemm, built on every platform
 * The first three are the CPU levels: mf_cpu_level() is the best one the CPU (and its OS)
 * supports, read once. The active set, mf_kernels(), starts as the CPU level, or as what the
 * environment variable MAPFORMER_KERNELS names when the module loads (mapformer._C calls
 * mf_set_kernels; a set the CPU cannot run is refused there), and changes only through
 * mf_set_kernels. An op reads it once per call and runs every product of that call on it.
 * The elementwise ops have no kernel sets: their plain loops are compiled per ISA by the
 * compiler (MF_CLONES, mapformer/clones.h) and give the same bits on every path. */
#ifndef MAPFORMER_CPU_H
#define MAPFORMER_CPU_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MF_X86 1 /* the x86/ kernel files are built */
#else
#define MF_X86 0
#endif

typedef enum {
    MF_KERNELS_PORTABLE = 0,
    MF_KERNELS_AVX2 = 1,
    MF_KERNELS_AVX512 = 2,
    MF_KERNELS_BLAS = 3,
    MF_KERNELS_COUNT = 4,
} MfKernels;

/* the best of PORTABLE, AVX2 (with FMA) and AVX512 (F, DQ, BW, VL) this CPU runs */
int mf_cpu_level(void);
/* the active kernel set */
int mf_kernels(void);
/* make `kernels` the active set: MF_OK, or MF_EINVAL for a set this CPU cannot run */
int mf_set_kernels(int kernels);
/* "portable", "avx2", "avx512", "blas"; NULL for anything else */
const char *mf_kernels_name(int kernels);
/* the set with that name, or -1 */
int mf_kernels_from_name(const char *name);
/* whether this CPU runs the set */
int mf_kernels_supported(int kernels);

#endif
