/* Picking code for the CPU at run time.
 *
 * MF_CLONES: compile a hot loop for AVX-512, AVX2 and baseline x86-64 and pick one at load
 * time from the CPU (GCC target_clones on x86-64 Linux; plain loops, gathers included, are
 * vectorised by the compiler on each path). Elsewhere it is empty and the loop is compiled
 * once. The results are the same bits on every path: ISO C mode (-std=c11) contracts no
 * a * b + c into an FMA.
 *
 * mf_use_avx512(): 1 where the CPU has AVX-512 (F, DQ, BW, VL), AVX2 and FMA, unless the
 * environment sets MAPFORMER_KERNELS=blas. The ops with hand-written AVX-512 kernels
 * (attention.c, conj_attention.c, gemm.c) check it on every call and otherwise take their
 * portable, OpenBLAS-based path; the tests set the variable to cover that path. */
#ifndef MAPFORMER_CLONES_H
#define MAPFORMER_CLONES_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MF_CLONES
#endif

#if defined(__GNUC__) && defined(__x86_64__)
#include <stdlib.h>
#include <string.h>
static inline int mf_use_avx512(void) {
    const char *kernels = getenv("MAPFORMER_KERNELS");
    if (kernels != NULL && strcmp(kernels, "blas") == 0) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
static inline int mf_use_avx512(void) { return 0; }
#endif

#endif
