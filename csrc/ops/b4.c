/* MapEM-b4 positions (MapFormer section 4, appendix 10.4.1): 4x4 blocks, one skew generator.
 *
 * so(4) splits into left and right quaternion multiplications: every skew S is
 * S = L(u) + R(v) with u, v pure quaternions (S p = u p + p v), and L(u), R(v) commute, so
 *   exp(Phi S) p* = qexp(Phi u) p* qexp(Phi v),  qexp(w) = (cos |w|, sin|w| / |w| w).
 * The generator is stored as its coordinates (u, v) (H, NB, 6), an orthogonal change of basis
 * of so(4) (|S|_F^2 = 4 (|u|^2 + |v|^2)). Phi_t = sum_{s<=t} delta[s] in double; cos and sin
 * of Phi |u| are taken in double (accurate at any length); sin n / n and
 * k(n) = (cos n - sin n / n) / n^2 by series below n = 0.05.
 *
 * Backward, per block, with g = dp[t], a = qexp(Phi u), c = qexp(Phi v), s = p*, p = a s c:
 *   dPhi_t = <g, u p + p v>, ddelta[t] = sum_{s >= t} dPhi_s (reverse scan, Phi recovered by
 *            subtracting delta[t] from the double total);
 *   dp*   += conj(a) g conj(c);
 *   du    += Phi J(Phi u)^T (g conj(s c)),  dv += Phi J(Phi v)^T (conj(a s) g),
 *   J(w)^T h = sinc n (h_vec - h_0 w) + k(n) w (w . h_vec), the Jacobian of qexp.
 * Nothing is saved by the forward. One work item per (h, k) block walks every (b, t): dgen and
 * dstart of a block are written by one thread in a fixed order (same bits for any thread
 * count).
 */
#include <math.h>

#include "mapformer/mapformer.h"
#include "mapformer/quat.h"

#define B4_MIN_PARALLEL 8192 /* B*T*H*NB below this runs on one thread */

static int b4_check(const MfB4Params *p) {
    if (p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 4 * p->NB || p->F != 6)
        return MF_EINVAL;
    return MF_OK;
}

int b4_forward(const MfB4Params *p) {
    if (!p || !p->p || !p->delta || !p->gen || !p->start) return MF_EINVAL;
    const int ok = b4_check(p);
    if (ok != MF_OK) return ok;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB, D = p->D;
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * NB >= B4_MIN_PARALLEL)
    for (int64_t item = 0; item < H * NB; item++) {
        const int64_t h = item / NB, k = item % NB;
        double u[3], v[3];
        for (int i = 0; i < 3; i++) {
            u[i] = p->gen[item * 6 + i];
            v[i] = p->gen[item * 6 + 3 + i];
        }
        const float *st = p->start + h * D + 4 * k;
        const Quat s = {st[0], st[1], st[2], st[3]};
        for (int64_t bb = 0; bb < B; bb++) {
            double phi = 0.0, sc, kk;
            for (int64_t t = 0; t < T; t++) {
                const int64_t row = (bb * T + t) * H + h;
                phi += (double)p->delta[row * NB + k];
                const Quat a = qexp(phi * u[0], phi * u[1], phi * u[2], &sc, &kk);
                const Quat c = qexp(phi * v[0], phi * v[1], phi * v[2], &sc, &kk);
                const Quat r = qmul(qmul(a, s), c);
                float *out = p->p + row * D + 4 * k;
                out[0] = (float)r.w;
                out[1] = (float)r.x;
                out[2] = (float)r.y;
                out[3] = (float)r.z;
            }
        }
    }
    return MF_OK;
}

/* dw += phi * J(phi u)^T h (sc, kk of n = |phi u|) */
static inline void qexp_vjp(double *dw, double phi, const double *u, double sc, double kk,
                            Quat h) {
    const double wx = phi * u[0], wy = phi * u[1], wz = phi * u[2];
    const double dot = wx * h.x + wy * h.y + wz * h.z;
    dw[0] += phi * (sc * (h.x - h.w * wx) + kk * wx * dot);
    dw[1] += phi * (sc * (h.y - h.w * wy) + kk * wy * dot);
    dw[2] += phi * (sc * (h.z - h.w * wz) + kk * wz * dot);
}

int b4_backward(const MfB4Params *p) {
    if (!p || !p->dp || !p->delta || !p->gen || !p->start || !p->ddelta || !p->dgen ||
        !p->dstart)
        return MF_EINVAL;
    const int ok = b4_check(p);
    if (ok != MF_OK) return ok;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB, D = p->D;
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * NB >= B4_MIN_PARALLEL)
    for (int64_t item = 0; item < H * NB; item++) {
        const int64_t h = item / NB, k = item % NB;
        double u[3], v[3], du[3] = {0, 0, 0}, dv[3] = {0, 0, 0};
        for (int i = 0; i < 3; i++) {
            u[i] = p->gen[item * 6 + i];
            v[i] = p->gen[item * 6 + 3 + i];
        }
        const Quat pu = {0.0, u[0], u[1], u[2]}, pv = {0.0, v[0], v[1], v[2]};
        const float *st = p->start + h * D + 4 * k;
        const Quat s = {st[0], st[1], st[2], st[3]};
        Quat ds = {0, 0, 0, 0};
        for (int64_t bb = 0; bb < B; bb++) {
            double phi = 0.0;
            for (int64_t t = 0; t < T; t++)
                phi += (double)p->delta[((bb * T + t) * H + h) * NB + k];
            double rsum = 0.0;
            for (int64_t t = T - 1; t >= 0; t--) {
                const int64_t row = (bb * T + t) * H + h;
                double sca, ka, scc, kc;
                const Quat a = qexp(phi * u[0], phi * u[1], phi * u[2], &sca, &ka);
                const Quat c = qexp(phi * v[0], phi * v[1], phi * v[2], &scc, &kc);
                const Quat as = qmul(a, s), sc = qmul(s, c), r = qmul(as, c);
                const float *gp = p->dp + row * D + 4 * k;
                const Quat g = {gp[0], gp[1], gp[2], gp[3]};
                const Quat sp = qmul(pu, r), ps = qmul(r, pv);
                rsum += g.w * (sp.w + ps.w) + g.x * (sp.x + ps.x) + g.y * (sp.y + ps.y) +
                        g.z * (sp.z + ps.z);
                p->ddelta[row * NB + k] = (float)rsum;
                const Quat dsi = qmul(qmul(qconj(a), g), qconj(c));
                ds.w += dsi.w;
                ds.x += dsi.x;
                ds.y += dsi.y;
                ds.z += dsi.z;
                qexp_vjp(du, phi, u, sca, ka, qmul(g, qconj(sc)));
                qexp_vjp(dv, phi, v, scc, kc, qmul(qconj(as), g));
                phi -= (double)p->delta[row * NB + k];
            }
        }
        float *dg = p->dgen + item * 6;
        for (int i = 0; i < 3; i++) {
            dg[i] += (float)du[i];
            dg[3 + i] += (float)dv[i];
        }
        float *dst = p->dstart + h * D + 4 * k;
        dst[0] += (float)ds.w;
        dst[1] += (float)ds.x;
        dst[2] += (float)ds.y;
        dst[3] += (float)ds.z;
    }
    return MF_OK;
}
