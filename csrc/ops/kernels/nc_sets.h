/* MapEM-NC's per-group kernels (kernels/nc.h), one copy per width: "clones" at MF_CLONES_VW
 * floats (target_clones, csrc/ops/nc.c), "avx512" at 16 floats (csrc/ops/x86/nc_avx512.c,
 * x86-64 only; run when the active kernel set is AVX-512, mapformer/cpu.h). */
#ifndef MAPFORMER_NC_SETS_H
#define MAPFORMER_NC_SETS_H

#include <stdint.h>

#include "mapformer/params.h"

#define NC_SAVED 12 /* vectors kept per step and group by the backward: w, the adjoint inputs */

/* the sizes of one call at one width: blocks per head (NB) and per (b, t) row (H NB), groups
 * per head (a group: up to width consecutive blocks of one head) and per row, spans per row;
 * stream: the output (p in the forward, dw in the backward) is written by non-temporal stores
 * on AVX-512 (nc.c sets it: output large and every group a whole, 64-byte aligned vector a
 * feature), and its rows are not prefetched */
typedef struct {
    int64_t T, NB, nblk, gph, ngroups, nspans;
    int stream;
} NcShape;

#define NC_SPAN 2   /* groups per kernel call (a span): groups g0, g0 + 1 of a row */

/* the forward of the span of groups from g0 (a multiple of NC_SPAN) of batch row b */
void nc_forward_span_clones(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0);
void nc_forward_span_avx512(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0);
/* its backward: dw, and E_1 (4 vectors per group) to ds; buf: T * NC_SPAN * NC_SAVED
 * vectors */
void nc_backward_span_clones(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0,
                             float *buf, float *ds);
void nc_backward_span_avx512(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t g0,
                             float *buf, float *ds);

#endif
