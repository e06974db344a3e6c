/* The residual family (csrc/ops/residual.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_RESIDUAL_H
#define MAPFORMER_OPS_RESIDUAL_H

#include <stdint.h>

/* residual: out = a + b (forward); dx += dout (backward) */
typedef struct {
    float *out;          /* forward (n,) */
    float *dx;           /* backward (n,) += */
    const float *a, *b;  /* forward (n,) */
    const float *dout;   /* backward (n,) */
    int64_t n;
} MfResidualParams;

/* ---- residual.c ---------------------------------------------------------------------------- */
/* out = a + b, all (n,) */
int residual_forward(const MfResidualParams *p);
/* dx += dout, both (n,): the residual stream's gradient reaching one branch input */
int residual_backward(const MfResidualParams *p);

#endif
