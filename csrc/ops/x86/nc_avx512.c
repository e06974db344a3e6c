/* MapEM-NC's group kernels (kernels/nc.h) at 16 floats, compiled with -mavx512f -mavx512dq
 * -mavx512bw -mavx512vl -mavx2 -mfma (setup.py): zmm registers and intrinsics; run by nc.c
 * when the active kernel set is AVX-512 (mapformer/cpu.h). */
#if defined(__x86_64__)
#define MF_VW 16
#define NC_SUFFIX avx512
#define NC_ATTR
#include "../kernels/nc.h"
#endif
