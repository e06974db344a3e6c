/* The row-block matrix products (csrc/ops/kernels/gemm.h) for AVX2 with FMA: 8-float vectors,
 * 16 ymm registers.
 *
 * Tile: 6 rows x 2 vectors (6 x 16: 12 accumulators, 2 b vectors, 1 broadcast). Measured on
 * an AMD Zen 3 (EPYC, 2 cores, 512 KB L2 each), one thread, thread CPU time, best of 8,
 * GFLOP/s of (forward, dx, dW) at the step's shapes, 4096 rows in 256-row blocks:
 *   operands in cache    128->128          128->512          512->128
 *     6 x 2              93.4 94.3 86.8    92.0 91.2 82.0    90.4 91.6 86.4
 *     4 x 3              88.8 90.1 83.6    91.3 86.1 74.9    85.5 91.7 87.7
 *     3 x 4              95.0 95.9 86.2    92.6 91.7 72.8    90.8 93.4 87.9
 *     5 x 2              92.6 93.2 86.1    91.1 89.8 80.2    89.5 90.5 84.8
 *     OpenBLAS sgemm     88.0 89.6 88.5    87.2 89.6 90.6    86.8 87.2 88.7
 * and in the ops (linear_forward/backward, mlp_forward/backward at N = 4096 and 32768 rows,
 * alternating runs, medians), 3 x 4 ran the linear forwards 5-10% faster and 6 x 2 the
 * weight-gradient products (the MLP backward 2-5%, the largest op of a training step) faster;
 * 3 x 4's 32-column panels also need passes of 128 over k to stay in L1. 6 x 2 it is.
 * Passes over k of 256 (against 128 and 512: within 2%, 128 the slowest).
 */
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
