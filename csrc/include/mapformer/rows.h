/* Row-block helpers of the sgemm-based ops (linear.c, mlp.c), in core.c. */
#ifndef MAPFORMER_ROWS_H
#define MAPFORMER_ROWS_H

#include <stdint.h>

/* out (rows, n) = row (n,) on every row: a bias broadcast before an sgemm with beta = 1 */
void mf_fill_rows(float *out, const float *row, int64_t rows, int64_t n);

/* sum (n,) = the sum over rows [0, rows) of a (rows, n), in double, in row order */
void mf_column_sums(double *sum, const float *a, int64_t rows, int64_t n);

#endif
