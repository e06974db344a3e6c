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
 * alone (vsincos of delta_angle * omega): no angle accumulates in float.
 *
 * The step delta_t: delta's row, + delta_bias[e] when given, through softplus with
 * delta_softplus (Mamba's selective_scan_fn: delta_bias, delta_softplus; simd.h's vsoftplus,
 * the bits of softplus_forward), formed in every pass from delta's row (so the block keeps
 * no separate (B, T, E) array of steps); delta_angle NULL (complex scan): the rotation takes
 * the step too. The gradient written to ddelta is delta's: (the step's, plus the rotation's
 * part when it shares the step) times softplus' (vsoftplus's slope, softplus_backward's bits);
 * delta_bias's is its sum over b, t (as dD's).
 *
 * Forward: sequential in t; it writes y and the state at each chunk's last step only
 * (states (B, NC, E, S), NC = ceil(T / chunk)).
 * Backward, per channel, chunks in reverse: the chunk's forward is recomputed from the
 * previous chunk's end state (zero for the first), keeping h_{t-1} of each step in the
 * thread's scratch (with a_t), then the reverse sweep with the adjoint g_t:
 *   g_t   = gy_t c_t + conj(a_{t+1}) g_{t+1}
 *   u_t   = a_t h_{t-1}       (from the stored h_{t-1}: the decay is never divided out)
 *   dz_t  = g_t conj(u_t) + conj(phi'(z_t)) r_t g_t conj(beta_t)
 *   dr_t  = sum_k Re(conj(g_t conj(beta_t)) phi_t),  dbeta_t += conj(r_t phi_t) g_t,
 *   dc_t += gy_t h_t,  dx_t = delta_t dr_t + D gy_t,
 *   ddelta_t = x_t dr_t + sum_k Re(dz) A,  ddelta_angle_t = sum_k Im(dz) omega,
 *   dA += sum_t Re(dz) delta_t,  domega += sum_t Im(dz) delta_angle_t,  dD += sum_t gy x.
 * Memory: O(B E S (T / chunk)) saved + O(threads * chunk * S * MF_VW) scratch (h_{t-1} and
 * a_t of each step of a chunk, ZOH's phi, phi', and the step, its slope and the rotation's
 * step, so the reverse sweep takes the decays, rotations, factors and steps of the recompute
 * instead of evaluating them again), never O(B T E S).
 *
 * Vectorisation: over channels. A group is MF_VW channels of one batch row, one per lane
 * (MF_VW: the kernel set's width, kernels/scan_sets.h: 16 on AVX-512, 8 on other x86-64)
 * (x, delta, dy rows of (B, T, E) are contiguous in e; lanes past E are zero), and each state
 * float is one vector h[j]; B_t[k], C_t[k] are shared by the channels (a broadcast). Per step
 * and state: one vexp2 of delta A log2(e) (lanes: channels; A log2(e) formed once per group)
 * and, for the complex scan, one vsincos of delta_angle omega (simd.h: Cody-Waite reduction
 * and polynomials, about 1 ulp, from this step's angle alone). The forward (Euler) forms each
 * state's decay inside the state loop of the step, the backward's recompute keeps them per
 * step. No horizontal sum except the backward's dB, dC, which are sums over channels: the S
 * vectors of a step are summed lane-wise, MF_VW at a time, by levels of shuffles and adds
 * (kernels/scan.h lanesum_add: the 8-lane tree on every set, so every set gives the same bits).
 * Euler's steps (forward, recompute and reverse sweep) and the decay's exponential use fused
 * multiply-adds (simd.h VFMAF, vexp2_fused: one rounding on every path; the loops are compiled
 * with MF_CLONES_FMA, so x86-64 v3 and v4 run them as vector FMAs, the baseline clone through
 * libm's fmaf, the same bits slowly): at batch 32 of the navigation step they took the real
 * scan's forward from 25.5 to 18 ms and its backward from 48 to 36 (1 thread, CPU time).
 * Speed: the exps bound it. Per (b, t, e, state) the forward does one vexp2 (about 20 vector
 * operations) and 5 more; benchmarks/scan_bound.c measures the forward at about 1.2x the
 * time of its exps alone and the backward (recompute and sweep) at about 2x, that is a few
 * per cent of a large copy's bandwidth: the scan is compute-bound, not memory-bound.
 * The (b, t, e) rows are strided by E, a new page every few steps, which the hardware
 * prefetchers do not follow: they are prefetched SCAN_AHEAD steps ahead, both ends of the
 * group's segment (NumPy's 16-byte aligned rows straddle two cache lines every other group).
 * dA, domega, dD are summed in float over runs of SCAN_RUN steps, the runs in double.
 * ZOH: phi and phi' in float vectors (zoh_factors), from e^{delta A} and expm1(delta A) of one
 * reduction (simd.h vexp_expm1; the decay's modulus comes from it, not from vexp2 as Euler's)
 * and the rotation's sin, cos and 1 - cos (vsincos_vers): e^z - 1 = (expm1(zr) - e^zr (1 -
 * cos zi)) + i e^zr sin zi and e^z - 1 - z (expm1(zr) - zr by series, zi - sin zi by series)
 * have no cancellation, so phi = (e^z - 1) / z holds a few ulps for every z, and phi' = phi -
 * (e^z - 1 - z) / z^2 below |z| = 1, (e^z - phi) / z above (where each is a difference of
 * values of its size); phi = 1 for |z|^2 < 2^-100, phi' = 1 / 2 + z / 3 for |z|^2 < 2^-24 (no
 * 0 / 0 in lanes past E).
 * Error bound (first order, u = 2^-24, exact z with Re z <= 0, where |phi| <= 1, |phi'| <=
 * 1/2): e^zr, expm1(zr) within 1 and 2 u, sin, cos 1 u, 1 - cos zi 3 u, so each of e^z - 1's
 * parts within 4.5 u (|expm1(zr)| + e^zr (1 - cos zi)) and 2.5 u e^zr |sin zi|; with |expm1
 * zr| <= |zr|, 1 - cos zi <= |zi| that is at most 9.75 u |z|^2 in (e^z - 1) conj(z), plus
 * 1.5 u for 1 / |z|^2 and the products: |phi - phi^| <= 12 u per component. phi' (|z| < 1):
 * e^z - 1 - z within 5 u |z|^2 (d, e^zr (1 - cos zi), expm1 sin, zi - sin zi bounded by |z|^2
 * / 2, |z|^2 / 2, |zr zi|, |zi|^3 / 6), 8.3 u after conj(z)^2 / |z|^4, so 21 u with phi's; (|z|
 * >= 1): (e^z within 2.5 u + phi's 12 u) / |z| and the products: 21.5 u. tests/test_scan.py
 * checks 12 u and 22 u against float64 over a grid of z (it measures about 5.5 u for both).
 * The backward's recompute keeps phi and phi' of each step beside h_{t-1} and a_t. Speed (1
 * thread, CPU time, B 16, T 64, E 128, K 8; benchmarks/bench_ops.py's scan family has zoh
 * rows): the complex forward about 1.65x Euler's, its backward 1.9x; the real scan's forward
 * 1.85x, backward 1.9x (phi, phi' lane by lane in double took 21x and 55-65x).
 *
 * Parallel layout: a work item is one batch row b and a block of SCAN_EB channels (a fixed
 * size, so the bits do not depend on the thread count); within it the groups of MF_VW
 * channels run one after the other, each walking t. dB and dC: each item sums its groups
 * into its own (T, S) slice of scratch, and the blocks are summed in a fixed order; dA,
 * domega, dD are summed in double per (b, e) and then over b in a fixed order.
 */
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/cpu.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

/* 8 floats on x86-64 whichever the compiler (clang builds no clones, where MF_CLONES_VW is 4):
 * a group's sums over channels (dB, dC) take the 8-lane tree the avx512 set takes on each half
 * of its lanes, so every kernel set gives the same bits (kernels/scan.h); elsewhere (aarch64:
 * no other set) the clones' width */
#if MF_X86
#define MF_VW 8
#else
#define MF_VW MF_CLONES_VW
#endif
#define MF_SCAN_TARGET MF_CLONES_FMA
#define MF_SCAN_TABLE mf_scan_clones
#include "kernels/scan.h"

#define SCAN_MIN_PARALLEL 65536 /* B*T*E*S below this runs on one thread */

static int bad_params(const MfScanParams *p, int cx) {
    const int64_t S = cx ? 2 * p->K : p->K;
    return p->B < 1 || p->T < 1 || p->E < 1 || p->K < 1 || S > SCAN_MAXS || p->chunk < 1 ||
           (p->bbar != MF_BBAR_EULER && p->bbar != MF_BBAR_ZOH) ||
           (p->delta_softplus != 0 && p->delta_softplus != 1);
}

/* p with chunk at most T: a longer chunk is one chunk of T steps (the same bits), so it is
 * clamped before any arithmetic on it (ceil(T / chunk) and the scratch sizes cannot wrap for
 * any int64 chunk) */
static MfScanParams clamped(const MfScanParams *p) {
    MfScanParams q = *p;
    if (q.chunk > q.T) q.chunk = q.T;
    return q;
}

static int scan_forward(const MfScanParams *params, int cx) {
    if (bad_params(params, cx)) return MF_EINVAL;
    const MfScanParams clamp = clamped(params), *p = &clamp;
    const int64_t T = p->T, E = p->E, S = cx ? 2 * p->K : p->K;
    const int64_t nblk = (E + SCAN_EB - 1) / SCAN_EB;
    const MfScanKernels *ks = mf_scan_kernels(mf_kernels());
    const int64_t vw = ks->vw;
#pragma omp parallel for schedule(dynamic, 1) if (p->B * T * E * S >= SCAN_MIN_PARALLEL)
    for (int64_t it = 0; it < p->B * nblk; it++) {
        const int64_t b = it / nblk, e1 = (it % nblk) * SCAN_EB + SCAN_EB;
        for (int64_t e0 = (it % nblk) * SCAN_EB; e0 < e1 && e0 < E; e0 += vw)
            ks->forward(p, cx, b, e0, E - e0 < vw ? E - e0 : vw);
    }
    return MF_OK;
}

/* scratch of the backward (p's chunk clamped to T): per thread chunk * scan_step_vectors
 * vectors of the widest set
 * (h_{t-1}, a_t, ZOH's phi and phi', the step, its slope and the rotation's step of each
 * step of a chunk); dB, dC
 * partials (B, nblk, T, S) each; dA, domega partials (B, E, K) doubles each; dD and
 * delta_bias's partials (B, E) doubles each */
static int64_t per_thread(const MfScanParams *p, int cx) {
    const int64_t S = cx ? 2 * p->K : p->K;
    return mf_scratch_size(p->chunk * scan_step_vectors(S, p->bbar) * SCAN_MAXVW);
}

static int64_t shared_floats(const MfScanParams *p, int cx) {
    const int64_t S = cx ? 2 * p->K : p->K, nblk = (p->E + SCAN_EB - 1) / SCAN_EB;
    return 2 * mf_scratch_size(p->B * nblk * p->T * S) +
           2 * mf_scratch_size(2 * p->B * p->E * p->K) +
           2 * mf_scratch_size(2 * p->B * p->E);
}

static int64_t scan_backward_scratch(const MfScanParams *params, int cx) {
    if (bad_params(params, cx)) return 0;
    const MfScanParams p = clamped(params);
    return shared_floats(&p, cx) + mf_max_threads() * per_thread(&p, cx);
}

static int scan_backward(const MfScanParams *params, int cx) {
    if (bad_params(params, cx) || (params->delta_bias != NULL) != (params->ddelta_bias != NULL))
        return MF_EINVAL;
    const MfScanParams clamp = clamped(params), *p = &clamp;
    const int64_t B = p->B, T = p->T, E = p->E, K = p->K, S = cx ? 2 * K : K;
    const int64_t nblk = (E + SCAN_EB - 1) / SCAN_EB;
    const int64_t shared = shared_floats(p, cx);
    const int threads = mf_scratch_threads(p->scratch_floats - shared, per_thread(p, cx));
    if (p->scratch_floats < shared || threads < 1) return MF_EINVAL;
    float *at = p->scratch;
    float *pB = mf_scratch_take(&at, B * nblk * T * S);
    float *pC = mf_scratch_take(&at, B * nblk * T * S);
    double *pA = (double *)mf_scratch_take(&at, 2 * B * E * K);
    double *pW = (double *)mf_scratch_take(&at, 2 * B * E * K);
    double *pD = (double *)mf_scratch_take(&at, 2 * B * E);
    double *pS = (double *)mf_scratch_take(&at, 2 * B * E);
    float *bufs = at;
    const MfScanKernels *ks = mf_scan_kernels(mf_kernels());
    const int64_t vw = ks->vw;
#pragma omp parallel num_threads(threads) if (B * T * E * S >= SCAN_MIN_PARALLEL)
    {
        float *buf = bufs + mf_thread_id() * per_thread(p, cx);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * nblk; it++) {
            const int64_t b = it / nblk, e1 = (it % nblk) * SCAN_EB + SCAN_EB;
            float *dBm = pB + it * T * S, *dCm = pC + it * T * S;
            for (int64_t i = 0; i < T * S; i++) dBm[i] = dCm[i] = 0.0f;
            for (int64_t e0 = (it % nblk) * SCAN_EB; e0 < e1 && e0 < E; e0 += vw) {
                const int64_t o = b * T * E + e0;
                const GroupGrad g = {.dx = p->dx + o, .ddelta = p->ddelta + o,
                                     .ddangle = cx && p->delta_angle ? p->ddelta_angle + o
                                                                     : NULL,
                                     .dBm = dBm, .dCm = dCm, .dA = pA + (b * E + e0) * K,
                                     .dW = pW + (b * E + e0) * K, .dD = pD + b * E + e0,
                                     .dS = pS + b * E + e0, .buf = buf};
                ks->backward(p, cx, b, e0, E - e0 < vw ? E - e0 : vw, &g);
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
            double s = 0.0, sb = 0.0;
            for (int64_t b = 0; b < B; b++) s += pD[b * E + e], sb += pS[b * E + e];
            p->dD[e] = (float)((double)p->dD[e] + s);
            if (p->ddelta_bias) p->ddelta_bias[e] = (float)((double)p->ddelta_bias[e] + sb);
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
