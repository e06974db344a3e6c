/* MapEM-SLN positions (MapFormer appendix 10.4.1): 2x2 blocks of the special linear group.
 *
 * Per head h and block k the generator is A = A_bar - (tr A_bar / 2) I = [[a, b], [c, -a]]
 * (trace-free; the paper's printed A_bar - Tr(A_bar) is not), and with Phi_t = sum_{s<=t}
 * delta[s] (in double), q = -det A = a^2 + b c:
 *   exp(Phi A) = C I + S A,  C = f(x), S = Phi g(x),  x = Phi^2 q,
 *   f(x) = cosh(sqrt x), g(x) = sinh(sqrt x) / sqrt x   (x > 0, hyperbolic)
 *   f(x) = cos(sqrt -x), g(x) = sin(sqrt -x) / sqrt -x  (x < 0, elliptic: a rotation in a
 *                                                        skewed basis)
 * with the Taylor series of f, g and g' for |x| < 1e-3 (A^2 = q I gives the closed form).
 * p[t] = C start + S A start, start = p* of the block.
 *
 * Growth: in the hyperbolic case |p| grows like e^{|Phi| sqrt q} without bound (float32
 * overflows near 88). The op computes everything in double and caps the argument: when
 * Phi^2 q > clamp^2 it uses |Phi| sqrt q = clamp, i.e. C = cosh(clamp), S = sign(Phi)
 * sinh(clamp) / sqrt q, whose gradient in Phi is 0 (and in q is -S / (2q)). With the default
 * clamp 10, |p| <= (cosh 10 + sinh 10 |A| / sqrt q) |p*| at any length. Elliptic blocks are bounded
 * and never clamped.
 *
 * Derivatives: dC/dPhi = q S, dS/dPhi = C; dC/dq = Phi S / 2, dS/dq = Phi^3 g'(x)
 * (= (Phi C - S) / (2 q) away from 0); dq/dA = A^T (q = -det A at trace-free A).
 * Backward, per block: with G = dp[t], dC = <G, p*>, dS = <G, A p*>:
 *   dPhi_t = dC dC/dPhi + dS dS/dPhi, ddelta[t] = sum_{s >= t} dPhi_s (reverse scan)
 *   dA += S G p*^T + (dC dC/dq + dS dS/dq) A^T,  dp* += C G + S A^T G
 * and dgen = dA - (tr dA / 2) I. Phi_t is recovered in the reverse scan by subtracting
 * delta[t] from the double total (exact to double rounding).
 *
 * Parallel layout: one work item per (h, k) block walks every (b, t), so dgen and dstart of a
 * block are written by one thread in a fixed order: the same bits for any thread count.
 */
#include <math.h>

#include "mapformer/mapformer.h"
#include "mapformer/sln_coef.h"

#define SLN_MIN_PARALLEL 16384 /* B*T*H*NB below this runs on one thread */

static int sln_check(const MfSlnParams *p) {
    if (p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 2 * p->NB || p->F != 4 ||
        !(p->clamp > 0.0f) || !isfinite(p->clamp))
        return MF_EINVAL;
    return MF_OK;
}

int sln_forward(const MfSlnParams *p) {
    if (!p || !p->p || !p->delta || !p->gen || !p->start) return MF_EINVAL;
    const int ok = sln_check(p);
    if (ok != MF_OK) return ok;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB, D = p->D;
    const double clamp = p->clamp;
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * NB >= SLN_MIN_PARALLEL)
    for (int64_t item = 0; item < H * NB; item++) {
        const int64_t h = item / NB, k = item % NB;
        const float *g = p->gen + item * 4;
        const double a = 0.5 * ((double)g[0] - (double)g[3]), b = g[1], c = g[2];
        const double q = a * a + b * c;
        const double u = p->start[h * D + 2 * k], v = p->start[h * D + 2 * k + 1];
        const double au = a * u + b * v, av = c * u - a * v;
        for (int64_t bb = 0; bb < B; bb++) {
            double phi = 0.0;
            for (int64_t t = 0; t < T; t++) {
                const int64_t row = (bb * T + t) * H + h;
                phi += (double)p->delta[row * NB + k];
                const SlnCoef r = sln_coef(phi, q, clamp);
                p->p[row * D + 2 * k] = (float)(r.C * u + r.S * au);
                p->p[row * D + 2 * k + 1] = (float)(r.C * v + r.S * av);
            }
        }
    }
    return MF_OK;
}

int sln_backward(const MfSlnParams *p) {
    if (!p || !p->dp || !p->delta || !p->gen || !p->start || !p->ddelta || !p->dgen ||
        !p->dstart)
        return MF_EINVAL;
    const int ok = sln_check(p);
    if (ok != MF_OK) return ok;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB, D = p->D;
    const double clamp = p->clamp;
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * NB >= SLN_MIN_PARALLEL)
    for (int64_t item = 0; item < H * NB; item++) {
        const int64_t h = item / NB, k = item % NB;
        const float *g = p->gen + item * 4;
        const double a = 0.5 * ((double)g[0] - (double)g[3]), b = g[1], c = g[2];
        const double q = a * a + b * c;
        const double u = p->start[h * D + 2 * k], v = p->start[h * D + 2 * k + 1];
        const double au = a * u + b * v, av = c * u - a * v;
        double dA00 = 0, dA01 = 0, dA10 = 0, dA11 = 0, dq = 0, du = 0, dv = 0;
        for (int64_t bb = 0; bb < B; bb++) {
            double phi = 0.0;
            for (int64_t t = 0; t < T; t++)
                phi += (double)p->delta[((bb * T + t) * H + h) * NB + k];
            double rsum = 0.0;
            for (int64_t t = T - 1; t >= 0; t--) {
                const int64_t row = (bb * T + t) * H + h;
                const SlnCoef r = sln_coef(phi, q, clamp);
                const double g0 = p->dp[row * D + 2 * k], g1 = p->dp[row * D + 2 * k + 1];
                const double dC = g0 * u + g1 * v, dS = g0 * au + g1 * av;
                rsum += dC * r.dC_dphi + dS * r.dS_dphi;
                p->ddelta[row * NB + k] = (float)rsum;
                dq += dC * r.dC_dq + dS * r.dS_dq;
                const double s0 = r.S * g0, s1 = r.S * g1; /* dL/d(A p*) */
                dA00 += s0 * u;
                dA01 += s0 * v;
                dA10 += s1 * u;
                dA11 += s1 * v;
                du += r.C * g0 + a * s0 + c * s1; /* C G + A^T (S G) */
                dv += r.C * g1 + b * s0 - a * s1;
                phi -= (double)p->delta[row * NB + k];
            }
        }
        dA00 += dq * a; /* dq/dA = A^T = [[a, c], [b, -a]] */
        dA01 += dq * c;
        dA10 += dq * b;
        dA11 -= dq * a;
        const double half_tr = 0.5 * (dA00 + dA11);
        float *dg = p->dgen + item * 4;
        dg[0] += (float)(dA00 - half_tr);
        dg[1] += (float)dA01;
        dg[2] += (float)dA10;
        dg[3] += (float)(dA11 - half_tr);
        p->dstart[h * D + 2 * k] += (float)du;
        p->dstart[h * D + 2 * k + 1] += (float)dv;
    }
    return MF_OK;
}
