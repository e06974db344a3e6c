/* MapEM-NC positions for any block size b and any number K of generators per block (MapFormer
 * eq. 20, appendix 10.4.2): per block of b coordinates, p_t = R_t p_{t-1}, p_0 = p*, with
 * R_t = exp(X_t), X_t = sum_i theta_t,i S_i (the generators S_i are given; MapEM-NC passes
 * skew-symmetric ones, S_i = A_i - A_i^T, so every R_t is a rotation). nc.c is the b = 4, K = 6
 * special case through unit quaternions; this op is the generic one.
 *
 * exp, in double: r(X) = T_12(X / 2^s)^(2^s), T_12 the degree-12 Taylor polynomial (Horner),
 * s the least integer >= 0 with ||X||_F / 2^s <= 1/2 (the Frobenius norm: submultiplicative
 * and the same for X and X^T, so r(X^T) = r(X)^T, which the backward uses). Truncation:
 * ||T_12(A) - exp(A)|| <= sum_{k > 12} ||A||^k / k! < 0.5^13 / 13! * 1.04 < 2.1e-14 for
 * ||A|| <= 1/2, and the s squarings multiply a relative error by at most about 2^s, so
 * ||r(X) - exp(X)|| / ||exp(X)|| stays below 2^s * 2.1e-14 plus double rounding (about
 * (13 + s) b 2^-53): under float32's unit roundoff 2^-24 = 6e-8 for ||X||_F < 2^20. The chain
 * p_t is carried in double and rounded to float32 once per output.
 *
 * Backward (g_t = dp_t): lam_t = g_t + R_{t+1}^T lam_{t+1} (lam_T = g_T), dR_t = lam_t p_{t-1}^T,
 * dX_t = L_r(X_t)^*(dR_t) = L_r(X_t^T, dR_t), the Frechet derivative of the same polynomial r
 * at X_t^T (for a power series with real coefficients, <L(X, E), G> = <E, L(X^T, G)>),
 * computed by forward-mode (dual) arithmetic through the Horner steps and the squarings: pairs
 * (M, N) with (M1, N1)(M2, N2) = (M1 M2, M1 N2 + N1 M2), started from (X^T, dR_t) / 2^s with the
 * forward's s. The pair's first half is r(X_t^T) = R_t^T, which carries lam to t - 1. So the
 * gradient is the exact one of the approximant the forward evaluates.
 *   dtheta_t,i = <dX_t, S_i>,  dS_i += sum_t theta_t,i dX_t,  dp* += R_1^T lam_1.
 * The backward first runs a block's chain forward, keeping p_{t-1} (T b doubles), then sweeps
 * t in reverse.
 *
 * Parallel layout: the forward's work item is a chain (batch row, head, block); the backward's
 * is a (head, block), its batch rows in order, so dS and dp* are summed in a fixed order in
 * double and written once: the same bits for any thread count.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

#define NCG_MAXB 16          /* largest block */
#define NCG_DEGREE 12        /* Taylor degree */
#define NCG_THETA 0.5        /* ||X||_F / 2^s at most this */
#define NCG_MAXS 64          /* squarings at most (beyond, the result overflows anyway) */
#define NCG_MIN_PARALLEL 4096 /* B*T*H*NB below this runs on one thread */

typedef double Mat[NCG_MAXB * NCG_MAXB];

/* the helpers are inlined into the two per-chain functions, which are compiled per ISA
 * (MF_CLONES: AVX-512, AVX2, baseline; the b x b products' loops over a row vectorise, the same
 * operations in the same order on every path, no contraction: the same bits) */
#define NCG_INLINE __attribute__((always_inline)) static inline

static int ncg_check(const MfNcGeneralParams *p) {
    if (p->b < 2 || p->b > NCG_MAXB || p->K < 1 || p->B < 0 || p->T < 0 || p->H < 0 ||
        p->NB < 0 || p->D != p->NB * p->b)
        return MF_EINVAL;
    return MF_OK;
}

/* rows of 4 and 8 doubles as vectors (GCC vector extensions; the products and sums of the
 * scalar loops below, lane by lane, in the same order: the same bits) */
typedef double ncg_v4 __attribute__((vector_size(32)));
typedef double ncg_v8 __attribute__((vector_size(64)));
#define NCG_LOAD(V, p) __extension__({ V v_; memcpy(&v_, (p), sizeof v_); v_; })
#define NCG_ROWS(V, W)                                                                      \
    /* c = a b */                                                                           \
    __attribute__((always_inline)) static inline void mul_##V(                              \
        double *restrict c, const double *restrict a, const double *restrict b) {           \
        for (int i = 0; i < W; i++) {                                                       \
            V row = {0};                                                                    \
            for (int k = 0; k < W; k++) row += a[i * W + k] * NCG_LOAD(V, b + k * W);       \
            memcpy(c + i * W, &row, sizeof row);                                            \
        }                                                                                   \
    }                                                                                       \
    /* c = a b + d e */                                                                     \
    __attribute__((always_inline)) static inline void mul2_##V(                             \
        double *restrict c, const double *restrict a, const double *restrict b,             \
        const double *restrict d, const double *restrict e) {                               \
        for (int i = 0; i < W; i++) {                                                       \
            V row = {0};                                                                    \
            for (int k = 0; k < W; k++)                                                     \
                row += a[i * W + k] * NCG_LOAD(V, b + k * W) +                              \
                       d[i * W + k] * NCG_LOAD(V, e + k * W);                               \
            memcpy(c + i * W, &row, sizeof row);                                            \
        }                                                                                   \
    }
NCG_ROWS(ncg_v4, 4)
NCG_ROWS(ncg_v8, 8)

/* c = a b (n x n, row-major, stride n); inlined for a constant n, the loops unrolled */
__attribute__((always_inline)) static inline void mat_mul_n(double *restrict c,
                                                            const double *restrict a,
                                                            const double *restrict b, int n) {
    if (n == 4 || n == 8) {
        if (n == 4) mul_ncg_v4(c, a, b);
        else mul_ncg_v8(c, a, b);
        return;
    }
    for (int i = 0; i < n; i++) {
        double row[NCG_MAXB] = {0};
        for (int k = 0; k < n; k++) {
            const double aik = a[i * n + k];
            for (int j = 0; j < n; j++) row[j] += aik * b[k * n + j];
        }
        memcpy(c + i * n, row, (size_t)n * sizeof(double));
    }
}

/* c = a b + d e */
__attribute__((always_inline)) static inline void mat_mul2_n(
    double *restrict c, const double *restrict a, const double *restrict b,
    const double *restrict d, const double *restrict e, int n) {
    if (n == 4 || n == 8) {
        if (n == 4) mul2_ncg_v4(c, a, b, d, e);
        else mul2_ncg_v8(c, a, b, d, e);
        return;
    }
    for (int i = 0; i < n; i++) {
        double row[NCG_MAXB] = {0};
        for (int k = 0; k < n; k++) {
            const double aik = a[i * n + k], dik = d[i * n + k];
            for (int j = 0; j < n; j++) row[j] += aik * b[k * n + j] + dik * e[k * n + j];
        }
        memcpy(c + i * n, row, (size_t)n * sizeof(double));
    }
}

/* the same operations in the same order for every n: the common sizes get their own copy */
#define NCG_SIZES(CALL) \
    switch (n) { \
    case 2: CALL(2); break; \
    case 3: CALL(3); break; \
    case 4: CALL(4); break; \
    case 6: CALL(6); break; \
    case 8: CALL(8); break; \
    default: CALL(n); break; \
    }

NCG_INLINE void mat_mul(double *restrict c, const double *restrict a, const double *restrict b,
                    int n) {
#define NCG_MUL(m) mat_mul_n(c, a, b, m)
    NCG_SIZES(NCG_MUL)
#undef NCG_MUL
}

NCG_INLINE void mat_mul2(double *restrict c, const double *restrict a, const double *restrict b,
                     const double *restrict d, const double *restrict e, int n) {
#define NCG_MUL2(m) mat_mul2_n(c, a, b, d, e, m)
    NCG_SIZES(NCG_MUL2)
#undef NCG_MUL2
}

/* the squarings s for X (n x n) */
NCG_INLINE int squarings(const double *x, int n) {
    double f = 0.0;
    for (int i = 0; i < n * n; i++) f += x[i] * x[i];
    f = sqrt(f);
    int s = 0;
    while (s < NCG_MAXS && f > NCG_THETA) f *= 0.5, s++;
    return s;
}

/* x = sum_i theta[i] S_i, in double (transposed when `transpose`: summed in place, then
 * transposed, each entry's sum the same) */
NCG_INLINE void generator(double *x, const float *theta, const float *gen, int64_t K, int n,
                          int transpose) {
    const int nn = n * n;
    Mat y;
    double *sum = transpose ? y : x;
    memset(sum, 0, sizeof(double) * (size_t)nn);
    for (int64_t i = 0; i < K; i++) {
        const double c = theta[i];
        const float *s = gen + i * nn;
        for (int q = 0; q < nn; q++) sum[q] += c * (double)s[q];
    }
    if (transpose)
        for (int r = 0; r < n; r++)
            for (int q = 0; q < n; q++) x[q * n + r] = y[r * n + q];
}

/* r = T_12(x / 2^s)^(2^s); x is overwritten (scaled) */
NCG_INLINE void expm(double *r, double *x, int n, int s) {
    const double scale = ldexp(1.0, -s);
    Mat t;
    for (int i = 0; i < n * n; i++) x[i] *= scale;
    for (int i = 0; i < n * n; i++) r[i] = x[i] / NCG_DEGREE;
    for (int i = 0; i < n; i++) r[i * n + i] += 1.0;
    for (int k = NCG_DEGREE - 1; k >= 1; k--) { /* r = I + x r / k */
        mat_mul(t, x, r, n);
        const double inv = 1.0 / k;
        for (int i = 0; i < n * n; i++) r[i] = t[i] * inv;
        for (int i = 0; i < n; i++) r[i * n + i] += 1.0;
    }
    for (int q = 0; q < s; q++) {
        mat_mul(t, r, r, n);
        memcpy(r, t, sizeof(double) * (size_t)(n * n));
    }
}

/* (r, l) = (r(x), L_r(x, e)) by dual arithmetic; x and e are overwritten (scaled) */
NCG_INLINE void expm_frechet(double *r, double *l, double *x, double *e, int n, int s) {
    const double scale = ldexp(1.0, -s);
    const int nn = n * n;
    Mat t, u;
    for (int i = 0; i < nn; i++) x[i] *= scale, e[i] *= scale;
    for (int i = 0; i < nn; i++) r[i] = x[i] / NCG_DEGREE, l[i] = e[i] / NCG_DEGREE;
    for (int i = 0; i < n; i++) r[i * n + i] += 1.0;
    for (int k = NCG_DEGREE - 1; k >= 1; k--) { /* (r, l) = (I + x r / k, (x l + e r) / k) */
        mat_mul(t, x, r, n);
        mat_mul2(u, x, l, e, r, n);
        const double inv = 1.0 / k;
        for (int i = 0; i < nn; i++) r[i] = t[i] * inv, l[i] = u[i] * inv;
        for (int i = 0; i < n; i++) r[i * n + i] += 1.0;
    }
    for (int q = 0; q < s; q++) { /* (r, l) = (r r, r l + l r) */
        mat_mul(t, r, r, n);
        mat_mul2(u, r, l, l, r, n);
        memcpy(r, t, sizeof(double) * (size_t)nn);
        memcpy(l, u, sizeof(double) * (size_t)nn);
    }
}

/* one chain (batch row bi, head h, block k) forward */
NCG_INLINE void forward_chain_n(const MfNcGeneralParams *p, int64_t bi, int64_t h, int64_t k,
                                const int n) {
    const int64_t T = p->T, H = p->H, NB = p->NB, K = p->K, D = p->D;
    const float *gen = p->gen + (h * NB + k) * K * n * n;
    double v[NCG_MAXB], w[NCG_MAXB];
    for (int i = 0; i < n; i++) v[i] = p->start[h * D + k * n + i];
    Mat x, r;
    for (int64_t t = 0; t < T; t++) {
        const int64_t row = (bi * T + t) * H + h;
        generator(x, p->theta + (row * NB + k) * K, gen, K, n, 0);
        expm(r, x, n, squarings(x, n));
        for (int i = 0; i < n; i++) {
            double acc = 0.0;
            for (int j = 0; j < n; j++) acc += r[i * n + j] * v[j];
            w[i] = acc;
        }
        memcpy(v, w, sizeof(double) * (size_t)n);
        float *out = p->p + row * D + k * n;
        for (int i = 0; i < n; i++) out[i] = (float)v[i];
    }
}

/* forward_chain_n for the block size b: a copy per common size, its loops over constants */
MF_CLONES
static void forward_chain(const MfNcGeneralParams *p, int64_t bi, int64_t h, int64_t k) {
    const int n = (int)p->b;
#define NCG_FORWARD(m) forward_chain_n(p, bi, h, k, m)
    NCG_SIZES(NCG_FORWARD)
#undef NCG_FORWARD
}

int nc_general_forward(const MfNcGeneralParams *p) {
    if (!p || !p->theta || !p->gen || !p->start || !p->p) return MF_EINVAL;
    const int ok = ncg_check(p);
    if (ok != MF_OK) return ok;
    const int64_t chains = p->B * p->H * p->NB;
    if (chains * p->T == 0) return MF_OK;
#pragma omp parallel for schedule(dynamic, 1) if (chains * p->T >= NCG_MIN_PARALLEL)
    for (int64_t c = 0; c < chains; c++)
        forward_chain(p, c / (p->H * p->NB), c / p->NB % p->H, c % p->NB);
    return MF_OK;
}

/* doubles per thread: p_{t-1} for every t (T b), dS (K b b), dp* (b) */
static int64_t per_thread(const MfNcGeneralParams *p) {
    return mf_scratch_size(2 * (p->T * p->b + p->K * p->b * p->b + p->b));
}

int64_t nc_general_backward_scratch_floats(const MfNcGeneralParams *p) {
    if (!p || ncg_check(p) != MF_OK) return 0;
    return mf_max_threads() * per_thread(p);
}

/* one (head h, block k): every batch row's chain, dS and dp* summed over them in order */
NCG_INLINE void backward_block_n(const MfNcGeneralParams *p, int64_t h, int64_t k, double *buf,
                                 const int n) {
    const int nn = n * n;
    const int64_t B = p->B, T = p->T, H = p->H, NB = p->NB, K = p->K, D = p->D;
    const float *gen = p->gen + (h * NB + k) * K * nn;
    double *hist = buf, *ds = buf + T * n, *dst = ds + K * nn;
    memset(ds, 0, sizeof(double) * (size_t)(K * nn + n));
    Mat x, r, e, l;
    for (int64_t bi = 0; bi < B; bi++) {
        for (int i = 0; i < n; i++) hist[i] = p->start[h * D + k * n + i];
        for (int64_t t = 0; t + 1 < T; t++) { /* hist[t] = p_{t-1} (p_{-1} = p*) */
            const int64_t row = (bi * T + t) * H + h;
            generator(x, p->theta + (row * NB + k) * K, gen, K, n, 0);
            expm(r, x, n, squarings(x, n));
            for (int i = 0; i < n; i++) {
                double acc = 0.0;
                for (int j = 0; j < n; j++) acc += r[i * n + j] * hist[t * n + j];
                hist[(t + 1) * n + i] = acc;
            }
        }
        double lam[NCG_MAXB], carry[NCG_MAXB] = {0};
        for (int64_t t = T - 1; t >= 0; t--) {
            const int64_t row = (bi * T + t) * H + h;
            const float *th = p->theta + (row * NB + k) * K;
            const float *g = p->dp + row * D + k * n;
            for (int i = 0; i < n; i++) lam[i] = (double)g[i] + carry[i];
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) e[i * n + j] = lam[i] * hist[t * n + j];
            generator(x, th, gen, K, n, 1); /* X_t^T */
            expm_frechet(r, l, x, e, n, squarings(x, n)); /* r = R_t^T, l = dX_t */
            float *dth = p->dtheta + (row * NB + k) * K;
            for (int64_t i = 0; i < K; i++) {
                const float *s = gen + i * nn;
                double dot = 0.0;
                for (int q = 0; q < nn; q++) dot += l[q] * (double)s[q];
                dth[i] = (float)dot;
                const double c = th[i];
                double *d = ds + i * nn;
                for (int q = 0; q < nn; q++) d[q] += c * l[q];
            }
            for (int i = 0; i < n; i++) {
                double acc = 0.0;
                for (int j = 0; j < n; j++) acc += r[i * n + j] * lam[j];
                carry[i] = acc;
            }
        }
        for (int i = 0; i < n; i++) dst[i] += carry[i];
    }
    float *dgen = p->dgen + (h * NB + k) * K * nn;
    for (int64_t q = 0; q < K * nn; q++) dgen[q] = (float)((double)dgen[q] + ds[q]);
    float *dstart = p->dstart + h * D + k * n;
    for (int i = 0; i < n; i++) dstart[i] = (float)((double)dstart[i] + dst[i]);
}

/* backward_block_n for the block size b, as forward_chain */
MF_CLONES
static void backward_block(const MfNcGeneralParams *p, int64_t h, int64_t k, double *buf) {
    const int n = (int)p->b;
#define NCG_BACKWARD(m) backward_block_n(p, h, k, buf, m)
    NCG_SIZES(NCG_BACKWARD)
#undef NCG_BACKWARD
}

int nc_general_backward(const MfNcGeneralParams *p) {
    if (!p || !p->dp || !p->theta || !p->gen || !p->start || !p->dtheta || !p->dgen ||
        !p->dstart)
        return MF_EINVAL;
    const int ok = ncg_check(p);
    if (ok != MF_OK) return ok;
    const int64_t blocks = p->H * p->NB;
    if (p->B * p->T * blocks == 0) return MF_OK; /* no steps: zero gradients */
    const int threads = mf_scratch_threads(p->scratch_floats, per_thread(p));
    if (!p->scratch || threads < 1) return MF_EINVAL;
#pragma omp parallel num_threads(threads) if (p->B * p->T * blocks >= NCG_MIN_PARALLEL)
    {
        double *buf = (double *)(p->scratch + mf_thread_id() * per_thread(p));
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < blocks; it++) backward_block(p, it / p->NB, it % p->NB, buf);
    }
    return MF_OK;
}
