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
#else
#define MF_CLONES
#endif

#include "mapformer/cpu.h"
/* transitional: the AVX-512 kernels run when they are the active set (mapformer/cpu.h) */
static inline int mf_use_avx512(void) { return mf_kernels() == MF_KERNELS_AVX512; }

#endif
