/* The lstm family (csrc/ops/lstm.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_LSTM_H
#define MAPFORMER_OPS_LSTM_H

#include <stdint.h>

/* lstm: one layer, gates (i, f, g, o) fused in one (4H) row */
typedef struct {
    float *h, *c;              /* forward (B, T, H), (B, T, H): hidden and cell states */
    float *gates;              /* forward (B, T, 4H): the activated gates, saved */
    float *dx;                 /* backward (B, T, C) (=) */
    float *dw_ih, *dw_hh, *db; /* backward (4H, C), (4H, H), (4H,) += */
    float *dh0, *dc0;          /* backward (B, H), (B, H) (=) or NULL */
    const float *dh;           /* backward (B, T, H): the gradient reaching h */
    const float *x;            /* (B, T, C) */
    const float *h_in, *c_in, *gates_in; /* backward: forward's h, c, gates */
    const float *h0, *c0;      /* (B, H), (B, H) or NULL (zeros) */
    const float *w_ih, *w_hh, *b; /* (4H, C), (4H, H), (4H,) */
    int64_t B, T, C, H;
    float *scratch;
    int64_t scratch_floats;
} MfLstmParams;

/* ---- lstm.c: one LSTM layer, gates (i, f, g, o) fused in rows of G = 4H ---------------------- */
/* pre = x w_ih^T + b (all steps at once), then for t in order
 *   pre[:, t] += h_{t-1} w_hh^T;  i, f, o = sigmoid, g = tanh of pre's four H-column parts;
 *   c_t = f c_{t-1} + i g;  h_t = o tanh(c_t)   (h_{-1} = h0, c_{-1} = c0; zeros when NULL)
 * Reads x, w_ih, w_hh, b, h0, c0; writes h, c (B, T, H) and gates (B, T, G): the activated
 * (i, f, g, o), saved for the backward. Scratch: lstm_forward_scratch_floats(p) floats. */
int64_t lstm_forward_scratch_floats(const MfLstmParams *p);
int lstm_forward(const MfLstmParams *p);
/* Backpropagation through time from dh (B, T, H), the gradient reaching every h_t: reads dh,
 * x, w_ih, w_hh, h0, c0 and forward's h_in, c_in, gates_in; writes dx (B, T, C) and, when not
 * NULL, dh0, dc0 (B, H) (=); dw_ih (G, C), dw_hh (G, H), db (G,) +=.
 * Scratch: lstm_backward_scratch_floats(p) floats. */
int64_t lstm_backward_scratch_floats(const MfLstmParams *p);
int lstm_backward(const MfLstmParams *p);

#endif
