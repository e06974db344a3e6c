/* The selective scans' kernel sets (csrc/ops/scan.c: the driver, its header comment the
 * method): a set runs one group, MF_VW channels of one batch row as the lanes of its vectors,
 * forward or backward (kernels/scan.h):
 *   mf_scan_avx512   csrc/ops/x86/scan_avx512.c   16 floats, -mavx512f ... -mfma
 *   mf_scan_clones   csrc/ops/scan.c              8 floats on x86-64 with any compiler (GCC's
 *                                                 MF_CLONES_FMA copies: AVX-512 in ymm, AVX2 with
 *                                                 FMA, or the baseline; clang: the baseline),
 *                                                 mapformer/clones.h's MF_CLONES_VW elsewhere
 * The active set (mf_kernels()) avx512 runs mf_scan_avx512, every other set mf_scan_clones.
 * Every lane's arithmetic is the same on both and the sums over channels (dB, dC) take the
 * same tree, so both give the same bits. */
#ifndef MAPFORMER_SCAN_SETS_H
#define MAPFORMER_SCAN_SETS_H

#include <stdint.h>

#include "mapformer/cpu.h"
#include "mapformer/mapformer.h"

#define SCAN_MAXS 256           /* state floats per channel (the CUDA kernel's MAX_DSTATE) */
#define SCAN_MAXVW 16           /* the widest set's floats per vector (scratch sizes) */
#define SCAN_EB 64              /* channels per work item (a multiple of every set's width) */

/* the group's outputs of the backward */
typedef struct {
    float *dx, *ddelta, *ddangle; /* at (b, 0, e0), stride E; ddangle NULL for the real scan */
    float *dBm, *dCm;             /* (T, S) of this item, accumulated over its groups */
    double *dA, *dW, *dD, *dS;    /* (n, K), (n, K), (n,), (n,) at (b, e0); dS: delta_bias's */
    float *buf; /* scratch: chunk * scan_step_vectors(S, bbar) vectors */
} GroupGrad;

/* the backward's scratch vectors per step of a chunk: h_{t-1} and a_t (S each), ZOH's phi and
 * phi' (S each), then the SCAN_STEP_VECTORS of the step: it, its slope (softplus') and the
 * rotation's step */
#define SCAN_STEP_VECTORS 3
static inline int64_t scan_step_vectors(int64_t S, int bbar) {
    return (bbar == MF_BBAR_ZOH ? 4 : 2) * S + SCAN_STEP_VECTORS;
}

/* one set: its width, and the forward and backward of the group (batch row b, channels e0 ..
 * e0 + n - 1, n <= vw) of the real (cx = 0) or complex (cx = 1) scan */
typedef struct {
    int64_t vw;
    void (*forward)(const MfScanParams *p, int cx, int64_t b, int64_t e0, int64_t n);
    void (*backward)(const MfScanParams *p, int cx, int64_t b, int64_t e0, int64_t n,
                     const GroupGrad *o);
} MfScanKernels;

#if MF_X86
extern const MfScanKernels mf_scan_avx512;
#endif
extern const MfScanKernels mf_scan_clones;

/* the set that kernel set `kernels` (an MfKernels value) runs */
static inline const MfScanKernels *mf_scan_kernels(int kernels) {
#if MF_X86
    if (kernels == MF_KERNELS_AVX512) return &mf_scan_avx512;
#endif
    (void)kernels;
    return &mf_scan_clones;
}

#endif
