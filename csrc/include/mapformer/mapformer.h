/* mapformer C core: every op on raw float32 buffers with int64 sizes.
 *
 * Conventions (llm.c):
 *  - arguments run outputs, then saved buffers, then inputs, then weights, then sizes;
 *    backward puts the d-prefixed gradients first;
 *  - parameter gradients are accumulated (+=); activation gradients are written (=) unless the
 *    op takes an explicit `accumulate` flag;
 *  - every op returns an MfStatus: no printing, no exit, no write outside the given buffers;
 *  - shapes are row-major (C order); `(B, T, H, D)` means index ((b*T + t)*H + h)*D + d.
 * The float64 NumPy reference of every op, the specification, is mapformer/reference.py.
 */
#ifndef MAPFORMER_H
#define MAPFORMER_H

#include <stdint.h>

#include "mapformer/params.h"

typedef enum {
    MF_OK = 0,
    MF_EINVAL = 1,  /* a size or scalar argument out of range */
    MF_ENOMEM = 2,  /* scratch allocation failed */
    MF_EINDEX = 3,  /* a token or target id outside [0, V) */
} MfStatus;

const char *mf_status_string(int status);

/* ---- embedding.c: out[n, :] = weight[tokens[n], :] ------------------------------------- */
/* out (N, C), tokens (N,), weight (V, C) */
int embedding_forward(float *out, const int32_t *tokens, const float *weight, int64_t N,
                      int64_t V, int64_t C);
/* dweight (V, C) +=, dout (N, C), tokens (N,) */
int embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int64_t N,
                       int64_t V, int64_t C);

/* ---- linear.c: y = x weight^T + bias ------------------------------------------------------ */
/* y (N, Cout), x (N, Cin), weight (Cout, Cin), bias (Cout,) or NULL */
int linear_forward(float *y, const float *x, const float *weight, const float *bias, int64_t N,
                   int64_t Cin, int64_t Cout);
/* dx (N, Cin) (= or += when accumulate_dx), dweight (Cout, Cin) +=, dbias (Cout,) += or NULL,
 * dy (N, Cout), x (N, Cin), weight (Cout, Cin) */
int linear_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                    const float *weight, int64_t N, int64_t Cin, int64_t Cout, int accumulate_dx);

/* ---- layernorm.c: y = (x - mean) * rstd * weight + bias over the last axis ---------------- */
/* y (N, C), mean (N,), rstd (N,) saved for backward; x (N, C), weight (C,), bias (C,) */
int layernorm_forward(float *y, float *mean, float *rstd, const float *x, const float *weight,
                      const float *bias, int64_t N, int64_t C, float eps);
/* dx (N, C) (= or += when accumulate_dx), dweight (C,) +=, dbias (C,) += */
int layernorm_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                       const float *mean, const float *rstd, const float *weight, int64_t N,
                       int64_t C, int accumulate_dx);

/* ---- gelu.c: tanh approximation, y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----- */
int gelu_forward(float *y, const float *x, int64_t n);
int gelu_backward(float *dx, const float *dy, const float *x, int64_t n);
/* single-threaded loops shared with mlp.c: y (n,) = gelu(x (n,)); and d (n,) *= gelu'(x)
 * in place with y (n,) = gelu(x) */
void mf_gelu_kernel(float *y, const float *x, int64_t n);
void mf_gelu_grad_kernel(float *y, float *d, const float *x, int64_t n);

/* ---- mlp.c: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj, in row blocks ------------------- */
/* y (N, C); h (N, F) = x w_fc^T + b_fc saved for backward;
 * x (N, C), w_fc (F, C), b_fc (F,), w_proj (C, F), b_proj (C,) */
int mlp_forward(float *y, float *h, const float *x, const float *w_fc, const float *b_fc,
                const float *w_proj, const float *b_proj, int64_t N, int64_t C, int64_t F);
/* dx (N, C) (=), dw_fc (F, C) +=, db_fc (F,) +=, dw_proj (C, F) +=, db_proj (C,) +=;
 * dy (N, C), h (N, F) from forward, x (N, C), w_fc (F, C), w_proj (C, F) */
int mlp_backward(float *dx, float *dw_fc, float *db_fc, float *dw_proj, float *db_proj,
                 const float *dy, const float *h, const float *x, const float *w_fc,
                 const float *w_proj, int64_t N, int64_t C, int64_t F);

/* ---- residual.c ---------------------------------------------------------------------------- */
/* out = a + b, all (n,) */
int residual_forward(float *out, const float *a, const float *b, int64_t n);
/* dx += dout: the residual stream's gradient reaching one branch input */
int residual_backward(float *dx, const float *dout, int64_t n);

/* ---- attention.c: causal softmax attention, tiled (FlashAttention-2); only lse is saved --- */
/* out[b,i,h] = sum_{j <= i} softmax_j(scale q_i . k_j) v_j, lse[b,h,i] = log sum_j exp(..).
 * Forward reads q, k, v, scale and writes out, lse; backward reads dout, q, k, v, o (forward's
 * out), lse_in (forward's lse) and writes dq, dk, dv (=). Both take p->scratch of at least
 * <op>_scratch_floats(p) floats (64-byte aligned; 0 when p's sizes are invalid): MfAttentionParams,
 * mapformer/params.h. */
int64_t attention_forward_scratch_floats(const MfAttentionParams *p);
int attention_forward(const MfAttentionParams *p);
int64_t attention_backward_scratch_floats(const MfAttentionParams *p);
int attention_backward(const MfAttentionParams *p);

/* ---- path_integration.c: theta = wrap(omega * cumsum_t(delta)), cumsum in double -------- */
/* theta, delta (B, T, H, NB); omega (H, NB). wrap(a) = a - 2 pi floor(a / (2 pi) + 1/2), in [-pi, pi) */
int path_integration_forward(float *theta, const float *delta, const float *omega, int64_t B,
                             int64_t T, int64_t H, int64_t NB);
/* ddelta (B, T, H, NB) (=), domega (H, NB) +=; dtheta, delta (B, T, H, NB); omega (H, NB) */
int path_integration_backward(float *ddelta, float *domega, const float *dtheta,
                              const float *delta, const float *omega, int64_t B, int64_t T,
                              int64_t H, int64_t NB);

/* ---- rotary.c: rotate pairs (x[2i], x[2i+1]) of q and k by theta_i ------------------------ */
/* q_out, k_out, q, k (B, T, H, D); theta (TB, T, H, D/2) with TB = 1 (broadcast) or B */
int rotary_forward(float *q_out, float *k_out, const float *q, const float *k,
                   const float *theta, int64_t B, int64_t T, int64_t H, int64_t D, int64_t TB);
/* dq, dk (B, T, H, D) (=); dtheta (TB, T, H, D/2) (=, summed over b when TB = 1) */
int rotary_backward(float *dq, float *dk, float *dtheta, const float *dq_out,
                    const float *dk_out, const float *q, const float *k, const float *theta,
                    int64_t B, int64_t T, int64_t H, int64_t D, int64_t TB);

/* ---- softmax_xent.c: masked softmax cross-entropy ----------------------------------------- */
/* losses (N,) = -log softmax(logits)[target] (every row); *loss = sum(mask*losses)/sum(mask)
 * (0 when sum(mask) == 0), accumulated in double. logits (N, V), targets (N,), mask (N,) */
int softmax_xent_forward(float *losses, double *loss, const float *logits,
                         const int32_t *targets, const float *mask, int64_t N, int64_t V);
/* dlogits (N, V) = scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])) */
int softmax_xent_backward(float *dlogits, const float *logits, const int32_t *targets,
                          const float *mask, float scale, int64_t N, int64_t V);

/* ---- adamw.c: one fused AdamW step over a flat buffer (in place) -------------------------- */
/* params, m, v, grads, decay_mask (n,); step >= 1 (bias correction). Decoupled weight decay
 * params -= lr * weight_decay * params where decay_mask != 0. */
int adamw_step(float *params, float *m, float *v, const float *grads, const uint8_t *decay_mask,
               int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
               int64_t step);

/* ---- grad_norm.c: global L2 norm (double accumulation) and clipping ----------------------- */
int global_norm(double *norm, const float *x, int64_t n);
/* *norm = ||grads||; when *norm > max_norm, grads *= max_norm / (*norm + 1e-6) */
int clip_grad_norm(double *norm, float *grads, int64_t n, float max_norm);

/* ---- cope.c: CoPE attention (contextual position encoding), causal; only lse is saved --- */
/* out (B, T, H, D), lse (B, H, T); q, k, v (B, T, H, D); e (H, n_pos, D) integer position
 * embeddings; scale usually 1/sqrt(D) (the position logits q . e are not scaled) */
int cope_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                 const float *e, int64_t B, int64_t T, int64_t H, int64_t D, int64_t n_pos,
                 float scale);
/* dq, dk, dv (B, T, H, D) (=), de (H, n_pos, D) +=; dout, q, k, v, out (B, T, H, D);
 * e (H, n_pos, D); lse (B, H, T) from cope_forward */
int cope_backward(float *dq, float *dk, float *dv, float *de, const float *dout, const float *q,
                  const float *k, const float *v, const float *e, const float *out,
                  const float *lse, int64_t B, int64_t T, int64_t H, int64_t D, int64_t n_pos,
                  float scale);

/* ---- tape.c: TAPE baseline: complex-state rotary, content-gated head mix of the state ---- */
/* The state e (B, T, H, D) holds NB = D/2 complex numbers per head, e[..., 2k] + i e[..., 2k+1].
 * q_out = q * e, k_out = k * e pairwise as complex numbers (the rotary op when |e| = 1).
 * q_out, k_out, q, k, e (B, T, H, D), D even */
int tape_rotate_forward(float *q_out, float *k_out, const float *q, const float *k,
                        const float *e, int64_t B, int64_t T, int64_t H, int64_t D);
/* dq = conj(e) dq_out, dk = conj(e) dk_out, de = conj(q) dq_out + conj(k) dk_out, all (=);
 * every array (B, T, H, D) */
int tape_rotate_backward(float *dq, float *dk, float *de, const float *dq_out,
                         const float *dk_out, const float *q, const float *k, const float *e,
                         int64_t B, int64_t T, int64_t H, int64_t D);
/* e_new[b,t,h] = e_att[b,t,h] + sigmoid(gate_logits[b,t,h]) sum_h' w[h,h'] e_att[b,t,h'];
 * e_new, e_att (B, T, H, D), D even; gate_logits (B, T, H); w (H, H) */
int tape_mix_forward(float *e_new, const float *e_att, const float *gate_logits,
                     const float *w, int64_t B, int64_t T, int64_t H, int64_t D);
/* de_att (B, T, H, D) (=), dgate_logits (B, T, H) (=), dw (H, H) +=; de_new, e_att
 * (B, T, H, D), gate_logits (B, T, H), w (H, H) */
int tape_mix_backward(float *de_att, float *dgate_logits, float *dw, const float *de_new,
                      const float *e_att, const float *gate_logits, const float *w, int64_t B,
                      int64_t T, int64_t H, int64_t D);

/* ---- conj_attention.c: MapEM's conjunctive attention, causal, tiled; only lse is saved ---- */
/* Content scores sX = qx kx^T and positional scores sP = qp kp^T (causal) combine by mode:
 *   MF_CONJ_SCORE_PRODUCT   A = softmax(scale sX * sP)               (lse: M = 1)
 *   MF_CONJ_SOFTMAX_PRODUCT A = softmax(scale sX) * softmax(scale sP) (lse_X, lse_P: M = 2)
 *   MF_CONJ_SUM             A = softmax(scale (sX + sP))              (lse: M = 1)
 * and out = A v. */
typedef enum {
    MF_CONJ_SCORE_PRODUCT = 0,
    MF_CONJ_SOFTMAX_PRODUCT = 1,
    MF_CONJ_SUM = 2,
} MfConjMode;
/* Forward reads qx, kx, qp, kp, v, scale, mode and writes out (B, T, H, D), lse (M, B, H, T);
 * backward reads dout, qx, kx, qp, kp, v, o (forward's out), lse_in (forward's lse, same scale
 * and mode) and writes dqx, dkx, dqp, dkp, dv (=). Both take p->scratch of at least
 * <op>_scratch_floats(p) floats (64-byte aligned; 0 when p's sizes or mode are invalid):
 * MfConjAttentionParams, mapformer/params.h. */
int64_t conj_attention_forward_scratch_floats(const MfConjAttentionParams *p);
int conj_attention_forward(const MfConjAttentionParams *p);
int64_t conj_attention_backward_scratch_floats(const MfConjAttentionParams *p);
int conj_attention_backward(const MfConjAttentionParams *p);

#endif
