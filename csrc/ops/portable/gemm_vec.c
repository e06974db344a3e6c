/* The row-block matrix products (csrc/ops/kernels/gemm.h) at 4 floats: the portable kernel
 * set, built on every platform (SSE2 on x86-64: 16 xmm registers, no fused multiply-add;
 * NEON on aarch64). Tile: MF_GEMM_ROWS x MF_GEMM_VECS vectors (see the measurements below). */
#define MF_VW 4
#ifndef MF_GEMM_ROWS
#define MF_GEMM_ROWS 6
#endif
#ifndef MF_GEMM_VECS
#define MF_GEMM_VECS 2
#endif
#define MF_GEMM_SUFFIX vec
#include "../kernels/gemm.h"
