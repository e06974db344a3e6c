/* mapformer C core: every op on raw float32 buffers with int64 sizes.
 *
 * Every op takes its family's parameter struct (mapformer/params.h: pointers, sizes, scalars,
 * mode and the caller's scratch), `int <op>(const Mf<Family>Params *p)`, reads the fields its
 * comment below names and ignores the rest. An op that needs scratch has
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

/* ---- embedding.c: out[n, :] = weight[tokens[n], :] ---------------------------------------- */
/* out (N, C); tokens (N,), weight (V, C) */
int embedding_forward(const MfEmbeddingParams *p);
/* dweight (V, C) += dout (N, C) rows by tokens (N,); a bad id's row is skipped (MF_EINDEX) */
int embedding_backward(const MfEmbeddingParams *p);

/* ---- linear.c: y = x weight^T + bias (MfLinearParams) --------------------------------- */
/* forward: y (N, Cout) = x (N, Cin) weight^T + bias; weight (Cout, Cin), bias (Cout,) or NULL.
 * Scratch: linear_forward_scratch_floats(p) floats (0 for sizes out of range). */
int64_t linear_forward_scratch_floats(const MfLinearParams *p);
int linear_forward(const MfLinearParams *p);
/* backward: dx (N, Cin) = dy weight (+= with accumulate_dx), dweight (Cout, Cin) += dy^T x,
 * dbias (Cout,) += column sums of dy (NULL: none); dy (N, Cout), x (N, Cin), weight.
 * Scratch: linear_backward_scratch_floats(p) floats (it depends on whether dbias is NULL). */
int64_t linear_backward_scratch_floats(const MfLinearParams *p);
int linear_backward(const MfLinearParams *p);

/* ---- layernorm.c: y = (x - mean) * rstd * weight + bias over the last axis ---------------- */
/* y (N, C), mean (N,), rstd (N,) saved for backward; x (N, C), weight (C,), bias (C,); eps > 0 */
int layernorm_forward(const MfLayernormParams *p);
/* dx (N, C) (= or += with accumulate_dx), dweight (C,) +=, dbias (C,) +=; dy, x (N, C),
 * mean_in, rstd_in (N,) from the forward, weight (C,) */
int layernorm_backward(const MfLayernormParams *p);
int64_t layernorm_backward_scratch_floats(const MfLayernormParams *p);

/* ---- gelu.c: tanh approximation, y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), or
 * with exact = 1 the exact y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) ----------------------- */
/* y (n,) = gelu(x (n,)) */
int gelu_forward(const MfGeluParams *p);
/* dx (n,) = dy (n,) * gelu'(x (n,)) */
int gelu_backward(const MfGeluParams *p);
/* the single-threaded kernels, shared with mlp.c and the BLAS products: csrc/ops/kernels/gelu.h */

/* ---- mlp.c: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj, in row blocks (MfMlpParams) --- */
/* forward: y (N, C); h (N, F) = x w_fc^T + b_fc saved for backward;
 * x (N, C), w_fc (F, C), b_fc (F,), w_proj (C, F), b_proj (C,).
 * Scratch: mlp_forward_scratch_floats(p) floats. */
int64_t mlp_forward_scratch_floats(const MfMlpParams *p);
int mlp_forward(const MfMlpParams *p);
/* backward: dx (N, C) (=), dw_fc (F, C) +=, db_fc (F,) +=, dw_proj (C, F) +=, db_proj (C,) +=;
 * dy (N, C), h_in (N, F) from forward, x (N, C), w_fc (F, C), w_proj (C, F).
 * Scratch: mlp_backward_scratch_floats(p) floats. */
int64_t mlp_backward_scratch_floats(const MfMlpParams *p);
int mlp_backward(const MfMlpParams *p);

/* ---- residual.c ---------------------------------------------------------------------------- */
/* out = a + b, all (n,) */
int residual_forward(const MfResidualParams *p);
/* dx += dout, both (n,): the residual stream's gradient reaching one branch input */
int residual_backward(const MfResidualParams *p);

/* ---- attention.c: softmax attention, tiled (FlashAttention-2); only lse is saved ---------- */
/* The attention masks (MfAttentionParams.mask, MfConjAttentionParams.mask): query i of batch
 * row b attends to key j when j <= max(i, P_b - 1), with P_b = 0 (causal), T (none: full
 * attention) or prefix[b] in [0, T] (prefix: full attention within the first P_b tokens, the
 * source of a prefix LM, causal after them). The keys a query sees are always a prefix of the
 * sequence, never empty. */
typedef enum {
    MF_MASK_CAUSAL = 0,
    MF_MASK_NONE = 1,
    MF_MASK_PREFIX = 2,
} MfMask;
/* attention's optional per-pair logit factor (MfAttentionParams.pos_ids, pair_factor): the
 * most positions its table may index (npos^2 floats: 64 MiB) */
#define MF_ATTN_MAX_POSITIONS 4096
/* out[b,i,h] = sum_{j seen} softmax_j(scale q_i . k_j) v_j, lse[b,h,i] = log sum_j exp(..);
 * with pos_ids and pair_factor given, the logits are f_ij scale q_i . k_j, f_ij =
 * pair_factor[pos_ids[b,i], pos_ids[b,j]] (before the mask). Forward reads q, k, v, scale
 * and writes out, lse; backward reads dout, q, k, v, o (forward's
 * out), lse_in (forward's lse) and writes dq, dk, dv (=). Both take p->scratch of at least
 * <op>_scratch_floats(p) floats (64-byte aligned; 0 when p's sizes are invalid): MfAttentionParams,
 * mapformer/params.h. */
int64_t attention_forward_scratch_floats(const MfAttentionParams *p);
int attention_forward(const MfAttentionParams *p);
int64_t attention_backward_scratch_floats(const MfAttentionParams *p);
int attention_backward(const MfAttentionParams *p);

/* ---- attention_decode.c: causal attention of new queries on cached keys (decoding) ------- */
/* out[b,i,h] = sum_{j <= Tk - Tq + i} softmax_j(scale q_i . k_j) v_j and its lse[b,h,i]: the
 * last Tq rows of causal attention over Tk positions, q holding only those rows, k and v the
 * first Tk of their Tmax positions. Forward only;
 * p->scratch of at least attention_decode_forward_scratch_floats(p) floats (64-byte aligned;
 * 0 when p's sizes are invalid): MfAttentionDecodeParams, mapformer/params.h. */
int64_t attention_decode_forward_scratch_floats(const MfAttentionDecodeParams *p);
int attention_decode_forward(const MfAttentionDecodeParams *p);

/* ---- path_integration.c: theta = wrap(omega * cumsum_t(delta)), cumsum in double -------- */
/* theta, delta (B, T, H, NB); omega (H, NB).
 * wrap(a) = a - 2 pi floor(a / (2 pi) + 1/2), in [-pi, pi) */
int path_integration_forward(const MfPathIntegrationParams *p);
/* ddelta (B, T, H, NB) (=), domega (H, NB) +=; dtheta, delta (B, T, H, NB); omega (H, NB) */
int path_integration_backward(const MfPathIntegrationParams *p);
int64_t path_integration_backward_scratch_floats(const MfPathIntegrationParams *p);

/* ---- rotary.c: rotate pairs (x[2i], x[2i+1]) of q and k by theta_i ------------------------ */
/* q_out, k_out, q, k (B, T, H, D); theta (TB, T, H, D/2) with TB = 1 (broadcast) or B */
int rotary_forward(const MfRotaryParams *p);
/* dq, dk (B, T, H, D) (=); dtheta (TB, T, H, D/2) (=, summed over b when TB = 1);
 * dq_out, dk_out, q, k (B, T, H, D); theta (TB, T, H, D/2) */
int rotary_backward(const MfRotaryParams *p);

/* ---- sln.c: MapEM-SLN positions p[t] = exp(cumsum(delta)_t A) p*, A trace-free 2x2 ------ */
/* p = exp(Phi A) start per block (Phi in double, hyperbolic |Phi| sqrt(q) clamped) */
int sln_forward(const MfSlnParams *p);
/* ddelta (=), dgen += (projected to trace-free), dstart += */
int sln_backward(const MfSlnParams *p);

/* ---- b4.c: MapEM-b4 positions p[t] = exp(cumsum(delta)_t S) p*, S = L(u) + R(v) in so(4) - */
/* p = qexp(Phi u) start qexp(Phi v) per 4-block (Phi in double) */
int b4_forward(const MfB4Params *p);
/* ddelta (=), dgen += (du, dv), dstart += */
int b4_backward(const MfB4Params *p);

/* ---- nc.c: MapEM-NC positions p[t] = exp(S_t) ... exp(S_1) p*, quaternion prefix pairs -- */
/* p = A_t start C_t, A_t = qexp(u_t) A_{t-1}, C_t = C_{t-1} qexp(v_t) (renormalised) */
int nc_forward(const MfNcParams *p);
/* dw (=) by the reverse-time adjoints, dstart +=.
 * Scratch: nc_backward_scratch_floats(p) floats (0 for sizes out of range). */
int nc_backward(const MfNcParams *p);
int64_t nc_backward_scratch_floats(const MfNcParams *p);

/* ---- nc_general.c: MapEM-NC for any block size b (2..16) and K generators --------------- */
/* p_t = exp(X_t) p_{t-1}, p_0 = start, X_t = sum_i theta_t,i S_i; exp by scaling and squaring
 * of a degree-12 Taylor polynomial in double */
int nc_general_forward(const MfNcGeneralParams *p);
/* dtheta (=), dgen +=, dstart +=: reverse-time adjoint, exp's Frechet adjoint.
 * Scratch: nc_general_backward_scratch_floats(p) floats (0 for sizes out of range). */
int nc_general_backward(const MfNcGeneralParams *p);
int64_t nc_general_backward_scratch_floats(const MfNcGeneralParams *p);

/* ---- ape.c: APE's per-token orthogonal maps on q or k ------------------------------------ */
/* y[b,t,h,aE+i] = sum_j maps[a, index[tb,t,a], h, i, j] x[b,t,h,aE+j]; y, x (B, T, H, D);
 * maps (A, P, H, E, E), E = D / A; index (TB, T, A) with TB = 1 (broadcast) or B */
int ape_apply_forward(const MfApeParams *p);
/* dx (B, T, H, D) (=) = M^T dy per chunk; dmaps (A, P, H, E, E) += sum over the tokens at each
 * position of dy_chunk x_chunk^T; dy, x (B, T, H, D); maps, index as above */
int ape_apply_backward(const MfApeParams *p);
/* q_out[b,t] = gamma^(t - c) q[b,t], k_out[b,t] = gamma^(c - t) k[b,t], c = (T - 1) / 2, so
 * q_out_i . k_out_j = gamma^(i - j) q_i . k_j: the logits of causal attention (j <= i)
 * multiplied by gamma^distance. MF_EINVAL unless gamma > 0 and |ln gamma| (T - 1) / 2 <=
 * APE_DECAY_MAX_LOG (the scales stay well inside float32's range) */
#define APE_DECAY_MAX_LOG 40.0
int ape_decay_forward(const MfApeDecayParams *p);
/* dq (=) = gamma^(t - c) dq_out, dk (=) = gamma^(c - t) dk_out (gamma is a constant) */
int ape_decay_backward(const MfApeDecayParams *p);

/* ---- gridpe.c: GridPE's complex form (one angle per real channel) ----------------------- */
/* y[b,t,h,2d] = x[b,t,h,d] cos theta[tb,t,h,d], y[b,t,h,2d+1] = x[b,t,h,d] sin theta[tb,t,h,d]:
 * y_m . y'_n = sum_d x_d x'_d cos(theta_d(m) - theta_d(n)). x (B, T, H, W/2), y (B, T, H, W),
 * theta (TB, T, H, W/2) with TB = 1 (broadcast) or B; cos and sin in double */
int gridpe_complex_forward(const MfGridpeParams *p);
/* dx (B, T, H, W/2) (=) = cos theta dy[2d] + sin theta dy[2d+1]; dy (B, T, H, W); theta as
 * above (fixed: no theta gradient) */
int gridpe_complex_backward(const MfGridpeParams *p);

/* ---- softmax_xent.c: masked softmax cross-entropy ----------------------------------------- */
/* losses (N,) = -log softmax(logits)[target] (every row); *loss = sum(mask*losses)/sum(mask)
 * (0 when sum(mask) == 0), accumulated in double. logits (N, V), targets (N,), mask (N,) */
int softmax_xent_forward(const MfSoftmaxXentParams *p);
/* dlogits (N, V) = scale * mask[n] * (softmax(logits[n]) - onehot(targets[n])) */
int softmax_xent_backward(const MfSoftmaxXentParams *p);

/* ---- adamw.c: one fused AdamW step over a flat buffer (in place) -------------------------- */
/* params, m, v, grads, decay_mask (n,); step >= 1 (bias correction). Decoupled weight decay
 * params -= lr * weight_decay * params where decay_mask != 0. */
int adamw_step(const MfAdamwParams *p);

/* ---- grad_norm.c: global L2 norm (double accumulation) and clipping ----------------------- */
/* *norm = ||x (n,)|| */
int global_norm(const MfGradNormParams *p);
/* *norm = ||grads (n,)||; when *norm > max_norm, grads *= max_norm / (*norm + 1e-6) */
int clip_grad_norm(const MfGradNormParams *p);

/* ---- cope.c: CoPE attention (contextual position encoding), causal; only lse is saved --- */
/* out (B, T, H, D), lse (B, H, T); q, k, v (B, T, H, D); e (H, n_pos, D) integer position
 * embeddings; scale usually 1/sqrt(D) (the position logits q . e are not scaled) */
int cope_forward(const MfCopeParams *p);
int64_t cope_forward_scratch_floats(const MfCopeParams *p);
/* dq, dk, dv (B, T, H, D) (=), de (H, n_pos, D) +=; dout, q, k, v, o (B, T, H, D);
 * e (H, n_pos, D); lse_in (B, H, T) from cope_forward */
int cope_backward(const MfCopeParams *p);
int64_t cope_backward_scratch_floats(const MfCopeParams *p);

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

/* ---- conj_attention.c: MapEM's conjunctive attention, tiled; only lse is saved ------------ */
/* Content scores sX = qx kx^T and positional scores sP = qp kp^T (under the mask, MfMask)
 * combine by mode:
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


/* ---- activation.c: SiLU, softplus (MfActivationParams), the SiLU gate, elementwise ------- */
/* y (n,) = x sigmoid(x) */
int silu_forward(const MfActivationParams *p);
/* dx (n,) = dy sigmoid(x) (1 + x (1 - sigmoid(x))) */
int silu_backward(const MfActivationParams *p);
/* y (n,) = log(1 + e^x), or x where x > 20 (Mamba's threshold) */
int softplus_forward(const MfActivationParams *p);
/* dx (n,) = dy sigmoid(x), or dy where x > 20 */
int softplus_backward(const MfActivationParams *p);
/* out (n,) = y silu(z) (MfSiluGateParams) */
int silu_gate_forward(const MfSiluGateParams *p);
/* dy (n,) = dout silu(z), dz (n,) = dout y silu'(z) (MfSiluGateParams) */
int silu_gate_backward(const MfSiluGateParams *p);

/* ---- conv1d.c: causal depthwise conv1d along t, any width W (MfConv1dParams) ------------- */
/* y (B, T, E) = bias + sum_j weight[:, j] x[t - W + 1 + j], through SiLU with p->silu */
int64_t causal_conv1d_forward_scratch_floats(const MfConv1dParams *p);
int causal_conv1d_forward(const MfConv1dParams *p);
/* dx (B, T, E) (=), dweight (E, W) +=, dbias (E,) += (with p->silu dy is SiLU's output's
 * gradient, and the bias is read) */
int64_t causal_conv1d_backward_scratch_floats(const MfConv1dParams *p);
int causal_conv1d_backward(const MfConv1dParams *p);

/* ---- scan.c: selective scans, sequential in t, parallel over (b, channel block) ---------- */
/* Per channel e and state k, z_t = delta_t A[e,k] (+ i delta_angle_t omega[e,k], complex_scan):
 *   h_t = e^z_t h_{t-1} + delta_t x_t phi(z_t) B_t[k],   y_t = sum_k <C_t[k], h_t[k]> + D x_t
 * with phi = 1 (MF_BBAR_EULER, Mamba's) or (e^z - 1) / z (MF_BBAR_ZOH); complex states are
 * (re, im) pairs of B, C, states (<c, h> = c_re h_re + c_im h_im = 2 Re(C' h) with
 * C' = (c_re - i c_im) / 2: selective_scan_ref's complex convention). The forward keeps only
 * the state at each chunk's end (states, (B, NC, E, S)); the backward recomputes each chunk
 * from the previous chunk's end state, in reverse, so memory is O(B E S (T/chunk + chunk)).
 * The backwards take p->scratch of at least <op>_scratch_floats(p) floats (0: invalid sizes).
 * S (the state floats per channel) = K for selective_scan, 2K for complex_scan; S <= 256. */
int selective_scan_forward(const MfScanParams *p);
int64_t selective_scan_backward_scratch_floats(const MfScanParams *p);
int selective_scan_backward(const MfScanParams *p);
int complex_scan_forward(const MfScanParams *p);
int64_t complex_scan_backward_scratch_floats(const MfScanParams *p);
int complex_scan_backward(const MfScanParams *p);

/* ---- vq.c: vector quantisation, M parallel codebooks (TDB's bottleneck) ------------------ */
/* For each row n and codebook m: indices[n, m] = argmin_k ||z[n, m] - codebook[m, k]||^2, the
 * lowest k on ties, found from one product z codebook^T per codebook (the comparison is
 * ||e_k||^2 - 2 z.e_k: ||z||^2, the same for every k, is left out); codes[n, m] =
 * codebook[m, indices[n, m]]; dist[n, m] = ||z[n, m] - codes[n, m]||^2 recomputed exactly (in
 * double) for the chosen code, *total = the sum of dist. Reads z, codebook.
 * Scratch: vq_forward_scratch_floats(p) floats. */
int64_t vq_forward_scratch_floats(const MfVqParams *p);
int vq_forward(const MfVqParams *p);
/* The gradients of L(codes(z)) + codebook_weight sum ||codebook[idx] - sg(z)||^2 +
 * commitment_weight sum ||sg(codebook[idx]) - z||^2, codes taken straight through:
 *   dz = dcodes + 2 commitment_weight (z - codebook[idx])                       (=)
 *   dcodebook[m, k] += 2 codebook_weight sum_{n: idx[n, m] = k} (codebook[m, k] - z[n, m])
 * the sum per code in double, in row order (the same bits for any thread count). Reads
 * dcodes, z, codebook, indices_in (each checked: MF_EINDEX), the weights.
 * Scratch: vq_backward_scratch_floats(p) floats. */
int64_t vq_backward_scratch_floats(const MfVqParams *p);
int vq_backward(const MfVqParams *p);

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

/* ---- l2_normalize.c: rows scaled to unit L2 norm (TDB's enc objective) --------------------- */
/* y (N, D) = x / norm, norm (N,) = sqrt(sum_d x^2 + eps) (squares summed in double), saved
 * for the backward; x (N, D); eps > 0 and finite (a zero row gives y = 0) */
int l2_normalize_forward(const MfL2NormalizeParams *p);
/* dx (N, D) (=) = (dy - y (y . dy)) / norm per row; dy (N, D), forward's y_in (N, D) and
 * norm_in (N,) */
int l2_normalize_backward(const MfL2NormalizeParams *p);

/* ---- ema.c: exponential moving average in place (TDB's teacher) ----------------------------- */
/* target (n,) = decay target + (1 - decay) source (n,), elementwise in float32 with
 * 1 - decay rounded once; decay in [0, 1) */
int ema_update(const MfEmaParams *p);

#endif
