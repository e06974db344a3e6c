/* MapEM-NC positions (MapFormer eq. 20, appendix 10.4.2): non-commutative path integration on
 * 4x4 blocks, p_t = exp(S_t) exp(S_{t-1}) ... exp(S_1) p*, an ordered product.
 *
 * Each step generator is S_t = L(u_t) + R(v_t) (so(4) split into left and right quaternion
 * multiplications, which commute), so exp(S_t) q = a_t q c_t with a_t = qexp(u_t),
 * c_t = qexp(v_t): the forward carries p_t = a_t p_{t-1} c_t (p_0 = p*), two quaternion
 * products a step instead of a 4x4 matrix product, renormalised to |p*| every step by one
 * Newton step for the inverse norm, q (3 - |q|^2 / |p*|^2) / 2, p_{t-1}'s factor applied to
 * p_t (vq_renorm_factor; no square root or division on the sequential chain; a relative
 * error e of the squared norm becomes about e^2, so the norm stays within a few ulp of |p*|
 * at any length). Equivalently p_t = A_t p* C_t with the prefix products A_t = a_t A_{t-1},
 * C_t = C_{t-1} c_t (A_0 = C_0 = 1).
 * The caller supplies (u_t, v_t) per token and block: with K = 6 generators (a basis of so(4))
 * the paper's theta_t -> sum_i theta_t,i S_i composed with a linear map or an MLP of the token
 * is the same function class as a linear map or an MLP straight to (u_t, v_t).
 *
 * The product is associative, so a log-depth parallel scan over t exists (the paper says it
 * can only be computed sequentially); on a CPU with B * H * NB independent chains per call the
 * sequential loop over t is the cheaper one, and that is what this op runs.
 *
 * Backward (g_t = dp_t). With the body-frame sums E_t = sum_{tau >= t} conj(A_tau) g_tau
 * conj(C_tau), dp* += E_1 and dw_t = J(u_t)^T da_t, J(v_t)^T dc_t, J the Jacobian of qexp
 * taken through the trivialised derivative: only the rotated 3-vectors
 *   Z_t = vec(A_{t-1} E_t conj(p*) conj(A_{t-1})) (= conj(a_t) da_t),
 *   W_t = vec(conj(C_{t-1}) conj(p*) E_t C_{t-1}) (= dc_t conj(c_t))
 * enter. They obey reverse-time recursions with no prefix product in them (unit a, c):
 *   Z_t = conj(a_t) (Z_{t+1} + vec(g_t conj(p_t))) a_t,
 *   W_t = c_t (W_{t+1} + vec(conj(p_t) g_t)) conj(c_t)
 * and the transposed trivialised derivative of the rotated vector composes with the rotation
 * into one map of the same form: for y = Z_{t+1} + vec(g_t conj(p_t)) and a = (cos n, sinc n u),
 *   dw_u = sinc cos y + k (u.y) u + sinc^2 y x u,   Z_t = (1 - 2 sinc^2 n^2) y + 2 sinc^2 (u.y) u
 *          + 2 sinc cos y x u  (k = (1 - sinc cos) / n^2; for v: v x y in place of y x u),
 * so a step of each side shares one dot and one cross product between its gradient and its
 * rotation (side_step). p* enters linearly: the backward runs the chain from
 * phat = p* / |p*| (1 where |p*|^2 <= 1e-30) and scales dw's coefficients by |p*|; the scalar
 * part of Z's quaternion is sig_t = sum_{tau >= t} g_tau . phat_tau (rotations keep it), and
 * E_1 = (sig_1, Z_1) phat, exact for p* = 0 too. The backward first runs the chain of phat_t
 * again, forward in t (one pair of quaternion products a step, renormalised as the forward),
 * reading g_t beside w_t, and keeps w_t and the step's adjoint inputs vec(g_t conj(phat_t)),
 * vec(conj(phat_t) g_t) (as lanes) for every step in the thread's scratch (NC_SAVED = 12
 * vectors a step and group: 384 KB per thread at T = 256, 16 lanes and a span of 2 groups;
 * sig_1 summed forward in t), then sweeps t in reverse over the scratch alone, taking each
 * step's qexp again with the Jacobian's k, and writes dw. Both input streams are read in
 * increasing address order (measured a few percent faster than reading dp in the sweep).
 * Keeping the 12 coefficient vectors of the steps' qexp instead (24 vectors a step) measured
 * slower: nothing is recovered by inverting steps. (Carrying A_t, C_t and E_t instead costs
 * two quaternion products more a step: 11.9 ms against 10.0 ms for the backward at B 128,
 * T 256, H 2, NB 16, one thread.) Pass 1 waits on memory: its software prefetches hold about
 * a third of the backward's profile samples, yet without them the backward is about 20%
 * slower (4.9 against 4.0 ms, same sizes, on a shared 2-core AVX-512 Xeon whose timings vary
 * by 20%). Measured there and not kept: fetching the next work item's rows of w and dp into
 * the second-level cache during pass 2 (which reads no input): slower (4.5 against 4.1 ms,
 * best of 25); re-reading w_t in pass 2 (from the cache: 6 saved vectors instead of 12), or
 * saving pass 1's qexp coefficients (sinc, cos, k and |w|^2 a side: 20 vectors, no qexp in
 * pass 2): no faster.
 *
 * Layout: feature-major within a head. w is (B, T, H, 6, NB): w[b, t, h, f, k] is coordinate
 * f of block k's (u, v); p, dp, p* and dp* are (..., H, D) with component f of block k's
 * quaternion at f NB + k. A feature of consecutive blocks of a head is then one contiguous
 * run, a vector load (block-major rows, 6 or 4 floats a block, took 18 or 8 permutes per 16
 * blocks to turn into lanes: about a quarter of the forward's instructions; measured at B 128,
 * T 256, H 2, NB 16, one thread, forward + backward 7.1 -> 5.9 ms).
 *
 * Vectorisation (mapformer/simd.h; the group kernels are kernels/nc.h, compiled per width):
 * a group is up to W consecutive blocks k of one head h of a batch row, one per lane (ceil(NB
 * / W) groups a head, the last partial when W does not divide NB); every quaternion is 4
 * vectors, w_t 6, each loaded or stored whole (a partial group float by float). W is 16 when
 * the active kernel set is AVX-512 (x86/nc_avx512.c: zmm registers), else MF_CLONES_VW (this
 * file's target_clones copies); every width gives the same bits (elementwise float32
 * operations, no contraction). The outputs p and dw, when large, are written by non-temporal
 * stores on the 16-lane kernels (NC_STREAM_MIN_BYTES). A kernel call runs a span of
 * NC_SPAN = 2 groups in lockstep: the span's part of each (b, t) row is contiguous (the whole
 * row at H 2, NB 16 and 16 lanes), and its chains are independent work in the sequential
 * loops.
 * All in float32, with fused multiply-adds (one rounding on every width and target: simd.h's
 * VFMAF, MF_CLONES_FMA clones). qexp per step: below |w| = 1.5 the Taylor series of cos, sinc
 * (and the Jacobian's k) in |w|^2, Horner, no square root, reduction or division; a group with a larger
 * step also takes a vector sqrt, vsincos (Cody-Waite reduction and polynomials, about 1 ulp;
 * |w| below 2^22) and a division for those lanes. The qexp of a chunk of steps (independent
 * over t) come first, then the chunk's products, the only sequential dependence (2 quaternion
 * products, each component's four products one chain of a product and three fused
 * multiply-adds, and a renormalisation a step).
 *
 * Parallel layout: a work item is (batch row b, span); the lanes do not interact, so a
 * block's bits do not depend on its group or thread. dp*: each item writes its E_1 to scratch,
 * summed over b in a fixed order (in double) after the items: same bits for any thread count.
 */
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/cpu.h"
#include "mapformer/mapformer.h"
#include "mapformer/scratch.h"
#include "mapformer/threads.h"

#define MF_VW MF_CLONES_VW
#define NC_SUFFIX clones
#define NC_ATTR MF_CLONES_FMA
#include "kernels/nc.h"

#define NC_MIN_PARALLEL 8192 /* B*T*H*NB below this runs on one thread */

static int nc_check(const MfNcParams *p) {
    if (p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 4 * p->NB || p->F != 6)
        return MF_EINVAL;
    return MF_OK;
}

/* the span kernels of the active kernel set: 16 lanes on AVX-512, else the clones' width */
typedef struct {
    int64_t vw;
    void (*forward)(const MfNcParams *, const NcShape *, int64_t, int64_t);
    void (*backward)(const MfNcParams *, const NcShape *, int64_t, int64_t, float *, float *);
} Kernels;

static Kernels kernels_of(int set) {
#if MF_X86
    if (set == MF_KERNELS_AVX512)
        return (Kernels){16, nc_forward_span_avx512, nc_backward_span_avx512};
#endif
    (void)set;
    return (Kernels){MF_VW, nc_forward_span_clones, nc_backward_span_clones};
}

/* Outputs of at least this many bytes are written by non-temporal stores on the 16-lane
 * kernels, and their rows are not prefetched for writing: a cached store first reads the line
 * it overwrites, and an output this large (p and dw of a training batch: 17 and 25 MB at
 * B 128, T 256, H 2, D 64) leaves the core's caches before it is read anyway. Measured at
 * that size, one thread, on a shared AVX-512 Xeon: forward + backward 10.9 -> 8.7 ms (with
 * the next reader's pass over p and dw counted: 17.4 -> 15.4 ms); at B 8 and 32 (1-6 MB) the
 * same time either way. */
#define NC_STREAM_MIN_BYTES ((int64_t)4 << 20)

/* whether out (F floats a block) takes non-temporal stores: the 16-lane kernels, NB a
 * multiple of 16 (every group whole, each feature's 16 lanes 64 bytes from a multiple of 64
 * bytes) and out 64-byte aligned */
static int streams(const float *out, int64_t F, const MfNcParams *p, int64_t vw) {
    const int64_t bytes = p->B * p->T * p->H * p->NB * F * 4;
    return vw == 16 && (uintptr_t)out % 64 == 0 && p->NB % 16 == 0 &&
           bytes >= NC_STREAM_MIN_BYTES;
}

static NcShape shape_of(const MfNcParams *p, int64_t vw) {
    NcShape s;
    s.T = p->T;
    s.NB = p->NB;
    s.nblk = p->H * p->NB;
    s.gph = (p->NB + vw - 1) / vw;
    s.ngroups = p->H * s.gph;
    s.nspans = (s.ngroups + NC_SPAN - 1) / NC_SPAN;
    s.stream = 0;
    return s;
}

int nc_forward(const MfNcParams *p) {
    if (!p || !p->p || !p->w || !p->start) return MF_EINVAL;
    const int ok = nc_check(p);
    if (ok != MF_OK) return ok;
    const Kernels k = kernels_of(mf_kernels());
    NcShape sh = shape_of(p, k.vw);
    sh.stream = streams(p->p, 4, p, k.vw);
#pragma omp parallel for schedule(dynamic, 1) if (p->B * sh.T * sh.nblk >= NC_MIN_PARALLEL)
    for (int64_t it = 0; it < p->B * sh.nspans; it++)
        k.forward(p, &sh, it / sh.nspans, it % sh.nspans * NC_SPAN);
    return MF_OK;
}

/* scratch of the backward: per thread T * NC_SPAN * NC_SAVED vectors; the dp* partials, 4
 * vectors per (b, group), H ceil(NB / width) groups a row; at the widest width (the most
 * lanes: a multiple of 16 is a multiple of every width), so that a change of the active set
 * between this count and the call is harmless */
#define NC_MAX_VW 16

static int64_t per_thread(const MfNcParams *p) {
    return mf_scratch_size(p->T * NC_SPAN * NC_SAVED * NC_MAX_VW);
}

static int64_t shared_floats(const MfNcParams *p) {
    return mf_scratch_size(p->B * p->H * ((p->NB + NC_MAX_VW - 1) / NC_MAX_VW * NC_MAX_VW) * 4);
}

int64_t nc_backward_scratch_floats(const MfNcParams *p) {
    if (!p || nc_check(p) != MF_OK) return 0;
    return shared_floats(p) + mf_max_threads() * per_thread(p);
}

int nc_backward(const MfNcParams *p) {
    if (!p || !p->dp || !p->w || !p->start || !p->dw || !p->dstart) return MF_EINVAL;
    const int ok = nc_check(p);
    if (ok != MF_OK) return ok;
    const Kernels k = kernels_of(mf_kernels());
    NcShape sh = shape_of(p, k.vw);
    sh.stream = streams(p->dw, 6, p, k.vw);
    const int64_t B = p->B, shared = shared_floats(p), vw = k.vw;
    const int threads = mf_scratch_threads(p->scratch_floats - shared, per_thread(p));
    if (B * sh.T * sh.nblk == 0) return MF_OK;
    if (!p->scratch || p->scratch_floats < shared || threads < 1) return MF_EINVAL;
    float *parts = p->scratch, *bufs = p->scratch + shared;
#pragma omp parallel num_threads(threads) if (B * sh.T * sh.nblk >= NC_MIN_PARALLEL)
    {
        float *buf = bufs + mf_thread_id() * per_thread(p);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < B * sh.nspans; it++) {
            const int64_t b = it / sh.nspans, span = it % sh.nspans;
            k.backward(p, &sh, b, span * NC_SPAN, buf,
                       parts + (b * sh.ngroups + span * NC_SPAN) * 4 * vw);
        }
    }
    /* dp* += sum over b of E_1, in b's order; block k of head h is lane k % vw of group
     * h gph + k / vw, its feature f at dp*[h, f NB + k] */
    for (int64_t j = 0; j < sh.nblk; j++) {
        const int64_t h = j / p->NB, kb = j % p->NB, g = h * sh.gph + kb / vw, l = kb % vw;
        for (int f = 0; f < 4; f++) {
            double sum = 0.0;
            for (int64_t b = 0; b < B; b++)
                sum += parts[((b * sh.ngroups + g) * 4 + f) * vw + l];
            float *d = p->dstart + (4 * h + f) * p->NB + kb;
            *d = (float)((double)*d + sum);
        }
    }
    return MF_OK;
}
