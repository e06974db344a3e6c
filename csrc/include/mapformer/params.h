/* One public parameter struct per op family: pointers, sizes, scalars, mode and the caller's
 * scratch, nothing else (no Python, no allocator), so that the CPU ops (csrc/ops) and the CUDA
 * ops (cuda/, the same struct plus a stream) take the same thing and the binding fills it in
 * one place (csrc/python).
 *
 * Conventions:
 *  - shapes are row-major; `(B, T, H, D)` means index ((b*T + t)*H + h)*D + d;
 *  - a struct serves its family's forward and backward: each op reads the fields its comment
 *    names and ignores the rest (NULL or 0);
 *  - parameter gradients (dweight, dbias, domega, de, dw ...) are accumulated (+=);
 *    activation gradients are written (=) unless the struct has an `accumulate_dx` flag;
 *  - scratch: an op with a `<op>_scratch_floats(p)` function needs that many floats of scratch
 *    (computed from p's sizes and the current OpenMP thread count): `scratch` points to at
 *    least `scratch_floats` floats, 64-byte aligned, contents undefined on entry (the op
 *    zeroes what it needs) and after return. An op given less returns MF_EINVAL; an op run on
 *    more threads than its scratch was sized for uses as many as the scratch serves. Ops
 *    without a scratch function ignore both fields.
 * Each family's struct and ops are in its own header, mapformer/ops/<family>.h (the file
 * csrc/ops/<family>.c implements), included here: a new family is its header and one line
 * below. The ops and their math are declared there too; mapformer/mapformer.h is the
 * core's entry point. */
#ifndef MAPFORMER_PARAMS_H
#define MAPFORMER_PARAMS_H

#include "mapformer/ops/embedding.h"
#include "mapformer/ops/linear.h"
#include "mapformer/ops/layernorm.h"
#include "mapformer/ops/gelu.h"
#include "mapformer/ops/mlp.h"
#include "mapformer/ops/residual.h"
#include "mapformer/ops/attention.h"
#include "mapformer/ops/attention_decode.h"
#include "mapformer/ops/path_integration.h"
#include "mapformer/ops/rotary.h"
#include "mapformer/ops/sln.h"
#include "mapformer/ops/b4.h"
#include "mapformer/ops/nc.h"
#include "mapformer/ops/nc_general.h"
#include "mapformer/ops/ape.h"
#include "mapformer/ops/gridpe.h"
#include "mapformer/ops/softmax_xent.h"
#include "mapformer/ops/adamw.h"
#include "mapformer/ops/grad_norm.h"
#include "mapformer/ops/cope.h"
#include "mapformer/ops/relative.h"
#include "mapformer/ops/tape.h"
#include "mapformer/ops/conj_attention.h"
#include "mapformer/ops/activation.h"
#include "mapformer/ops/conv1d.h"
#include "mapformer/ops/scan.h"
#include "mapformer/ops/vq.h"
#include "mapformer/ops/lstm.h"
#include "mapformer/ops/l2_normalize.h"
#include "mapformer/ops/ema.h"

#endif
