/* The row-block matrix products (csrc/ops/kernels/gemm.h) at 4 floats: the portable kernel
 * set, built on every platform (SSE2 on x86-64: 16 xmm registers, no fused multiply-add, so
 * VFMA is a multiply and an add; NEON on aarch64: 32 registers, fused).
 *
 * Tile: 6 rows x 2 vectors (6 x 8), as on AVX2. Measured with SSE2 on an AMD Zen 3, one
 * thread, operands in cache, GFLOP/s of (forward, dx, dW) at 128->128 / 128->512 / 512->128:
 * 6 x 2 28.7 29.0 29.4 / 29.0 29.0 29.8 / 29.3 29.4 29.0; 3 x 3 30.7 30.2 29.6 / 30.7 30.9
 * 28.2 / 30.1 30.3 30.3; 4 x 2 and 4 x 3 within those, 8 x 1 20 (OpenBLAS's AVX2 kernel:
 * 82-88): within 5% of each other, so the shape that also suits NEON's 32 registers.
 */
#define MF_VW 4
#ifndef MF_GEMM_ROWS
#define MF_GEMM_ROWS 6
#endif
#ifndef MF_GEMM_VECS
#define MF_GEMM_VECS 2
#endif
#define MF_GEMM_SUFFIX vec
#include "../kernels/gemm.h"
