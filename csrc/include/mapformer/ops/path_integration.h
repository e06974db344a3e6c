/* The path_integration family (csrc/ops/path_integration.c): its parameter struct and its ops,
 * included through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_PATH_INTEGRATION_H
#define MAPFORMER_OPS_PATH_INTEGRATION_H

#include <stdint.h>

/* path_integration: theta = wrap(omega * cumsum_t(delta)), the cumulative sum in double */
typedef struct {
    float *theta;         /* forward (B, T, H, NB) */
    float *ddelta;        /* backward (B, T, H, NB) (=) */
    float *domega;        /* backward (H, NB) += */
    const float *dtheta;  /* backward (B, T, H, NB) */
    const float *delta;   /* (B, T, H, NB) */
    const float *omega;   /* (H, NB) */
    int64_t B, T, H, NB;
    float *scratch;
    int64_t scratch_floats;
} MfPathIntegrationParams;

/* ---- path_integration.c: theta = wrap(omega * cumsum_t(delta)), cumsum in double -------- */
/* theta, delta (B, T, H, NB); omega (H, NB).
 * wrap(a) = a - 2 pi floor(a / (2 pi) + 1/2), in [-pi, pi) */
int path_integration_forward(const MfPathIntegrationParams *p);
/* ddelta (B, T, H, NB) (=), domega (H, NB) +=; dtheta, delta (B, T, H, NB); omega (H, NB) */
int path_integration_backward(const MfPathIntegrationParams *p);
int64_t path_integration_backward_scratch_floats(const MfPathIntegrationParams *p);

#endif
