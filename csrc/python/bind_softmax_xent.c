/* Binding of csrc/ops/softmax_xent.c. */
#include "bind.h"

#define P(f) offsetof(MfSoftmaxXentParams, f)
static const MfSize sizes[] = {{"N", P(N), "N"}, {"V", P(V), "V"}, {0}};

/* every target in [0, V), checked here for the message; the kernel checks each again as it
 * reads it (MF_EINDEX, raised naming targets); every mask weight finite and >= 0 (a negative
 * weight would make the loss reward wrong predictions) */
static int check(MfCall *c, void *params) {
    const MfSoftmaxXentParams *p = params;
    (void)c;
    for (int64_t n = 0; n < p->N; n++) {
        if (!(p->mask[n] >= 0.0f && isfinite(p->mask[n]))) {
            char value[32];
            snprintf(value, sizeof value, "%g", (double)p->mask[n]);
            PyErr_Format(PyExc_ValueError, "mask[%lld] = %s must be a finite weight >= 0",
                         (long long)n, value);
            return -1;
        }
    }
    return mf_check_ids(p->targets, p->N, p->V, "targets");
}

static const MfArg forward_args[] = {
    {"logits", 1, MF_IN, 0, "N V", MF_FIELD(P, logits)},
    {"targets", 2, MF_IN, 0, "N", MF_FIELD(P, targets), .dtype = MF_I32},
    {"mask", 3, MF_IN, 0, "N", MF_FIELD(P, mask)},
    {"losses", 0, MF_OUT, 0, "N", MF_FIELD(P, losses)},
    {"loss", 0, MF_RESULT, MF_FIELD(P, loss)},
    {0}};
static const MfOp forward = {"softmax_xent_forward", forward_args, sizes,
                             sizeof(MfSoftmaxXentParams), .run = MF_OP(softmax_xent_forward),
                             .check = check, .index_arg = "targets"};

static const MfArg backward_args[] = {
    {"logits", 1, MF_IN, 0, "N V", MF_FIELD(P, logits)},
    {"targets", 2, MF_IN, 0, "N", MF_FIELD(P, targets), .dtype = MF_I32},
    {"mask", 3, MF_IN, 0, "N", MF_FIELD(P, mask)},
    {"scale", 4, MF_FLOAT, 0, MF_FIELD(P, scale), MF_FINITE},
    {"dlogits", 0, MF_OUT, 0, "N V", MF_FIELD(P, dlogits)},
    {0}};
static const MfOp backward = {"softmax_xent_backward", backward_args, sizes,
                              sizeof(MfSoftmaxXentParams), .run = MF_OP(softmax_xent_backward),
                              .check = check, .index_arg = "targets"};

MF_DEFINE(softmax_xent_forward, forward)
MF_DEFINE(softmax_xent_backward, backward)

PyMethodDef mf_softmax_xent_methods[] = {
    MF_METHOD(softmax_xent_forward,
     "softmax_xent_forward(logits, targets, mask) -> (losses, loss)\n\n"
     "logits float32 (N, V), targets int32 (N,) in [0, V), mask float32 (N,)\n"
     "-> losses float32 (N,) = -log softmax(logits)[n, targets[n]] for every row, and\n"
     "loss (float, summed in double) = sum(mask * losses) / sum(mask), 0.0 when sum(mask) == 0."),
    MF_METHOD(softmax_xent_backward,
     "softmax_xent_backward(logits, targets, mask, scale) -> dlogits\n\n"
     "logits float32 (N, V), targets int32 (N,) in [0, V), mask float32 (N,), scale finite\n"
     "-> dlogits float32 (N, V) = scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])).\n"
     "scale = 1 / sum(mask) gives the gradient of the forward's loss."),
    {NULL, NULL, 0, NULL}};
