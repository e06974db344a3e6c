/* MapEM-NC positions (MapFormer eq. 20, appendix 10.4.2): non-commutative path integration on
 * 4x4 blocks, p_t = exp(S_t) exp(S_{t-1}) ... exp(S_1) p*, an ordered product.
 *
 * Each step generator is S_t = L(u_t) + R(v_t) (so(4) split into left and right quaternion
 * multiplications, which commute), so exp(S_t) q = a_t q c_t with a_t = qexp(u_t),
 * c_t = qexp(v_t), and the product of t steps is p_t = A_t p* C_t with the two prefix
 * products A_t = a_t A_{t-1}, C_t = C_{t-1} c_t (A_0 = C_0 = 1): 8 doubles of state per block
 * and two quaternion products per step instead of a 4x4 matrix product. A_t and C_t are
 * renormalised every step (exactly unit, so the product stays in SO(4)).
 * The caller supplies (u_t, v_t) per token and block: with K = 6 generators (a basis of so(4))
 * the paper's theta_t -> sum_i theta_t,i S_i composed with a linear map or an MLP of the token
 * is the same function class as a linear map or an MLP straight to (u_t, v_t).
 *
 * The product is associative, so a log-depth parallel scan over t exists (the paper says it
 * can only be computed sequentially); on a CPU with B * H * NB independent chains per call the
 * sequential loop over t is the cheaper one, and that is what this op runs: parallel over the
 * (h, k) blocks, sequential in t.
 *
 * Backward (g_t = dp_t), reverse in t, A_{t-1} = conj(a_t) A_t and C_{t-1} = C_t conj(c_t)
 * recovered from the end state (renormalised), nothing saved by the forward:
 *   lam_t = g_t conj(p* C_t) + conj(a_{t+1}) lam_{t+1}      (adjoint of A_t)
 *   mu_t  = conj(A_t p*) g_t + mu_{t+1} conj(c_{t+1})      (adjoint of C_t)
 *   da_t = lam_t conj(A_{t-1}),  dc_t = conj(C_{t-1}) mu_t,  dw_t = J(u_t)^T da_t, J(v_t)^T dc_t
 *   dp* += sum_t conj(A_t) g_t conj(C_t)
 * with J the Jacobian of qexp (series below |w| = 0.05: mapformer/quat.h).
 * One work item per (h, k) block: dstart written by one thread (same bits for any thread count).
 */
#include <math.h>

#include "mapformer/mapformer.h"
#include "mapformer/quat.h"

#define NC_MIN_PARALLEL 8192 /* B*T*H*NB below this runs on one thread */

/* out = J(w)^T h (3 floats) */
static inline void qexp_vjp(float *out, const float *w, double sc, double k, Quat h) {
    const double wx = w[0], wy = w[1], wz = w[2];
    const double dot = wx * h.x + wy * h.y + wz * h.z;
    out[0] = (float)(sc * (h.x - h.w * wx) + k * wx * dot);
    out[1] = (float)(sc * (h.y - h.w * wy) + k * wy * dot);
    out[2] = (float)(sc * (h.z - h.w * wz) + k * wz * dot);
}

static int nc_check(const MfNcParams *p) {
    if (p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 4 * p->NB || p->F != 6)
        return MF_EINVAL;
    return MF_OK;
}

static const Quat ONE = {1.0, 0.0, 0.0, 0.0};

int nc_forward(const MfNcParams *p) {
    if (!p || !p->p || !p->w || !p->start) return MF_EINVAL;
    const int ok = nc_check(p);
    if (ok != MF_OK) return ok;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB, D = p->D;
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * NB >= NC_MIN_PARALLEL)
    for (int64_t item = 0; item < H * NB; item++) {
        const int64_t h = item / NB, k = item % NB;
        const float *st = p->start + h * D + 4 * k;
        const Quat s = {st[0], st[1], st[2], st[3]};
        for (int64_t bb = 0; bb < B; bb++) {
            Quat A = ONE, C = ONE;
            for (int64_t t = 0; t < T; t++) {
                const int64_t row = (bb * T + t) * H + h;
                const float *w = p->w + (row * NB + k) * 6;
                double sc, kk;
                A = qnormalize(qmul(qexp(w[0], w[1], w[2], &sc, &kk), A));
                C = qnormalize(qmul(C, qexp(w[3], w[4], w[5], &sc, &kk)));
                const Quat r = qmul(qmul(A, s), C);
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

int nc_backward(const MfNcParams *p) {
    if (!p || !p->dp || !p->w || !p->start || !p->dw || !p->dstart) return MF_EINVAL;
    const int ok = nc_check(p);
    if (ok != MF_OK) return ok;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB, D = p->D;
#pragma omp parallel for schedule(dynamic, 1) if (B * T * H * NB >= NC_MIN_PARALLEL)
    for (int64_t item = 0; item < H * NB; item++) {
        const int64_t h = item / NB, k = item % NB;
        const float *st = p->start + h * D + 4 * k;
        const Quat s = {st[0], st[1], st[2], st[3]};
        Quat ds = {0, 0, 0, 0};
        for (int64_t bb = 0; bb < B; bb++) {
            Quat A = ONE, C = ONE;
            double sc, kk;
            for (int64_t t = 0; t < T; t++) {
                const float *w = p->w + (((bb * T + t) * H + h) * NB + k) * 6;
                A = qnormalize(qmul(qexp(w[0], w[1], w[2], &sc, &kk), A));
                C = qnormalize(qmul(C, qexp(w[3], w[4], w[5], &sc, &kk)));
            }
            Quat lam = {0, 0, 0, 0}, mu = {0, 0, 0, 0}, a_next = ONE, c_next = ONE;
            for (int64_t t = T - 1; t >= 0; t--) {
                const int64_t row = (bb * T + t) * H + h;
                const float *w = p->w + (row * NB + k) * 6;
                float *dw = p->dw + (row * NB + k) * 6;
                double sca, ka, scc, kc;
                const Quat a = qexp(w[0], w[1], w[2], &sca, &ka);
                const Quat c = qexp(w[3], w[4], w[5], &scc, &kc);
                const float *gp = p->dp + row * D + 4 * k;
                const Quat g = {gp[0], gp[1], gp[2], gp[3]};
                lam = qadd(qmul(g, qconj(qmul(s, C))), qmul(qconj(a_next), lam));
                mu = qadd(qmul(qconj(qmul(A, s)), g), qmul(mu, qconj(c_next)));
                ds = qadd(ds, qmul(qmul(qconj(A), g), qconj(C)));
                const Quat A_prev = qnormalize(qmul(qconj(a), A));
                const Quat C_prev = qnormalize(qmul(C, qconj(c)));
                qexp_vjp(dw, w, sca, ka, qmul(lam, qconj(A_prev)));
                qexp_vjp(dw + 3, w + 3, scc, kc, qmul(qconj(C_prev), mu));
                A = A_prev;
                C = C_prev;
                a_next = a;
                c_next = c;
            }
        }
        float *dst = p->dstart + h * D + 4 * k;
        dst[0] += (float)ds.w;
        dst[1] += (float)ds.x;
        dst[2] += (float)ds.y;
        dst[3] += (float)ds.z;
    }
    return MF_OK;
}
