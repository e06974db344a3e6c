/* The softmax_xent family (csrc/ops/softmax_xent.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_SOFTMAX_XENT_H
#define MAPFORMER_OPS_SOFTMAX_XENT_H

#include <stdint.h>

/* softmax_xent: masked softmax cross-entropy over V classes */
typedef struct {
    float *losses;           /* forward (N,): -log softmax(logits)[target], every row */
    double *loss;            /* forward: sum(mask * losses) / sum(mask) (0 if sum(mask) = 0) */
    float *dlogits;          /* backward (N, V) = scale mask (softmax - onehot(target)) */
    const float *logits;     /* (N, V) */
    const int32_t *targets;  /* (N,), each in [0, V) (checked by the op) */
    const float *mask;       /* (N,) */
    int64_t N, V;
    float scale;             /* backward */
} MfSoftmaxXentParams;

/* ---- softmax_xent.c: masked softmax cross-entropy ----------------------------------------- */
/* losses (N,) = -log softmax(logits)[target] (every row); *loss = sum(mask*losses)/sum(mask)
 * (0 when sum(mask) == 0), accumulated in double. logits (N, V), targets (N,), mask (N,) */
int softmax_xent_forward(const MfSoftmaxXentParams *p);
/* dlogits (N, V) = scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])) */
int softmax_xent_backward(const MfSoftmaxXentParams *p);

#endif
