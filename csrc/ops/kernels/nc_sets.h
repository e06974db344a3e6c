/* MapEM-NC's per-group kernels (kernels/nc.h), one copy per width: "clones" at MF_CLONES_VW
 * floats (target_clones, csrc/ops/nc.c), "avx512" at 16 floats (csrc/ops/x86/nc_avx512.c,
 * x86-64 only; run when the active kernel set is AVX-512, mapformer/cpu.h). */
#ifndef MAPFORMER_NC_SETS_H
#define MAPFORMER_NC_SETS_H

#include <stdint.h>

#include "mapformer/params.h"

#define NC_SAVED 12 /* vectors kept per step and group by the backward: w, the adjoint inputs */

/* the sizes of one call at one width: blocks per (b, t) row, groups and spans per row;
 * stream: the output (p in the forward, dw in the backward) is written by non-temporal stores
 * where a whole group is stored at once on AVX-512 (nc.c sets it: output large and every
 * group's rows 64-byte aligned), and its rows are not prefetched */
typedef struct {
    int64_t T, nblk, ngroups, nspans, wlen, plen; /* wlen, plen: the floats of w, p (or dp) */
    int stream;
} NcShape;

#define NC_SPAN 2   /* groups per kernel call (a span): blocks j0 .. j0 + 2 width - 1 */

/* the forward of the span of blocks from j0 (a multiple of 2 width) of batch row b */
void nc_forward_span_clones(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0);
void nc_forward_span_avx512(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0);
/* its backward: dw, and E_1 (4 vectors per group) to ds; buf: T * NC_SPAN * NC_SAVED
 * vectors */
void nc_backward_span_clones(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0,
                             float *buf, float *ds);
void nc_backward_span_avx512(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0,
                             float *buf, float *ds);

#endif
