/* Kernel sets and the CPU level (mapformer/cpu.h). The level is computed on first use and
 * cached; the module's init calls mf_cpu_level while it holds the GIL, so no two threads race
 * to compute it. */
#include <string.h>

#include "mapformer/cpu.h"
#include "mapformer/mapformer.h"

static int cpu_level = -1;
static int active = -1;

static int detect(void) {
#if MF_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return MF_KERNELS_AVX512;
    return avx2 ? MF_KERNELS_AVX2 : MF_KERNELS_PORTABLE;
#else
    return MF_KERNELS_PORTABLE;
#endif
}

int mf_cpu_level(void) {
    if (cpu_level < 0) cpu_level = detect();
    return cpu_level;
}

int mf_kernels(void) {
    if (active < 0) active = mf_cpu_level();
    return active;
}

int mf_kernels_supported(int kernels) {
    switch (kernels) {
        case MF_KERNELS_PORTABLE:
        case MF_KERNELS_BLAS: return 1;
        case MF_KERNELS_AVX2:
        case MF_KERNELS_AVX512: return mf_cpu_level() >= kernels;
        default: return 0;
    }
}

int mf_set_kernels(int kernels) {
    if (!mf_kernels_supported(kernels)) return MF_EINVAL;
    active = kernels;
    return MF_OK;
}

static const char *const names[MF_KERNELS_COUNT] = {"portable", "avx2", "avx512", "blas"};

const char *mf_kernels_name(int kernels) {
    return kernels >= 0 && kernels < MF_KERNELS_COUNT ? names[kernels] : NULL;
}

int mf_kernels_from_name(const char *name) {
    for (int k = 0; k < MF_KERNELS_COUNT; k++)
        if (name != NULL && strcmp(name, names[k]) == 0) return k;
    return -1;
}
