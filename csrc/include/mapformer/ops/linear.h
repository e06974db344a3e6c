/* The linear family (csrc/ops/linear.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_LINEAR_H
#define MAPFORMER_OPS_LINEAR_H

#include <stdint.h>

/* linear: y = x weight^T + bias */
typedef struct {
    float *y;                    /* forward (N, Cout) */
    float *dx, *dweight, *dbias; /* backward (N, Cin) (= or += with accumulate_dx),
                                  * (Cout, Cin) +=, (Cout,) += or NULL */
    const float *dy;             /* backward (N, Cout) */
    const float *x;              /* (N, Cin) */
    const float *weight, *bias;  /* (Cout, Cin), (Cout,) or NULL */
    int64_t N, Cin, Cout;
    int accumulate_dx;
    float *scratch;
    int64_t scratch_floats;
} MfLinearParams;

/* ---- linear.c: y = x weight^T + bias (MfLinearParams) --------------------------------- */
/* forward: y (N, Cout) = x (N, Cin) weight^T + bias; weight (Cout, Cin), bias (Cout,) or NULL.
 * Scratch: linear_forward_scratch_floats(p) floats (0 for sizes out of range). */
int64_t linear_forward_scratch_floats(const MfLinearParams *p);
int linear_forward(const MfLinearParams *p);
/* backward: dx (N, Cin) = dy weight (+= with accumulate_dx), dweight (Cout, Cin) += dy^T x,
 * dbias (Cout,) += column sums of dy (NULL: none); dy (N, Cout), x (N, Cin), weight.
 * Scratch: linear_backward_scratch_floats(p) floats (it depends on whether dbias is NULL). */
int64_t linear_backward_scratch_floats(const MfLinearParams *p);
int linear_backward(const MfLinearParams *p);

#endif
