/* The activation family (csrc/ops/activation.c): its parameter structs and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_ACTIVATION_H
#define MAPFORMER_OPS_ACTIVATION_H

#include <stdint.h>

/* silu and softplus (Mamba's threshold 20), elementwise over n floats */
typedef struct {
    float *y;        /* forward (n,) */
    float *dx;       /* backward (n,) (=) */
    const float *dy; /* backward (n,) */
    const float *x;  /* (n,) */
    int64_t n;
} MfActivationParams;

/* silu_gate: out = y silu(z), Mamba's output gate, elementwise over n floats */
typedef struct {
    float *out;         /* forward (n,) */
    float *dy, *dz;     /* backward (n,) (=) */
    const float *dout;  /* backward (n,) */
    const float *y, *z; /* (n,) */
    int64_t n;
} MfSiluGateParams;

/* ---- activation.c: SiLU, softplus (MfActivationParams), the SiLU gate, elementwise ------- */
/* y (n,) = x sigmoid(x) */
int silu_forward(const MfActivationParams *p);
/* dx (n,) = dy sigmoid(x) (1 + x (1 - sigmoid(x))) */
int silu_backward(const MfActivationParams *p);
/* y (n,) = log(1 + e^x), or x where x > 20 (Mamba's threshold) */
int softplus_forward(const MfActivationParams *p);
/* dx (n,) = dy sigmoid(x), or dy where x > 20 */
int softplus_backward(const MfActivationParams *p);
/* out (n,) = y silu(z) (MfSiluGateParams) */
int silu_gate_forward(const MfSiluGateParams *p);
/* dy (n,) = dout silu(z), dz (n,) = dout y silu'(z) (MfSiluGateParams) */
int silu_gate_backward(const MfSiluGateParams *p);

#endif
