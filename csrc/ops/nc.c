/* MapEM-NC positions (MapFormer eq. 20, appendix 10.4.2): non-commutative path integration on
 * 4x4 blocks, p_t = exp(S_t) exp(S_{t-1}) ... exp(S_1) p*, an ordered product.
 *
 * Each step generator is S_t = L(u_t) + R(v_t) (so(4) split into left and right quaternion
 * multiplications, which commute), so exp(S_t) q = a_t q c_t with a_t = qexp(u_t),
 * c_t = qexp(v_t): the forward carries p_t = a_t p_{t-1} c_t (p_0 = p*), two quaternion
 * products a step instead of a 4x4 matrix product, renormalised to |p*| every step by one
 * Newton step for the inverse norm, q (3 - |q|^2 / |p*|^2) / 2, p_{t-1}'s factor applied to
 * p_t (vq_renorm_factor; no square root or division on the sequential chain; a relative error e of the squared norm becomes about e^2, so the norm
 * stays within a few ulp of |p*| at any length). Equivalently p_t = A_t p* C_t with the prefix
 * products A_t = a_t A_{t-1}, C_t = C_{t-1} c_t (A_0 = C_0 = 1), which the backward carries
 * (unit, renormalised the same way).
 * The caller supplies (u_t, v_t) per token and block: with K = 6 generators (a basis of so(4))
 * the paper's theta_t -> sum_i theta_t,i S_i composed with a linear map or an MLP of the token
 * is the same function class as a linear map or an MLP straight to (u_t, v_t).
 *
 * The product is associative, so a log-depth parallel scan over t exists (the paper says it
 * can only be computed sequentially); on a CPU with B * H * NB independent chains per call the
 * sequential loop over t is the cheaper one, and that is what this op runs.
 *
 * Backward (g_t = dp_t). With the body-frame sums E_t = sum_{tau >= t} conj(A_tau) g_tau
 * conj(C_tau) (a plain reverse cumulative sum), the adjoints of the two prefix products are
 * lam_t = A_t E_t conj(p*) and mu_t = conj(p*) E_t C_t (they satisfy the reverse-time
 * recursions lam_t = g_t conj(p* C_t) + conj(a_{t+1}) lam_{t+1} and
 * mu_t = conj(A_t p*) g_t + mu_{t+1} conj(c_{t+1}) for unit a, c), so
 *   da_t = lam_t conj(A_{t-1}),  dc_t = conj(C_{t-1}) mu_t,  dw_t = J(u_t)^T da_t, J(v_t)^T dc_t
 *   dp* += E_1
 * with J the Jacobian of qexp, taken through the trivialised derivative (dexp_t): only the
 * rotations conj(a_t) da_t = A_{t-1} (E_t conj(p*)) conj(A_{t-1}) and
 * dc_t conj(c_t) = conj(C_{t-1}) (conj(p*) E_t) C_{t-1} of two 3-vectors enter. The backward first runs the forward
 * chain again, keeping A_t, C_t, w_t and qexp's coefficients (sinc, k, cos) of every step in
 * the thread's scratch (NC_SAVED = 20 vectors a step: 160 KB per thread at T = 256 and 8
 * lanes), then sweeps t in reverse: nothing is recovered by inverting steps.
 *
 * Vectorisation (mapformer/simd.h, MF_VW = MF_CLONES_VW lanes): a group is MF_VW consecutive
 * (h, k) blocks of one batch row, one per lane; every quaternion is 4 vectors, w_t 6. The
 * (b, t) rows of w (6 floats a block), p, dp and p* (4 a block) are turned into lanes by
 * in-register transposes (simd.h's butterfly stages; the loads may read past the group's last
 * block up to the array's end, the group at the array's end is gathered float by float).
 * All in float32. qexp per step: below |w| = 1.5 the Taylor series of cos, sinc (and the
 * Jacobian's k) in |w|^2, Horner, no square root, reduction or division; a group with a larger
 * step also takes a vector sqrt, vsincos (Cody-Waite reduction and polynomials, about 1 ulp;
 * |w| below 2^22) and a division for those lanes. The qexp of a chunk of steps (independent
 * over t) come first, then the chunk's products, the only sequential dependence (2 quaternion
 * products, each component's four products summed in pairs, and a renormalisation a step).
 *
 * Parallel layout: a work item is (batch row b, group); the lanes do not interact, so a
 * block's bits do not depend on its group or thread. dp*: each item writes its E_1 to scratch,
 * summed over b in a fixed order (in double) after the items: same bits for any thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

#define MF_VW MF_CLONES_VW
#include "mapformer/simd.h"

#define NC_MIN_PARALLEL 8192 /* B*T*H*NB below this runs on one thread */
#define NC_POLY2 2.25f       /* |w|^2 below which qexp is its Taylor series (|w| < 1.5) */
#define NC_SAVED 20 /* vectors kept per step by the backward: A, C, w, sc and k x 2, cos x 2 */
#define NC_CHUNK 8 /* steps whose qexp the forward evaluates before their products */
#define NC_ROWS ((6 + MF_VW - 1) / MF_VW * MF_VW) /* transpose rows for 6 (or 4) features */
#define NC_AHEAD 8            /* steps ahead that the (b, t) rows are prefetched */
#define ALIGNED __attribute__((aligned(64)))

typedef struct {
    vf w, x, y, z;
} vq;

/* *r = a b, each component's four products summed as two pairs (a shorter chain of adds on
 * the sequential product) */
MF_INLINE void vq_mul(vq *r, const vq *a, const vq *b) {
    const vf w = (a->w * b->w - a->x * b->x) - (a->y * b->y + a->z * b->z);
    const vf x = (a->w * b->x + a->x * b->w) + (a->y * b->z - a->z * b->y);
    const vf y = (a->w * b->y - a->x * b->z) + (a->y * b->w + a->z * b->x);
    const vf z = (a->w * b->z + a->x * b->y) - (a->y * b->x - a->z * b->w);
    r->w = w, r->x = x, r->y = y, r->z = z;
}

MF_INLINE void vq_conj(vq *r, const vq *a) {
    r->w = a->w, r->x = -a->x, r->y = -a->y, r->z = -a->z;
}

/* *f = (3 - |q|^2) / 2: one Newton step for 1 / |q| from 1. The chains apply q_{t-1}'s factor
 * to q_t = x_t q_{t-1} (or q_{t-1} x_t), computed beside the product rather than after it, so
 * that the chain's latency is the products' alone: with |q_{t-1}|^2 = 1 + e and a step's
 * rounding d_t, |q_t|^2 = (1 + e)(1 + 2 d_t)(1 - e + O(e^2)) = 1 + 2 d_t + O(e^2): as
 * converged as the factor applied after the product. */
MF_INLINE void vq_renorm_factor(vf *f, const vq *q) {
    const vf n2 = (q->w * q->w + q->x * q->x) + (q->y * q->y + q->z * q->z);
    *f = 1.5f - 0.5f * n2;
}

MF_INLINE void vq_scale(vq *q, const vf *f) {
    q->w *= *f, q->x *= *f, q->y *= *f, q->z *= *f;
}

MF_INLINE void vsqrt(vf *r, const vf *x) {
    for (int l = 0; l < MF_VW; l++) (*r)[l] = __builtin_sqrtf((*x)[l]);
}

/* whether any lane of m is set */
MF_INLINE int vany(const vi *m) {
    int any = 0;
    for (int l = 0; l < MF_VW; l++) any |= (*m)[l];
    return any != 0;
}

/* *a = qexp(w) = (cos n, sinc(n) w) for the pure quaternion w = (w[0], w[1], w[2]), n = |w|;
 * *sc = sinc n and, when k is not NULL, *k = (1 - sinc n cos n) / n^2 (qexp's Jacobian, see
 * dexp_t). Lanes with n^2 < NC_POLY2: their Taylor series in n^2 (cos and sinc to n^12, k to
 * n^14: the next terms are below 4e-9 there), no square root, division or reduction; any other lane
 * (only when there is one): sqrt, vsincos and a division. */
MF_INLINE void vqexp(vq *a, vf *sc, vf *k, const vf *w) {
    const vf n2 = (w[0] * w[0] + w[1] * w[1]) + w[2] * w[2];
    vf c = VSPLAT(1.0f / 479001600);
    c = c * n2 - 1.0f / 3628800, c = c * n2 + 1.0f / 40320, c = c * n2 - 1.0f / 720;
    c = c * n2 + 1.0f / 24, c = c * n2 - 0.5f, c = c * n2 + 1.0f;
    vf s = VSPLAT(1.0f / 6227020800);
    s = s * n2 - 1.0f / 39916800, s = s * n2 + 1.0f / 362880, s = s * n2 - 1.0f / 5040;
    s = s * n2 + 1.0f / 120, s = s * n2 - 1.0f / 6, s = s * n2 + 1.0f;
    vf q = VZERO;
    if (k) { /* sum_{j >= 1} (-1)^(j+1) 4^j n^(2j-2) / (2j+1)!, to j = 8 */
        q = VSPLAT(-65536.0f / 355687428096000.0f);
        q = q * n2 + 16384.0f / 1307674368000.0f, q = q * n2 - 4096.0f / 6227020800.0f;
        q = q * n2 + 1024.0f / 39916800, q = q * n2 - 256.0f / 362880;
        q = q * n2 + 64.0f / 5040, q = q * n2 - 16.0f / 120, q = q * n2 + 4.0f / 6;
    }
    const vi big = n2 >= VSPLAT(NC_POLY2);
    if (vany(&big)) {
        const vf m2 = VSELECT(big, n2, VSPLAT(1.0f)); /* 1: lanes taken from the series */
        vf n, sn, cn;
        vsqrt(&n, &m2);
        vsincos(&n, &sn, &cn);
        const vf rn = 1.0f / n, sg = sn * rn;
        c = VSELECT(big, cn, c);
        s = VSELECT(big, sg, s);
        if (k) q = VSELECT(big, (1.0f - sg * cn) * rn * rn, q);
    }
    *sc = s;
    if (k) *k = q;
    a->w = c, a->x = s * w[0], a->y = s * w[1], a->z = s * w[2];
}

/* out = J(w)^T (a z) for the left factor a = qexp(w) (sign 1), J(w)^T (z a) for the right one
 * (sign -1), z a pure quaternion (3 vectors), J the Jacobian of qexp at w: the transposed
 * trivialised derivative of the exponential,
 *   sinc(n) cos(n) z + k (w . z) w + sign sinc(n)^2 w x z,   k = (1 - sinc n cos n) / n^2
 * (scc = sinc cos, sc2 = sinc^2); the scalar part of a^-1 da (or dc c^-1) does not enter */
MF_INLINE void dexp_t(vf *out, const vf *w, const vf *scc, const vf *sc2, const vf *k,
                      const vf *z, float sign) {
    const vf kd = *k * (w[0] * z[0] + w[1] * z[1] + w[2] * z[2]), s2 = sign * *sc2;
    out[0] = (*scc * z[0] + kd * w[0]) + s2 * (w[1] * z[2] - w[2] * z[1]);
    out[1] = (*scc * z[1] + kd * w[1]) + s2 * (w[2] * z[0] - w[0] * z[2]);
    out[2] = (*scc * z[2] + kd * w[2]) + s2 * (w[0] * z[1] - w[1] * z[0]);
}

/* out = q x conj(q) for the pure quaternion x (3 vectors) and a unit q (its rotation),
 * conj(q) x q when sign is -1: x + q.w t + q.v x t, t = 2 q.v x x */
MF_INLINE void vq_rotate(vf *out, const vq *q, const vf *x, float sign) {
    const vf qx = sign * q->x, qy = sign * q->y, qz = sign * q->z;
    const vf tx = 2.0f * (qy * x[2] - qz * x[1]), ty = 2.0f * (qz * x[0] - qx * x[2]),
             tz = 2.0f * (qx * x[1] - qy * x[0]);
    out[0] = (x[0] + q->w * tx) + (qy * tz - qz * ty);
    out[1] = (x[1] + q->w * ty) + (qz * tx - qx * tz);
    out[2] = (x[2] + q->w * tz) + (qx * ty - qy * tx);
}

/* x[r] = row r of an MF_VW x MF_VW tile -> x[c] = its column c, in registers (simd.h's
 * butterfly stages) */
MF_INLINE void transpose_regs(vf *x) {
#if MF_VW == 16
    MF_STAGE(x, 8)
#endif
#if MF_VW >= 8
    MF_STAGE(x, 4)
#endif
    MF_STAGE(x, 2)
    MF_STAGE(x, 1)
}

/* v[f] (f < F) = feature f of the n blocks at src (F floats each), lane by block, zero lanes
 * beyond n; avail = the floats readable from src on (to the array's end): a whole group whose
 * rows of MF_VW floats stay inside the array is transposed in registers (each row read past
 * its block's F floats, the extra columns dropped), any other gathered float by float */
MF_INLINE void tile_load(vf *v, const float *src, int64_t n, int F, int64_t avail) {
    const int last = (F - 1) / MF_VW * MF_VW; /* the last transpose's first feature */
    if (n == MF_VW && (MF_VW - 1) * F + last + MF_VW <= avail) {
        for (int f0 = 0; f0 < F; f0 += MF_VW) {
            vf x[MF_VW];
            for (int i = 0; i < MF_VW; i++) x[i] = VLOADU(src + i * F + f0);
            transpose_regs(x);
            for (int c = 0; c < MF_VW && f0 + c < F; c++) v[f0 + c] = x[c];
        }
        return;
    }
    float tmp[NC_ROWS * MF_VW] ALIGNED;
    for (int i = 0; i < F * MF_VW; i++) tmp[i] = 0.0f;
    for (int64_t l = 0; l < n; l++)
        for (int f = 0; f < F; f++) tmp[f * MF_VW + l] = src[l * F + f];
    for (int f = 0; f < F; f++) v[f] = VLOAD(tmp + f * MF_VW);
}

/* the n blocks at dst (F floats each) = the lanes of v[f] (f < F), transposed in registers;
 * a whole group of blocks at most MF_VW floats long by stores of MF_VW floats, each one's
 * tail overwritten by the next (the last block's F floats stored alone): nothing outside the
 * group's n F floats is written */
MF_INLINE void tile_store(float *dst, const vf *v, int64_t n, int F) {
    for (int f0 = 0; f0 < F; f0 += MF_VW) {
        const int m = F - f0 < MF_VW ? F - f0 : MF_VW;
        vf x[MF_VW];
        for (int c = 0; c < MF_VW; c++) x[c] = f0 + c < F ? v[f0 + c] : VZERO;
        transpose_regs(x);
        if (m == F && n == MF_VW && MF_VW <= 2 * F) {
            for (int l = 0; l < MF_VW - 1; l++) VSTOREU(dst + l * F, x[l]);
            memcpy(dst + (MF_VW - 1) * F, &x[MF_VW - 1], 4 * (size_t)F);
        } else {
            for (int64_t l = 0; l < n; l++) memcpy(dst + l * F + f0, &x[l], 4 * (size_t)m);
        }
    }
}

/* the cache lines of floats [0, n) at x into the cache (rw 1: for writing); the (b, t) rows
 * of a group are strided by the whole row (a new page every few steps), which the hardware
 * prefetchers do not follow */
MF_INLINE void prefetch_floats(const float *x, int64_t n, int rw) {
    for (int64_t i = 0; i < n; i += 16) {
        if (rw)
            __builtin_prefetch(x + i, 1);
        else
            __builtin_prefetch(x + i, 0);
    }
    if (rw)
        __builtin_prefetch(x + n - 1, 1);
    else
        __builtin_prefetch(x + n - 1, 0);
}

MF_INLINE void vq_load(vq *q, const float *src, int64_t n, int64_t avail) {
    vf v[4];
    tile_load(v, src, n, 4, avail);
    q->w = v[0], q->x = v[1], q->y = v[2], q->z = v[3];
}

MF_INLINE void vq_one(vq *q) {
    q->w = VSPLAT(1.0f), q->x = q->y = q->z = VZERO;
}

static int nc_check(const MfNcParams *p) {
    if (p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 4 * p->NB || p->F != 6)
        return MF_EINVAL;
    return MF_OK;
}

/* the sizes of one call: blocks per (b, t) row, groups per row */
typedef struct {
    int64_t T, nblk, ngroups, wlen, plen; /* wlen, plen: the floats of w and of p (or dp) */
} Shape;

static Shape shape_of(const MfNcParams *p) {
    Shape s;
    s.T = p->T;
    s.nblk = p->H * p->NB;
    s.ngroups = (s.nblk + MF_VW - 1) / MF_VW;
    s.wlen = p->B * p->T * s.nblk * 6;
    s.plen = p->B * p->T * s.nblk * 4;
    return s;
}

/* One group: the steps' qexp for a chunk of NC_CHUNK steps first (independent over t), then
 * the sequential products of the chunk */
MF_CLONES
static void forward_group(const MfNcParams *p, const Shape *sh, int64_t b, int64_t j0) {
    const int64_t n = sh->nblk - j0 < MF_VW ? sh->nblk - j0 : MF_VW, nb = sh->nblk;
    vq q; /* p_t = a_t p_{t-1} c_t, renormalised to |p*| */
    vq_load(&q, p->start + 4 * j0, n, 4 * (nb - j0));
    const vf s2 = (q.w * q.w + q.x * q.x) + (q.y * q.y + q.z * q.z);
    const vf inv = VSELECT(s2 > VSPLAT(1e-30f), 1.0f / VSELECT(s2 > VSPLAT(1e-30f), s2,
                                                              VSPLAT(1.0f)), VZERO);
    vq steps[2 * NC_CHUNK]; /* a_t, c_t */
    for (int64_t t0 = 0; t0 < sh->T; t0 += NC_CHUNK) {
        const int64_t t1 = t0 + NC_CHUNK < sh->T ? t0 + NC_CHUNK : sh->T;
        for (int64_t t = t0; t < t1; t++) {
            const int64_t row = (b * sh->T + t) * nb + j0;
            if (t + NC_AHEAD < sh->T) prefetch_floats(p->w + 6 * (row + NC_AHEAD * nb), 6 * n, 0);
            vf w[6], sc;
            tile_load(w, p->w + 6 * row, n, 6, sh->wlen - 6 * row);
            vqexp(&steps[2 * (t - t0)], &sc, NULL, w);
            vqexp(&steps[2 * (t - t0) + 1], &sc, NULL, w + 3);
        }
        for (int64_t t = t0; t < t1; t++) {
            const int64_t row = (b * sh->T + t) * nb + j0;
            if (t + NC_AHEAD < sh->T) prefetch_floats(p->p + 4 * (row + NC_AHEAD * nb), 4 * n, 1);
            /* p_{t-1}'s renormalisation, beside the products, applied to p_t (vq_renorm) */
            const vf n2 = (q.w * q.w + q.x * q.x) + (q.y * q.y + q.z * q.z);
            const vf f = 1.5f - 0.5f * (n2 * inv);
            vq_mul(&q, &steps[2 * (t - t0)], &q);
            vq_mul(&q, &q, &steps[2 * (t - t0) + 1]);
            q.w *= f, q.x *= f, q.y *= f, q.z *= f;
            const vf out[4] = {q.w, q.x, q.y, q.z};
            tile_store(p->p + 4 * row, out, n, 4);
        }
    }
}

int nc_forward(const MfNcParams *p) {
    if (!p || !p->p || !p->w || !p->start) return MF_EINVAL;
    const int ok = nc_check(p);
    if (ok != MF_OK) return ok;
    const Shape sh = shape_of(p);
#pragma omp parallel for schedule(dynamic, 1) if (p->B * sh.T * sh.nblk >= NC_MIN_PARALLEL)
    for (int64_t it = 0; it < p->B * sh.ngroups; it++)
        forward_group(p, &sh, it / sh.ngroups, it % sh.ngroups * MF_VW);
    return MF_OK;
}

/* the saved vectors of step t in buf: A (4), C (4), w (6), sc_u, k_u, sc_v, k_v, cos |u|, cos |v| */
#define SAVED(buf, t) ((buf) + (t) * NC_SAVED * MF_VW)

MF_CLONES
static void backward_group(const MfNcParams *p, const Shape *sh, int64_t b, int64_t j0,
                           float *buf, float *ds) {
    const int64_t n = sh->nblk - j0 < MF_VW ? sh->nblk - j0 : MF_VW, nb = sh->nblk;
    const int64_t T = sh->T;
    vq s, A, C;
    vq_load(&s, p->start + 4 * j0, n, 4 * (nb - j0));
    vq_one(&A);
    vq_one(&C);
    for (int64_t t = 0; t < T; t++) { /* the forward chain again */
        const int64_t row = (b * T + t) * nb + j0;
        vf *v = (vf *)SAVED(buf, t);
        if (t + NC_AHEAD < T) prefetch_floats(p->w + 6 * (row + NC_AHEAD * nb), 6 * n, 0);
        tile_load(v + 8, p->w + 6 * row, n, 6, sh->wlen - 6 * row);
        vq a, c;
        vqexp(&a, v + 14, v + 15, v + 8);
        vqexp(&c, v + 16, v + 17, v + 11);
        v[18] = a.w, v[19] = c.w;
        vf fa, fc;
        vq_renorm_factor(&fa, &A);
        vq_renorm_factor(&fc, &C);
        vq_mul(&A, &a, &A);
        vq_scale(&A, &fa);
        vq_mul(&C, &C, &c);
        vq_scale(&C, &fc);
        v[0] = A.w, v[1] = A.x, v[2] = A.y, v[3] = A.z;
        v[4] = C.w, v[5] = C.x, v[6] = C.y, v[7] = C.z;
    }
    vq E = {VZERO, VZERO, VZERO, VZERO};
    for (int64_t t = T - 1; t >= 0; t--) {
        const int64_t row = (b * T + t) * nb + j0;
        const vf *v = (const vf *)SAVED(buf, t);
        if (t >= NC_AHEAD) {
            prefetch_floats(p->dp + 4 * (row - NC_AHEAD * nb), 4 * n, 0);
            prefetch_floats(p->dw + 6 * (row - NC_AHEAD * nb), 6 * n, 1);
        }
        const vq At = {v[0], v[1], v[2], v[3]}, Ct = {v[4], v[5], v[6], v[7]};
        vq Ap, Cp; /* A_{t-1}, C_{t-1} */
        if (t > 0) {
            const vf *u = (const vf *)SAVED(buf, t - 1);
            Ap.w = u[0], Ap.x = u[1], Ap.y = u[2], Ap.z = u[3];
            Cp.w = u[4], Cp.x = u[5], Cp.y = u[6], Cp.z = u[7];
        } else {
            vq_one(&Ap);
            vq_one(&Cp);
        }
        vq g, q, r;
        vq_load(&g, p->dp + 4 * row, n, sh->plen - 4 * row);
        vq_conj(&q, &At); /* E += conj(A_t) g conj(C_t) */
        vq_mul(&q, &q, &g);
        vq_conj(&r, &Ct);
        vq_mul(&q, &q, &r);
        E.w += q.w, E.x += q.x, E.y += q.y, E.z += q.z;
        vf X[3], Y[3]; /* vec(E conj(p*)), vec(conj(p*) E): the same but the cross product's sign */
        {
            const vf sw = s.w, sx = s.x, sy = s.y, sz = s.z;
            const vf vx = sw * E.x - E.w * sx, vy = sw * E.y - E.w * sy, vz = sw * E.z - E.w * sz;
            const vf cx = E.y * sz - E.z * sy, cy = E.z * sx - E.x * sz, cz = E.x * sy - E.y * sx;
            X[0] = vx - cx, X[1] = vy - cy, X[2] = vz - cz;
            Y[0] = vx + cx, Y[1] = vy + cy, Y[2] = vz + cz;
        }
        /* a_t^-1 da_t = A_{t-1} E conj(p*) conj(A_{t-1}), dc_t c_t^-1 = conj(C_{t-1}) conj(p*) E
         * C_{t-1}: rotations of X and Y (their scalar parts do not enter dw) */
        vf za[3], zc[3], dw[6];
        vq_rotate(za, &Ap, X, 1.0f);
        vq_rotate(zc, &Cp, Y, -1.0f);
        const vf scca = v[14] * v[18], sc2a = v[14] * v[14];
        const vf sccc = v[16] * v[19], sc2c = v[16] * v[16];
        dexp_t(dw, v + 8, &scca, &sc2a, v + 15, za, 1.0f);
        dexp_t(dw + 3, v + 11, &sccc, &sc2c, v + 17, zc, -1.0f);
        tile_store(p->dw + 6 * row, dw, n, 6);
    }
    VSTORE(ds, E.w);
    VSTORE(ds + MF_VW, E.x);
    VSTORE(ds + 2 * MF_VW, E.y);
    VSTORE(ds + 3 * MF_VW, E.z);
}

/* scratch of the backward: per thread T * NC_SAVED vectors; the dp* partials, 4 vectors per
 * (b, group) */
static int64_t per_thread(const MfNcParams *p) {
    return mf_scratch_size(p->T * NC_SAVED * MF_VW);
}

static int64_t shared_floats(const MfNcParams *p) {
    const Shape sh = shape_of(p);
    return mf_scratch_size(p->B * sh.ngroups * 4 * MF_VW);
}

int64_t nc_backward_scratch_floats(const MfNcParams *p) {
    if (!p || nc_check(p) != MF_OK) return 0;
    return shared_floats(p) + mf_max_threads() * per_thread(p);
}

int nc_backward(const MfNcParams *p) {
    if (!p || !p->dp || !p->w || !p->start || !p->dw || !p->dstart) return MF_EINVAL;
    const int ok = nc_check(p);
    if (ok != MF_OK) return ok;
    const Shape sh = shape_of(p);
    const int64_t B = p->B, shared = shared_floats(p);
    const int threads = mf_scratch_threads(p->scratch_floats - shared, per_thread(p));
    if (B * sh.T * sh.nblk == 0) return MF_OK;
    if (!p->scratch || p->scratch_floats < shared || threads < 1) return MF_EINVAL;
    float *at = p->scratch;
    float *parts = mf_scratch_take(&at, B * sh.ngroups * 4 * MF_VW);
    float *bufs = at;
#pragma omp parallel num_threads(threads) if (B * sh.T * sh.nblk >= NC_MIN_PARALLEL)
    {
        float *buf = bufs + mf_thread_id() * per_thread(p);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * sh.ngroups; it++)
            backward_group(p, &sh, it / sh.ngroups, it % sh.ngroups * MF_VW, buf,
                           parts + it * 4 * MF_VW);
    }
    /* dp* += sum over b of E_1, in b's order */
    for (int64_t j = 0; j < sh.nblk; j++) {
        const int64_t g = j / MF_VW, l = j % MF_VW;
        for (int f = 0; f < 4; f++) {
            double sum = 0.0;
            for (int64_t b = 0; b < B; b++)
                sum += parts[((b * sh.ngroups + g) * 4 + f) * MF_VW + l];
            p->dstart[4 * j + f] = (float)((double)p->dstart[4 * j + f] + sum);
        }
    }
    return MF_OK;
}
