/* MapEM-NC's per-group kernels (kernels/nc.h), one copy per width: "clones" at MF_CLONES_VW
 * floats (target_clones, csrc/ops/nc.c), "avx512" at 16 floats (csrc/ops/x86/nc_avx512.c,
 * x86-64 only; run when the active kernel set is AVX-512, mapformer/cpu.h). */
#ifndef MAPFORMER_NC_SETS_H
#define MAPFORMER_NC_SETS_H

#include <stdint.h>

#include "mapformer/params.h"

#define NC_SAVED 22 /* vectors kept per step by the backward: phat_t, w, 6 coefficients x 2 */

/* the sizes of one call at one width: blocks per (b, t) row, groups per row */
typedef struct {
    int64_t T, nblk, ngroups, wlen, plen; /* wlen, plen: the floats of w and of p (or dp) */
} NcShape;

/* the forward of the group of blocks j0 .. j0 + width - 1 of batch row b */
void nc_forward_group_clones(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0);
void nc_forward_group_avx512(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0);
/* its backward: dw, and E_1 (4 vectors) to ds; buf: T * NC_SAVED vectors */
void nc_backward_group_clones(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0,
                              float *buf, float *ds);
void nc_backward_group_avx512(const MfNcParams *p, const NcShape *sh, int64_t b, int64_t j0,
                              float *buf, float *ds);

#endif
