/* The attention family's portable kernel set (mf_attn_vec, kernels/attention_sets.h):
 * kernels/attention.h at 4 floats, compiled with the baseline flags (SSE2 on x86-64, where
 * VFMA is a multiply and an add; NEON on aarch64, where it is fused). Shapes measured on Zen 3
 * with SSE2, one thread, plain attention at the training step's size
 * (benchmarks/attention_tiles.py --set portable --threads 1 --kinds 3, CPU-time medians):
 * blocks of 32 with register tiles of 4 rows x 2 vectors took 92.9 ms forward / 214.8 ms
 * backward, against 102.8 / 221.8 (16 x 4 x 2), 112.8 / 256.0 (24 x 4 x 3), 121.5 / 252.0
 * (48 x 4 x 3) and 127.9 / 279.8 (32 x 8 x 1). aarch64's 32 registers might take wider tiles;
 * not measured. */
#define MF_VW 4
#define MF_ATTN_BT 32
#define MF_ATTN_MR 4
#define MF_ATTN_NV 2
#define MF_ATTN_TABLE mf_attn_vec
#include "../kernels/attention.h"
