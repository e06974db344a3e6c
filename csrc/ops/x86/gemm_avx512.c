/* The row-block matrix products (csrc/ops/kernels/gemm.h) for AVX-512: 16-float vectors, 32
 * zmm registers. Tile: 8 rows x 2 vectors (8 x 32, 16 accumulators), the tile of the
 * hand-written AVX-512 kernel this replaces, which was measured on AVX-512 machines (this
 * one cannot run AVX-512). */
#if defined(__x86_64__)
#define MF_VW 16
#define MF_GEMM_ROWS 8
#define MF_GEMM_VECS 2
#define MF_GEMM_SUFFIX avx512
#include "../kernels/gemm.h"
#endif
