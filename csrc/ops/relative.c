/* Relative-position attention (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention with
 * Relative Position Representations"), under the attention masks.
 *
 * Per (b, h), query i sees keys j <= lim_i = max(i, P_b - 1) (P_b = 0 causal, T none,
 * prefix[b] prefix; ops/attention.h); the offset j - i is clipped to [-R, R] (R2 = 2R + 1
 * learned embeddings, shared by the heads):
 *   c_ij   = min(max(j - i, -R), R) + R
 *   a_ij   = scale q_i . k_j + rel_scale q_i . rk[c_ij]       rk = rel_k (R2, D)
 *   out_i  = sum_j P_ij v_j + sum_r W_ir rv[r],  P = softmax_j(a),  lse_i = log sum_j exp(a_ij)
 *   W_ir   = sum_{j: c_ij = r} P_ij                            rv = rel_v (R2, D), optional
 * Shaw et al. scale both logit terms by 1/sqrt(D) and add rv; the APE paper's code (its
 * "Relative" baseline) adds q . rk unscaled and has no rv: rel_scale and rel_v say which.
 * Forward saves lse (B, H, T); the caller keeps out.
 *
 * Backward (Dv_i = dout_i . out_i):
 *   dP_ij  = dout_i . v_j + dout_i . rv[c_ij]
 *   dA_ij  = P_ij (dP_ij - Dv_i),  G_ir = sum_{j: c_ij = r} dA_ij
 *   dq_i   = scale sum_j dA_ij k_j + rel_scale sum_r G_ir rk[r]
 *   dk_j   = scale sum_i dA_ij q_i,  dv_j = sum_i P_ij dout_i
 *   drk[r] += rel_scale sum_{b, h, i} G_ir q_i,  drv[r] += sum_{b, h, i} W_ir dout_i
 * Gradient rule: dq, dk, dv are activation gradients, written (=); drel_k, drel_v are
 * parameter gradients, accumulated (+=).
 *
 * Layout of the work (as cope.c's, mapformer/row_attention.h). Query rows are taken BR at a
 * time: rows i0 .. i1-1 meet keys 0 .. L-1, L = max(i1, P_b) (at most T). Per block, sgemm
 * gives S = scale Q K^T (BR x L) and Z = rel_scale Q rk^T (BR x R2); each row adds its Z
 * row at its offsets (a left run at Z[0], a band Z[j - i + R], a right run at Z[2R]), is
 * masked past lim_i and becomes probabilities; O = P V + W rv. The backward recomputes the
 * logits and P from lse, takes dP = dout V^T (+ dout rv^T at the offsets) by sgemm, and
 * finishes with sgemms. No T x T buffer: scratch is O(BR T + D T) floats per thread.
 *
 * Parallelism: one task per (b, h), dynamic schedule forward, static backward (a task owns
 * its head's dk and dv rows). drel_k and drel_v: each task adds into its own (R2, D) rows
 * of scratch, summed in task order after the loop, so every output has the same bits for
 * any thread count. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"
#include "mapformer/row_attention.h"
#include "mapformer/threads.h"

#define BR 64 /* query rows per block */

typedef struct {
    MfRelativeParams p;
    int64_t ld, Tp, R; /* ld = H * D, Tp = round_up(T), R = (R2 - 1) / 2 */
    float *RKT, *RVT;  /* rel_k, rel_v transposed (D, R2), shared; RVT NULL without rel_v */
    float *parts;      /* backward: per task 2 R2 D floats (drel_k's, then drel_v's) */
} Rel;

typedef struct {
    float *S;  /* (BR, Tp): scores, then logits, then probabilities */
    float *Z;  /* (BR, R2): relative logits, then (backward) G */
    float *KT; /* (D, Tp): keys of one head, transposed */
    /* backward only */
    float *dP; /* (BR, Tp): dout V^T, then dA */
    float *Y;  /* (BR, R2): dout rv^T, then W */
    float *VT; /* (D, Tp): values of one head, transposed */
} RelScratch;

/* The keys of query i (lim >= i) fall in three runs: j < i - R at offset -R (c = 0), the
 * band i - R <= j <= i + R at c = j - i + R, and j > i + R at offset R (c = 2R). */

/* row[j] += z[c_ij] for j <= lim */
MF_CLONES static void add_at_offsets(float *restrict row, const float *restrict z, int64_t i,
                                     int64_t lim, int64_t R) {
    const int64_t band = i - R > 0 ? i - R : 0, right = min64(lim, i + R);
    for (int64_t j = 0; j < i - R; j++) row[j] += z[0];
    for (int64_t j = band; j <= right; j++) row[j] += z[j - i + R];
    for (int64_t j = i + R + 1; j <= lim; j++) row[j] += z[2 * R];
}

/* w[r] = sum_{j <= lim: c_ij = r} x[j], each run in key order */
static void sum_at_offsets(float *restrict w, const float *restrict x, int64_t i, int64_t lim,
                           int64_t R) {
    const int64_t band = i - R > 0 ? i - R : 0, right = min64(lim, i + R);
    for (int64_t r = 0; r < 2 * R + 1; r++) w[r] = 0.0f;
    float far = 0.0f;
    for (int64_t j = 0; j < i - R; j++) far += x[j];
    w[0] += far;
    for (int64_t j = band; j <= right; j++) w[j - i + R] += x[j];
    far = 0.0f;
    for (int64_t j = i + R + 1; j <= lim; j++) far += x[j];
    w[2 * R] += far;
}

/* The keys query i sees: lim_i = max(i, P - 1) */
static inline int64_t limit(int64_t i, int64_t P) { return i > P - 1 ? i : P - 1; }

/* P_b read once: T (none), 0 (causal), prefix[b]; -1 when outside [0, T] (another thread
 * wrote the array after the binding checked it: the task returns MF_EINDEX) */
static int64_t prefix_of(const MfRelativeParams *p, int64_t b) {
    if (p->mask == MF_MASK_NONE) return p->T;
    if (p->mask != MF_MASK_PREFIX) return 0;
    const int64_t P = ((const volatile int32_t *)p->prefix)[b];
    return P < 0 || P > p->T ? -1 : P;
}

/* Logits of row i in place (srow: the scores, z: the relative logits), masked past lim with
 * -inf up to round_up(lim + 1); returns that length */
static int64_t logits_row(const Rel *r, float *srow, const float *z, int64_t i, int64_t lim) {
    const int64_t nv = round_up(lim + 1);
    add_at_offsets(srow, z, i, lim, r->R);
    for (int64_t j = lim + 1; j < nv; j++) srow[j] = -INFINITY;
    return nv;
}

/* Forward of head (b, h). */
static int fwd_task(const Rel *r, RelScratch *sc, int64_t b, int64_t h) {
    const MfRelativeParams *p = &r->p;
    const int64_t T = p->T, D = p->D, ld = r->ld, Tp = r->Tp, R2 = p->R2;
    const int64_t P = prefix_of(p, b);
    if (P < 0) return MF_EINDEX;
    const int64_t off = b * T * ld + h * D;
    transpose(sc->KT, Tp, p->k + off, ld, T, D);
    for (int64_t i0 = 0; i0 < T; i0 += BR) {
        const int64_t nr = min64(BR, T - i0), L = min64(T, i0 + nr > P ? i0 + nr : P);
        const int64_t ldS = round_up(L);
        const float *q = p->q + off + i0 * ld;
        int st = gemm(0, 0, nr, L, D, p->scale, q, ld, sc->KT, Tp, 0.0f, sc->S, ldS);
        if (st == MF_OK)
            st = gemm(0, 0, nr, R2, D, p->rel_scale, q, ld, r->RKT, R2, 0.0f, sc->Z, R2);
        if (st != MF_OK) return st;
        float *lse = p->lse + (b * p->H + h) * T + i0;
        for (int64_t row = 0; row < nr; row++) {
            const int64_t i = i0 + row, lim = limit(i, P);
            float *srow = sc->S + row * ldS, *z = sc->Z + row * R2;
            const int64_t nv = logits_row(r, srow, z, i, lim);
            const float mx = max_array(srow, nv);
            const float sum = exp_sum_array(srow, nv, mx); /* 0 past lim */
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j <= lim; j++) srow[j] *= inv;
            for (int64_t j = nv; j < L; j++) srow[j] = 0.0f;
            lse[row] = mx + logf(sum);
            if (p->rel_v != NULL) sum_at_offsets(z, srow, i, lim, r->R); /* W */
        }
        float *out = p->out + off + i0 * ld;
        st = gemm(0, 0, nr, D, L, 1.0f, sc->S, ldS, p->v + off, ld, 0.0f, out, ld);
        if (st == MF_OK && p->rel_v != NULL)
            st = gemm(0, 0, nr, D, R2, 1.0f, sc->Z, R2, p->rel_v, D, 1.0f, out, ld);
        if (st != MF_OK) return st;
    }
    return MF_OK;
}

/* Backward of head (b, h) as task number `task`: writes its dq, dk, dv rows and its parts. */
static int bwd_task(const Rel *r, RelScratch *sc, int64_t b, int64_t h, int64_t task) {
    const MfRelativeParams *p = &r->p;
    const int64_t T = p->T, D = p->D, ld = r->ld, Tp = r->Tp, R2 = p->R2;
    const int64_t P = prefix_of(p, b);
    if (P < 0) return MF_EINDEX;
    const int64_t off = b * T * ld + h * D;
    float *drk = r->parts + task * 2 * R2 * D, *drv = drk + R2 * D;
    memset(drk, 0, (size_t)(2 * R2 * D) * sizeof(float));
    transpose(sc->KT, Tp, p->k + off, ld, T, D);
    transpose(sc->VT, Tp, p->v + off, ld, T, D);
    for (int64_t t = 0; t < T; t++) {
        memset(p->dk + off + t * ld, 0, (size_t)D * sizeof(float));
        memset(p->dv + off + t * ld, 0, (size_t)D * sizeof(float));
    }
    for (int64_t i0 = 0; i0 < T; i0 += BR) {
        const int64_t nr = min64(BR, T - i0), L = min64(T, i0 + nr > P ? i0 + nr : P);
        const int64_t ldS = round_up(L);
        const float *qi = p->q + off + i0 * ld, *doi = p->dout + off + i0 * ld;
        const float *lse = p->lse_in + (b * p->H + h) * T + i0;
        float *S = sc->S, *Z = sc->Z, *dP = sc->dP, *Y = sc->Y;
        int st = gemm(0, 0, nr, L, D, p->scale, qi, ld, sc->KT, Tp, 0.0f, S, ldS);
        if (st == MF_OK)
            st = gemm(0, 0, nr, R2, D, p->rel_scale, qi, ld, r->RKT, R2, 0.0f, Z, R2);
        if (st == MF_OK) st = gemm(0, 0, nr, L, D, 1.0f, doi, ld, sc->VT, Tp, 0.0f, dP, ldS);
        if (st == MF_OK && p->rel_v != NULL)
            st = gemm(0, 0, nr, R2, D, 1.0f, doi, ld, r->RVT, R2, 0.0f, Y, R2);
        if (st != MF_OK) return st;
        for (int64_t row = 0; row < nr; row++) {
            const int64_t i = i0 + row, lim = limit(i, P);
            float *srow = S + row * ldS, *dprow = dP + row * ldS;
            const float *o_i = p->o + off + i * ld, *do_i = doi + row * ld;
            float dv_i = 0.0f;
#pragma omp simd reduction(+ : dv_i)
            for (int64_t d = 0; d < D; d++) dv_i += do_i[d] * o_i[d];
            const int64_t nv = logits_row(r, srow, Z + row * R2, i, lim);
            if (p->rel_v != NULL) add_at_offsets(dprow, Y + row * R2, i, lim, r->R);
            prob_da_array(srow, dprow, nv, lse[row], dv_i); /* P = 0, dA = 0 past lim */
            for (int64_t j = nv; j < L; j++) srow[j] = dprow[j] = 0.0f;
            sum_at_offsets(Z + row * R2, dprow, i, lim, r->R); /* G */
            if (p->rel_v != NULL) sum_at_offsets(Y + row * R2, srow, i, lim, r->R); /* W */
        }
        float *dq = p->dq + off + i0 * ld;
        st = gemm(1, 0, L, D, nr, 1.0f, S, ldS, doi, ld, 1.0f, p->dv + off, ld);
        if (st == MF_OK) st = gemm(1, 0, L, D, nr, p->scale, dP, ldS, qi, ld, 1.0f, p->dk + off, ld);
        if (st == MF_OK) st = gemm(0, 0, nr, D, L, p->scale, dP, ldS, p->k + off, ld, 0.0f, dq, ld);
        if (st == MF_OK)
            st = gemm(0, 0, nr, D, R2, p->rel_scale, Z, R2, p->rel_k, D, 1.0f, dq, ld);
        if (st == MF_OK) st = gemm(1, 0, R2, D, nr, p->rel_scale, Z, R2, qi, ld, 1.0f, drk, D);
        if (st == MF_OK && p->rel_v != NULL)
            st = gemm(1, 0, R2, D, nr, 1.0f, Y, R2, doi, ld, 1.0f, drv, D);
        if (st != MF_OK) return st;
    }
    return MF_OK;
}

/* ---- driver ------------------------------------------------------------------------------- */

/* Sizes every sgemm call sees must fit BLAS's int: checked once here. */
static int valid(const MfRelativeParams *p) {
    return p->B >= 1 && p->T >= 1 && p->H >= 1 && p->D >= 1 && p->R2 >= 1 && p->R2 % 2 == 1 &&
           p->T < INT_MAX - MF_VW && p->H <= INT_MAX / p->D && p->R2 < INT_MAX / p->D &&
           p->mask >= MF_MASK_CAUSAL && p->mask <= MF_MASK_PREFIX &&
           (p->mask != MF_MASK_PREFIX || p->prefix != NULL) &&
           p->B <= INT64_MAX / p->H / (2 * p->R2 * p->D) &&
           p->T <= INT64_MAX / p->B / (p->H * p->D);
}

static Rel rel_of(const MfRelativeParams *a) {
    Rel r = {.p = *a, .ld = a->H * a->D, .Tp = round_up(a->T), .R = (a->R2 - 1) / 2};
    return r;
}

/* Floats of the shared part (rk^T, rv^T; the backward's task parts) and of one thread's
 * scratch (S, Z, KT; backward dP, Y, VT) */
static int64_t shared_floats(const Rel *r, int backward) {
    const int64_t n = 2 * mf_scratch_size(r->p.D * r->p.R2);
    return backward ? n + mf_scratch_size(r->p.B * r->p.H * 2 * r->p.R2 * r->p.D) : n;
}
static int64_t thread_floats(const Rel *r, int backward) {
    const int64_t rows = min64(BR, r->p.T), Tp = r->Tp, R2 = r->p.R2, D = r->p.D;
    int64_t n = mf_scratch_size(rows * Tp) + mf_scratch_size(rows * R2) +
                mf_scratch_size(D * Tp);
    if (backward) n += n;
    return n;
}

/* Thread scratch at `at` (thread_floats floats), S and dP zeroed so that lanes past a row's
 * end, which the vector passes read, hold numbers. */
static RelScratch carve(const Rel *r, float *at, int backward) {
    const int64_t rows = min64(BR, r->p.T), Tp = r->Tp, R2 = r->p.R2, D = r->p.D;
    RelScratch s = {0};
    s.S = mf_scratch_take(&at, rows * Tp);
    s.Z = mf_scratch_take(&at, rows * R2);
    s.KT = mf_scratch_take(&at, D * Tp);
    memset(s.S, 0, (size_t)(rows * Tp) * sizeof(float));
    if (!backward) return s;
    s.dP = mf_scratch_take(&at, rows * Tp);
    s.Y = mf_scratch_take(&at, rows * R2);
    s.VT = mf_scratch_take(&at, D * Tp);
    memset(s.dP, 0, (size_t)(rows * Tp) * sizeof(float));
    return s;
}

/* rk^T and rv^T (D, R2) at the scratch's start, then (backward) the task parts */
static void carve_shared(Rel *r, float *scratch, int backward) {
    const int64_t D = r->p.D, R2 = r->p.R2;
    r->RKT = scratch;
    transpose(r->RKT, R2, r->p.rel_k, D, R2, D);
    r->RVT = NULL;
    if (r->p.rel_v != NULL) {
        r->RVT = scratch + mf_scratch_size(D * R2);
        transpose(r->RVT, R2, r->p.rel_v, D, R2, D);
    }
    r->parts = backward ? scratch + 2 * mf_scratch_size(D * R2) : NULL;
}

static int64_t scratch_floats(const MfRelativeParams *a, int backward) {
    if (!valid(a)) return 0;
    const Rel r = rel_of(a);
    return shared_floats(&r, backward) + min64(mf_max_threads(), a->B * a->H) *
                                             thread_floats(&r, backward);
}
int64_t relative_forward_scratch_floats(const MfRelativeParams *a) { return scratch_floats(a, 0); }
int64_t relative_backward_scratch_floats(const MfRelativeParams *a) { return scratch_floats(a, 1); }

/* Both directions: the tasks (b, h) over the threads the scratch serves */
static int run(const MfRelativeParams *a, int backward) {
    if (!valid(a) || !isfinite(a->scale) || !isfinite(a->rel_scale)) return MF_EINVAL;
    if (backward && (a->rel_v != NULL) != (a->drel_v != NULL)) return MF_EINVAL;
    Rel r = rel_of(a);
    const int64_t per = thread_floats(&r, backward), ntask = a->B * a->H;
    const int64_t shared = shared_floats(&r, backward);
    const int nt = (int)min64(mf_scratch_threads(a->scratch_floats - shared, per), ntask);
    if (nt < 1) return MF_EINVAL;
    carve_shared(&r, a->scratch, backward);
    float *base = a->scratch + shared;
    int status = MF_OK;
#pragma omp parallel num_threads(nt)
    {
        RelScratch sc = carve(&r, base + mf_thread_id() * per, backward);
        if (backward) {
#pragma omp for schedule(static)
            for (int64_t task = 0; task < ntask; task++) {
                const int st = bwd_task(&r, &sc, task / a->H, task % a->H, task);
                if (st != MF_OK) {
#pragma omp atomic write
                    status = st;
                }
            }
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < ntask; task++) {
                const int st = fwd_task(&r, &sc, task / a->H, task % a->H);
                if (st != MF_OK) {
#pragma omp atomic write
                    status = st;
                }
            }
        }
    }
    if (status != MF_OK || !backward) return status;
    /* the parameter gradients: the tasks' parts summed in task order (the same bits for any
     * thread count); nothing is added on failure */
    const int64_t n = a->R2 * a->D, stride = 2 * n;
#pragma omp parallel for schedule(static) if (ntask * n >= ((int64_t)1 << 16))
    for (int64_t x = 0; x < n; x++) {
        float sk = 0.0f, sv = 0.0f;
        for (int64_t t = 0; t < ntask; t++) {
            sk += r.parts[t * stride + x];
            sv += r.parts[t * stride + n + x];
        }
        a->drel_k[x] += sk;
        if (a->drel_v != NULL) a->drel_v[x] += sv;
    }
    return MF_OK;
}

int relative_forward(const MfRelativeParams *a) { return run(a, 0); }
int relative_backward(const MfRelativeParams *a) { return run(a, 1); }
