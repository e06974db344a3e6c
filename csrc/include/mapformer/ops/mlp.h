/* The mlp family (csrc/ops/mlp.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_MLP_H
#define MAPFORMER_OPS_MLP_H

#include <stdint.h>

/* mlp: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj; exact as MfGeluParams' */
typedef struct {
    float *y, *h;                  /* forward (N, C); h (N, F) = x w_fc^T + b_fc, saved */
    float *dx;                     /* backward (N, C) (=) */
    float *dw_fc, *db_fc;          /* backward (F, C) +=, (F,) += */
    float *dw_proj, *db_proj;      /* backward (C, F) +=, (C,) += */
    const float *dy;               /* backward (N, C) */
    const float *h_in;             /* backward: forward's h (N, F) */
    const float *x;                /* (N, C) */
    const float *w_fc, *b_fc;      /* (F, C), (F,) */
    const float *w_proj, *b_proj;  /* (C, F), (C,) */
    int64_t N, C, F;
    int exact;
    float *scratch;
    int64_t scratch_floats;
} MfMlpParams;

/* ---- mlp.c: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj, in row blocks (MfMlpParams) --- */
/* forward: y (N, C); h (N, F) = x w_fc^T + b_fc saved for backward;
 * x (N, C), w_fc (F, C), b_fc (F,), w_proj (C, F), b_proj (C,).
 * Scratch: mlp_forward_scratch_floats(p) floats. */
int64_t mlp_forward_scratch_floats(const MfMlpParams *p);
int mlp_forward(const MfMlpParams *p);
/* backward: dx (N, C) (=), dw_fc (F, C) +=, db_fc (F,) +=, dw_proj (C, F) +=, db_proj (C,) +=;
 * dy (N, C), h_in (N, F) from forward, x (N, C), w_fc (F, C), w_proj (C, F).
 * Scratch: mlp_backward_scratch_floats(p) floats. */
int64_t mlp_backward_scratch_floats(const MfMlpParams *p);
int mlp_backward(const MfMlpParams *p);

#endif
