/* Causal softmax attention of a block of new queries on the keys of a cache (incremental
 * decoding; MfAttentionDecodeParams, params.h). Forward only.
 *
 * The Tq queries are the last Tq positions of sequences of Tk >= Tq tokens whose keys and
 * values hold every position: the cached prefix (Tk - Tq), then the block's own, in the first
 * Tk of the Tmax >= Tk positions of k and v (B, Tmax, H, D) (a cache with room to grow).
 * Query i sits at position t_i = Tk - Tq + i and sees the keys j <= t_i:
 *   out[b,i,h] = sum_{j <= t_i} softmax_j(scale q_i . k_j) v_j
 *   lse[b,h,i] = log sum_{j <= t_i} exp(scale q_i . k_j)
 * With Tq = Tk it is attention_forward (the same function, not the same bits: that op tiles).
 *
 * A task is a head (b, h), on one thread's scratch: the head's keys transposed once (D, Tk),
 * then per query its scores, simd.h vectors of keys (each a sum over d in order), their max
 * m, p_j = exp(s_j - m) and l = sum p_j (vexp, vector lanes then one horizontal sum), then
 * out = sum_j p_j v_j / l (registers of vectors over D) and lse = m + log l. What a task
 * computes does not depend on the thread that runs it, so every output has the same bits for
 * any thread count.
 * Scratch: one thread's share is the scores (Tk rounded up to whole vectors) and the
 * transposed keys (each rounded up to 64 bytes); with less scratch than the team needs, fewer
 * threads run.
 * MF_EINVAL for D odd or outside [16, 128], a size < 1, Tq > Tk or Tk > Tmax, a non-finite
 * scale, a NULL pointer, outputs overlapping each other or an input, or scratch that is NULL,
 * not 64-byte aligned or short of one thread's share. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/attention_sets.h"
#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/params.h"
#include "mapformer/scratch.h"
#define MF_VW MF_CLONES_VW /* the width of the target_clones copies (clones.h) */
#include "mapformer/simd.h"

/* heads below this many multiply-adds (B H Tq Tk D) run on the calling thread */
#define DECODE_MIN_PARALLEL 2e6

static int valid(const MfAttentionDecodeParams *p) {
    return p != NULL && p->Tq >= 1 && p->Tk >= p->Tq && p->Tmax >= p->Tk &&
           mf_attn_check_sizes(p->B, p->Tmax, p->H, p->D, p->scale) == MF_OK;
}

/* keys rounded up to whole vectors */
static int64_t padded_keys(const MfAttentionDecodeParams *p) {
    return (p->Tk + MF_VW - 1) / MF_VW * MF_VW;
}

static int64_t per_thread(const MfAttentionDecodeParams *p) {
    const int64_t Tkp = padded_keys(p);
    return mf_scratch_size(Tkp) + mf_scratch_size(p->D * Tkp);
}

int64_t attention_decode_forward_scratch_floats(const MfAttentionDecodeParams *p) {
    return valid(p) ? per_thread(p) * mf_max_threads() : 0;
}

/* keys per register tile of the score loop: NJ vectors of independent sums */
#define NJ 4

/* Head (b, h) on the thread's scratch: s (Tkp) the scores, kt (D, Tkp) the head's keys
 * transposed (zero past Tk), so that a query's scores are MF_VW keys per vector: s[j] =
 * sum_d q[d] kt[d][j], in order over d. */
MF_CLONES
static void head(const MfAttentionDecodeParams *p, int64_t b, int64_t h, float *s, float *kt) {
    const int64_t Tq = p->Tq, Tk = p->Tk, H = p->H, D = p->D, ld = H * D;
    const int64_t Tkp = padded_keys(p);
    const float *k = p->k + b * p->Tmax * ld + h * D, *v = p->v + b * p->Tmax * ld + h * D;
    mf_transpose(kt, Tkp, k, ld, Tk, D);
    for (int64_t d = 0; d < D; d++)
        for (int64_t j = Tk; j < Tkp; j++) kt[d * Tkp + j] = 0.0f;
    for (int64_t i = 0; i < Tq; i++) {
        const float *q = p->q + (b * Tq + i) * ld + h * D;
        const int64_t n = Tk - Tq + i + 1, nv = (n + MF_VW - 1) / MF_VW; /* keys 0 .. t_i */
        vf mv = VSPLAT(-INFINITY);
        for (int64_t g0 = 0; g0 < nv; g0 += NJ) {
            const int64_t ng = nv - g0 < NJ ? nv - g0 : NJ;
            vf sc[NJ] = {VZERO};
            for (int64_t d = 0; d < D; d++) {
                const vf qd = VSPLAT(q[d]);
                const float *row = kt + d * Tkp + g0 * MF_VW;
                for (int64_t g = 0; g < ng; g++) sc[g] = sc[g] + qd * VLOAD(row + g * MF_VW);
            }
            for (int64_t g = 0; g < ng; g++) {
                const int64_t j = (g0 + g) * MF_VW;
                vf x = sc[g] * p->scale;
                x = VSELECT(VFIRST(n - j), x, VSPLAT(-INFINITY)); /* keys past t_i */
                VSTORE(s + j, x);
                mv = VMAX(mv, x);
            }
        }
        const float m = vhmax(&mv);
        vf lv = VZERO;
        for (int64_t j = 0; j < nv * MF_VW; j += MF_VW) {
            vf x = VLOAD(s + j) - m;
            vexp(&x);
            x = VAND(VFIRST(n - j), x); /* keys past t_i: 0 */
            VSTORE(s + j, x);
            lv = lv + x;
        }
        const float l = vhsum(&lv);
        float *o = p->out + (b * Tq + i) * ld + h * D;
        /* out = sum_j p_j v_j / l, NJ vectors of D at a time in registers, in order over j */
        for (int64_t d0 = 0; d0 < D; d0 += NJ * MF_VW) {
            const int64_t left = (D - d0 + MF_VW - 1) / MF_VW, ng = left < NJ ? left : NJ;
            vf a[NJ] = {VZERO};
            for (int64_t j = 0; j < n; j++) {
                const vf pj = VSPLAT(s[j]);
                const float *vj = v + j * ld + d0;
                for (int64_t g = 0; g < ng; g++) {
                    const int64_t c = D - d0 - g * MF_VW < MF_VW ? D - d0 - g * MF_VW : MF_VW;
                    vf x;
                    vload_n(&x, vj + g * MF_VW, c);
                    a[g] = a[g] + pj * x;
                }
            }
            for (int64_t g = 0; g < ng; g++) {
                const int64_t c = D - d0 - g * MF_VW < MF_VW ? D - d0 - g * MF_VW : MF_VW;
                const vf x = a[g] / l;
                vstore_n(o + d0 + g * MF_VW, &x, c);
            }
        }
        p->lse[(b * H + h) * Tq + i] = m + logf(l);
    }
}

int attention_decode_forward(const MfAttentionDecodeParams *p) {
    if (!valid(p)) return MF_EINVAL;
    if (p->q == NULL || p->k == NULL || p->v == NULL || p->out == NULL || p->lse == NULL)
        return MF_EINVAL;
    const int64_t per = per_thread(p);
    if (p->scratch == NULL || (uintptr_t)p->scratch % 64 != 0 || p->scratch_floats < per)
        return MF_EINVAL;
    const int64_t B = p->B, H = p->H, ld = p->H * p->D;
    const int64_t nq = B * p->Tq * ld, nk = B * p->Tmax * ld;
    float *const out[] = {p->out, p->lse, p->scratch};
    const int64_t out_n[] = {nq, B * H * p->Tq, p->scratch_floats};
    const float *const in[] = {p->q, p->k, p->v};
    const int64_t in_n[] = {nq, nk, nk};
    if (mf_attn_check_overlaps(out, out_n, 3, in, in_n, 3) != MF_OK) return MF_EINVAL;
    const int threads = mf_scratch_threads(p->scratch_floats, per);
    const double work = (double)B * H * p->Tq * p->Tk * p->D;
#pragma omp parallel num_threads(threads) if (threads > 1 && B * H > 1 && work > DECODE_MIN_PARALLEL)
    {
        float *s = p->scratch + (int64_t)mf_thread_id() * per;
        float *kt = s + mf_scratch_size(padded_keys(p));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < B * H; t++) head(p, t / H, t % H, s, kt);
    }
    return MF_OK;
}
