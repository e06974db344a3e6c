/* Selective scans: Mamba's (real diagonal A) and MAMPa's (2x2 rotation-scaling blocks, i.e.
 * one complex state per pair of state floats), forward and backward.
 *
 * Per batch row b, channel e and state k (K states; S = K floats of state, or 2K for the
 * complex scan as (re, im) pairs), with z_t = delta_t A[e,k] + i delta_angle_t omega[e,k]
 * (the imaginary part only for the complex scan):
 *   h_t = a_t h_{t-1} + r_t phi_t beta_t,   a_t = e^{z_t},   r_t = delta_t x_t,
 *   y_t = sum_k <c_t, h_t> + D x_t,
 * beta_t, c_t the pair (B_t[2k], B_t[2k+1]) as a complex number (or B_t[k] real), <c, h> =
 * Re(conj(c) h), phi = 1 (Euler, Mamba's B_bar = delta B) or (e^z - 1) / z (zero-order hold).
 * The rotation e^{i delta_angle omega} of each step is formed from that step's small angle
 * alone (cosf, sinf of delta_angle * omega): no angle accumulates in float.
 *
 * Forward: sequential in t; it writes y and the state at each chunk's last step only
 * (states (B, NC, E, S), NC = ceil(T / chunk)).
 * Backward, per channel, chunks in reverse: the chunk's forward is recomputed from the
 * previous chunk's end state (zero for the first), keeping h_{t-1} of each step in the
 * thread's scratch (chunk * S floats), then the reverse sweep with the adjoint g_t:
 *   g_t   = gy_t c_t + conj(a_{t+1}) g_{t+1}
 *   u_t   = a_t h_{t-1}       (from the stored h_{t-1}: the decay is never divided out)
 *   dz_t  = g_t conj(u_t) + conj(phi'(z_t)) r_t g_t conj(beta_t)
 *   dr_t  = sum_k Re(conj(g_t conj(beta_t)) phi_t),  dbeta_t += conj(r_t phi_t) g_t,
 *   dc_t += gy_t h_t,  dx_t = delta_t dr_t + D gy_t,
 *   ddelta_t = x_t dr_t + sum_k Re(dz) A,  ddelta_angle_t = sum_k Im(dz) omega,
 *   dA += sum_t Re(dz) delta_t,  domega += sum_t Im(dz) delta_angle_t,  dD += sum_t gy x.
 * Memory: O(B E S (T / chunk)) saved + O(threads * chunk * S) scratch, never O(B T E S).
 * Per step and channel the K states run as whole vectors of simd.h (the rows padded with
 * zero states): the decays through vexp, the rotations through a branch-free polynomial
 * sincos the compiler vectorises, the readout and the backward's sums over k in vector
 * accumulators.
 *
 * Parallel layout: a work item is one batch row b and a block of SCAN_EB channels (a fixed
 * size, so the bits do not depend on the thread count); within it each channel walks t with
 * its K states in vectors. dB and
 * dC are sums over channels: each item sums its block's channels into its own (T, S) slice
 * of scratch, and the blocks are summed in a fixed order; dA, domega, dD are summed in double
 * per (b, e) and then over b in a fixed order.
 */
#include <math.h>
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

#define MF_VW MF_CLONES_VW
#include "mapformer/simd.h"

#define SCAN_MAXS 256           /* state floats per channel (the CUDA kernel's MAX_DSTATE) */
#define SCAN_EB 16              /* channels per work item */
#define SCAN_MIN_PARALLEL 65536 /* B*T*E*S below this runs on one thread */

/* K rounded up to whole vectors: the kernels' local arrays are padded with states that stay
 * zero (A = 0, omega = 0, B = C = 0) so that every loop runs on whole, aligned vectors */
#define KP(K) (((K) + MF_VW - 1) / MF_VW * MF_VW)
#define ALIGNED __attribute__((aligned(64)))

/* one step's coefficients for the states of a channel (planar, padded) */
typedef struct {
    float ar[SCAN_MAXS] ALIGNED, ai[SCAN_MAXS] ALIGNED; /* a = e^z */
    float pr[SCAN_MAXS] ALIGNED, pi[SCAN_MAXS] ALIGNED; /* phi(z) */
    float qr[SCAN_MAXS] ALIGNED, qi[SCAN_MAXS] ALIGNED; /* phi'(z) */
} Coefs;

/* phi(z) = (e^z - 1) / z and phi'(z) = (e^z - phi) / z in double, from float z; series
 * below |z| = 1e-2, e^z - 1 by expm1 and 2 sin^2(zi / 2) (no cancellation) above */
static void zoh_phi(double zr, double zi, float *pr, float *pi, float *qr, float *qi) {
    const double m2 = zr * zr + zi * zi;
    double Pr, Pi, Qr, Qi;
    if (m2 < 1e-4) {
        static const double pc[5] = {1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120};
        static const double qc[5] = {1.0 / 2, 1.0 / 3, 1.0 / 8, 1.0 / 30, 1.0 / 144};
        Pr = pc[4], Pi = 0.0, Qr = qc[4], Qi = 0.0;
        for (int i = 3; i >= 0; i--) { /* Horner in complex: v = v z + c */
            double t = Pr * zr - Pi * zi;
            Pi = Pr * zi + Pi * zr;
            Pr = t + pc[i];
            t = Qr * zr - Qi * zi;
            Qi = Qr * zi + Qi * zr;
            Qr = t + qc[i];
        }
    } else {
        const double er = exp(zr), c = cos(zi), s = sin(zi), h = sin(0.5 * zi);
        const double nr = expm1(zr) * c - 2.0 * h * h, ni = er * s; /* e^z - 1 */
        Pr = (nr * zr + ni * zi) / m2;
        Pi = (ni * zr - nr * zi) / m2;
        const double wr = er * c - Pr, wi = er * s - Pi; /* e^z - phi */
        Qr = (wr * zr + wi * zi) / m2;
        Qi = (wi * zr - wr * zi) / m2;
    }
    *pr = (float)Pr, *pi = (float)Pi, *qr = (float)Qr, *qi = (float)Qi;
}

/* sin and cos of one float angle, branch-free so that a loop of them vectorises: Cody-Waite
 * reduction by pi/2 (three-part constant, exact products for |x| < 2^15 pi/2; the per-step
 * angles are far smaller), Cephes' sinf/cosf polynomials on [-pi/4, pi/4] (about 1 ulp),
 * the quadrant by selects */
MF_INLINE void sincos_poly(float x, float *s_out, float *c_out) {
    const float n = (x * 0.636619772367581343f + 12582912.0f) - 12582912.0f; /* round */
    const float r = ((x - n * 1.5703125f) - n * 4.837512969970703125e-4f) -
                    n * 7.54978995489188216e-8f;
    const float z = r * r;
    const float s = r + r * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z *
                                                          -1.9515295891e-4f));
    const float c = 1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z *
                                                (-1.388731625493765e-3f + z *
                                                 2.443315711809948e-5f));
    const int q = (int)n;
    const float sw_s = (q & 1) ? c : s, sw_c = (q & 1) ? s : c;
    *s_out = (q & 2) ? -sw_s : sw_s;
    *c_out = ((q + 1) & 2) ? -sw_c : sw_c;
}

/* the step's coefficients: a = e^(dt A) (and its rotation by da W), phi and phi' for ZOH
 * (Euler's phi = 1, phi' = 0 are set once per channel by chan_init) */
MF_INLINE void coefs(Coefs *restrict c, float dt, float da, const float *restrict A,
                     const float *restrict W, int64_t K, int cx, int zoh) {
    const int64_t Kp = KP(K);
    for (int64_t k = 0; k < Kp; k += MF_VW) {
        vf v = VLOAD(A + k) * dt;
        vexp(&v);
        VSTORE(c->ar + k, v);
    }
    if (cx) {
        for (int64_t k = 0; k < Kp; k++) {
            float sn, cs;
            sincos_poly(da * W[k], &sn, &cs);
            c->ai[k] = c->ar[k] * sn;
            c->ar[k] = c->ar[k] * cs;
        }
    }
    if (zoh) {
        for (int64_t k = 0; k < K; k++)
            zoh_phi((double)(dt * A[k]), cx ? (double)(da * W[k]) : 0.0, &c->pr[k], &c->pi[k],
                    &c->qr[k], &c->qi[k]);
    }
}

/* The arguments of one channel's walk: strides and pointers at (b, t = 0, e). */
typedef struct {
    const float *x, *delta, *dangle; /* stride E */
    const float *Bm, *Cm;            /* stride S */
    const float *A, *W;              /* (K,) at e; W NULL for the real scan */
    float D;
    int64_t T, E, K, S, chunk;
    int zoh;
} Chan;

/* a channel's padded rows: A, W (zero beyond K), and its Euler coefficients */
typedef struct {
    float A[SCAN_MAXS] ALIGNED, W[SCAN_MAXS] ALIGNED;
    float br[SCAN_MAXS] ALIGNED, bi[SCAN_MAXS] ALIGNED; /* B_t, planar */
    float cr[SCAN_MAXS] ALIGNED, ci[SCAN_MAXS] ALIGNED; /* C_t, planar */
    Coefs c;
} Work;

MF_INLINE void chan_init(Work *w, const Chan *ch) {
    const int64_t K = ch->K, Kp = KP(K);
    for (int64_t k = 0; k < Kp; k++) {
        w->A[k] = k < K ? ch->A[k] : 0.0f;
        w->W[k] = k < K && ch->W != NULL ? ch->W[k] : 0.0f;
        w->br[k] = w->bi[k] = w->cr[k] = w->ci[k] = 0.0f;
        w->c.ai[k] = 0.0f;
        w->c.pr[k] = 1.0f, w->c.pi[k] = 0.0f, w->c.qr[k] = 0.0f, w->c.qi[k] = 0.0f;
    }
}

/* B_t, C_t of step t into the padded planar rows */
MF_INLINE void load_bc(Work *w, const float *Bt, const float *Ct, int64_t K, int cx) {
    if (cx) {
        for (int64_t k = 0; k < K; k++) {
            w->br[k] = Bt[2 * k], w->bi[k] = Bt[2 * k + 1];
            w->cr[k] = Ct[2 * k], w->ci[k] = Ct[2 * k + 1];
        }
    } else {
        for (int64_t k = 0; k < K; k++) w->br[k] = Bt[k], w->cr[k] = Ct[k];
    }
}

/* h_t from h_{t-1} (planar hr, hi, padded) and the readout <c_t, h_t> */
MF_INLINE float step(const Work *w, float r, float *restrict hr, float *restrict hi,
                     int64_t Kp, int cx) {
    const Coefs *c = &w->c;
    vf y = VZERO;
    const vf rv = VSPLAT(r);
    for (int64_t k = 0; k < Kp; k += MF_VW) {
        const vf ar = VLOAD(c->ar + k), sr = rv * VLOAD(c->pr + k), br = VLOAD(w->br + k);
        const vf h0 = VLOAD(hr + k);
        if (cx) {
            const vf ai = VLOAD(c->ai + k), si = rv * VLOAD(c->pi + k), bi = VLOAD(w->bi + k);
            const vf h1 = VLOAD(hi + k);
            const vf nr = ar * h0 - ai * h1 + (sr * br - si * bi);
            const vf ni = ar * h1 + ai * h0 + (sr * bi + si * br);
            VSTORE(hr + k, nr);
            VSTORE(hi + k, ni);
            y += VLOAD(w->cr + k) * nr + VLOAD(w->ci + k) * ni;
        } else {
            const vf nr = ar * h0 + sr * br;
            VSTORE(hr + k, nr);
            y += VLOAD(w->cr + k) * nr;
        }
    }
    return vhsum(&y);
}

static void store_state(float *dst, const float *hr, const float *hi, int64_t K, int cx) {
    for (int64_t k = 0; k < K; k++) {
        if (cx) {
            dst[2 * k] = hr[k];
            dst[2 * k + 1] = hi[k];
        } else {
            dst[k] = hr[k];
        }
    }
}

static void load_state(float *hr, float *hi, const float *src, int64_t K, int cx) {
    for (int64_t k = 0; k < KP(K); k++) {
        hr[k] = k >= K ? 0.0f : cx ? src[2 * k] : src[k];
        hi[k] = k < K && cx ? src[2 * k + 1] : 0.0f;
    }
}

/* forward of one channel: y (stride E), states (stride E * S per chunk) */
MF_CLONES
static void forward_channel(const Chan *ch, float *y, float *states) {
    float hr[SCAN_MAXS] ALIGNED, hi[SCAN_MAXS] ALIGNED;
    Work w;
    const int64_t E = ch->E, K = ch->K, S = ch->S, Kp = KP(K);
    const int cx = ch->W != NULL;
    chan_init(&w, ch);
    for (int64_t k = 0; k < Kp; k++) hr[k] = hi[k] = 0.0f;
    for (int64_t t = 0; t < ch->T; t++) {
        const float dt = ch->delta[t * E], xv = ch->x[t * E];
        coefs(&w.c, dt, cx ? ch->dangle[t * E] : dt, w.A, w.W, K, cx, ch->zoh);
        load_bc(&w, ch->Bm + t * S, ch->Cm + t * S, K, cx);
        y[t * E] = step(&w, dt * xv, hr, hi, Kp, cx) + ch->D * xv;
        if ((t + 1) % ch->chunk == 0 || t == ch->T - 1)
            store_state(states + (t / ch->chunk) * E * S, hr, hi, K, cx);
    }
}

/* the per-channel outputs of the backward */
typedef struct {
    float *dx, *ddelta, *ddangle; /* stride E; ddangle NULL for the real scan */
    float *dBm, *dCm;             /* (T, S) of this item, accumulated over its channels */
    double *dA, *dW, *dD;         /* (K,), (K,), (1,) of this (b, e) */
    float *buf;                   /* scratch: chunk * 2 KP(K) floats of h_{t-1} */
} ChanGrad;

MF_CLONES
static void backward_channel(const Chan *ch, const float *dy, const float *states,
                             const ChanGrad *o) {
    float hr[SCAN_MAXS] ALIGNED, hi[SCAN_MAXS] ALIGNED, gr[SCAN_MAXS] ALIGNED,
        gi[SCAN_MAXS] ALIGNED;
    float db_r[SCAN_MAXS] ALIGNED, db_i[SCAN_MAXS] ALIGNED, dc_r[SCAN_MAXS] ALIGNED,
        dc_i[SCAN_MAXS] ALIGNED, dz_r[SCAN_MAXS] ALIGNED, dz_i[SCAN_MAXS] ALIGNED;
    double dA[SCAN_MAXS], dW[SCAN_MAXS], dD = 0.0;
    Work w;
    const int64_t E = ch->E, K = ch->K, S = ch->S, T = ch->T, L = ch->chunk, Kp = KP(K);
    const int cx = ch->W != NULL;
    chan_init(&w, ch);
    for (int64_t k = 0; k < Kp; k++) gr[k] = gi[k] = 0.0f, dA[k] = dW[k] = 0.0;
    const int64_t NC = (T + L - 1) / L;
    for (int64_t ci = NC - 1; ci >= 0; ci--) {
        const int64_t t0 = ci * L, t1 = t0 + L < T ? t0 + L : T;
        if (ci > 0)
            load_state(hr, hi, states + (ci - 1) * E * S, K, cx);
        else
            for (int64_t k = 0; k < Kp; k++) hr[k] = hi[k] = 0.0f;
        for (int64_t t = t0; t < t1; t++) { /* recompute, keeping h_{t-1} */
            float *hb = o->buf + (t - t0) * 2 * Kp;
            for (int64_t k = 0; k < Kp; k++) hb[k] = hr[k], hb[Kp + k] = hi[k];
            if (t + 1 < t1) {
                const float dt = ch->delta[t * E];
                coefs(&w.c, dt, cx ? ch->dangle[t * E] : dt, w.A, w.W, K, cx, ch->zoh);
                load_bc(&w, ch->Bm + t * S, ch->Cm + t * S, K, cx);
                step(&w, dt * ch->x[t * E], hr, hi, Kp, cx);
            }
        }
        for (int64_t t = t1 - 1; t >= t0; t--) { /* the reverse sweep */
            const float dt = ch->delta[t * E], xv = ch->x[t * E], gy = dy[t * E];
            const float da = cx ? ch->dangle[t * E] : dt, r = dt * xv;
            const float *hpr = o->buf + (t - t0) * 2 * Kp, *hpi = hpr + Kp;
            coefs(&w.c, dt, da, w.A, w.W, K, cx, ch->zoh);
            load_bc(&w, ch->Bm + t * S, ch->Cm + t * S, K, cx);
            const Coefs *c = &w.c;
            const vf rv = VSPLAT(r), gyv = VSPLAT(gy);
            vf dr = VZERO, dzA = VZERO, dzW = VZERO;
            for (int64_t k = 0; k < Kp; k += MF_VW) {
                const vf ar = VLOAD(c->ar + k), ai = VLOAD(c->ai + k);
                const vf pr = VLOAD(c->pr + k), pi = VLOAD(c->pi + k);
                const vf br = VLOAD(w.br + k), bi = VLOAD(w.bi + k);
                const vf hp0 = VLOAD(hpr + k), hp1 = VLOAD(hpi + k);
                const vf g_r = VLOAD(gr + k) + gyv * VLOAD(w.cr + k);
                const vf g_i = VLOAD(gi + k) + gyv * VLOAD(w.ci + k);
                const vf ur = ar * hp0 - ai * hp1, ui = ar * hp1 + ai * hp0;
                const vf sr = rv * pr, si = rv * pi;
                const vf htr = ur + (sr * br - si * bi), hti = ui + (sr * bi + si * br);
                const vf gsr = g_r * br + g_i * bi, gsi = g_i * br - g_r * bi;
                const vf tr = rv * gsr, ti = rv * gsi;
                const vf qr = VLOAD(c->qr + k), qi = VLOAD(c->qi + k);
                const vf dzr = g_r * ur + g_i * ui + (qr * tr + qi * ti);
                const vf dzi = g_i * ur - g_r * ui + (qr * ti - qi * tr);
                dr += gsr * pr + gsi * pi;
                VSTORE(db_r + k, sr * g_r + si * g_i);
                VSTORE(db_i + k, sr * g_i - si * g_r);
                VSTORE(dc_r + k, gyv * htr);
                VSTORE(dc_i + k, gyv * hti);
                VSTORE(dz_r + k, dzr);
                VSTORE(dz_i + k, dzi);
                dzA += dzr * VLOAD(w.A + k);
                dzW += dzi * VLOAD(w.W + k);
                VSTORE(gr + k, ar * g_r + ai * g_i); /* conj(a_t) g_t, for step t - 1 */
                VSTORE(gi + k, ar * g_i - ai * g_r);
            }
            float *dBt = o->dBm + t * S, *dCt = o->dCm + t * S;
            if (cx) {
                for (int64_t k = 0; k < K; k++) {
                    dBt[2 * k] += db_r[k], dBt[2 * k + 1] += db_i[k];
                    dCt[2 * k] += dc_r[k], dCt[2 * k + 1] += dc_i[k];
                    dA[k] += (double)dz_r[k] * dt;
                    dW[k] += (double)dz_i[k] * da;
                }
            } else {
                for (int64_t k = 0; k < K; k++) {
                    dBt[k] += db_r[k], dCt[k] += dc_r[k];
                    dA[k] += (double)dz_r[k] * dt;
                }
            }
            const float drs = vhsum(&dr);
            o->dx[t * E] = dt * drs + ch->D * gy;
            o->ddelta[t * E] = xv * drs + vhsum(&dzA);
            if (o->ddangle != NULL) o->ddangle[t * E] = vhsum(&dzW);
            dD += (double)gy * xv;
        }
    }
    for (int64_t k = 0; k < K; k++) {
        o->dA[k] = dA[k];
        if (cx) o->dW[k] = dW[k];
    }
    *o->dD = dD;
}

static int bad_params(const MfScanParams *p, int cx) {
    const int64_t S = cx ? 2 * p->K : p->K;
    return p->B < 1 || p->T < 1 || p->E < 1 || p->K < 1 || S > SCAN_MAXS || p->chunk < 1 ||
           (p->bbar != MF_BBAR_EULER && p->bbar != MF_BBAR_ZOH);
}

static Chan channel(const MfScanParams *p, int cx, int64_t b, int64_t e) {
    const int64_t T = p->T, E = p->E, K = p->K, S = cx ? 2 * K : K, o = b * T * E + e;
    return (Chan){.x = p->x + o, .delta = p->delta + o,
                  .dangle = cx ? p->delta_angle + o : NULL,
                  .Bm = p->Bm + b * T * S, .Cm = p->Cm + b * T * S, .A = p->A + e * K,
                  .W = cx ? p->omega + e * K : NULL, .D = p->D[e], .T = T, .E = E, .K = K,
                  .S = S, .chunk = p->chunk, .zoh = p->bbar == MF_BBAR_ZOH};
}

static int scan_forward(const MfScanParams *p, int cx) {
    if (bad_params(p, cx)) return MF_EINVAL;
    const int64_t T = p->T, E = p->E, S = cx ? 2 * p->K : p->K;
    const int64_t NC = (T + p->chunk - 1) / p->chunk, nblk = (E + SCAN_EB - 1) / SCAN_EB;
#pragma omp parallel for schedule(dynamic, 1) if (p->B * T * E * S >= SCAN_MIN_PARALLEL)
    for (int64_t it = 0; it < p->B * nblk; it++) {
        const int64_t b = it / nblk, e0 = (it % nblk) * SCAN_EB;
        const int64_t e1 = e0 + SCAN_EB < E ? e0 + SCAN_EB : E;
        for (int64_t e = e0; e < e1; e++) {
            const Chan ch = channel(p, cx, b, e);
            forward_channel(&ch, p->y + b * T * E + e, p->states + (b * NC * E + e) * S);
        }
    }
    return MF_OK;
}

/* scratch of the backward: per thread chunk * 2K floats (h_{t-1}); dB, dC partials
 * (B, nblk, T, S) each; dA, domega partials (B, E, K) doubles each; dD partials (B, E)
 * doubles */
static int64_t per_thread(const MfScanParams *p) {
    return mf_scratch_size(p->chunk * 2 * KP(p->K));
}

static int64_t shared_floats(const MfScanParams *p, int cx) {
    const int64_t S = cx ? 2 * p->K : p->K, nblk = (p->E + SCAN_EB - 1) / SCAN_EB;
    return 2 * mf_scratch_size(p->B * nblk * p->T * S) +
           2 * mf_scratch_size(2 * p->B * p->E * p->K) +
           mf_scratch_size(2 * p->B * p->E);
}

static int64_t scan_backward_scratch(const MfScanParams *p, int cx) {
    if (bad_params(p, cx)) return 0;
    return shared_floats(p, cx) + mf_max_threads() * per_thread(p);
}

static int scan_backward(const MfScanParams *p, int cx) {
    if (bad_params(p, cx)) return MF_EINVAL;
    const int64_t B = p->B, T = p->T, E = p->E, K = p->K, S = cx ? 2 * K : K;
    const int64_t NC = (T + p->chunk - 1) / p->chunk, nblk = (E + SCAN_EB - 1) / SCAN_EB;
    const int64_t shared = shared_floats(p, cx);
    const int threads = mf_scratch_threads(p->scratch_floats - shared, per_thread(p));
    if (p->scratch_floats < shared || threads < 1) return MF_EINVAL;
    float *at = p->scratch;
    float *pB = mf_scratch_take(&at, B * nblk * T * S);
    float *pC = mf_scratch_take(&at, B * nblk * T * S);
    double *pA = (double *)mf_scratch_take(&at, 2 * B * E * K);
    double *pW = (double *)mf_scratch_take(&at, 2 * B * E * K);
    double *pD = (double *)mf_scratch_take(&at, 2 * B * E);
    float *bufs = at;
#pragma omp parallel num_threads(threads) if (B * T * E * S >= SCAN_MIN_PARALLEL)
    {
        float *buf = bufs + mf_thread_id() * per_thread(p);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * nblk; it++) {
            const int64_t b = it / nblk, blk = it % nblk, e0 = blk * SCAN_EB;
            const int64_t e1 = e0 + SCAN_EB < E ? e0 + SCAN_EB : E;
            float *dBm = pB + it * T * S, *dCm = pC + it * T * S;
            for (int64_t i = 0; i < T * S; i++) dBm[i] = dCm[i] = 0.0f;
            for (int64_t e = e0; e < e1; e++) {
                const Chan ch = channel(p, cx, b, e);
                const int64_t o = b * T * E + e;
                const ChanGrad g = {.dx = p->dx + o, .ddelta = p->ddelta + o,
                                    .ddangle = cx ? p->ddelta_angle + o : NULL, .dBm = dBm,
                                    .dCm = dCm, .dA = pA + (b * E + e) * K,
                                    .dW = pW + (b * E + e) * K, .dD = pD + b * E + e,
                                    .buf = buf};
                backward_channel(&ch, p->dy + o, p->states_in + (b * NC * E + e) * S, &g);
            }
        }
        /* implicit barrier: every partial is written; sums in a fixed order */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < B * T * S; i++) {
            const int64_t b = i / (T * S), j = i % (T * S);
            float sb = 0.0f, sc = 0.0f;
            for (int64_t blk = 0; blk < nblk; blk++) {
                sb += pB[(b * nblk + blk) * T * S + j];
                sc += pC[(b * nblk + blk) * T * S + j];
            }
            p->dBm[i] = sb;
            p->dCm[i] = sc;
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < E * K; i++) {
            double sa = 0.0, sw = 0.0;
            for (int64_t b = 0; b < B; b++) {
                sa += pA[b * E * K + i];
                sw += pW[b * E * K + i];
            }
            p->dA[i] = (float)((double)p->dA[i] + sa);
            if (cx) p->domega[i] = (float)((double)p->domega[i] + sw);
        }
#pragma omp for schedule(static)
        for (int64_t e = 0; e < E; e++) {
            double s = 0.0;
            for (int64_t b = 0; b < B; b++) s += pD[b * E + e];
            p->dD[e] = (float)((double)p->dD[e] + s);
        }
    }
    return MF_OK;
}

int selective_scan_forward(const MfScanParams *p) { return scan_forward(p, 0); }
int complex_scan_forward(const MfScanParams *p) { return scan_forward(p, 1); }
int64_t selective_scan_backward_scratch_floats(const MfScanParams *p) {
    return scan_backward_scratch(p, 0);
}
int64_t complex_scan_backward_scratch_floats(const MfScanParams *p) {
    return scan_backward_scratch(p, 1);
}
int selective_scan_backward(const MfScanParams *p) { return scan_backward(p, 0); }
int complex_scan_backward(const MfScanParams *p) { return scan_backward(p, 1); }
