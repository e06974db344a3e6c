/* Selective scans on the GPU (csrc/ops/scan.c's math): Mamba's real diagonal scan and MAMPa's
 * complex one (2x2 rotation-scaling blocks, (re, im) pairs), Euler or zero-order hold:
 *   z_t = d_t A[e,k] (+ i d'_t omega[e,k]),  a_t = e^z_t,
 *   h_t = a_t h_{t-1} + s_t,  s_t = d_t x_t phi(z_t) beta_t,
 *   y_t = sum_k <c_t, h_t> + D x_t   (<c, h> = c_re h_re + c_im h_im),
 * phi = 1 (Euler) or (e^z - 1) / z (ZOH). The step d_t: delta's row, + delta_bias[e] when
 * given, through softplus with delta_softplus (activation.cu's softplus_forward: threshold 20),
 * formed from delta's row in every pass (no (B, T, E) array of steps is kept); the rotation's
 * step d'_t is delta_angle's row, or d_t itself when delta_angle is NULL (complex scan).
 * The forward writes y and the state at each chunk's last step (states (B, NC, E, S)); the
 * backward recomputes each chunk from states_in.
 *
 * Chunked as state-spaces/mamba's selective_scan kernel: a block is SCAN_EC channels
 * (threadIdx.x, adjacent channels adjacent threads: the (b, t, e) rows load coalesced) times a
 * tile of SCAN_NT steps (threadIdx.y). Time runs in tiles aligned to the op's chunks; per
 * tile and state k, every thread forms its step's pair (a_t, s_t) and a block scan along y
 * (Hillis-Steele in shared memory, per channel column) composes the pairs,
 * (a2, s2) o (a1, s1) = (a2 a1, a2 s1 + s2), so h_t = A_t h_start + S_t with h_start the
 * prefix carried across tiles (shared memory, per channel and state).
 *
 * Backward, per block a batch row and SCAN_EB channels (groups of SCAN_EC one after another),
 * chunks in reverse: (1) the chunk's forward is recomputed from states_in as above, keeping
 * each tile's start state in scratch (O(chunk / SCAN_NT) states per channel); (2) its tiles in
 * reverse: the forward scan again gives h_t and h_{t-1}, and a reverse block scan gives the
 * adjoint g_t = gy_t c_t + conj(a_{t+1}) g_{t+1} (pairs (conj(a_{t+1}), gy_t c_t), the carry
 * conj(a_{t0}) g_{t0} handed to the earlier tile), then as the C op:
 *   u = a_t h_{t-1}, dz = g conj(u) + conj(phi') r g conj(beta), dr = sum_k Re(conj(g
 *   conj(beta)) phi), dbeta = conj(r phi) g, dc = gy h_t, dx = d dr + D gy,
 *   dd = x dr + sum_k Re(dz) A, dd' = sum_k Im(dz) omega;
 * ddelta_angle = dd' with a delta_angle; without one, dd' is the step's too: dd += dd' and
 * ddelta_angle is not written. ddelta (delta's gradient) = dd times softplus'(delta + bias)
 * (sigmoid, 1 above the threshold: softplus_backward's) with delta_softplus, else dd; and
 * ddelta_bias += its sum over b, t.
 * Parameter gradients without atomics: dB, dC summed over the block's channels in a fixed
 * order into the block's own (T, S) slice of scratch; dA, domega, dD and ddelta_bias per
 * (b, e) in double in scratch (summed over the tile's steps in a fixed order); a last kernel
 * sums the slices over channel blocks and batch rows in a fixed order (the same bits on every
 * run).
 * ZOH's phi and phi' are formed in double (expm1 and sin(zi / 2): no cancellation; series for
 * |z| < 1e-3), the decay then rounded to float; Euler's decay is expf and sinf/cosf of the
 * step's own angle (no angle accumulates).
 * First version: scalar per-thread complex arithmetic (the real scan carries a zero imaginary
 * part through the scan), no warp shuffles: on an H100 the real forward moves 67 GB/s and
 * the backward takes 17x the forward (README, "On a GPU"). */
#include "common.cuh"

#define SCAN_EC 8    /* channels per block (threadIdx.x) */
#define SCAN_NT 16   /* steps per tile (threadIdx.y), a power of two */
#define SCAN_EB 64   /* channels per backward block, a multiple of SCAN_EC */
#define SCAN_MAXS 256 /* state floats per channel, as the C op */
#define SCAN_SOFTPLUS_THRESHOLD 20.0f /* activation.cu's SOFTPLUS_THRESHOLD (Mamba's) */

namespace { /* this file's own helpers (other kernel files may use the same names) */

struct Cx {
    float r, i;
};
__device__ __forceinline__ Cx cmul(Cx a, Cx b) {
    return Cx{a.r * b.r - a.i * b.i, a.r * b.i + a.i * b.r};
}
__device__ __forceinline__ Cx cadd(Cx a, Cx b) { return Cx{a.r + b.r, a.i + b.i}; }
__device__ __forceinline__ Cx cconj(Cx a) { return Cx{a.r, -a.i}; }

/* one state's parts of a step: decay a, input s = r phi beta, and ZOH's phi, phi' */
struct StepParts {
    Cx a, s, phi, dphi;
};

/* phi(z) = (e^z - 1) / z and phi'(z) = (e^z - phi) / z in double: e^z - 1 = (expm1(zr) -
 * e^zr (1 - cos zi)) + i e^zr sin zi with 1 - cos zi = 2 sin^2(zi / 2) (no cancellation);
 * below |z| = 1e-3 the series (error |z|^4 / 120 and |z|^4 / 144) */
__device__ void zoh_factors(double zr, double zi, double *pr, double *pi, double *qr,
                            double *qi) {
    const double m2 = zr * zr + zi * zi;
    if (m2 < 1e-6) {
        const double z2r = zr * zr - zi * zi, z2i = 2.0 * zr * zi;
        const double z3r = z2r * zr - z2i * zi, z3i = z2r * zi + z2i * zr;
        *pr = 1.0 + zr / 2.0 + z2r / 6.0 + z3r / 24.0;
        *pi = zi / 2.0 + z2i / 6.0 + z3i / 24.0;
        *qr = 0.5 + zr / 3.0 + z2r / 8.0 + z3r / 30.0;
        *qi = zi / 3.0 + z2i / 8.0 + z3i / 30.0;
        return;
    }
    const double e = exp(zr), m1 = expm1(zr), sn = sin(zi), cs = cos(zi), hv = sin(zi / 2.0);
    const double nr = m1 - e * 2.0 * hv * hv, ni = e * sn;
    *pr = (nr * zr + ni * zi) / m2;
    *pi = (ni * zr - nr * zi) / m2;
    const double ur = e * cs - *pr, ui = e * sn - *pi;
    *qr = (ur * zr + ui * zi) / m2;
    *qi = (ui * zr - ur * zi) / m2;
}

template <bool CX, bool ZOH>
__device__ StepParts step_parts(float dt, float ang, float r, float A, float W, Cx beta) {
    StepParts o;
    if (ZOH) {
        const double zr = (double)dt * A, zi = CX ? (double)ang * W : 0.0;
        double pr, pi, qr, qi;
        zoh_factors(zr, zi, &pr, &pi, &qr, &qi);
        const double e = exp(zr);
        o.a = Cx{(float)(e * cos(zi)), CX ? (float)(e * sin(zi)) : 0.0f};
        o.phi = Cx{(float)pr, (float)pi};
        o.dphi = Cx{(float)qr, (float)qi};
        o.s = cmul(Cx{r * o.phi.r, r * o.phi.i}, beta);
    } else {
        const float e = expf(dt * A);
        if (CX) {
            const float th = ang * W;
            o.a = Cx{e * cosf(th), e * sinf(th)};
        } else {
            o.a = Cx{e, 0.0f};
        }
        o.phi = Cx{1.0f, 0.0f};
        o.dphi = Cx{0.0f, 0.0f};
        o.s = Cx{r * beta.r, r * beta.i};
    }
    return o;
}

/* inclusive scan along threadIdx.y of the pairs (a, s), earlier steps first:
 * (a, s) <- (a a', a s' + s) with (a', s') the partial of the rows d before */
__device__ void scan_up(Cx *a, Cx *s, Cx (*sa)[SCAN_EC], Cx (*ss)[SCAN_EC]) {
    const int x = threadIdx.x, y = threadIdx.y;
    for (int d = 1; d < SCAN_NT; d <<= 1) {
        sa[y][x] = *a;
        ss[y][x] = *s;
        __syncthreads();
        if (y >= d) {
            const Cx pa = sa[y - d][x], ps = ss[y - d][x];
            *s = cadd(cmul(*a, ps), *s);
            *a = cmul(*a, pa);
        }
        __syncthreads();
    }
}

/* inclusive reverse scan along threadIdx.y of (m, b), g_y = b_y + m_y g_{y+1}:
 * (m, b) <- (m m', b + m b') with (m', b') the partial of the rows d after */
__device__ void scan_down(Cx *m, Cx *b, Cx (*sa)[SCAN_EC], Cx (*ss)[SCAN_EC]) {
    const int x = threadIdx.x, y = threadIdx.y;
    for (int d = 1; d < SCAN_NT; d <<= 1) {
        sa[y][x] = *m;
        ss[y][x] = *b;
        __syncthreads();
        if (y + d < SCAN_NT) {
            const Cx pm = sa[y + d][x], pb = ss[y + d][x];
            *b = cadd(*b, cmul(*m, pb));
            *m = cmul(*m, pm);
        }
        __syncthreads();
    }
}

/* the step of the element io = (b, t, e) of delta: delta + delta_bias[e] (when given),
 * through softplus with delta_softplus (activation.cu's softplus_forward); *slope (when
 * asked) its derivative there: sigmoid (softplus_backward's), 1 above the threshold or
 * without softplus */
__device__ __forceinline__ float step_at(const MfScanParams &p, int64_t io, int64_t e,
                                         float *slope) {
    float v = p.delta[io];
    if (p.delta_bias) v += p.delta_bias[e];
    if (!p.delta_softplus || v > SCAN_SOFTPLUS_THRESHOLD) {
        if (slope) *slope = 1.0f;
        return v;
    }
    if (slope) *slope = 1.0f / (1.0f + expf(-v));
    return fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v)));
}

/* state k's (beta or c) of step t as a complex number ((B, T, S) rows) */
template <bool CX>
__device__ __forceinline__ Cx pair_at(const float *v, int64_t row, int64_t k) {
    return CX ? Cx{v[row + 2 * k], v[row + 2 * k + 1]} : Cx{v[row + k], 0.0f};
}

} // namespace

template <bool CX, bool ZOH>
__global__ void scan_forward_kernel(MfScanParams p) {
    __shared__ Cx sa[SCAN_NT][SCAN_EC], ss[SCAN_NT][SCAN_EC];
    __shared__ Cx carry[SCAN_EC][SCAN_MAXS];
    const int x = threadIdx.x, y = threadIdx.y;
    const int64_t b = blockIdx.y, e = (int64_t)blockIdx.x * SCAN_EC + x;
    const int64_t T = p.T, E = p.E, K = p.K, S = CX ? 2 * K : K, L = p.chunk < T ? p.chunk : T;
    const int64_t NC = (T + L - 1) / L;
    const bool ce = e < E;
    for (int64_t k = y; k < K; k += SCAN_NT) carry[x][k] = Cx{0.0f, 0.0f};
    __syncthreads();
    for (int64_t ci = 0; ci < NC; ci++) {
        const int64_t c1 = ci * L + L < T ? ci * L + L : T;
        for (int64_t t0 = ci * L; t0 < c1; t0 += SCAN_NT) {
            const int64_t t = t0 + y, last = (t0 + SCAN_NT < c1 ? t0 + SCAN_NT : c1) - 1 - t0;
            const bool valid = ce && t < c1;
            const int64_t io = (b * T + t) * E + e, row = (b * T + t) * S;
            float xv = 0.0f, dt = 0.0f, ang = 0.0f;
            if (valid) {
                xv = p.x[io], dt = step_at(p, io, e, NULL);
                if (CX) ang = p.delta_angle ? p.delta_angle[io] : dt;
            }
            const float r = dt * xv;
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                Cx a = {1.0f, 0.0f}, s = {0.0f, 0.0f};
                if (valid) {
                    const StepParts st = step_parts<CX, ZOH>(
                        dt, ang, r, p.A[e * K + k], CX ? p.omega[e * K + k] : 0.0f,
                        pair_at<CX>(p.Bm, row, k));
                    a = st.a, s = st.s;
                }
                scan_up(&a, &s, sa, ss);
                const Cx h = cadd(cmul(a, carry[x][k]), s);
                if (valid) {
                    const Cx c = pair_at<CX>(p.Cm, row, k);
                    acc += c.r * h.r + c.i * h.i;
                    if (t == c1 - 1) {
                        float *dst = p.states + ((b * NC + ci) * E + e) * S;
                        if (CX)
                            dst[2 * k] = h.r, dst[2 * k + 1] = h.i;
                        else
                            dst[k] = h.r;
                    }
                }
                __syncthreads(); /* every row has read carry[x][k] */
                if (y == last) carry[x][k] = h;
            }
            if (valid) p.y[io] = acc + p.D[e] * xv;
        }
    }
}

/* the backward's scratch, in floats: dA, domega partials (B, E, K), dD and ddelta_bias's
 * (B, E) in double, the tile start states (B, E, ceil(min(chunk, T) / SCAN_NT), S), dB and dC
 * partials (B, nblk, T, S) each (nblk = ceil(E / SCAN_EB)) */
struct ScanScratch {
    double *pA, *pW, *pD, *pS;
    float *hs, *pB, *pC;
    int64_t ntc, nblk;
};

static int64_t scan_scratch_layout(const MfScanParams *p, int cx, ScanScratch *w) {
    const int64_t B = p->B, T = p->T, E = p->E, K = p->K, S = cx ? 2 * K : K;
    const int64_t ntc = ((p->chunk < T ? p->chunk : T) + SCAN_NT - 1) / SCAN_NT;
    const int64_t nblk = (E + SCAN_EB - 1) / SCAN_EB;
    const int64_t nA = 2 * B * E * K, nD = 2 * B * E, nh = B * E * ntc * S, nB = B * nblk * T * S;
    if (w) {
        float *f = p->scratch;
        w->pA = (double *)f, w->pW = (double *)(f + nA), w->pD = (double *)(f + 2 * nA);
        w->pS = (double *)(f + 2 * nA + nD);
        w->hs = f + 2 * nA + 2 * nD, w->pB = w->hs + nh, w->pC = w->pB + nB;
        w->ntc = ntc, w->nblk = nblk;
    }
    return 2 * nA + 2 * nD + nh + 2 * nB;
}

template <bool CX, bool ZOH>
__global__ void scan_backward_kernel(MfScanParams p, ScanScratch w) {
    __shared__ Cx sa[SCAN_NT][SCAN_EC], ss[SCAN_NT][SCAN_EC];
    __shared__ Cx hc[SCAN_EC][SCAN_MAXS], gc[SCAN_EC][SCAN_MAXS];
    __shared__ float red[6][SCAN_NT][SCAN_EC];
    __shared__ double dred[2][SCAN_NT][SCAN_EC];
    const int x = threadIdx.x, y = threadIdx.y, tid = y * SCAN_EC + x;
    const int64_t b = blockIdx.y, blk = blockIdx.x;
    const int64_t T = p.T, E = p.E, K = p.K, S = CX ? 2 * K : K, L = p.chunk < T ? p.chunk : T;
    const int64_t NC = (T + L - 1) / L;
    float *pB = w.pB + (b * w.nblk + blk) * T * S, *pC = w.pC + (b * w.nblk + blk) * T * S;
    for (int64_t i = tid; i < T * S; i += SCAN_EC * SCAN_NT) pB[i] = 0.0f, pC[i] = 0.0f;
    __syncthreads();
    const int64_t g1 = blk * SCAN_EB + SCAN_EB < E ? blk * SCAN_EB + SCAN_EB : E;
    for (int64_t g0 = blk * SCAN_EB; g0 < g1; g0 += SCAN_EC) {
        const int64_t e = g0 + x;
        const bool ce = e < E;
        double *pA = w.pA + (b * E + e) * K, *pW = w.pW + (b * E + e) * K;
        float *hs = w.hs + (b * E + e) * w.ntc * S;
        if (ce && y == 0)
            for (int64_t k = 0; k < K; k++) pA[k] = 0.0, pW[k] = 0.0;
        for (int64_t k = y; k < K; k += SCAN_NT) gc[x][k] = Cx{0.0f, 0.0f};
        double dD = 0.0, dS = 0.0;
        for (int64_t ci = NC - 1; ci >= 0; ci--) {
            const int64_t c0 = ci * L, c1 = c0 + L < T ? c0 + L : T;
            /* (1) the chunk's forward from its start state, keeping each tile's start */
            for (int64_t k = y; k < K; k += SCAN_NT) {
                Cx h0 = {0.0f, 0.0f};
                if (ci > 0 && ce) {
                    const float *src = p.states_in + ((b * NC + ci - 1) * E + e) * S;
                    h0 = CX ? Cx{src[2 * k], src[2 * k + 1]} : Cx{src[k], 0.0f};
                }
                hc[x][k] = h0;
            }
            __syncthreads();
            for (int64_t t0 = c0; t0 < c1; t0 += SCAN_NT) {
                const int64_t t = t0 + y, last = (t0 + SCAN_NT < c1 ? t0 + SCAN_NT : c1) - 1 - t0;
                const bool valid = ce && t < c1;
                const int64_t io = (b * T + t) * E + e, row = (b * T + t) * S;
                float dt = 0.0f, ang = 0.0f, r = 0.0f;
                if (valid) {
                    dt = step_at(p, io, e, NULL), r = dt * p.x[io];
                    if (CX) ang = p.delta_angle ? p.delta_angle[io] : dt;
                }
                float *hst = hs + (t0 - c0) / SCAN_NT * S;
                for (int64_t k = 0; k < K; k++) {
                    Cx a = {1.0f, 0.0f}, s = {0.0f, 0.0f};
                    if (valid) {
                        const StepParts st = step_parts<CX, ZOH>(
                            dt, ang, r, p.A[e * K + k], CX ? p.omega[e * K + k] : 0.0f,
                            pair_at<CX>(p.Bm, row, k));
                        a = st.a, s = st.s;
                    }
                    const Cx start = hc[x][k];
                    if (y == 0 && ce) {
                        if (CX)
                            hst[2 * k] = start.r, hst[2 * k + 1] = start.i;
                        else
                            hst[k] = start.r;
                    }
                    scan_up(&a, &s, sa, ss);
                    const Cx h = cadd(cmul(a, start), s);
                    __syncthreads();
                    if (y == last) hc[x][k] = h;
                }
            }
            __syncthreads();
            /* (2) the chunk's tiles in reverse */
            const int64_t nt = (c1 - c0 + SCAN_NT - 1) / SCAN_NT;
            for (int64_t ti = nt - 1; ti >= 0; ti--) {
                const int64_t t0 = c0 + ti * SCAN_NT, t = t0 + y;
                const bool valid = ce && t < c1;
                const int64_t io = (b * T + t) * E + e, row = (b * T + t) * S;
                float xv = 0.0f, dt = 0.0f, ang = 0.0f, gy = 0.0f, slope = 1.0f;
                if (valid) {
                    xv = p.x[io], dt = step_at(p, io, e, &slope), gy = p.dy[io];
                    if (CX) ang = p.delta_angle ? p.delta_angle[io] : dt;
                }
                const float r = dt * xv;
                const float *hst = hs + ti * S;
                float dr = 0.0f, dzA = 0.0f, dzW = 0.0f;
                for (int64_t k = 0; k < K; k++) {
                    const float Ak = ce ? p.A[e * K + k] : 0.0f;
                    const float Wk = CX && ce ? p.omega[e * K + k] : 0.0f;
                    Cx beta = {0.0f, 0.0f}, c = {0.0f, 0.0f};
                    StepParts st = {{1.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
                    if (valid) {
                        beta = pair_at<CX>(p.Bm, row, k), c = pair_at<CX>(p.Cm, row, k);
                        st = step_parts<CX, ZOH>(dt, ang, r, Ak, Wk, beta);
                    }
                    Cx h0 = {0.0f, 0.0f};
                    if (ce) h0 = CX ? Cx{hst[2 * k], hst[2 * k + 1]} : Cx{hst[k], 0.0f};
                    Cx a = st.a, s = st.s;
                    scan_up(&a, &s, sa, ss);
                    const Cx h = cadd(cmul(a, h0), s);
                    sa[y][x] = h;
                    ss[y][x] = st.a;
                    __syncthreads();
                    const Cx hprev = y > 0 ? sa[y - 1][x] : h0;
                    Cx m = y + 1 < SCAN_NT ? cconj(ss[y + 1][x]) : Cx{1.0f, 0.0f};
                    Cx bb = {gy * c.r, gy * c.i};
                    __syncthreads();
                    scan_down(&m, &bb, sa, ss);
                    const Cx g = cadd(bb, cmul(m, gc[x][k]));
                    float parts[6] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                    if (valid) {
                        const Cx u = cmul(st.a, hprev);
                        const Cx gs = cmul(g, cconj(beta));
                        Cx dz = cmul(g, cconj(u));
                        if (ZOH) dz = cadd(dz, cmul(cconj(st.dphi), Cx{r * gs.r, r * gs.i}));
                        dr += gs.r * st.phi.r + gs.i * st.phi.i;
                        const Cx db = cmul(cconj(Cx{r * st.phi.r, r * st.phi.i}), g);
                        dzA += dz.r * Ak;
                        dzW += dz.i * Wk;
                        parts[0] = db.r, parts[1] = db.i, parts[2] = gy * h.r, parts[3] = gy * h.i;
                        parts[4] = dz.r * dt, parts[5] = dz.i * ang;
                    }
                    for (int j = 0; j < 6; j++) red[j][y][x] = parts[j];
                    __syncthreads(); /* every row has read gc[x][k] and written red */
                    if (y == 0) gc[x][k] = cmul(cconj(st.a), g);
                    if (x == 0 && t < c1) {
                        float sb = 0.0f, sbi = 0.0f, sc = 0.0f, sci = 0.0f;
                        for (int l = 0; l < SCAN_EC; l++) {
                            sb += red[0][y][l], sbi += red[1][y][l];
                            sc += red[2][y][l], sci += red[3][y][l];
                        }
                        if (CX) {
                            pB[t * S + 2 * k] += sb, pB[t * S + 2 * k + 1] += sbi;
                            pC[t * S + 2 * k] += sc, pC[t * S + 2 * k + 1] += sci;
                        } else {
                            pB[t * S + k] += sb, pC[t * S + k] += sc;
                        }
                    }
                    if (y == 0 && ce) {
                        float sA = 0.0f, sW = 0.0f;
                        for (int l = 0; l < SCAN_NT; l++) sA += red[4][l][x], sW += red[5][l][x];
                        pA[k] += sA;
                        if (CX) pW[k] += sW;
                    }
                    __syncthreads();
                }
                if (valid) {
                    p.dx[io] = dt * dr + p.D[e] * gy;
                    float dd = xv * dr + dzA; /* the step's gradient */
                    if (CX && p.delta_angle)
                        p.ddelta_angle[io] = dzW;
                    else if (CX)
                        dd = dd + dzW; /* the rotation took the step too */
                    if (p.delta_softplus) dd = dd * slope;
                    p.ddelta[io] = dd;
                    dD += (double)gy * xv;
                    dS += (double)dd;
                }
            }
        }
        dred[0][y][x] = dD, dred[1][y][x] = dS;
        __syncthreads();
        if (y == 0 && ce) {
            double s = 0.0, sb = 0.0;
            for (int l = 0; l < SCAN_NT; l++) s += dred[0][l][x], sb += dred[1][l][x];
            w.pD[b * E + e] = s, w.pS[b * E + e] = sb;
        }
        __syncthreads();
    }
}

/* the partials summed in a fixed order: dB, dC over channel blocks (=), dA, domega, dD and
 * ddelta_bias (when given) over batch rows (+=) */
template <bool CX>
__global__ void scan_reduce_kernel(MfScanParams p, ScanScratch w) {
    const int64_t B = p.B, T = p.T, E = p.E, K = p.K, S = CX ? 2 * K : K;
    for (int64_t i = MF_GRID_START; i < B * T * S; i += MF_GRID_STRIDE) {
        const int64_t b = i / (T * S), j = i % (T * S);
        float sb = 0.0f, sc = 0.0f;
        for (int64_t blk = 0; blk < w.nblk; blk++) {
            sb += w.pB[(b * w.nblk + blk) * T * S + j];
            sc += w.pC[(b * w.nblk + blk) * T * S + j];
        }
        p.dBm[i] = sb, p.dCm[i] = sc;
    }
    for (int64_t i = MF_GRID_START; i < E * K; i += MF_GRID_STRIDE) {
        double sa = 0.0, sw = 0.0;
        for (int64_t b = 0; b < B; b++) sa += w.pA[b * E * K + i], sw += w.pW[b * E * K + i];
        p.dA[i] = (float)((double)p.dA[i] + sa);
        if (CX) p.domega[i] = (float)((double)p.domega[i] + sw);
    }
    for (int64_t e = MF_GRID_START; e < E; e += MF_GRID_STRIDE) {
        double s = 0.0, sb = 0.0;
        for (int64_t b = 0; b < B; b++) s += w.pD[b * E + e], sb += w.pS[b * E + e];
        p.dD[e] = (float)((double)p.dD[e] + s);
        if (p.ddelta_bias) p.ddelta_bias[e] = (float)((double)p.ddelta_bias[e] + sb);
    }
}

static int scan_bad(const MfScanParams *p, int cx) {
    const int64_t S = cx ? 2 * p->K : p->K;
    return p->B < 1 || p->T < 1 || p->E < 1 || p->K < 1 || S > SCAN_MAXS || p->chunk < 1 ||
           p->B > MF_MAX_GRID || (p->bbar != MF_BBAR_EULER && p->bbar != MF_BBAR_ZOH) ||
           (p->delta_softplus != 0 && p->delta_softplus != 1);
}

template <bool CX>
static int scan_forward(const MfScanParams *p, cudaStream_t stream) {
    if (scan_bad(p, CX)) return MF_EINVAL;
    const dim3 grid(mf_blocks(p->E, SCAN_EC), (unsigned)p->B), block(SCAN_EC, SCAN_NT);
    if (p->bbar == MF_BBAR_ZOH)
        return MF_LAUNCH((scan_forward_kernel<CX, true>), grid, block, 0, stream, *p);
    return MF_LAUNCH((scan_forward_kernel<CX, false>), grid, block, 0, stream, *p);
}

template <bool CX>
static int scan_backward(const MfScanParams *p, cudaStream_t stream) {
    /* delta_bias's gradient goes to ddelta_bias: both or neither */
    if (scan_bad(p, CX) || (p->delta_bias != NULL) != (p->ddelta_bias != NULL))
        return MF_EINVAL;
    ScanScratch w;
    if (p->scratch == NULL || p->scratch_floats < scan_scratch_layout(p, CX, &w))
        return MF_EINVAL;
    const dim3 grid(mf_blocks(p->E, SCAN_EB), (unsigned)p->B), block(SCAN_EC, SCAN_NT);
    const int status =
        p->bbar == MF_BBAR_ZOH
            ? MF_LAUNCH((scan_backward_kernel<CX, true>), grid, block, 0, stream, *p, w)
            : MF_LAUNCH((scan_backward_kernel<CX, false>), grid, block, 0, stream, *p, w);
    if (status != MF_OK) return status;
    const int64_t n = p->B * p->T * (CX ? 2 : 1) * p->K;
    const unsigned rg = mf_blocks(n, 256) < MF_MAX_GRID ? mf_blocks(n, 256) : MF_MAX_GRID;
    return MF_LAUNCH((scan_reduce_kernel<CX>), dim3(rg), dim3(256), 0, stream, *p, w);
}

extern "C" int selective_scan_forward_cuda(const MfScanParams *p, cudaStream_t stream) {
    return scan_forward<false>(p, stream);
}
extern "C" int complex_scan_forward_cuda(const MfScanParams *p, cudaStream_t stream) {
    return scan_forward<true>(p, stream);
}
/* the floats of scratch the backwards need (0: invalid sizes) */
extern "C" int64_t selective_scan_backward_scratch_floats_cuda(const MfScanParams *p) {
    return scan_bad(p, 0) ? 0 : scan_scratch_layout(p, 0, NULL);
}
extern "C" int64_t complex_scan_backward_scratch_floats_cuda(const MfScanParams *p) {
    return scan_bad(p, 1) ? 0 : scan_scratch_layout(p, 1, NULL);
}
extern "C" int selective_scan_backward_cuda(const MfScanParams *p, cudaStream_t stream) {
    return scan_backward<false>(p, stream);
}
extern "C" int complex_scan_backward_cuda(const MfScanParams *p, cudaStream_t stream) {
    return scan_backward<true>(p, stream);
}
