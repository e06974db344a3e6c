/* The activations' AVX-512 kernel set (mf_act_avx512, kernels/activation.h): 16 floats,
 * compiled with -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma (setup.py). */
#if defined(__x86_64__)
#define MF_VW 16
#define MF_ACT_TARGET
#define MF_ACT_TABLE mf_act_avx512
#include "../kernels/activation.h"
#endif
