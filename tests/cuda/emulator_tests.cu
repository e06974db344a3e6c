/* Kernels that test the emulation of CUDA's model itself (tests/test_cuda_emulator.py); valid
 * CUDA, compiled by nvcc too (.ci/cuda_check). */
#include "common.cuh"

/* thread t writes s[t] = t + 1 then reads its neighbour's s[(t + 1) % n]: with the barrier
 * out[t] = (t + 1) % n + 1; without it, a race */
__global__ void neighbour_kernel(float *out, int sync) {
    MF_DYNAMIC_SHARED(float, s);
    const unsigned t = threadIdx.x, n = blockDim.x;
    s[t] = (float)(t + 1);
    if (sync) __syncthreads();
    out[t] = s[(t + 1) % n];
}

extern "C" int mf_test_neighbour(float *out, int n, int sync) {
    return MF_LAUNCH(neighbour_kernel, dim3(1), dim3(n), n * sizeof(float), (cudaStream_t)0,
                     out, sync);
}

/* per block, the sum of its threads' flat indices (+1) by mf_block_reduce over a static
 * __shared__ buffer, and each thread's (x, y, z, block) coordinates; odd threads return
 * before a second barrier that even threads still use */
__global__ void blocks_kernel(float *sums, int *coords, float *after) {
    __shared__ float buf[1024];
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned n = blockDim.x * blockDim.y * blockDim.z;
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int *c = coords + 4 * ((int64_t)b * n + t);
    c[0] = (int)threadIdx.x;
    c[1] = (int)threadIdx.y;
    c[2] = (int)threadIdx.z;
    c[3] = (int)b;
    /* the reduction as mf_block_reduce does it, over the flat thread index */
    buf[t] = (float)(t + 1);
    __syncthreads();
    for (unsigned s = n / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) sums[b] = buf[0];
    __syncthreads();
    if (t % 2 == 1) return;
    buf[t] = (float)b;
    __syncthreads();
    after[(int64_t)b * n + t] = buf[(t + 2) % n];
}

extern "C" int mf_test_blocks(float *sums, int *coords, float *after, const int *grid,
                              const int *block) {
    return MF_LAUNCH(blocks_kernel, dim3(grid[0], grid[1], grid[2]),
                     dim3(block[0], block[1], block[2]), 0, (cudaStream_t)0, sums, coords,
                     after);
}

/* every thread of every block adds 1 to *count */
__global__ void count_kernel(float *count) { atomicAdd(count, 1.0f); }

extern "C" int mf_test_count(float *count, int blocks, int threads) {
    return MF_LAUNCH(count_kernel, dim3(blocks), dim3(threads), 0, (cudaStream_t)0, count);
}

/* the sum of x (n <= 1024 floats) by mf_block_reduce in one block of 256 threads */
__global__ void reduce_kernel(float *out, const float *x, int n) {
    __shared__ float buf[256];
    float v = 0.0f;
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) v += x[i];
    const float s = mf_block_reduce(v, buf, MfSum());
    if (threadIdx.x == 0) out[0] = s;
}

extern "C" int mf_test_reduce(float *out, const float *x, int n) {
    return MF_LAUNCH(reduce_kernel, dim3(1), dim3(256), 0, (cudaStream_t)0, out, x, n);
}

/* thread 0 waits, with no barrier, for a flag that the block's last thread sets: it can only
 * see it if the threads really run at the same time (a serial execution of the block would
 * run thread 0 to its end first); out[0] = 1 when seen, 0 when the wait gave up */
__global__ void concurrency_kernel(int *flag, int *out) {
    if (threadIdx.x == blockDim.x - 1) atomicAdd(flag, 1);
    if (threadIdx.x == 0) {
        long spins = 0;
        while (atomicAdd(flag, 0) == 0 && ++spins < (1L << 28)) {
        }
        out[0] = atomicAdd(flag, 0) != 0;
    }
}

extern "C" int mf_test_concurrency(int *flag, int *out, int threads) {
    return MF_LAUNCH(concurrency_kernel, dim3(1), dim3(threads), 0, (cudaStream_t)0, flag, out);
}
