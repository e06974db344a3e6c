/* The attention family's AVX2 kernel set (mf_attn_avx2, kernels/attention_sets.h):
 * kernels/attention.h at 8 floats, compiled with -mavx2 -mfma (setup.py). 16 ymm registers:
 * register tiles of MR rows x NV vectors, chosen by measurement (the report in the commit that
 * set them; benchmarks/attention_tiles.py repeats it). */
#if defined(__x86_64__)
#define MF_VW 8
#define MF_ATTN_BT 32
#define MF_ATTN_MR 4
#define MF_ATTN_NV 2
#define MF_ATTN_TABLE mf_attn_avx2
#include "../kernels/attention.h"
#endif
