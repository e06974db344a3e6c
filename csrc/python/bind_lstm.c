/* Binding of csrc/ops/lstm.c. */
#include "bind.h"

#define P(f) offsetof(MfLstmParams, f)
/* G is the gates' width, 4 H */
static const MfSize sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"C", P(C), "C"},
                               {"H", P(H), "H"}, {0}};

/* w_hh fixes H (its second axis) and G: G must be 4 H */
static int check(MfCall *c, void *params) {
    (void)params;
    if (mf_size(c, "G") != 4 * mf_size(c, "H")) {
        PyErr_Format(PyExc_ValueError, "w_hh must have shape (4H, H), got (%lld, %lld)",
                     (long long)mf_size(c, "G"), (long long)mf_size(c, "H"));
        return -1;
    }
    return 0;
}

static const MfArg forward_args[] = {
    {"x", 1, MF_IN, 0, "B T C", MF_FIELD(P, x)},
    {"w_hh", 3, MF_IN, 0, "G H", MF_FIELD(P, w_hh)},
    {"w_ih", 2, MF_IN, 0, "G C", MF_FIELD(P, w_ih)},
    {"b", 4, MF_IN, 0, "G", MF_FIELD(P, b)},
    {"h0", 5, MF_IN, MF_OPTIONAL | MF_NONE, "B H", MF_FIELD(P, h0)},
    {"c0", 6, MF_IN, MF_OPTIONAL | MF_NONE, "B H", MF_FIELD(P, c0)},
    {"h", 0, MF_OUT, 0, "B T H", MF_FIELD(P, h)},
    {"c", 0, MF_OUT, 0, "B T H", MF_FIELD(P, c)},
    {"gates", 0, MF_OUT, 0, "B T G", MF_FIELD(P, gates)},
    {0}};
static const MfOp forward = {"lstm_forward", forward_args, sizes, sizeof(MfLstmParams),
                             .run = MF_OP(lstm_forward), .check = check,
                             .scratch = MF_SCRATCH(lstm_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfLstmParams)};

static const MfArg backward_args[] = {
    {"dh", 1, MF_IN, 0, "B T H", MF_FIELD(P, dh)},
    {"x", 2, MF_IN, 0, "B T C", MF_FIELD(P, x)},
    {"w_hh", 4, MF_IN, 0, "G H", MF_FIELD(P, w_hh)},
    {"w_ih", 3, MF_IN, 0, "G C", MF_FIELD(P, w_ih)},
    {"h", 5, MF_IN, 0, "B T H", MF_FIELD(P, h_in)},
    {"c", 6, MF_IN, 0, "B T H", MF_FIELD(P, c_in)},
    {"gates", 7, MF_IN, 0, "B T G", MF_FIELD(P, gates_in)},
    {"db", 10, MF_INOUT, 0, "G", MF_FIELD(P, db)},
    {"dw_ih", 8, MF_INOUT, 0, "G C", MF_FIELD(P, dw_ih)},
    {"dw_hh", 9, MF_INOUT, 0, "G H", MF_FIELD(P, dw_hh)},
    {"h0", 11, MF_IN, MF_OPTIONAL | MF_NONE, "B H", MF_FIELD(P, h0)},
    {"c0", 12, MF_IN, MF_OPTIONAL | MF_NONE, "B H", MF_FIELD(P, c0)},
    {"dx", 0, MF_OUT, 0, "B T C", MF_FIELD(P, dx)},
    {"dh0", 0, MF_OUT, 0, "B H", MF_FIELD(P, dh0)},
    {"dc0", 0, MF_OUT, 0, "B H", MF_FIELD(P, dc0)},
    {0}};
static const MfOp backward = {"lstm_backward", backward_args, sizes, sizeof(MfLstmParams),
                              .run = MF_OP(lstm_backward), .check = check,
                              .scratch = MF_SCRATCH(lstm_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfLstmParams)};

MF_DEFINE(lstm_forward, forward)
MF_DEFINE(lstm_backward, backward)

PyMethodDef mf_lstm_methods[] = {
    MF_METHOD(lstm_forward,
     "lstm_forward(x, w_ih, w_hh, b, h0=None, c0=None) -> (h, c, gates)\n\n"
     "One LSTM layer over x float32 (B, T, C): w_ih (4H, C), w_hh (4H, H), b (4H,), gates in\n"
     "the order (i, f, g, o); h0, c0 (B, H) or None (zeros). Returns h, c (B, T, H) and the\n"
     "activated gates (B, T, 4H), which the backward reads."),
    MF_METHOD(lstm_backward,
     "lstm_backward(dh, x, w_ih, w_hh, h, c, gates, dw_ih, dw_hh, db, h0=None, c0=None)\n"
     "    -> (dx, dh0, dc0)\n\n"
     "Backpropagation through time from dh float32 (B, T, H) (the gradient reaching every h),\n"
     "with forward's h, c, gates. dw_ih (4H, C), dw_hh (4H, H), db (4H,) are accumulated in\n"
     "place; returns dx (B, T, C), dh0 and dc0 (B, H)."),
    {NULL, NULL, 0, NULL}};
