/* Binding of csrc/ops/adamw.c, csrc/ops/grad_norm.c and csrc/ops/ema.c. */
#include "bind.h"

#define A(f) offsetof(MfAdamwParams, f)
#define G(f) offsetof(MfGradNormParams, f)
#define E(f) offsetof(MfEmaParams, f)

/* params, m, v are updated in place; lr and step are required keyword-only arguments */
static const MfArg adamw_args[] = {
    {"params", 1, MF_INOUT, 0, "P", MF_FIELD(A, params)},
    {"grads", 2, MF_IN, 0, "P", MF_FIELD(A, grads)},
    {"m", 3, MF_INOUT, 0, "P", MF_FIELD(A, m)},
    {"v", 4, MF_INOUT, 0, "P", MF_FIELD(A, v)},
    {"decay_mask", 5, MF_IN, 0, "P", MF_FIELD(A, decay_mask), .dtype = MF_BOOL},
    {"lr", 6, MF_FLOAT, MF_KWONLY, MF_FIELD(A, lr), .lo = 0, .hi = INFINITY, .open = MF_HI_OPEN},
    {"step", 7, MF_INT, MF_KWONLY, MF_FIELD(A, step), .lo = 1},
    {"beta1", 8, MF_FLOAT, MF_KWONLY | MF_OPTIONAL, MF_FIELD(A, beta1), .lo = 0, .hi = 1,
     .open = MF_HI_OPEN, .dflt = 0.9},
    {"beta2", 9, MF_FLOAT, MF_KWONLY | MF_OPTIONAL, MF_FIELD(A, beta2), .lo = 0, .hi = 1,
     .open = MF_HI_OPEN, .dflt = 0.999},
    {"eps", 10, MF_FLOAT, MF_KWONLY | MF_OPTIONAL, MF_FIELD(A, eps), .lo = 0, .hi = INFINITY,
     .open = MF_LO_OPEN | MF_HI_OPEN, .dflt = 1e-8},
    {"weight_decay", 11, MF_FLOAT, MF_KWONLY | MF_OPTIONAL, MF_FIELD(A, weight_decay), .lo = 0,
     .hi = INFINITY, .open = MF_HI_OPEN, .dflt = 0.0},
    {0}};
static const MfSize adamw_sizes[] = {{"P", A(n), "n"}, {0}};

/* v, the second moment, finite and >= 0 (a negative entry would make its parameter NaN:
 * found by tests/fuzz_ops.py) */
static int adamw_check(MfCall *c, void *params) {
    const MfAdamwParams *p = params;
    (void)c;
    for (int64_t i = 0; i < p->n; i++) {
        if (!(p->v[i] >= 0.0f && isfinite(p->v[i]))) {
            char value[32];
            snprintf(value, sizeof value, "%g", (double)p->v[i]);
            PyErr_Format(PyExc_ValueError,
                         "v[%lld] = %s must be finite and >= 0 (AdamW's second moment)",
                         (long long)i, value);
            return -1;
        }
    }
    return 0;
}

static const MfOp adamw = {"adamw_step", adamw_args, adamw_sizes, sizeof(MfAdamwParams),
                           .run = MF_OP(adamw_step), .check = adamw_check};

static const MfSize norm_sizes[] = {{"P", G(n), "n"}, {0}};
static const MfArg global_norm_args[] = {
    {"x", 1, MF_IN, 0, "P", MF_FIELD(G, x)},
    {"norm", 0, MF_RESULT, MF_FIELD(G, norm)},
    {0}};
static const MfOp global_norm_op = {"global_norm", global_norm_args, norm_sizes,
                                    sizeof(MfGradNormParams), .run = MF_OP(global_norm)};

/* max_norm > 0; +inf computes the norm and never clips */
static const MfArg clip_args[] = {
    {"grads", 1, MF_INOUT, 0, "P", MF_FIELD(G, grads)},
    {"max_norm", 2, MF_FLOAT, 0, MF_FIELD(G, max_norm), .lo = 0, .hi = INFINITY,
     .open = MF_LO_OPEN},
    {"norm", 0, MF_RESULT, MF_FIELD(G, norm)},
    {0}};
static const MfOp clip = {"clip_grad_norm", clip_args, norm_sizes, sizeof(MfGradNormParams),
                          .run = MF_OP(clip_grad_norm)};

/* target is updated in place; decay in [0, 1) */
static const MfArg ema_args[] = {
    {"target", 1, MF_INOUT, 0, "P", MF_FIELD(E, target)},
    {"source", 2, MF_IN, 0, "P", MF_FIELD(E, source)},
    {"decay", 3, MF_FLOAT, 0, MF_FIELD(E, decay), .lo = 0, .hi = 1, .open = MF_HI_OPEN},
    {0}};
static const MfSize ema_sizes[] = {{"P", E(n), "n"}, {0}};
static const MfOp ema = {"ema_update", ema_args, ema_sizes, sizeof(MfEmaParams),
                         .run = MF_OP(ema_update)};

MF_DEFINE(adamw_step, adamw)
MF_DEFINE(global_norm, global_norm_op)
MF_DEFINE(clip_grad_norm, clip)
MF_DEFINE(ema_update, ema)

PyMethodDef mf_optim_methods[] = {
    MF_METHOD(adamw_step,
     "adamw_step(params, grads, m, v, decay_mask, *, lr, step, beta1=0.9, beta2=0.999,\n"
     "           eps=1e-8, weight_decay=0.0) -> None\n\n"
     "One AdamW step (PyTorch's rule, decoupled weight decay) in place on params, m, v.\n"
     "params, grads, m, v float32 (P,), decay_mask bool (P,) (decay only where True), all\n"
     "distinct buffers. lr finite >= 0, beta1 and beta2 in [0, 1), eps finite > 0,\n"
     "weight_decay finite >= 0, step int >= 1 (the 1-based step for bias correction)."),
    MF_METHOD(global_norm,
     "global_norm(x) -> float\n\n"
     "x float32 (P,) -> sqrt(sum(x**2)), squares summed in double; the same bits for any\n"
     "thread count."),
    MF_METHOD(clip_grad_norm,
     "clip_grad_norm(grads, max_norm) -> float\n\n"
     "grads float32 (P,), scaled in place by max_norm / (norm + 1e-6) when norm > max_norm.\n"
     "Returns the norm before clipping. max_norm > 0; float('inf') computes the norm and never\n"
     "clips. A non-finite norm (NaN or inf in grads) is returned and grads are left untouched,\n"
     "so the caller can skip the step."),
    MF_METHOD(ema_update,
     "ema_update(target, source, decay) -> None\n\n"
     "target = decay * target + (1 - decay) * source in place (an exponential moving average:\n"
     "TDB's teacher). target, source float32 (P,), distinct buffers; decay in [0, 1). Float32\n"
     "arithmetic, 1 - decay rounded once; the same bits for any thread count."),
    {NULL, NULL, 0, NULL}};
