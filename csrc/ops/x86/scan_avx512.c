/* The selective scans' AVX-512 kernel set (mf_scan_avx512, kernels/scan_sets.h):
 * kernels/scan.h at 16 floats (16 channels per group), compiled with -mavx512f -mavx512dq
 * -mavx512bw -mavx512vl -mavx2 -mfma (setup.py), where simd.h's VFMAF is one vector FMA. */
#if defined(__x86_64__)
#define MF_VW 16
#define MF_SCAN_TARGET
#define MF_SCAN_TABLE mf_scan_avx512
#include "../kernels/scan.h"
#endif
