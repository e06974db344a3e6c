/* The tape family (csrc/ops/tape.c): its parameter structs and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_TAPE_H
#define MAPFORMER_OPS_TAPE_H

#include <stdint.h>

/* tape_rotate: q_out = q * e, k_out = k * e pairwise as complex numbers */
typedef struct {
    float *q_out, *k_out;          /* forward (B, T, H, D) */
    float *dq, *dk, *de;           /* backward (B, T, H, D) (=) */
    const float *dq_out, *dk_out;  /* backward (B, T, H, D) */
    const float *q, *k, *e;        /* (B, T, H, D), D even */
    int64_t B, T, H, D;
} MfTapeRotateParams;

/* tape_mix: e_new[b,t,h] = e_att[b,t,h] + sigmoid(gate_logits[b,t,h]) sum_h' w[h,h'] e_att[b,t,h'] */
typedef struct {
    float *e_new;                    /* forward (B, T, H, D) */
    float *de_att, *dgate_logits;    /* backward (B, T, H, D) (=), (B, T, H) (=) */
    float *dw;                       /* backward (H, H) += */
    const float *de_new;             /* backward (B, T, H, D) */
    const float *e_att;              /* (B, T, H, D), D even */
    const float *gate_logits;        /* (B, T, H) */
    const float *w;                  /* (H, H) */
    int64_t B, T, H, D;
    float *scratch;
    int64_t scratch_floats;
} MfTapeMixParams;

/* ---- tape.c: TAPE baseline: complex-state rotary, content-gated head mix of the state ---- */
/* The state e (B, T, H, D) holds NB = D/2 complex numbers per head, e[..., 2k] + i e[..., 2k+1].
 * q_out = q * e, k_out = k * e pairwise as complex numbers (the rotary op when |e| = 1).
 * q_out, k_out, q, k, e (B, T, H, D), D even */
int tape_rotate_forward(const MfTapeRotateParams *p);
/* dq = conj(e) dq_out, dk = conj(e) dk_out, de = conj(q) dq_out + conj(k) dk_out, all (=);
 * every array (B, T, H, D) */
int tape_rotate_backward(const MfTapeRotateParams *p);
/* e_new[b,t,h] = e_att[b,t,h] + sigmoid(gate_logits[b,t,h]) sum_h' w[h,h'] e_att[b,t,h'];
 * e_new, e_att (B, T, H, D), D even; gate_logits (B, T, H); w (H, H) */
int tape_mix_forward(const MfTapeMixParams *p);
/* de_att (B, T, H, D) (=), dgate_logits (B, T, H) (=), dw (H, H) +=; de_new, e_att
 * (B, T, H, D), gate_logits (B, T, H), w (H, H) */
int tape_mix_backward(const MfTapeMixParams *p);
int64_t tape_mix_backward_scratch_floats(const MfTapeMixParams *p);

#endif
