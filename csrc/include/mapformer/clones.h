/* Picking code for the CPU at run time.
 *
 * MF_CLONES: compile a hot loop for AVX-512, AVX2 and baseline x86-64 and pick one at load
 * time from the CPU (GCC target_clones on x86-64 Linux; plain loops, gathers included, are
 * vectorised by the compiler on each path). Elsewhere it is empty and the loop is compiled
 * once. The results are the same bits on every path: ISO C mode (-std=c11) contracts no
 * a * b + c into an FMA.
 */
#ifndef MAPFORMER_CLONES_H
#define MAPFORMER_CLONES_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define MF_CLONES_FMA \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define MF_CLONES_VW 8
#else
#define MF_CLONES
#define MF_CLONES_FMA
#define MF_CLONES_VW 4
#endif
/* MF_CLONES_VW: the vector width (mapformer/simd.h's MF_VW) of the files whose loops are
 * compiled with MF_CLONES. GCC 12 lowers the comparisons of a vector wider than the clone's
 * own registers lane by lane (measured: vgelu over 16-float vectors in the AVX2 clone, 2.7x
 * slower than over 8-float ones), so the width is the AVX2 clone's: 8 floats (the AVX-512 clone
 * runs them in ymm registers, the baseline clone as pairs of xmm). Without clones, the
 * baseline's: 4 floats (SSE2, NEON).
 * MF_CLONES_FMA: the same for loops that use simd.h's VFMAF (fused multiply-adds, one rounding
 * on every path): the clones are the x86-64 levels v4 (AVX-512) and v3 (AVX2 with FMA), where
 * VFMAF is one vector instruction, and the baseline, where it is a libm fmaf per lane (the
 * same bits, slowly; "avx2" alone does not include FMA). */

#endif
