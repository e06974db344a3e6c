/* CoPE attention (Golovneva et al. 2024, "Contextual Position Encoding"), causal.
 *
 * Per (b, h), for query i and keys j <= i:
 *   s_ij   = scale q_i . k_j                         content score
 *   g_ij   = sigmoid(s_ij)                           gate
 *   p_ij   = min(sum_{t=j..i} g_it, n_pos - 1)       position: reverse cumulative sum over keys
 *   z_i[n] = q_i . e[h, n], n < n_pos                position logits (unscaled, as in CoPE)
 *   f = floor(p_ij), c = ceil(p_ij), w = p_ij - f
 *   a_ij   = s_ij + (1 - w) z_i[f] + w z_i[c]
 *   out_i  = sum_j softmax_j(a_ij) v_j,  lse_i = log sum_j exp(a_ij)
 * Forward saves lse (B, H, T); the caller keeps out.
 *
 * Backward (P = softmax(a), Dv_i = dout_i . out_i):
 *   dA_ij  = P_ij (dout_i . v_j - Dv_i)                     as in flash attention
 *   dz_i[f] += (1 - w) dA_ij,  dz_i[c] += w dA_ij           a_ij is linear in z_i[f], z_i[c]
 *   dp_ij  = dA_ij (z_i[c] - z_i[f])                        d a_ij / d p_ij, floor's derivative
 *            taken as 0 (autograd in the CoPE code). Where the position is clamped
 *            (p = n_pos - 1) or an exact integer, c = f and dp = 0: the clamp needs no test.
 *   dg_it  = sum_{j <= t} dp_ij                             p_ij sums g_it over t = j..i, so
 *            g_it feeds every p_ij with j <= t: a forward cumulative sum over j
 *   ds_ij  = dA_ij + dg_ij g_ij (1 - g_ij)                  s feeds a_ij and the gate
 *   dq_i   = scale sum_j ds_ij k_j + sum_n dz_i[n] e[h, n]
 *   dk_j   = scale sum_i ds_ij q_i,  dv_j = sum_i P_ij dout_i
 *   de[h, n] += sum_{b, i} dz_i[n] q_i
 * Gradient rule: dq, dk, dv are activation gradients, written (=); de is a parameter
 * gradient, accumulated (+=).
 *
 * Layout of the work. Query rows are taken BR at a time: rows i0 .. i1-1 meet keys
 * 0 .. i1-1 (L = i1). Positions never exceed i1 (each gate is at most 1), so only
 * z[0 .. nz) with nz = min(n_pos, i1 + 1) is needed. Per block, sgemm gives the scores
 * S = scale Q K^T (BR x L) and Z = Q E^T (BR x nz), then each row becomes logits in passes
 * over whole vectors: gates; positions, a reverse prefix sum in double inside blocks of VDL
 * lanes carried from the top; the interpolation (a gather from z); the softmax. O = P V is
 * one more sgemm. The backward recomputes S, Z and P from lse, takes dP = dout V^T by
 * sgemm, turns each row into dA, dz (a scatter), dp and ds (a forward prefix sum in double)
 * and finishes with sgemms: dv += P^T dout, dk += scale ds^T Q, dq = scale ds K + dZ E,
 * de_part += dZ^T Q. No T x T buffer: scratch is O(BR T + D T) floats per thread.
 *
 * BLAS. Every product goes through gemm() (mapformer/row_attention.h), in pieces that
 * OpenBLAS runs on the calling thread, and A B^T products go through transposed copies of K,
 * V and E (see gemm()).
 *
 * Parallelism. Forward: one task per (b, h, query block), dynamic schedule, longest blocks
 * first. Backward: one task per (b, h), which owns that head's dk and dv rows; static
 * schedule, so which thread handles which head depends only on the thread count. de is
 * accumulated race-free: each thread adds into its own (H, nzmax, D) buffer, then the
 * buffers are summed in thread order into de (deterministic for a given thread count).
 * Scratch is the caller's (cope_forward_scratch_floats, cope_backward_scratch_floats): e
 * transposed, shared, then one region per thread for as many threads as it serves.
 *
 * Exponentials (gates and softmax) are simd.h's vexp (the core's one exponential: Cephes
 * exp2f, about 2 ulp, plus the rounding of x log2 e), on simd.h's vectors. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/blas.h"
#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"
#include "mapformer/row_attention.h"
#include "mapformer/threads.h"


#define BR 64 /* query rows per block */

/* ---- vector helpers ----------------------------------------------------------------------- */
/* simd.h's vectors of MF_VW floats (vf), or VDL = MF_VW / 2 doubles (vd) widened from VDL
 * floats (vfh); every exponential (gates and softmax) is simd.h's vexp. */

/* The array helpers work on whole vectors where they can (n a multiple of MF_VW: rows of
 * scratch are padded); each is compiled per ISA (MF_CLONES, mapformer/clones.h). */

/* g[j] = sigmoid(s[j]) for j < n (n a multiple of MF_VW). */
MF_CLONES static void sigmoid_array(float *g, const float *s, int64_t n) {
    for (int64_t j = 0; j < n; j += MF_VW) {
        vf x = VLOADU(s + j);
        vsigmoid(&x);
        VSTOREU(g + j, x);
    }
}

/* Positions of row i: p_j = min(sum_{t=j..i} g[t], pmax) for j <= i, summed in double
 * (a NaN sum gives pmax), stored as their floor F[j] and fractional part W[j]; g[i+1 ..] is
 * zeroed up to the next multiple of VDL. Blocks of VDL from the top: a suffix sum inside
 * the block (simd.h's vd_suffix_sum), plus the sum of everything above it. */
MF_CLONES static void positions_array(int32_t *F, float *W, float *g, int64_t i, double pmax) {
    const int64_t nd = (i + VDL) / VDL * VDL;
    for (int64_t j = i + 1; j < nd; j++) g[j] = 0.0f;
    const vd top = (vd){0} + pmax;
    double carry = 0.0;
    for (int64_t j0 = nd - VDL; j0 >= 0; j0 -= VDL) {
        vd r = __builtin_convertvector(*(const vfhu *)(g + j0), vd);
        vd_suffix_sum(&r);
        r += carry;
        carry = r[0];
        r = DSELECT(r < top, r, top);
        const vih f = __builtin_convertvector(r, vih); /* r >= 0: truncation is floor */
        *(vihu *)(F + j0) = f;
        *(vfhu *)(W + j0) = __builtin_convertvector(r - __builtin_convertvector(f, vd), vfh);
    }
}

/* Interpolated position logits added to the scores, for j < n:
 * s[j] += (1 - w) z[f] + w z[c] with c = f + (w > 0). */
MF_CLONES static void interp_array(float *restrict s, const int32_t *restrict F,
                                   const float *restrict W, const float *restrict z,
                                   int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        const float w = W[j];
        const int32_t f = F[j], c = f + (int32_t)(w > 0.0f);
        s[j] = s[j] + (1.0f - w) * z[f] + w * z[c];
    }
}

/* Backward: x[j] = dA[j] (z[c] - z[f]), the position gradient, for j < n; x[n ..] is zeroed
 * up to the next multiple of VDL. */
MF_CLONES static void dpos_array(float *restrict x, const float *restrict da,
                                 const int32_t *restrict F, const float *restrict W,
                                 const float *restrict z, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        const int32_t f = F[j], c = f + (int32_t)(W[j] > 0.0f);
        x[j] = da[j] * (z[c] - z[f]);
    }
    for (int64_t j = n; j < (n + VDL - 1) / VDL * VDL; j++) x[j] = 0.0f;
}

/* Backward: ds[j] = dA[j] + dg[j] g[j] (1 - g[j]) with dg[j] = sum_{t <= j} x[t] (double),
 * in place over the dA row, for j < n rounded up to VDL (lanes past n get garbage). */
MF_CLONES static void ds_array(float *da, const float *x, const float *g, int64_t n) {
    double carry = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += VDL) {
        vd r = __builtin_convertvector(*(const vfhu *)(x + j0), vd);
        vd_prefix_sum(&r);
        r += carry;
        carry = r[VDL - 1];
        const vfh dg = __builtin_convertvector(r, vfh), gj = *(const vfhu *)(g + j0);
        *(vfhu *)(da + j0) = *(const vfhu *)(da + j0) + dg * gj * (1.0f - gj);
    }
}

/* Backward: dz[f_j] += (1 - w_j) dA_j, dz[c_j] += w_j dA_j for j < n. Consecutive keys
 * mostly share f, so one accumulator would wait on its own store every step: four partial
 * rows (part, 4 x nz, all zero on entry and on return) take turns, then are added up over
 * the touched range. */
static void scatter_dz(float *restrict dz, float *restrict part, const float *restrict da,
                       const int32_t *restrict F, const float *restrict W, int64_t n,
                       int64_t nz) {
    int32_t lo = INT32_MAX, hi = 0;
    for (int64_t j = 0; j < n; j++) {
        const float w = W[j], x = da[j];
        const int32_t f = F[j], c = f + (int32_t)(w > 0.0f);
        float *pj = part + (j & 3) * nz;
        pj[f] += (1.0f - w) * x;
        pj[c] += w * x;
        lo = f < lo ? f : lo;
        hi = c > hi ? c : hi;
    }
    for (int32_t m = lo; m <= hi; m++) {
        dz[m] += (part[m] + part[nz + m]) + (part[2 * nz + m] + part[3 * nz + m]);
        part[m] = part[nz + m] = part[2 * nz + m] = part[3 * nz + m] = 0.0f;
    }
}

/* ---- the op ------------------------------------------------------------------------------- */

typedef struct {
    float *out, *lse;               /* forward outputs: out (B, T, H, D), lse (B, H, T) */
    float *dq, *dk, *dv;            /* backward outputs (B, T, H, D) */
    const float *q, *k, *v, *e;     /* (B, T, H, D) x3, e (H, n_pos, D) */
    const float *dout, *o, *lse_in; /* backward inputs */
    int64_t B, T, H, D, n_pos, ld;  /* ld = H * D: the row stride of one head */
    int64_t Tp, nzmax;              /* round_up(T); min(n_pos, T + 1): logits ever read */
    float *ET;                      /* (H, D, nzmax): e[:, :nzmax] transposed, shared */
    float scale;
} Cope;

/* Scratch of one thread. Rows of S and dP have stride ldS = round_up(L) <= Tp, so the vector
 * passes run over whole vectors. */
typedef struct {
    float *S;    /* (BR, Tp): scores, then logits, then probabilities */
    float *Z;    /* (BR, nzmax): position logits */
    float *G;    /* (Tp,): gates of one row */
    int32_t *F;  /* (Tp,): floor of the positions of one row */
    float *W;    /* (Tp,): their fractional part */
    float *KT;   /* (D, Tp): keys of one head, transposed */
    /* backward only */
    float *dP;   /* (BR, Tp): dout V^T, then dA, then ds */
    float *dZ;   /* (BR, nzmax): dz */
    float *X;    /* (Tp,): dp of one row */
    float *part; /* (4, nzmax): partial dz rows of scatter_dz, kept zero */
    float *VT;   /* (D, Tp): values of one head, transposed */
    float *de;   /* (H, nzmax, D): this thread's share of de */
} CopeScratch;

/* Row i of a block: turn the scores srow[0..i] into attention logits in place, using the
 * position logits z (nz of them), and fill srow[i+1 .. round_up(i+1)) with -inf so that
 * whole-vector passes see exp = 0 there. Leaves the gates in G, the positions' floor and
 * fractional part in F and W. Returns the row maximum of the logits.
 * Positions are clamped to nz - 1: that is n_pos - 1 where n_pos <= L + 1 and otherwise
 * L, which no sum of at most L gates exceeds; a NaN position (from a NaN score) is clamped
 * too, so every index into z stays in range. They are summed in double: a float sum of T
 * gates would move them by up to ~T^2 eps32, and the logits with them. */
static float logits_row(CopeScratch *sc, float *srow, const float *z, int64_t i, int64_t nz) {
    const int64_t nv = round_up(i + 1);
    sigmoid_array(sc->G, srow, nv);
    positions_array(sc->F, sc->W, sc->G, i, (double)(nz - 1));
    interp_array(srow, sc->F, sc->W, z, i + 1);
    for (int64_t j = i + 1; j < nv; j++) srow[j] = -INFINITY;
    return max_array(srow, nv);
}

/* Forward of query blocks ib0 .. ib1-1 of head (b, h). */
static int fwd_task(const Cope *p, CopeScratch *sc, int64_t b, int64_t h, int64_t ib0,
                    int64_t ib1) {
    const int64_t T = p->T, D = p->D, ld = p->ld, Tp = p->Tp, nzmax = p->nzmax;
    const int64_t off = b * T * ld + h * D; /* element (b, 0, h, 0) */
    const float *ET = p->ET + h * D * nzmax;
    float *S = sc->S, *Z = sc->Z, *KT = sc->KT;
    transpose(KT, Tp, p->k + off, ld, min64(T, ib1 * BR), D);
    for (int64_t ib = ib0; ib < ib1; ib++) {
        const int64_t i0 = ib * BR, nr = min64(BR, T - i0), L = i0 + nr, ldS = round_up(L);
        const int64_t nz = min64(p->n_pos, L + 1);
        const float *q = p->q + off + i0 * ld;
        int st = gemm(0, 0, nr, L, D, p->scale, q, ld, KT, Tp, 0.0f, S, ldS);
        if (st == MF_OK) st = gemm(0, 0, nr, nz, D, 1.0f, q, ld, ET, nzmax, 0.0f, Z, nz);
        if (st != MF_OK) return st;

        float *lse = p->lse + (b * p->H + h) * T + i0;
        for (int64_t r = 0; r < nr; r++) {
            const int64_t i = i0 + r, nv = round_up(i + 1);
            float *srow = S + r * ldS;
            const float mx = logits_row(sc, srow, Z + r * nz, i, nz);
            const float sum = exp_sum_array(srow, nv, mx); /* 0 past i */
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j <= i; j++) srow[j] *= inv;
            for (int64_t j = nv; j < L; j++) srow[j] = 0.0f;
            lse[r] = mx + logf(sum);
        }
        st = gemm(0, 0, nr, D, L, 1.0f, S, ldS, p->v + off, ld, 0.0f, p->out + off + i0 * ld,
                  ld);
        if (st != MF_OK) return st;
    }
    return MF_OK;
}

/* Backward of query block ib of head (b, h); sc->KT, VT hold the head's k, v transposed
 * (bwd_task). Adds into dk, dv and sc->de; writes the block's dq rows. */
static int bwd_block(const Cope *p, CopeScratch *sc, int64_t b, int64_t h, int64_t ib) {
    const int64_t T = p->T, D = p->D, ld = p->ld, Tp = p->Tp;
    const int64_t i0 = ib * BR, nr = min64(BR, T - i0), L = i0 + nr, ldS = round_up(L);
    const int64_t nz = min64(p->n_pos, L + 1);
    const int64_t off = b * T * ld + h * D;
    const float *qi = p->q + off + i0 * ld, *doi = p->dout + off + i0 * ld;
    const float *lse = p->lse_in + (b * p->H + h) * T + i0;
    float *S = sc->S, *Z = sc->Z, *dP = sc->dP, *dZ = sc->dZ;
    const float scale = p->scale;

    int st = gemm(0, 0, nr, L, D, scale, qi, ld, sc->KT, Tp, 0.0f, S, ldS);
    if (st == MF_OK)
        st = gemm(0, 0, nr, nz, D, 1.0f, qi, ld, p->ET + h * D * p->nzmax, p->nzmax, 0.0f, Z, nz);
    if (st == MF_OK) st = gemm(0, 0, nr, L, D, 1.0f, doi, ld, sc->VT, Tp, 0.0f, dP, ldS);
    if (st != MF_OK) return st;
    memset(dZ, 0, (size_t)(nr * nz) * sizeof(float));

    for (int64_t r = 0; r < nr; r++) {
        const int64_t i = i0 + r;
        float *srow = S + r * ldS, *dprow = dP + r * ldS;
        const float *z = Z + r * nz, *o_i = p->o + off + i * ld, *do_i = doi + r * ld;
        float dv_i = 0.0f;
#pragma omp simd reduction(+ : dv_i)
        for (int64_t d = 0; d < D; d++) dv_i += do_i[d] * o_i[d];
        logits_row(sc, srow, z, i, nz);
        prob_da_array(srow, dprow, round_up(i + 1), lse[r], dv_i); /* P = 0, dA = 0 past i */
        scatter_dz(dZ + r * nz, sc->part, dprow, sc->F, sc->W, i + 1, nz);
        dpos_array(sc->X, dprow, sc->F, sc->W, z, i + 1);
        ds_array(dprow, sc->X, sc->G, i + 1);
        for (int64_t j = i + 1; j < L; j++) srow[j] = dprow[j] = 0.0f;
    }

    float *dq = p->dq + off + i0 * ld, *dk = p->dk + off, *dv = p->dv + off;
    float *de = sc->de + h * p->nzmax * D;
    st = gemm(1, 0, L, D, nr, 1.0f, S, ldS, doi, ld, 1.0f, dv, ld);
    if (st == MF_OK) st = gemm(1, 0, L, D, nr, scale, dP, ldS, qi, ld, 1.0f, dk, ld);
    if (st == MF_OK) st = gemm(0, 0, nr, D, L, scale, dP, ldS, p->k + off, ld, 0.0f, dq, ld);
    if (st == MF_OK)
        st = gemm(0, 0, nr, D, nz, 1.0f, dZ, nz, p->e + h * p->n_pos * D, D, 1.0f, dq, ld);
    if (st == MF_OK) st = gemm(1, 0, nz, D, nr, 1.0f, dZ, nz, qi, ld, 1.0f, de, D);
    return st;
}

/* Backward of head (b, h). */
static int bwd_task(const Cope *p, CopeScratch *sc, int64_t b, int64_t h) {
    const int64_t T = p->T, D = p->D, ld = p->ld, off = b * T * ld + h * D;
    transpose(sc->KT, p->Tp, p->k + off, ld, T, D);
    transpose(sc->VT, p->Tp, p->v + off, ld, T, D);
    for (int64_t t = 0; t < T; t++) {
        memset(p->dk + off + t * ld, 0, (size_t)D * sizeof(float));
        memset(p->dv + off + t * ld, 0, (size_t)D * sizeof(float));
    }
    for (int64_t ib = 0; ib * BR < T; ib++) {
        const int st = bwd_block(p, sc, b, h, ib);
        if (st != MF_OK) return st;
    }
    return MF_OK;
}

/* ---- driver ------------------------------------------------------------------------------- */

/* Sizes every sgemm call sees must fit BLAS's int: checked once here. */
static int check_sizes(int64_t B, int64_t T, int64_t H, int64_t D, int64_t n_pos, float scale) {
    if (B < 1 || T < 1 || H < 1 || D < 1 || n_pos < 1 || !isfinite(scale)) return MF_EINVAL;
    if (T >= INT_MAX - MF_VW || H > INT_MAX / D) return MF_EINVAL;
    return MF_OK;
}

/* The op's state from the public params (pointers, sizes) */
static Cope cope_of(const MfCopeParams *a) {
    Cope c = {.out = a->out, .lse = a->lse, .dq = a->dq, .dk = a->dk, .dv = a->dv, .q = a->q,
              .k = a->k, .v = a->v, .e = a->e, .dout = a->dout, .o = a->o,
              .lse_in = a->lse_in, .B = a->B, .T = a->T, .H = a->H, .D = a->D,
              .n_pos = a->n_pos, .ld = a->H * a->D, .Tp = round_up(a->T),
              .nzmax = min64(a->n_pos, a->T + 1), .scale = a->scale};
    return c;
}

/* Floats of e transposed (shared), and of one thread's scratch (each region rounded to 64
 * bytes): S, Z, G, F, W, KT, and for the backward dP, dZ, X, part, VT, de. */
static int64_t et_floats(const Cope *c) { return mf_scratch_size(c->H * c->D * c->nzmax); }
static int64_t thread_floats(const Cope *c, int backward) {
    const int64_t rows = min64(BR, c->T), Tp = c->Tp, nz = c->nzmax;
    int64_t n = mf_scratch_size(rows * Tp) + mf_scratch_size(rows * nz) +
                3 * mf_scratch_size(Tp) + mf_scratch_size(c->D * Tp);
    if (backward)
        n += mf_scratch_size(rows * Tp) + mf_scratch_size(rows * nz) + mf_scratch_size(Tp) +
             mf_scratch_size(4 * nz) + mf_scratch_size(c->D * Tp) +
             mf_scratch_size(c->H * nz * c->D);
    return n;
}

/* Thread scratch at `at` (thread_floats floats); zero: S and dP are zeroed so that lanes past a
 * row's end, which the vector passes read, hold numbers, part and de because they accumulate
 * (done by the thread that uses them). */
static CopeScratch carve(const Cope *c, float *at, int backward, int zero) {
    const int64_t rows = min64(BR, c->T), Tp = c->Tp, nz = c->nzmax;
    CopeScratch s = {0};
    s.S = mf_scratch_take(&at, rows * Tp);
    s.Z = mf_scratch_take(&at, rows * nz);
    s.G = mf_scratch_take(&at, Tp);
    s.F = (int32_t *)mf_scratch_take(&at, Tp);
    s.W = mf_scratch_take(&at, Tp);
    s.KT = mf_scratch_take(&at, c->D * Tp);
    if (zero) memset(s.S, 0, (size_t)(rows * Tp) * sizeof(float));
    if (!backward) return s;
    s.dP = mf_scratch_take(&at, rows * Tp);
    s.dZ = mf_scratch_take(&at, rows * nz);
    s.X = mf_scratch_take(&at, Tp);
    s.part = mf_scratch_take(&at, 4 * nz);
    s.VT = mf_scratch_take(&at, c->D * Tp);
    s.de = mf_scratch_take(&at, c->H * nz * c->D);
    if (zero) {
        memset(s.dP, 0, (size_t)(rows * Tp) * sizeof(float));
        memset(s.part, 0, (size_t)(4 * nz) * sizeof(float));
        memset(s.de, 0, (size_t)(c->H * nz * c->D) * sizeof(float));
    }
    return s;
}

/* c->ET = e[:, :nzmax] transposed per head (H, D, nzmax), at the scratch's start */
static void make_et(Cope *c, float *scratch) {
    c->ET = scratch;
    for (int64_t h = 0; h < c->H; h++)
        transpose(c->ET + h * c->D * c->nzmax, c->nzmax, c->e + h * c->n_pos * c->D, c->D,
                  c->nzmax, c->D);
}

/* Forward tasks: whole heads when there are enough to keep every thread busy (K is then
 * transposed once per head); else one query block per task, the longest first. */
static int whole_heads(const Cope *c) { return c->B * c->H >= 4 * (int64_t)mf_max_threads(); }
static int64_t fwd_tasks(const Cope *c) {
    return whole_heads(c) ? c->B * c->H : c->B * c->H * ((c->T + BR - 1) / BR);
}

int64_t cope_forward_scratch_floats(const MfCopeParams *a) {
    if (check_sizes(a->B, a->T, a->H, a->D, a->n_pos, 0.0f) != MF_OK) return 0;
    const Cope c = cope_of(a);
    return et_floats(&c) + min64(mf_max_threads(), fwd_tasks(&c)) * thread_floats(&c, 0);
}

int64_t cope_backward_scratch_floats(const MfCopeParams *a) {
    if (check_sizes(a->B, a->T, a->H, a->D, a->n_pos, 0.0f) != MF_OK) return 0;
    const Cope c = cope_of(a);
    return et_floats(&c) + min64(mf_max_threads(), c.B * c.H) * thread_floats(&c, 1);
}

int cope_forward(const MfCopeParams *a) {
    int status = check_sizes(a->B, a->T, a->H, a->D, a->n_pos, a->scale);
    if (status != MF_OK) return status;
    Cope p = cope_of(a);
    const int64_t per = thread_floats(&p, 0), B = p.B, H = p.H;
    const int64_t nb = (p.T + BR - 1) / BR, ntask = fwd_tasks(&p);
    const int heads = whole_heads(&p);
    const int nt = (int)min64(mf_scratch_threads(a->scratch_floats - et_floats(&p), per), ntask);
    if (nt < 1) return MF_EINVAL;
    make_et(&p, a->scratch);
    float *base = a->scratch + et_floats(&p);
#pragma omp parallel num_threads(nt)
    {
        CopeScratch sc = carve(&p, base + mf_thread_id() * per, 0, 1);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntask; task++) {
            const int64_t bh = task % (B * H);
            const int64_t ib0 = heads ? 0 : nb - 1 - task / (B * H);
            const int64_t ib1 = heads ? nb : ib0 + 1;
            const int st = fwd_task(&p, &sc, bh / H, bh % H, ib0, ib1);
            if (st != MF_OK) {
#pragma omp atomic write
                status = st;
            }
        }
    }
    return status;
}

int cope_backward(const MfCopeParams *a) {
    int status = check_sizes(a->B, a->T, a->H, a->D, a->n_pos, a->scale);
    if (status != MF_OK) return status;
    Cope p = cope_of(a);
    const int64_t per = thread_floats(&p, 1), ntask = p.B * p.H, D = p.D, n_pos = p.n_pos;
    const int nt = (int)min64(mf_scratch_threads(a->scratch_floats - et_floats(&p), per), ntask);
    if (nt < 1) return MF_EINVAL;
    make_et(&p, a->scratch);
    float *base = a->scratch + et_floats(&p), *de = a->de;
    const int64_t nde = p.H * p.nzmax * D; /* rows n >= nzmax of de get nothing */
    const int64_t de_at = carve(&p, base, 1, 0).de - base; /* de in a thread's region */
#pragma omp parallel num_threads(nt)
    {
        CopeScratch sc = carve(&p, base + mf_thread_id() * per, 1, 1);
#pragma omp for schedule(static)
        for (int64_t task = 0; task < ntask; task++) {
            const int st = bwd_task(&p, &sc, task / p.H, task % p.H);
            if (st != MF_OK) {
#pragma omp atomic write
                status = st;
            }
        }
        /* After the implicit barrier every partial is complete (and status the same in
         * every thread): sum them in thread order. de is left untouched on failure. */
        const int team = mf_num_threads();
        if (status == MF_OK) {
#pragma omp for schedule(static)
            for (int64_t x = 0; x < nde; x++) {
                const int64_t hh = x / (p.nzmax * D), rest = x % (p.nzmax * D);
                float s = 0.0f;
                for (int t = 0; t < team; t++) s += base[t * per + de_at + x];
                de[hh * n_pos * D + rest] += s;
            }
        }
    }
    return status;
}
