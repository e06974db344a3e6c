/* The selective scans' group kernels (csrc/ops/scan.c's header comment: the method, the error
 * bounds, the speed), written once over the SIMD layer. A kernel-set file defines, then
 * includes this file:
 *   MF_VW           floats per vector: channels per group (16, 8 or 4; mapformer/simd.h)
 *   MF_SCAN_TARGET  the attribute of the group functions (mapformer/clones.h's MF_CLONES_FMA,
 *                   or nothing where the file's flags pick the instruction set)
 *   MF_SCAN_TABLE   the name of the MfScanKernels it defines (kernels/scan_sets.h)
 * Everything else is static, so the copies of the sets do not clash. */
#ifndef MF_SCAN_TABLE
#error "define MF_VW, MF_SCAN_TARGET and MF_SCAN_TABLE first"
#endif

#include <stdint.h>

#include "mapformer/mapformer.h"
#include "mapformer/simd.h"
#include "scan_sets.h"

#define SCAN_RUN 16             /* steps summed in float before dA, domega, dD (and
                                 * delta_bias's gradient) take them */
#define SCAN_AHEAD 16           /* steps ahead that the (b, t, e) rows are prefetched */
#define SCAN_TILE 16            /* steps formed ahead of the recurrence at once (forward and
                                 * the backward's recompute) */

/* The 16-float set compiles the Euler scans once more for Mamba's and MAMPa's d_state of 16
 * (16 real states, 8 complex ones; the bodies' `kc`), with the state loops unrolled: the same
 * bits. benchmarks/scan_bound.c at 128 256 256 16 (the navigation step's shape), one thread,
 * CPU time, this build and the general loops alternated 15 times, medians: the real backward
 * 114.3 -> 97.3 ms, the complex one 133.0 -> 119.2 ms, the forwards within 3%. The 8-float
 * clones run the general loops: unrolled, GCC's clones of them were slower (the same
 * benchmark with the kernel set `avx2`, 5 alternations on a loaded host: real backward 236.6 ->
 * 279.3 ms, complex 250.1 -> 339.4 ms) and scan.c took 7x as long to compile. */
#if MF_VW == 16
#define SCAN_UNROLL _Pragma("GCC unroll 16")
#define SCAN_FIXED_K 1
#else
#define SCAN_UNROLL
#define SCAN_FIXED_K 0
#endif


/* x - sin x for |x| < 1: x^3 (1/3! - x^2 / 5! + ... + x^8 / 11!) (the rest below 1.6e-10 x^3) */
MF_INLINE void x_minus_sin(vf *d, const vf *x) {
    const vf v = *x, w = v * v;
    vf p = VSPLAT(2.505210838544172e-8f); /* 1 / 11! */
    p = p * w - 2.755731922398589e-6f;    /* 1 / 9! */
    p = p * w + 1.984126984126984e-4f;    /* 1 / 7! */
    p = p * w - 8.333333333333333e-3f;    /* 1 / 5! */
    p = p * w + 1.666666666666667e-1f;    /* 1 / 3! */
    *d = (v * w) * p;
}

/* Zero-order hold's factors of the lanes of z = zr + i zi (zi = 0 for the real scan, cx = 0):
 * phi = (e^z - 1) / z into (*pr, *pi) and, with `deriv`, phi' = (e^z - phi) / z into (*qr,
 * *qi), from the step's e = e^zr, (cs, sn) = e^{i zi} and vs = 1 - cos zi (the decay's).
 *   e^z - 1     = (expm1(zr) - e vs) + i e sn           (no cancellation: each term exact to
 *   e^z - 1 - z = (d(zr) - e vs) + i (expm1(zr) sn - (zi - sin zi))    a few ulps)
 *   phi = (e^z - 1) conj(z) / |z|^2,
 *   phi' = phi - (e^z - 1 - z) conj(z)^2 / |z|^4        for |z| < 1 (phi - phi_2),
 *        = (e^z - phi) conj(z) / |z|^2                  for |z| >= 1,
 *   and phi = 1 for |z|^2 < 2^-100 (within 2^-51; z = 0: no 0 / 0), phi' = 1 / 2 + z / 3 for
 *   |z|^2 < 2^-24 (within |z|^2 / 8; 1 / |z|^4 stays finite above).
 * Bound (Re z <= 0): see the header comment. */
MF_INLINE void zoh_factors(const vf *zr_, const vf *zi_, const vf *e_, const vf *m1_,
                           const vf *sn_, const vf *cs_, const vf *vs_, int cx, int deriv,
                           vf *pr, vf *pi, vf *qr, vf *qi) {
    const vf zr = *zr_, e = *e_, m1 = *m1_;
    vf d2 = VZERO;
    if (deriv) vexpm1_minus_x(&d2, &zr);
    if (cx) {
        const vf zi = *zi_, sn = *sn_, cs = *cs_, vs = *vs_;
        const vf n1r = m1 - e * vs, n1i = e * sn;
        const vf m2 = zr * zr + zi * zi;
        const vf inv = 1.0f / m2; /* inf at z = 0: the NaN lanes are selected away */
        const vf p_r = (n1r * zr + n1i * zi) * inv, p_i = (n1i * zr - n1r * zi) * inv;
        const vi zero = m2 < VSPLAT(0x1p-100f);
        *pr = VSELECT(zero, VSPLAT(1.0f), p_r);
        *pi = VAND(~zero, p_i);
        if (!deriv) return;
        const vi tiny = m2 < VSPLAT(0x1p-24f);
        vf s3;
        x_minus_sin(&s3, &zi);
        const vf n2r = d2 - e * vs, n2i = m1 * sn - s3;
        const vf wr = zr * zr - zi * zi, wi = -(2.0f * zr * zi); /* conj(z)^2 */
        const vf i2 = inv * inv;
        const vf sr = p_r - (n2r * wr - n2i * wi) * i2, si = p_i - (n2i * wr + n2r * wi) * i2;
        const vf ur = e * cs - p_r, ui = e * sn - p_i;
        const vf lr = (ur * zr + ui * zi) * inv, li = (ui * zr - ur * zi) * inv;
        const vi small = m2 < VSPLAT(1.0f);
        *qr = VSELECT(tiny, 0.5f + zr * (1.0f / 3.0f), VSELECT(small, sr, lr));
        *qi = VSELECT(tiny, zi * (1.0f / 3.0f), VSELECT(small, si, li));
    } else { /* the complex arithmetic at zi = 0, sn = 0, cs = 1, vs = 0: the same bits */
        const vf m2 = zr * zr;
        const vf inv = 1.0f / m2;
        const vf p_r = (m1 * zr) * inv;
        *pr = VSELECT(m2 < VSPLAT(0x1p-100f), VSPLAT(1.0f), p_r);
        if (!deriv) return;
        const vi tiny = m2 < VSPLAT(0x1p-24f);
        const vf sr = p_r - (d2 * m2) * (inv * inv);
        const vf lr = ((e - p_r) * zr) * inv;
        *qr = VSELECT(tiny, 0.5f + zr * (1.0f / 3.0f), VSELECT(m2 < VSPLAT(1.0f), sr, lr));
    }
}

/* The lane sums of a group's vectors of one state each (the backward's dB, dC: sums over the
 * group's channels), always by the 8-lane tree: neighbouring pairs of lanes, then pairs of
 * pairs, then the two quads. At 16 floats the tree runs on each half of the lanes (channels
 * 0-7, 8-15) and the halves are added to dst one after the other, as the two 8-float groups
 * of those channels are: every kernel set gives the same bits. */
#if MF_VW == 16
/* s[i] = the sums of v[8i .. 8i+7]: lanes 0-7 over channel lanes 0-7, lanes 8-15 over 8-15 */
MF_INLINE void half_sums(vf *s, const vf *v) {
    vf w[8], x[4];
    for (int j = 0; j < 8; j++)
        w[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8,
                                       24, 10, 26, 12, 28, 14, 30) +
               __builtin_shufflevector(v[2 * j], v[2 * j + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9,
                                       25, 11, 27, 13, 29, 15, 31);
    for (int j = 0; j < 4; j++)
        x[j] = __builtin_shufflevector(w[2 * j], w[2 * j + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9,
                                       24, 25, 12, 13, 28, 29) +
               __builtin_shufflevector(w[2 * j], w[2 * j + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10,
                                       11, 26, 27, 14, 15, 30, 31);
    for (int j = 0; j < 2; j++)
        s[j] = __builtin_shufflevector(x[2 * j], x[2 * j + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9,
                                       10, 11, 24, 25, 26, 27) +
               __builtin_shufflevector(x[2 * j], x[2 * j + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12,
                                       13, 14, 15, 28, 29, 30, 31);
}

/* dst[j] += (the sum of v[j]'s lanes) for j < m: lanes 0-7 first, then lanes 8-15 when the
 * group has more than 8 channels (n > 8); v has room for m rounded up to 16 (the tail is
 * zeroed here) */
MF_INLINE void lanesum_add(float *dst, vf *v, int64_t m, int64_t n) {
    typedef float vh __attribute__((vector_size(32), __may_alias__, aligned(4)));
    const int64_t mp = (m + 15) / 16 * 16;
    for (int64_t j = m; j < mp; j++) v[j] = VZERO;
    for (int64_t j0 = 0; j0 < mp; j0 += 16) {
        vf s[2];
        half_sums(s, v + j0);
        for (int i = 0; i < 2 && j0 + 8 * i < m; i++) {
            float *d = dst + j0 + 8 * i;
            const vh lo = __builtin_shufflevector(s[i], s[i], 0, 1, 2, 3, 4, 5, 6, 7);
            const vh hi = __builtin_shufflevector(s[i], s[i], 8, 9, 10, 11, 12, 13, 14, 15);
            if (j0 + 8 * i + 8 <= m) {
                *(vh *)d = *(vh *)d + lo;
                if (n > 8) *(vh *)d = *(vh *)d + hi;
            } else {
                for (int64_t j = 0; j < m - j0 - 8 * i; j++) {
                    d[j] += lo[j];
                    if (n > 8) d[j] += hi[j];
                }
            }
        }
    }
}
#else
/* *s = the lane sums of v[0 .. MF_VW-1] (lane j: the sum of v[j]'s lanes) */
MF_INLINE void lane_sums(vf *s, const vf *v) {
#if MF_VW == 8
    vf w[4], x[2];
    for (int j = 0; j < 4; j++)
        w[j] = __builtin_shufflevector(v[2 * j], v[2 * j + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               __builtin_shufflevector(v[2 * j], v[2 * j + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int j = 0; j < 2; j++)
        x[j] = __builtin_shufflevector(w[2 * j], w[2 * j + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(w[2 * j], w[2 * j + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    *s = __builtin_shufflevector(x[0], x[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(x[0], x[1], 4, 5, 6, 7, 12, 13, 14, 15);
#else
    const vf w0 = __builtin_shufflevector(v[0], v[1], 0, 4, 2, 6) +
                  __builtin_shufflevector(v[0], v[1], 1, 5, 3, 7);
    const vf w1 = __builtin_shufflevector(v[2], v[3], 0, 4, 2, 6) +
                  __builtin_shufflevector(v[2], v[3], 1, 5, 3, 7);
    *s = __builtin_shufflevector(w0, w1, 0, 1, 4, 5) + __builtin_shufflevector(w0, w1, 2, 3, 6, 7);
#endif
}

/* dst[j] += (the sum of v[j]'s lanes) for j < m, MF_VW states at a time (v has room for m
 * rounded up to MF_VW; the tail is zeroed here); n (the group's channels) unused */
MF_INLINE void lanesum_add(float *dst, vf *v, int64_t m, int64_t n) {
    (void)n;
    const int64_t mp = (m + MF_VW - 1) / MF_VW * MF_VW;
    for (int64_t j = m; j < mp; j++) v[j] = VZERO;
    for (int64_t j0 = 0; j0 < mp; j0 += MF_VW) {
        vf sum;
        lane_sums(&sum, v + j0);
        if (j0 + MF_VW <= m) {
            VSTOREU(dst + j0, VLOADU(dst + j0) + sum);
        } else {
            for (int64_t j = j0; j < m; j++) dst[j] += sum[j - j0];
        }
    }
}
#endif

/* the group's floats (w of them) of step t in n arrays (stride E: a new page every few
 * steps, which the hardware prefetchers do not follow) into the cache ahead of their use:
 * the first and the last float, as a row of a NumPy array (16-byte aligned) straddles two
 * cache lines every other group (prefetching the first line only, the loads of those groups
 * waited on the second at every step: measured, 1.6x the backward's time) */
MF_INLINE void prefetch_rows(const float *const *rows, int n, int64_t t, int64_t E,
                             int64_t w) {
    for (int i = 0; i < n; i++) {
        if (rows[i] == NULL) continue;
        __builtin_prefetch(rows[i] + t * E);
        __builtin_prefetch(rows[i] + t * E + w - 1);
    }
}

/* One group: batch row b, the n <= MF_VW channels e0 .. e0 + n - 1 as the lanes of every
 * vector, the states one vector each (h[j] holds state float j of the n channels). */
typedef struct {
    vf A[SCAN_MAXS], W[SCAN_MAXS / 2]; /* A[e, k], omega[e, k] by lane (zero lanes beyond n) */
    vf A2[SCAN_MAXS];                  /* A[e, k] log2(e): the decay is 2^(delta A2) */
    vf D;
    vf bias;                         /* delta_bias[e] by lane (zero without it) */
    const float *x, *delta, *dangle; /* at (b, 0, e0), stride E; dangle NULL: the step's */
    const float *Bm, *Cm;            /* at (b, 0), stride S */
    int64_t b, e0, n, T, E, K, S, L, NC;
    int softplus, biased, shared;    /* delta_softplus, delta_bias given, no delta_angle */
    int64_t stride;                  /* the backward's scratch vectors per step */
} Group;

static void group_init(Group *g, const MfScanParams *p, int cx, int64_t b, int64_t e0,
                       int64_t n) {
    const int64_t T = p->T, E = p->E, K = p->K, S = cx ? 2 * K : K, o = b * T * E + e0;
    for (int64_t k = 0; k < K; k++) {
        g->A[k] = VZERO;
        if (cx) g->W[k] = VZERO;
        for (int64_t l = 0; l < n; l++) {
            g->A[k][l] = p->A[(e0 + l) * K + k];
            if (cx) g->W[k][l] = p->omega[(e0 + l) * K + k];
        }
        g->A2[k] = g->A[k] * MF_LOG2E;
    }
    vload_n(&g->D, p->D + e0, n);
    g->bias = VZERO;
    if (p->delta_bias) vload_n(&g->bias, p->delta_bias + e0, n);
    g->biased = p->delta_bias != NULL, g->softplus = p->delta_softplus;
    g->shared = cx && p->delta_angle == NULL;
    g->x = p->x + o, g->delta = p->delta + o;
    g->dangle = cx && !g->shared ? p->delta_angle + o : NULL;
    g->stride = scan_step_vectors(S, p->bbar);
    g->Bm = p->Bm + b * T * S, g->Cm = p->Cm + b * T * S;
    g->b = b, g->e0 = e0, g->n = n, g->T = T, g->E = E, g->K = K, g->S = S;
    g->L = p->chunk < T ? p->chunk : T; /* clamped before any arithmetic (scan.c does too) */
    g->NC = (T + g->L - 1) / g->L;
}

/* the step of t (lanes: channels): delta's row, + delta_bias, through softplus with
 * delta_softplus (simd.h's vsoftplus: softplus_forward's bits), and with `slope` its
 * derivative there (1 without softplus); the rotation's step into *ang (complex scan: the
 * step itself without a delta_angle; the real scan: zero) */
MF_INLINE void load_step(const Group *g, int64_t t, vf *dt, vf *ang, vf *slope, int cx) {
    vload_n(dt, g->delta + t * g->E, g->n);
    if (g->biased) *dt = *dt + g->bias;
    if (g->softplus) {
        vsoftplus(dt, slope);
    } else if (slope) {
        *slope = VSPLAT(1.0f);
    }
    if (!cx)
        *ang = VZERO;
    else if (g->shared)
        *ang = *dt;
    else
        vload_n(ang, g->dangle + t * g->E, g->n);
}

/* state k's decay of the step: e^{delta A} (2^(delta A log2 e): one vexp2), times
 * (cos, sin) of delta_angle omega for the complex scan (*ai untouched for the real one) */
MF_INLINE void decay(const Group *g, const vf *dt, const vf *ang, int64_t k, vf *ar, vf *ai,
                     int cx) {
    vf e = *dt * g->A2[k];
    vexp2_fused(&e);
    if (cx) {
        vf th = *ang * g->W[k], sn, cs;
        vsincos_fused(&th, &sn, &cs);
        *ar = e * cs;
        *ai = e * sn;
    } else {
        *ar = e;
    }
}

/* Euler's step with its decays formed on the fly (the forward: nothing kept), the same
 * arithmetic as step_keep */
MF_INLINE void step_euler(const Group *g, int64_t K, vf *h, const vf *r, const vf *dt,
                          const vf *ang, const float *Bt, const float *Ct, int cx, vf *out) {
    vf acc = VZERO;
SCAN_UNROLL
    for (int64_t k = 0; k < K; k++) {
        vf ar, ai;
        decay(g, dt, ang, k, &ar, &ai, cx);
        if (cx) {
            const vf h0 = h[2 * k], h1 = h[2 * k + 1];
            const vf nr = VFMAF(ar, h0, VFMAF(-ai, h1, *r * Bt[2 * k]));
            const vf ni = VFMAF(ar, h1, VFMAF(ai, h0, *r * Bt[2 * k + 1]));
            h[2 * k] = nr, h[2 * k + 1] = ni;
            acc = VFMAF(VSPLAT(Ct[2 * k + 1]), ni, VFMAF(VSPLAT(Ct[2 * k]), nr, acc));
        } else {
            const vf nr = VFMAF(ar, h[k], *r * Bt[k]);
            h[k] = nr;
            acc = VFMAF(VSPLAT(Ct[k]), nr, acc);
        }
    }
    *out = acc;
}

/* the backward's recompute of an Euler step: keeps h_{t-1} (hb) and the step's decays (ab),
 * and moves h on to h_t when `advance` (not at a chunk's last step); the same arithmetic as
 * step_euler */
MF_INLINE void step_keep(const Group *g, int64_t K, vf *h, vf *hb, vf *ab, const vf *r,
                         const vf *dt, const vf *ang, const float *Bt, int cx, int advance) {
SCAN_UNROLL
    for (int64_t k = 0; k < K; k++) {
        vf ar, ai;
        decay(g, dt, ang, k, &ar, &ai, cx);
        if (cx) {
            const vf h0 = h[2 * k], h1 = h[2 * k + 1];
            hb[2 * k] = h0, hb[2 * k + 1] = h1;
            ab[2 * k] = ar, ab[2 * k + 1] = ai;
            if (advance) {
                h[2 * k] = VFMAF(ar, h0, VFMAF(-ai, h1, *r * Bt[2 * k]));
                h[2 * k + 1] = VFMAF(ar, h1, VFMAF(ai, h0, *r * Bt[2 * k + 1]));
            }
        } else {
            hb[k] = h[k];
            ab[k] = ar;
            if (advance) h[k] = VFMAF(ar, h[k], *r * Bt[k]);
        }
    }
}

/* state k's decay a = e^z and ZOH factors phi(z) (and phi'(z) with `deriv`) of the step,
 * z = delta A + i delta_angle omega: e^{delta A} and expm1(delta A) from one reduction
 * (vexp_expm1), the rotation as decay()'s */
MF_INLINE void zoh_parts(const Group *g, const vf *dt, const vf *ang, int64_t k, int cx,
                         int deriv, vf *ar, vf *ai, vf *pr, vf *pi, vf *qr, vf *qi) {
    const vf zr = *dt * g->A[k];
    vf e, m1;
    vexp_expm1(&zr, &e, &m1);
    if (cx) {
        const vf zi = *ang * g->W[k];
        vf sn, cs, vs;
        vsincos_vers(&zi, &sn, &cs, &vs);
        *ar = e * cs;
        *ai = e * sn;
        zoh_factors(&zr, &zi, &e, &m1, &sn, &cs, &vs, 1, deriv, pr, pi, qr, qi);
    } else {
        *ar = e;
        zoh_factors(&zr, NULL, &e, &m1, NULL, NULL, NULL, 0, deriv, pr, pi, qr, qi);
    }
}

/* ZOH's step h_t = a h_{t-1} + r phi(z) beta_t in place, the readout sum_k <c_t, h_t> into
 * *out (lanes: channels) unless out is NULL; with `kb` (the backward's recompute) it keeps
 * h_{t-1}, a, phi, phi' of each state in kb[0 .. 4S) and moves h on only when `advance` */
MF_INLINE void step_zoh(const Group *g, int64_t K, vf *h, const vf *r, const vf *dt,
                        const vf *ang, const float *Bt, const float *Ct, int cx, vf *out,
                        vf *kb, int advance) {
    const int64_t S = cx ? 2 * K : K;
    vf acc = VZERO;
    for (int64_t k = 0; k < K; k++) {
        vf ar, ai = VZERO, pr, pi = VZERO, qr = VZERO, qi = VZERO;
        zoh_parts(g, dt, ang, k, cx, kb != NULL, &ar, &ai, &pr, &pi, &qr, &qi);
        const vf sr = *r * pr, si = *r * pi;
        if (cx) {
            const vf h0 = h[2 * k], h1 = h[2 * k + 1];
            const float br = Bt[2 * k], bi = Bt[2 * k + 1];
            if (kb) {
                kb[2 * k] = h0, kb[2 * k + 1] = h1;
                kb[S + 2 * k] = ar, kb[S + 2 * k + 1] = ai;
                kb[2 * S + 2 * k] = pr, kb[2 * S + 2 * k + 1] = pi;
                kb[3 * S + 2 * k] = qr, kb[3 * S + 2 * k + 1] = qi;
            }
            if (!advance) continue;
            const vf nr = ar * h0 - ai * h1 + (sr * br - si * bi);
            const vf ni = ar * h1 + ai * h0 + (sr * bi + si * br);
            h[2 * k] = nr, h[2 * k + 1] = ni;
            if (out) acc += Ct[2 * k] * nr + Ct[2 * k + 1] * ni;
        } else {
            if (kb) kb[k] = h[k], kb[S + k] = ar, kb[2 * S + k] = pr, kb[3 * S + k] = qr;
            if (!advance) continue;
            const vf nr = ar * h[k] + sr * Bt[k];
            h[k] = nr;
            if (out) acc += Ct[k] * nr;
        }
    }
    if (out) *out = acc;
}

/* states (B, NC, E, S) at chunk ci of the group's channels from / into the state vectors */
static void put_state(const Group *g, float *states, int64_t ci, const vf *h) {
    float *dst = states + ((g->b * g->NC + ci) * g->E + g->e0) * g->S;
    for (int64_t l = 0; l < g->n; l++)
        for (int64_t j = 0; j < g->S; j++) dst[l * g->S + j] = h[j][l];
}
static void get_state(const Group *g, const float *states, int64_t ci, vf *h) {
    const float *src = states + ((g->b * g->NC + ci) * g->E + g->e0) * g->S;
    for (int64_t j = 0; j < g->S; j++) {
        h[j] = VZERO;
        for (int64_t l = 0; l < g->n; l++) h[j][l] = src[l * g->S + j];
    }
}

/* whether the group runs the bodies compiled for a constant state count (SCAN_FIXED_K: the
 * Euler scans at 16 real states or 8 complex ones) */
MF_INLINE int fixed_states(const Group *g, int cx, int zoh) {
    return SCAN_FIXED_K && !zoh && g->K == (cx ? 8 : 16);
}

/* kc: the states per channel as a constant (fixed_states), or 0 for g->K */
MF_INLINE void forward_body(const Group *g, float *y, float *states, int cx, int zoh,
                            int64_t kc) {
    vf h[SCAN_MAXS];
    const int64_t E = g->E, K = kc ? kc : g->K, S = cx ? 2 * K : K;
    const float *const rows[4] = {g->x, g->delta, g->dangle, y};
    vf dts[SCAN_TILE], angs[SCAN_TILE];
    for (int64_t j = 0; j < S; j++) h[j] = VZERO;
    for (int64_t t = 0; t < g->T; t++) {
        if (t % SCAN_TILE == 0) /* the tile's steps first: independent of each other and of
                                 * h, they pipeline instead of delaying each step's decays
                                 * by softplus's latency (measured: 1.5x the forward's time) */
            for (int64_t u = t; u < t + SCAN_TILE && u < g->T; u++)
                load_step(g, u, &dts[u - t], &angs[u - t], NULL, cx);
        if (t + SCAN_AHEAD < g->T)
            prefetch_rows(rows, 4, t + SCAN_AHEAD, E, g->n);
        vf xv;
        const vf dt = dts[t % SCAN_TILE], ang = angs[t % SCAN_TILE];
        vload_n(&xv, g->x + t * E, g->n);
        const vf r = dt * xv;
        vf yv;
        if (zoh) {
            step_zoh(g, K, h, &r, &dt, &ang, g->Bm + t * S, g->Cm + t * S, cx, &yv, NULL, 1);
        } else {
            step_euler(g, K, h, &r, &dt, &ang, g->Bm + t * S, g->Cm + t * S, cx, &yv);
        }
        yv += g->D * xv;
        vstore_n(y + t * E, &yv, g->n);
        if ((t + 1) % g->L == 0 || t == g->T - 1) put_state(g, states, t / g->L, h);
    }
}

MF_SCAN_TARGET
static void forward_group(const MfScanParams *p, int cx, int64_t b, int64_t e0, int64_t n) {
    Group g;
    group_init(&g, p, cx, b, e0, n);
    float *y = p->y + b * p->T * p->E + e0;
    const int zoh = p->bbar == MF_BBAR_ZOH;
    const int fixed = fixed_states(&g, cx, zoh);
    if (cx)
        zoh ? forward_body(&g, y, p->states, 1, 1, 0)
            : fixed ? forward_body(&g, y, p->states, 1, 0, 8)
                    : forward_body(&g, y, p->states, 1, 0, 0);
    else
        zoh ? forward_body(&g, y, p->states, 0, 1, 0)
            : fixed ? forward_body(&g, y, p->states, 0, 0, 16)
                    : forward_body(&g, y, p->states, 0, 0, 0);
}


/* d[l] += (double)v[l] for the MF_VW lanes, VDL at a time (d aligned to a vd, as the sums
 * below are): the additions of a loop over the lanes, in vector code (lane by lane they took
 * about 4% of the real scan's backward at the navigation step's shape) */
typedef double vd_alias __attribute__((vector_size(4 * MF_VW), __may_alias__));
MF_INLINE void add_to_doubles(double *d, const vf *v) {
    for (int h = 0; h < MF_VW; h += VDL) {
        const vfh half = *(const vfhu *)((const float *)v + h);
        *(vd_alias *)(d + h) += __builtin_convertvector(half, vd);
    }
}

/* the float runs of dA, domega, dD and delta_bias's gradient into their double sums (the
 * double additions of a loop over the lanes) */
MF_INLINE void flush_runs(int64_t K, vf *rA, vf *rW, vf *rD, vf *rS, double *sA,
                          double *sW, double *sD, double *sS, int cx) {
    for (int64_t k = 0; k < K; k++) {
        add_to_doubles(sA + k * MF_VW, &rA[k]);
        if (cx) add_to_doubles(sW + k * MF_VW, &rW[k]);
        rA[k] = VZERO;
        if (cx) rW[k] = VZERO; /* rW holds SCAN_MAXS / 2 vectors: K of them for cx only */
    }
    add_to_doubles(sD, rD);
    add_to_doubles(sS, rS);
    *rD = VZERO, *rS = VZERO;
}

/* kc as forward_body's */
MF_INLINE void backward_body(const Group *g, const float *dy, const float *states,
                             const GroupGrad *o, int cx, int zoh, int64_t kc) {
    vf h[SCAN_MAXS], gc[SCAN_MAXS], dbv[SCAN_MAXS], dcv[SCAN_MAXS];
    vf rA[SCAN_MAXS], rW[SCAN_MAXS / 2], rD = VZERO, rS = VZERO;
    double sA[SCAN_MAXS * MF_VW] __attribute__((aligned(64)));
    double sW[SCAN_MAXS / 2 * MF_VW] __attribute__((aligned(64)));
    double sD[MF_VW] __attribute__((aligned(64))), sS[MF_VW] __attribute__((aligned(64)));
    const int64_t E = g->E, K = kc ? kc : g->K, S = cx ? 2 * K : K, T = g->T, L = g->L;
    for (int64_t j = 0; j < S; j++) gc[j] = VZERO;
    for (int64_t k = 0; k < K; k++) {
        rA[k] = VZERO;
        if (cx) rW[k] = VZERO;
        for (int l = 0; l < MF_VW; l++) {
            sA[k * MF_VW + l] = 0.0;
            if (cx) sW[k * MF_VW + l] = 0.0;
        }
    }
    for (int l = 0; l < MF_VW; l++) sD[l] = 0.0, sS[l] = 0.0;
    int run = 0;
    vf *buf = (vf *)o->buf;
    const int64_t W = g->stride, steps = W - SCAN_STEP_VECTORS; /* a step's scratch; the
                                                                * step's vectors from here */
    const float *const fw_rows[3] = {g->x, g->delta, g->dangle};
    const float *const bw_rows[5] = {dy, o->dx, o->ddelta, o->ddangle, g->x};
    for (int64_t ci = g->NC - 1; ci >= 0; ci--) {
        const int64_t t0 = ci * L, t1 = t0 + L < T ? t0 + L : T;
        if (ci > 0) {
            get_state(g, states, ci - 1, h);
        } else {
            for (int64_t j = 0; j < S; j++) h[j] = VZERO;
        }
        for (int64_t t = t0; t < t1; t++) { /* recompute, keeping h_{t-1}, a_t, the step */
            if ((t - t0) % SCAN_TILE == 0) /* the tile's steps first, as the forward's */
                for (int64_t u = t; u < t + SCAN_TILE && u < t1; u++) {
                    vf *sv = buf + (u - t0) * W + steps;
                    load_step(g, u, &sv[0], &sv[2], &sv[1], cx);
                }
            vf *hb = buf + (t - t0) * W, *ab = hb + S;
            if (t + SCAN_AHEAD < t1)
                prefetch_rows(fw_rows, 3, t + SCAN_AHEAD, E, g->n);
            const vf dt = hb[steps], ang = hb[steps + 2];
            vf xv;
            vload_n(&xv, g->x + t * E, g->n);
            const vf r = dt * xv;
            if (zoh)
                step_zoh(g, K, h, &r, &dt, &ang, g->Bm + t * S, NULL, cx, NULL, hb, t + 1 < t1);
            else
                step_keep(g, K, h, hb, ab, &r, &dt, &ang, g->Bm + t * S, cx, t + 1 < t1);
        }
        for (int64_t t = t1 - 1; t >= t0; t--) { /* the reverse sweep */
            const vf *hp = buf + (t - t0) * W, *ab = hp + S, *ph = ab + S, *dph = ph + S,
                     *sv = hp + steps;
            if (t - SCAN_AHEAD >= 0) {
                prefetch_rows(bw_rows, 5, t - SCAN_AHEAD, E, g->n);
                if (t - SCAN_AHEAD < t0) prefetch_rows(fw_rows, 3, t - SCAN_AHEAD, E, g->n);
            }
            vf xv, gy;
            const vf dt = sv[0], slope = sv[1], ang = sv[2];
            vload_n(&xv, g->x + t * E, g->n);
            vload_n(&gy, dy + t * E, g->n);
            const vf r = dt * xv;
            const float *Bt = g->Bm + t * S, *Ct = g->Cm + t * S;
            vf dr = VZERO, dzA = VZERO, dzW = VZERO;
SCAN_UNROLL
            for (int64_t k = 0; k < K; k++) {
                vf pr = VSPLAT(1.0f), pi = VZERO, qr = VZERO, qi = VZERO;
                if (zoh) {
                    pr = ph[cx ? 2 * k : k], qr = dph[cx ? 2 * k : k];
                    if (cx) pi = ph[2 * k + 1], qi = dph[2 * k + 1];
                }
                if (cx) {
                    const vf ar = ab[2 * k], ai = ab[2 * k + 1];
                    const vf hp0 = hp[2 * k], hp1 = hp[2 * k + 1];
                    const float br = Bt[2 * k], bi = Bt[2 * k + 1];
                    const vf g_r = VFMAF(gy, VSPLAT(Ct[2 * k]), gc[2 * k]);
                    const vf g_i = VFMAF(gy, VSPLAT(Ct[2 * k + 1]), gc[2 * k + 1]);
                    const vf ur = VFMAF(ar, hp0, -(ai * hp1)), ui = VFMAF(ar, hp1, ai * hp0);
                    const vf gsr = VFMAF(g_r, VSPLAT(br), g_i * bi);
                    const vf gsi = VFMAF(g_i, VSPLAT(br), -(g_r * bi));
                    vf dzr = VFMAF(g_r, ur, g_i * ui), dzi = VFMAF(g_i, ur, -(g_r * ui));
                    if (zoh) {
                        const vf sr = r * pr, si = r * pi, tr = r * gsr, ti = r * gsi;
                        dzr += qr * tr + qi * ti;
                        dzi += qr * ti - qi * tr;
                        dr += gsr * pr + gsi * pi;
                        dbv[2 * k] = sr * g_r + si * g_i;
                        dbv[2 * k + 1] = sr * g_i - si * g_r;
                        dcv[2 * k] = gy * (ur + (sr * br - si * bi));
                        dcv[2 * k + 1] = gy * (ui + (sr * bi + si * br));
                    } else {
                        dr += gsr;
                        dbv[2 * k] = r * g_r;
                        dbv[2 * k + 1] = r * g_i;
                        dcv[2 * k] = gy * VFMAF(r, VSPLAT(br), ur);
                        dcv[2 * k + 1] = gy * VFMAF(r, VSPLAT(bi), ui);
                    }
                    dzA = VFMAF(dzr, g->A[k], dzA);
                    dzW = VFMAF(dzi, g->W[k], dzW);
                    rA[k] = VFMAF(dzr, dt, rA[k]);
                    rW[k] = VFMAF(dzi, ang, rW[k]);
                    gc[2 * k] = VFMAF(ar, g_r, ai * g_i); /* conj(a_t) g_t, for step t - 1 */
                    gc[2 * k + 1] = VFMAF(ar, g_i, -(ai * g_r));
                } else {
                    const vf a = ab[k], u = a * hp[k];
                    const float bk = Bt[k];
                    const vf gk = VFMAF(gy, VSPLAT(Ct[k]), gc[k]), gs = gk * bk;
                    vf dz = gk * u;
                    if (zoh) {
                        dz += qr * (r * gs);
                        dr += gs * pr;
                        const vf sr = r * pr;
                        dbv[k] = sr * gk;
                        dcv[k] = gy * (u + sr * bk);
                    } else {
                        dr += gs;
                        dbv[k] = r * gk;
                        dcv[k] = gy * VFMAF(r, VSPLAT(bk), u);
                    }
                    dzA = VFMAF(dz, g->A[k], dzA);
                    rA[k] = VFMAF(dz, dt, rA[k]);
                    gc[k] = a * gk;
                }
            }
            lanesum_add(o->dBm + t * S, dbv, S, g->n);
            lanesum_add(o->dCm + t * S, dcv, S, g->n);
            const vf dxv = dt * dr + g->D * gy;
            vf ddv = xv * dr + dzA; /* the gradient of the step */
            if (g->shared)
                ddv = ddv + dzW;   /* the rotation took the step too */
            else if (cx)
                vstore_n(o->ddangle + t * E, &dzW, g->n);
            if (g->softplus) ddv = ddv * slope; /* softplus_backward's bits */
            vstore_n(o->dx + t * E, &dxv, g->n);
            vstore_n(o->ddelta + t * E, &ddv, g->n);
            rD += gy * xv;
            if (g->biased) rS += ddv;
            if (++run == SCAN_RUN) {
                flush_runs(K, rA, rW, &rD, &rS, sA, sW, sD, sS, cx);
                run = 0;
            }
        }
    }
    flush_runs(K, rA, rW, &rD, &rS, sA, sW, sD, sS, cx);
    for (int64_t l = 0; l < g->n; l++) {
        for (int64_t k = 0; k < K; k++) {
            o->dA[l * K + k] = sA[k * MF_VW + l];
            if (cx) o->dW[l * K + k] = sW[k * MF_VW + l];
        }
        o->dD[l] = sD[l];
        o->dS[l] = sS[l]; /* 0 without delta_bias: the reduce reads every partial */
    }
}

MF_SCAN_TARGET
static void backward_group(const MfScanParams *p, int cx, int64_t b, int64_t e0, int64_t n,
                           const GroupGrad *o) {
    Group g;
    group_init(&g, p, cx, b, e0, n);
    const float *dy = p->dy + b * p->T * p->E + e0;
    const int zoh = p->bbar == MF_BBAR_ZOH;
    const int fixed = fixed_states(&g, cx, zoh);
    if (cx)
        zoh ? backward_body(&g, dy, p->states_in, o, 1, 1, 0)
            : fixed ? backward_body(&g, dy, p->states_in, o, 1, 0, 8)
                    : backward_body(&g, dy, p->states_in, o, 1, 0, 0);
    else
        zoh ? backward_body(&g, dy, p->states_in, o, 0, 1, 0)
            : fixed ? backward_body(&g, dy, p->states_in, o, 0, 0, 16)
                    : backward_body(&g, dy, p->states_in, o, 0, 0, 0);
}

const MfScanKernels MF_SCAN_TABLE = {MF_VW, forward_group, backward_group};
