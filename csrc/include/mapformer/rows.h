/* Row-block helpers of the sgemm-based ops (linear.c, mlp.c), in core.c. */
#ifndef MAPFORMER_ROWS_H
#define MAPFORMER_ROWS_H

#include <stdint.h>

#include "mapformer/mapformer.h"

/* Rows per block of linear.c and mlp.c on a kernel set. The blocks are the unit of the weight
 * gradients' chunks (below) and of the bias sums, so of their bits: the two ops cut rows
 * alike on each set (the fused MLP gives the bits of linear, gelu, linear), whatever the
 * thread count. A block's activations, and the MLP's hidden rows g and dh (R x F floats),
 * stay in the core's L2 cache between the products of a block. */
int64_t mf_row_block(int kernels);

/* linear.c's outputs of at least this many floats (4 MB, past a core's L2 cache), y and a dx
 * written (not accumulated), are stored non-temporally: their lines are not read before the
 * writes. At 32768 rows, AVX-512, one thread: Mamba's dt_proj forward (8 -> 256, 32 MB out)
 * took 1.7 ms so against 2.9-5.1 ms, the 128 <-> 256 linears' forwards and 256 -> 128's
 * backward 0.5-1.5 ms less (of 14-30). The MLP's y and dx (N x 128) streamed took no less. */
#define MF_STREAM_FLOATS ((int64_t)1 << 20)

/* sum (n,) = the sum over rows [0, rows) of a (rows, n), in double, in row order */
void mf_column_sums(double *sum, const float *a, int64_t rows, int64_t n);

/* Weight gradients in chunks of row blocks. The backward ops cut their row blocks into
 * mf_grad_chunks(blocks, weight_floats) chunks, chunk c holding blocks
 * [c * blocks / chunks, (c + 1) * blocks / chunks); each chunk, on one thread, sums its
 * blocks' weight gradients in order into its own scratch (weight_floats floats), and
 * mf_add_chunks adds the scratches in chunk order. The chunks are a function of the sizes,
 * so the gradients have the same bits for any thread count. At most MF_GRAD_CHUNKS chunks,
 * fewer where their scratch would pass MF_GRAD_SCRATCH floats (64 MB). The chunks are the
 * backward's unit of parallelism: an MLP of width 512 (two 512 x 2048 weights) has 8, one of
 * width 1024 has 2, and no more threads than that share its backward. */
#define MF_GRAD_CHUNKS 16
#define MF_GRAD_SCRATCH ((int64_t)1 << 24)
int64_t mf_grad_chunks(int64_t blocks, int64_t weight_floats);

/* dst (size,) += the sum over c < chunks of parts[c * stride : c * stride + size], in double,
 * in chunk order (parallel over the elements) */
void mf_add_chunks(float *dst, const float *parts, int64_t chunks, int64_t stride, int64_t size);

/* dst (n,) += the sum over b < blocks of sums[b * stride : b * stride + n] (the blocks' own
 * double column sums, from mf_column_sums), in block order: the bias gradients */
void mf_add_block_sums(float *dst, const double *sums, int64_t blocks, int64_t stride,
                       int64_t n);

/* In a parallel loop over blocks: *status = st unless st is MF_OK (the last failure wins) */
static inline void mf_record_status(int *status, int st) {
    if (st != MF_OK) {
#pragma omp atomic write
        *status = st;
    }
}

#endif
