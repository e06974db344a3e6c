/* The row-block matrix products (csrc/ops/kernels/gemm.h) for AVX2 with FMA: 8-float vectors,
 * 16 ymm registers. Tile: MF_GEMM_ROWS x MF_GEMM_VECS vectors (see the measurements below). */
#if defined(__x86_64__)
#define MF_VW 8
#ifndef MF_GEMM_ROWS
#define MF_GEMM_ROWS 6
#endif
#ifndef MF_GEMM_VECS
#define MF_GEMM_VECS 2
#endif
#define MF_GEMM_SUFFIX avx2
#include "../kernels/gemm.h"
#endif
