/* The ema family (csrc/ops/ema.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_EMA_H
#define MAPFORMER_OPS_EMA_H

#include <stdint.h>

/* ema: an exponential moving average in place, target = decay target + (1 - decay) source */
typedef struct {
    float *target;        /* (n,), updated */
    const float *source;  /* (n,) */
    int64_t n;
    float decay;          /* in [0, 1) */
} MfEmaParams;

/* ---- ema.c: exponential moving average in place (TDB's teacher) ----------------------------- */
/* target (n,) = decay target + (1 - decay) source (n,), elementwise in float32 with
 * 1 - decay rounded once; decay in [0, 1) */
int ema_update(const MfEmaParams *p);

#endif
