/* mapformer C core: every op on raw float32 buffers with int64 sizes.
 *
 * Every op takes its family's parameter struct (pointers, sizes, scalars, mode and the
 * caller's scratch), `int <op>(const Mf<Family>Params *p)`, reads the fields its comment names
 * and ignores the rest: struct, ops and their math are in the family's header,
 * mapformer/ops/<family>.h (csrc/ops/<family>.c implements it), all included through
 * mapformer/params.h (the structs' conventions). An op that needs scratch has
 * `int64_t <op>_scratch_floats(const Mf<Family>Params *p)`: the floats of p->scratch it needs
 * for p's sizes on mf_max_threads() threads (params.h says how scratch works); the op itself
 * allocates nothing.
 *
 * Conventions (llm.c):
 *  - parameter gradients are accumulated (+=); activation gradients are written (=) unless the
 *    struct has an `accumulate_dx` flag;
 *  - every op returns an MfStatus: no printing, no exit, no write outside the given buffers;
 *  - shapes are row-major (C order); `(B, T, H, D)` means index ((b*T + t)*H + h)*D + d;
 *  - an index read from memory (a token or target id) is checked where the kernel reads it,
 *    never trusted from an earlier check: MF_EINDEX, the op's outputs then unspecified.
 * The float64 NumPy reference of every op, the specification, is mapformer/reference.py.
 */
#ifndef MAPFORMER_H
#define MAPFORMER_H

#include <stdint.h>

#include "mapformer/params.h"

typedef enum {
    MF_OK = 0,
    MF_EINVAL = 1,  /* a size or scalar argument out of range, or too little scratch */
    MF_ENOMEM = 2,  /* out of memory (the caller's allocation of outputs or scratch) */
    MF_EINDEX = 3,  /* an id outside its range: a token, target, position id, index, prefix */
} MfStatus;

const char *mf_status_string(int status);

#endif
