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
 * The ops and their math are declared in mapformer/mapformer.h. */
#ifndef MAPFORMER_PARAMS_H
#define MAPFORMER_PARAMS_H

#include <stdint.h>

/* embedding: out[n, :] = weight[tokens[n], :] */
typedef struct {
    float *out;             /* forward (N, C) */
    float *dweight;         /* backward (V, C) += */
    const float *dout;      /* backward (N, C) */
    const int32_t *tokens;  /* (N,), each in [0, V) (checked by the op) */
    const float *weight;    /* (V, C) */
    int64_t N, V, C;
} MfEmbeddingParams;

/* linear: y = x weight^T + bias */
typedef struct {
    float *y;                    /* forward (N, Cout) */
    float *dx, *dweight, *dbias; /* backward (N, Cin) (= or += with accumulate_dx),
                                  * (Cout, Cin) +=, (Cout,) += or NULL */
    const float *dy;             /* backward (N, Cout) */
    const float *x;              /* (N, Cin) */
    const float *weight, *bias;  /* (Cout, Cin), (Cout,) or NULL */
    int64_t N, Cin, Cout;
    int accumulate_dx;
    float *scratch;
    int64_t scratch_floats;
} MfLinearParams;

/* layernorm: y = (x - mean) * rstd * weight + bias over the last axis */
typedef struct {
    float *y, *mean, *rstd;      /* forward (N, C), (N,), (N,): mean and rstd saved */
    float *dx, *dweight, *dbias; /* backward (N, C) (= or += with accumulate_dx), (C,) +=,
                                  * (C,) += */
    const float *dy;             /* backward (N, C) */
    const float *x;              /* (N, C) */
    const float *mean_in, *rstd_in; /* backward: forward's mean, rstd (N,) */
    const float *weight, *bias;  /* (C,), (C,) */
    int64_t N, C;
    float eps;
    int accumulate_dx;
    float *scratch;
    int64_t scratch_floats;
} MfLayernormParams;

/* gelu, elementwise over n floats: exact 0 the tanh approximation, 1 the exact x Phi(x) */
typedef struct {
    float *y;        /* forward (n,) */
    float *dx;       /* backward (n,) */
    const float *dy; /* backward (n,) */
    const float *x;  /* (n,) */
    int64_t n;
    int exact;
} MfGeluParams;

/* mlp: y = gelu(x w_fc^T + b_fc) w_proj^T + b_proj; exact as MfGeluParams' */
typedef struct {
    float *y, *h;                  /* forward (N, C); h (N, F) = x w_fc^T + b_fc, saved */
    float *dx;                     /* backward (N, C) (=) */
    float *dw_fc, *db_fc;          /* backward (F, C) +=, (F,) += */
    float *dw_proj, *db_proj;      /* backward (C, F) +=, (C,) += */
    const float *dy;               /* backward (N, C) */
    const float *h_in;             /* backward: forward's h (N, F) */
    const float *x;                /* (N, C) */
    const float *w_fc, *b_fc;      /* (F, C), (F,) */
    const float *w_proj, *b_proj;  /* (C, F), (C,) */
    int64_t N, C, F;
    int exact;
    float *scratch;
    int64_t scratch_floats;
} MfMlpParams;

/* residual: out = a + b (forward); dx += dout (backward) */
typedef struct {
    float *out;          /* forward (n,) */
    float *dx;           /* backward (n,) += */
    const float *a, *b;  /* forward (n,) */
    const float *dout;   /* backward (n,) */
    int64_t n;
} MfResidualParams;

/* attention: softmax attention, causal or another MfMask; only the row log-sum-exp is saved */
typedef struct {
    float *out, *lse;          /* forward (B, T, H, D), (B, H, T) */
    float *dq, *dk, *dv;       /* backward (B, T, H, D) each (=) */
    const float *q, *k, *v;    /* (B, T, H, D) */
    const float *dout, *o;     /* backward (B, T, H, D): out's gradient, forward's out */
    const float *lse_in;       /* backward (B, H, T) */
    int64_t B, T, H, D;        /* D even in [16, 128] */
    float scale;               /* usually 1/sqrt(D) */
    int mask;                  /* an MfMask (mapformer.h); 0 = MF_MASK_CAUSAL */
    const int32_t *prefix;     /* MF_MASK_PREFIX: (B,) prefix lengths in [0, T]; else unused */
    float *scratch;
    int64_t scratch_floats;
    const int32_t *pos_ids;    /* optional per-pair logit factor (both or neither): (B, T) */
    const float *pair_factor;  /* position ids in [0, npos), table (npos, npos): the logit of
                                * query i, key j is multiplied by
                                * pair_factor[pos_ids[b,i], pos_ids[b,j]] before the mask */
    int64_t npos;
} MfAttentionParams;

/* attention_decode: a block of Tq new queries on the keys of Tk >= Tq positions (incremental
 * decoding); query i sits at position Tk - Tq + i; forward only */
typedef struct {
    float *out, *lse;          /* (B, Tq, H, D), (B, H, Tq) */
    const float *q;            /* (B, Tq, H, D) */
    const float *k, *v;        /* (B, Tmax, H, D): the cached positions, then the block's,
                                * in the first Tk of Tmax (a cache with room to grow) */
    int64_t B, Tq, Tk, Tmax, H, D; /* Tq <= Tk <= Tmax; D even in [16, 128] */
    float scale;               /* usually 1/sqrt(D) */
    float *scratch;
    int64_t scratch_floats;
} MfAttentionDecodeParams;

/* conj_attention: MapEM's conjunctive attention; mode an MfConjMode, mask an MfMask */
typedef struct {
    float *out, *lse;                    /* forward (B, T, H, D), (M, B, H, T): M = 2 for
                                          * softmax_product, else 1 */
    float *dqx, *dkx, *dqp, *dkp, *dv;   /* backward (B, T, H, D) each (=) */
    const float *qx, *kx, *qp, *kp, *v;  /* (B, T, H, D) */
    const float *dout, *o;               /* backward (B, T, H, D) */
    const float *lse_in;                 /* backward (M, B, H, T) */
    int64_t B, T, H, D;                  /* D even in [16, 128] */
    float scale;
    int mode;
    int mask;                            /* an MfMask (mapformer.h); 0 = MF_MASK_CAUSAL */
    const int32_t *prefix;               /* MF_MASK_PREFIX: (B,) in [0, T]; else unused */
    float *scratch;
    int64_t scratch_floats;
} MfConjAttentionParams;

/* path_integration: theta = wrap(omega * cumsum_t(delta)), the cumulative sum in double */
typedef struct {
    float *theta;         /* forward (B, T, H, NB) */
    float *ddelta;        /* backward (B, T, H, NB) (=) */
    float *domega;        /* backward (H, NB) += */
    const float *dtheta;  /* backward (B, T, H, NB) */
    const float *delta;   /* (B, T, H, NB) */
    const float *omega;   /* (H, NB) */
    int64_t B, T, H, NB;
    float *scratch;
    int64_t scratch_floats;
} MfPathIntegrationParams;

/* sln: MapEM-SLN positions, per 2x2 block a trace-free generator A (from gen, projected) and
 * p[t] = exp(Phi_t A) p*, Phi_t = cumsum_t(delta) in double, the hyperbolic argument clamped */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *ddelta;        /* backward (B, T, H, NB) (=) */
    float *dgen;          /* backward (H, NB, 4) += */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *delta;   /* (B, T, H, NB) */
    const float *gen;     /* (H, NB, 4): A_bar row-major, A = A_bar - tr(A_bar)/2 I */
    const float *start;   /* (H, D) */
    float clamp;          /* > 0: |Phi| sqrt(-det A) is capped at clamp when det A < 0 */
    int64_t B, T, H, D, NB, F; /* D = 2 NB, F = 4 */
} MfSlnParams;

/* b4: MapEM-b4 positions, per 4x4 block one skew generator S = L(u) + R(v) (quaternion
 * split) and p[t] = qexp(Phi_t u) p* qexp(Phi_t v), Phi_t = cumsum_t(delta) in double */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *ddelta;        /* backward (B, T, H, NB) (=) */
    float *dgen;          /* backward (H, NB, 6) += */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *delta;   /* (B, T, H, NB) */
    const float *gen;     /* (H, NB, 6): (u, v), two pure quaternions per block */
    const float *start;   /* (H, D) */
    int64_t B, T, H, D, NB, F; /* D = 4 NB, F = 6 */
} MfB4Params;

/* nc: MapEM-NC positions, per 4x4 block the ordered product of per-token rotations
 * exp(S_t), S_t = L(u_t) + R(v_t), as a pair of unit-quaternion prefix products */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *dw;            /* backward (B, T, H, NB, 6) (=) */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *w;       /* (B, T, H, NB, 6): (u_t, v_t) per token and block */
    const float *start;   /* (H, D) */
    int64_t B, T, H, D, NB, F; /* D = 4 NB, F = 6 */
    float *scratch;       /* backward */
    int64_t scratch_floats;
} MfNcParams;

/* nc_general: MapEM-NC positions for any block size b and K generators per block, per block
 * the ordered product p_t = exp(X_t) ... exp(X_1) p*, X_t = sum_i theta_t,i S_i */
typedef struct {
    float *p;             /* forward (B, T, H, D) */
    float *dtheta;        /* backward (B, T, H, NB, K) (=) */
    float *dgen;          /* backward (H, NB, K, b, b) += */
    float *dstart;        /* backward (H, D) += */
    const float *dp;      /* backward (B, T, H, D) */
    const float *theta;   /* (B, T, H, NB, K): each token's coordinates */
    const float *gen;     /* (H, NB, K, b, b): the generators S_i (skew-symmetric in MapEM-NC) */
    const float *start;   /* (H, D) */
    int64_t B, T, H, D, NB, K, b; /* D = NB b, 2 <= b <= 16, K >= 1 */
    float *scratch;       /* backward */
    int64_t scratch_floats;
} MfNcGeneralParams;

/* rotary: rotate pairs (x[2i], x[2i+1]) of q and k by theta_i */
typedef struct {
    float *q_out, *k_out;           /* forward (B, T, H, D) */
    float *dq, *dk, *dtheta;        /* backward (B, T, H, D) (=), (TB, T, H, D/2) (=, summed
                                     * over b when TB = 1) */
    const float *dq_out, *dk_out;   /* backward (B, T, H, D) */
    const float *q, *k;             /* (B, T, H, D) */
    const float *theta;             /* (TB, T, H, D/2) */
    int64_t B, T, H, D, TB;         /* D even; TB = 1 (broadcast over b) or B */
} MfRotaryParams;

/* ape_apply: per-token orthogonal maps (APE), chunk a of the head (E = D / A) multiplied by
 * maps[a, index[tb, t, a], h] */
typedef struct {
    float *y;               /* forward (B, T, H, D) */
    float *dx;              /* backward (B, T, H, D) (=) */
    float *dmaps;           /* backward (A, P, H, E, E) += */
    const float *dy;        /* backward (B, T, H, D) */
    const float *x;         /* (B, T, H, D) */
    const float *maps;      /* (A, P, H, E, E), E = D / A */
    const int32_t *index;   /* (TB, T, A), each in [0, P) (checked by the op) */
    int64_t B, T, H, D, A, P, TB; /* TB = 1 (every sequence at the same positions) or B */
} MfApeParams;

/* ape_decay: APE's multiplicative distance decay of causal logits, as per-token scales of q
 * and k (q_i gamma^(i - c), k_j gamma^(c - j), c = (T - 1) / 2) */
typedef struct {
    float *q_out, *k_out;         /* forward (B, T, H, D) */
    float *dq, *dk;               /* backward (B, T, H, D) (=) */
    const float *q, *k;           /* forward (B, T, H, D) */
    const float *dq_out, *dk_out; /* backward (B, T, H, D) */
    float gamma;                  /* > 0, with |ln gamma| (T - 1) / 2 <= APE_DECAY_MAX_LOG */
    int64_t B, T, H, D;
} MfApeDecayParams;

/* gridpe_complex: GridPE's complex form, one angle per real channel: y (B, T, H, W) holds
 * (x cos theta, x sin theta) of each channel of x (B, T, H, W/2) interleaved */
typedef struct {
    float *y;               /* forward (B, T, H, W) */
    float *dx;              /* backward (B, T, H, W/2) (=) */
    const float *x;         /* forward (B, T, H, W/2) */
    const float *dy;        /* backward (B, T, H, W) */
    const float *theta;     /* (TB, T, H, W/2) */
    int64_t B, T, H, W, TB; /* W even; TB = 1 (broadcast over b) or B */
} MfGridpeParams;

/* softmax_xent: masked softmax cross-entropy over V classes */
typedef struct {
    float *losses;           /* forward (N,): -log softmax(logits)[target], every row */
    double *loss;            /* forward: sum(mask * losses) / sum(mask) (0 if sum(mask) = 0) */
    float *dlogits;          /* backward (N, V) = scale mask (softmax - onehot(target)) */
    const float *logits;     /* (N, V) */
    const int32_t *targets;  /* (N,), each in [0, V) (checked by the op) */
    const float *mask;       /* (N,) */
    int64_t N, V;
    float scale;             /* backward */
} MfSoftmaxXentParams;

/* adamw: one fused AdamW step over a flat buffer, in place */
typedef struct {
    float *params, *m, *v;       /* (n,) each, updated */
    const float *grads;          /* (n,) */
    const uint8_t *decay_mask;   /* (n,): decoupled weight decay where != 0 */
    int64_t n;
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step;                /* >= 1: bias correction */
} MfAdamwParams;

/* grad_norm: global L2 norm in double (global_norm), and clipping (clip_grad_norm:
 * when *norm > max_norm, grads *= max_norm / (*norm + 1e-6)) */
typedef struct {
    double *norm;         /* out */
    float *grads;         /* clip_grad_norm: (n,), scaled in place */
    const float *x;       /* global_norm: (n,) */
    int64_t n;
    float max_norm;
} MfGradNormParams;

/* cope: CoPE attention, causal; only lse is saved */
typedef struct {
    float *out, *lse;          /* forward (B, T, H, D), (B, H, T) */
    float *dq, *dk, *dv;       /* backward (B, T, H, D) (=) */
    float *de;                 /* backward (H, n_pos, D) += */
    const float *q, *k, *v;    /* (B, T, H, D) */
    const float *e;            /* (H, n_pos, D): integer position embeddings */
    const float *dout, *o;     /* backward (B, T, H, D) */
    const float *lse_in;       /* backward (B, H, T) */
    int64_t B, T, H, D, n_pos;
    float scale;               /* the content logits' scale, usually 1/sqrt(D) */
    float *scratch;
    int64_t scratch_floats;
} MfCopeParams;

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

/* silu and softplus (Mamba's threshold 20), elementwise over n floats */
typedef struct {
    float *y;        /* forward (n,) */
    float *dx;       /* backward (n,) (=) */
    const float *dy; /* backward (n,) */
    const float *x;  /* (n,) */
    int64_t n;
} MfActivationParams;

/* silu_gate: out = y silu(z), Mamba's output gate, elementwise over n floats */
typedef struct {
    float *out;         /* forward (n,) */
    float *dy, *dz;     /* backward (n,) (=) */
    const float *dout;  /* backward (n,) */
    const float *y, *z; /* (n,) */
    int64_t n;
} MfSiluGateParams;

/* causal_conv1d: depthwise causal convolution along t,
 * y[b,t,e] = bias[e] + sum_{j<W} weight[e,j] x[b, t-W+1+j, e] */
typedef struct {
    float *y;                /* forward (B, T, E) */
    float *dx;               /* backward (B, T, E) (=) */
    float *dweight, *dbias;  /* backward (E, W) +=, (E,) += */
    const float *dy;         /* backward (B, T, E) */
    const float *x;          /* (B, T, E) */
    const float *weight;     /* (E, W) */
    const float *bias;       /* (E,) (forward; backward with silu) */
    int64_t B, T, E, W;
    int silu;                /* 1: y = silu(conv), and dy is the gradient of that y */
    float *scratch;
    int64_t scratch_floats;
} MfConv1dParams;

/* selective_scan (Mamba, real diagonal A: K = N states per channel, S = N floats of state)
 * and complex_scan (MAMPa, K complex states = 2x2 rotation-scaling blocks per channel,
 * S = 2K floats of state as (re, im) pairs), both by mapformer/mapformer.h's scan section */
typedef enum { MF_BBAR_EULER = 0, MF_BBAR_ZOH = 1 } MfBbar;
typedef struct {
    float *y;                 /* forward (B, T, E) */
    float *states;            /* forward (B, NC, E, S): the state at each chunk's last step */
    float *dx, *ddelta;       /* backward (B, T, E) (=) */
    float *ddelta_angle;      /* complex_scan backward (B, T, E) (=) */
    float *dBm, *dCm;         /* backward (B, T, S) (=) */
    float *dA, *domega, *dD;  /* backward (E, K) +=, complex_scan (E, K) +=, (E,) += */
    float *ddelta_bias;       /* backward (E,) += when delta_bias is given, else NULL */
    const float *dy;          /* backward (B, T, E) */
    const float *states_in;   /* backward: forward's states (B, NC, E, S) */
    const float *x, *delta;   /* (B, T, E); the step is delta (+ delta_bias) (through softplus
                               * with delta_softplus): > 0 in Mamba's use (not checked) */
    const float *delta_bias;  /* (E,) or NULL: added to delta (Mamba's delta_bias) */
    const float *delta_angle; /* complex_scan (B, T, E): the rotation's step, taken as it is
                               * (signed); NULL: the rotation takes the step (delta's), and
                               * ddelta_angle is not written (ddelta holds its part) */
    const float *A, *omega;   /* (E, K): decay rate (A <= 0 keeps the scan stable), and
                               * complex_scan's angular rate */
    const float *Bm, *Cm;     /* (B, T, S) */
    const float *D;           /* (E,) */
    int64_t B, T, E, K, chunk; /* NC = ceil(T / chunk) */
    int bbar;                 /* MfBbar */
    int delta_softplus;       /* 1: the step is softplus(delta + delta_bias) (threshold 20, as
                               * softplus_forward; Mamba's delta_softplus), and ddelta the
                               * gradient of delta before it */
    float *scratch;
    int64_t scratch_floats;
} MfScanParams;

/* vq: M parallel codebooks of K codes of width D; row n's slice m is snapped to the nearest
 * code of codebook m */
typedef struct {
    float *codes;              /* forward (N, M, D): codebook[m, indices[n, m]] */
    int32_t *indices;          /* forward (N, M): the nearest code, lowest index on ties */
    float *dist;               /* forward (N, M): ||z[n, m] - codes[n, m]||^2 (in double) */
    double *total;             /* forward: the sum of dist */
    float *dz;                 /* backward (N, M, D) (=) */
    float *dcodebook;          /* backward (M, K, D) += */
    const float *dcodes;       /* backward (N, M, D): the gradient reaching the codes */
    const int32_t *indices_in; /* backward (N, M), each in [0, K) (checked by the op) */
    const float *z;            /* (N, M, D) */
    const float *codebook;     /* (M, K, D) */
    int64_t N, M, K, D;
    float codebook_weight;     /* backward: the weight of sum ||codebook[idx] - sg(z)||^2 */
    float commitment_weight;   /* backward: the weight of sum ||sg(codebook[idx]) - z||^2 */
    float *scratch;
    int64_t scratch_floats;
} MfVqParams;

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

/* l2_normalize: rows of width D scaled to unit length, y = x / norm,
 * norm = sqrt(sum_d x^2 + eps) */
typedef struct {
    float *y, *norm;           /* forward (N, D), (N,): norm saved */
    float *dx;                 /* backward (N, D) (=) */
    const float *dy;           /* backward (N, D) */
    const float *x;            /* forward (N, D) */
    const float *y_in, *norm_in; /* backward: forward's y (N, D), norm (N,) */
    int64_t N, D;
    float eps;                 /* forward: > 0, finite */
} MfL2NormalizeParams;

/* ema: an exponential moving average in place, target = decay target + (1 - decay) source */
typedef struct {
    float *target;        /* (n,), updated */
    const float *source;  /* (n,) */
    int64_t n;
    float decay;          /* in [0, 1) */
} MfEmaParams;

#endif
