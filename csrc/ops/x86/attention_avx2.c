/* The attention family's AVX2 kernel set (mf_attn_avx2, kernels/attention_sets.h):
 * kernels/attention.h at 8 floats, compiled with -mavx2 -mfma (setup.py). Shapes measured on
 * Zen 3 (32 KB L1D, 16 ymm registers), one thread, at the training step's size, CPU-time
 * medians of 5 alternated rounds (benchmarks/attention_tiles.py --set avx2 --threads 1
 * --rounds 5 --repeats 3 --shapes 32x4x2,24x4x3,48x4x3,64x4x2,48x6x2,16x4x2), forward /
 * backward ms, plain attention and score_product:
 *   32 x 4 x 2   38.5 /  87.0    59.2 / 154.9     (block x tile rows x tile vectors)
 *   64 x 4 x 2   38.2 /  89.9    57.6 / 153.4
 *   48 x 6 x 2   48.0 /  85.5    63.7 / 143.3
 *   24 x 4 x 3   55.5 /  85.4    76.7 / 147.8
 *   48 x 4 x 3   61.3 /  87.9    99.3 / 154.2
 *   16 x 4 x 2   68.0 /  86.7   113.2 / 146.1
 * Tiles of 12 accumulators lose the forward (the compiler spills one in the score and PV
 * loops; the loop as a function of its own costs more), and blocks past 32 push a forward
 * block pair's working set (Q^T, S^T, V, O) out of L1. */
#if defined(__x86_64__)
#define MF_VW 8
#define MF_ATTN_BT 32
#define MF_ATTN_MR 4
#define MF_ATTN_NV 2
#define MF_ATTN_TABLE mf_attn_avx2
#include "../kernels/attention.h"
#endif
