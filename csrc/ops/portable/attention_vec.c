/* The attention family's portable kernel set (mf_attn_vec, kernels/attention_sets.h):
 * kernels/attention.h at 4 floats, compiled with the baseline flags (SSE2 on x86-64, NEON on
 * aarch64, where VFMA is a fused multiply-add). 16 xmm registers on x86-64: register tiles of
 * 4 rows x 3 vectors (12 accumulators, 3 operand vectors and a broadcast). */
#define MF_VW 4
#define MF_ATTN_BT 48
#define MF_ATTN_MR 4
#define MF_ATTN_NV 3
#define MF_ATTN_TABLE mf_attn_vec
#include "../kernels/attention.h"
