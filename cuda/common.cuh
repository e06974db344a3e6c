/* What every kernel file (cuda/<family>.cu) includes: the CUDA runtime under nvcc, or, under a
 * host C++ compiler, a faithful execution of CUDA's model on the CPU (cuda/emulate/), so that
 * the same kernel source is compiled for the GPU and run by the tests on any machine.
 *
 * The emulation (any compiler without __CUDACC__, with -fopenmp):
 *  - a launch runs the grid's blocks one after another (x fastest, then y, z); a block's
 *    threads are real concurrent threads, one OpenMP thread each in one parallel region of
 *    exactly blockDim.x * blockDim.y * blockDim.z threads (threadIdx from the thread number,
 *    x fastest); blockIdx, threadIdx, blockDim and gridDim are per-thread variables;
 *  - __syncthreads() is a barrier of the block's threads that, as on sm_70 and later, is not
 *    waited for by threads that have returned from the kernel;
 *  - __shared__ variables are static storage: one copy shared by the block's threads, valid
 *    because one block runs at a time and one launch at a time (a lock); MF_DYNAMIC_SHARED's
 *    memory (the launch's shared bytes) is filled with NaNs (0xff bytes) at every block's
 *    start, so that a read of what no thread of the block wrote shows;
 *  - three schedules (mf_emu_set_schedule): CONCURRENT (the threads run freely), and
 *    SERIAL_FORWARD / SERIAL_REVERSE, where the threads run one at a time between barriers,
 *    in increasing or decreasing thread order (a token passed round the block). A kernel whose
 *    result differs between the two serial orders has a race between barriers (a write and a
 *    read or two writes of one address by two threads with no barrier between them) that the
 *    tests then see deterministically; the concurrent schedule runs the real thing;
 *  - atomicAdd (int, float, double) is an OpenMP atomic; no warp-level operation (shuffles,
 *    votes, warp-synchronous code) is provided: kernels reduce through shared memory and
 *    __syncthreads only;
 *  - device pointers are host pointers; a launch is synchronous and its status is returned.
 * Under nvcc the same macros are CUDA's: MF_LAUNCH is kernel<<<grid, block, shared, stream>>>
 * followed by cudaGetLastError. */
#ifndef MAPFORMER_CUDA_COMMON_CUH
#define MAPFORMER_CUDA_COMMON_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "mapformer/mapformer.h"
}

/* a launch that CUDA refused (bad configuration, no device, an earlier asynchronous error) */
#define MF_ECUDA 4

#ifdef __CUDACC__

#include <cuda_runtime.h>

#define MF_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define MF_LAUNCH(kernel, grid, block, shared, stream, ...)                  \
    (kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__),            \
     cudaGetLastError() == cudaSuccess ? MF_OK : MF_ECUDA)

#else /* the emulation */

#include "emulate/emulate.h"

#endif

/* the number of blocks of `per_block` items covering n items */
static inline unsigned mf_blocks(int64_t n, int64_t per_block) {
    return (unsigned)((n + per_block - 1) / per_block);
}

/* the largest grid.x the kernels use (grid-stride loops cover the rest) */
#define MF_MAX_GRID 65535

/* the first index and the stride of a grid-stride loop over a 1-D grid of 1-D blocks */
#define MF_GRID_START ((int64_t)blockIdx.x * blockDim.x + threadIdx.x)
#define MF_GRID_STRIDE ((int64_t)gridDim.x * blockDim.x)

struct MfSum {
    template <class T>
    __device__ T operator()(T a, T b) const { return a + b; }
};
struct MfMax {
    template <class T>
    __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

/* op-reduction of v over the threads of a 1-D block (blockDim.x a power of two), returned to
 * every thread; buf: blockDim.x elements of shared memory, free again on return. A fixed
 * tree (the same bits on every run and schedule). Every thread of the block must call it. */
template <class T, class Op>
__device__ T mf_block_reduce(T v, T *buf, Op op) {
    const unsigned t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] = op(buf[t], buf[t + s]);
        __syncthreads();
    }
    const T r = buf[0];
    __syncthreads();
    return r;
}

/* Column sums without atomics or scratch: for each column c < C two double sums over the rows
 * r < R, add(r, c, s0, s1) adding row r's terms to them, then done(c, s0, s1). A block is
 * MF_COL_WIDTH columns x MF_COL_LANES row lanes (mf_column_block(), grid mf_column_grid(C),
 * columns in a grid-stride loop): lane l sums rows l, l + MF_COL_LANES, ... in order, and the
 * lanes' sums meet in a fixed shared-memory tree, so every run and schedule gives the same
 * bits. Every thread of the block must call it. */
#define MF_COL_WIDTH 32
#define MF_COL_LANES 32
/* a kernel that calls mf_column_sums2: 1024-thread blocks need at most 64 registers a thread */
#define MF_COLUMN_KERNEL __global__ __launch_bounds__(MF_COL_WIDTH * MF_COL_LANES)
template <class Add, class Done>
__device__ void mf_column_sums2(int64_t R, int64_t C, Add add, Done done) {
    __shared__ double sums[2][MF_COL_LANES][MF_COL_WIDTH + 1];
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    for (int64_t c0 = (int64_t)blockIdx.x * MF_COL_WIDTH; c0 < C;
         c0 += (int64_t)gridDim.x * MF_COL_WIDTH) {
        const int64_t c = c0 + tx;
        double s0 = 0.0, s1 = 0.0;
        if (c < C)
            for (int64_t r = ty; r < R; r += MF_COL_LANES) add(r, c, s0, s1);
        sums[0][ty][tx] = s0;
        sums[1][ty][tx] = s1;
        __syncthreads();
        for (int h = MF_COL_LANES / 2; h > 0; h >>= 1) {
            if (ty < h) {
                sums[0][ty][tx] += sums[0][ty + h][tx];
                sums[1][ty][tx] += sums[1][ty + h][tx];
            }
            __syncthreads();
        }
        if (ty == 0 && c < C) done(c, sums[0][0][tx], sums[1][0][tx]);
        __syncthreads();
    }
}

static inline dim3 mf_column_block() { return dim3(MF_COL_WIDTH, MF_COL_LANES); }
static inline dim3 mf_column_grid(int64_t C) {
    const unsigned grid = mf_blocks(C, MF_COL_WIDTH);
    return dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID);
}

/* The scores of one key tile for one query row: s[j] = q . k_j (row j of ks, n x D) for
 * j < n; returns the larger of m and every s[j] (the tile's running max). */
__device__ __forceinline__ float mf_tile_scores(float *s, const float *q, const float *ks,
                                                int64_t n, int64_t D, float m) {
    for (int64_t jj = 0; jj < n; jj++) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++) dot += q[d] * ks[jj * D + d];
        s[jj] = dot;
        m = fmaxf(m, dot);
    }
    return m;
}

/* One key tile of the online softmax (FlashAttention-2), for one query row: the running max m
 * and sum l and the output accumulator acc (D floats) rescaled from m to the tile's max mt
 * (>= m and every s[j]; the factor is 0 on the first tile, m = -inf), then for each of the n
 * scores e = exp(s[j] - mt) added to l and e v_j (row j of vs, n x D) to acc, j from 0 up or,
 * with reverse, from n - 1 down (the sums' bits follow the order); m becomes mt. */
__device__ __forceinline__ void mf_softmax_tile(float &m, float &l, float *acc, float mt,
                                                const float *s, const float *vs, int64_t n,
                                                int64_t D, bool reverse) {
    const float corr = expf(m - mt);
    l *= corr;
    for (int64_t d = 0; d < D; d++) acc[d] *= corr;
    for (int64_t k = 0; k < n; k++) {
        const int64_t jj = reverse ? n - 1 - k : k;
        const float e = expf(s[jj] - mt);
        l += e;
        for (int64_t d = 0; d < D; d++) acc[d] += e * vs[jj * D + d];
    }
    m = mt;
}

#endif
