/* The attention family's AVX-512 kernel set (mf_attn_avx512, kernels/attention_sets.h):
 * kernels/attention.h at 16 floats, compiled with -mavx512f -mavx512dq -mavx512bw -mavx512vl
 * -mavx2 -mfma (setup.py). The shapes of the AVX-512 kernels this set replaced, measured on
 * Zen 4/5: blocks of 64 queries and keys, register tiles of 4 rows x 4 vectors (16 of the 32
 * zmm registers hold accumulators). */
#if defined(__x86_64__)
#define MF_VW 16
#define MF_ATTN_BT 64
#define MF_ATTN_MR 4
#define MF_ATTN_NV 4
#define MF_ATTN_TABLE mf_attn_avx512
#include "../kernels/attention.h"
#endif
