/* GELU's AVX-512 kernel set (mf_gelu_avx512, kernels/gelu.h): 16 floats, compiled with
 * -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma (setup.py). */
#if defined(__x86_64__)
#define MF_VW 16
#define MF_GELU_TARGET
#define MF_GELU_TABLE mf_gelu_avx512
#include "../kernels/gelu.h"
#endif
