/* The selective scans (csrc/ops/scan.c, included here: the same code as the library's) against
 * the two bounds their speed can be judged by, in one process and one run:
 *   copy   a large memcpy (bytes read + written, as bench_ops.py's scan family counts it);
 *   exp    the forward's irreducible arithmetic alone: per (b, t, e, state) one vexp2 of
 *          delta A log2(e) (and, for the complex scan, one vsincos of delta_angle omega), the
 *          functions of mapformer/simd.h the scan calls, summed so that none is optimised out;
 *   fma    the CPU's issue rate (x86-64; benchmarks/fma_peak.h): vector FMAs per second at
 *          the widest width it has (512-bit with AVX-512F, else 256-bit), 12 independent
 *          chains, so that a loop's count of vector operations (objdump -d) converts to its
 *          least time.
 * The scan's bytes are bench_ops.py's (compulsory traffic, 4 B per float):
 *   forward 4 (3M + 2P + Q), complex 4 (4M + 2P + Q); backward 4 (5M + 4P + Q), complex
 *   4 (7M + 4P + Q), with M = B T E, P = B T N, Q = the saved chunk states.
 * Inputs are malloc'd (16-byte aligned, as NumPy's arrays are), filled like bench_ops.py's
 * (delta a softplus of about 0.05, A = -(1..K), omega geometric from 2 pi).
 *
 * Build and run from the repository root (1 thread; the figures are process CPU time, the
 * median of `repeats` calls, so that on a shared machine the time a thread waited for a core
 * is not counted). -fwrapv is in the flags because setup.py's builds get it from Python's
 * own CFLAGS, and it changes the vectoriser's choices (once, the library's scan backward
 * 1.65x slower than this program's without it):
 *   F="-std=c11 -O3 -fwrapv -fopenmp -ffp-contract=off -fno-math-errno -Icsrc/include"
 *   gcc $F -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma \
 *       -c csrc/ops/x86/scan_avx512.c -o /tmp/scan_avx512.o
 *   gcc $F benchmarks/scan_bound.c csrc/ops/cpu.c /tmp/scan_avx512.o -o /tmp/scan_bound -lm
 * (x86-64; the scans run on the CPU's kernel set, kernels/scan_sets.h: 16 channels per
 * vector on AVX-512, where the exp figure, taken at scan.c's own width of 8, is no bound)
 *   OMP_NUM_THREADS=1 /tmp/scan_bound 128 256 256 16 real 5
 *   OMP_NUM_THREADS=1 /tmp/scan_bound 128 256 256 16 complex 5
 * Usage: scan_bound B T E N real|complex repeats [kernels] (N state floats per channel;
 * kernels: a kernel set's name, avx2 say, to time that set's scans instead of the CPU's best,
 * as _C.set_kernels does). Prints one
 * JSON line: ms and GB/s of the copy, the forward, the backward and the exp work, the scans'
 * fractions of the copy's GB/s, the fraction the forward would reach at the exp bound, and the
 * FMA rate (fma_bits 0 where it is not measured). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../csrc/ops/scan.c"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* uniform on [-1, 1) */
static float uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 40) / 8388608.0 - 1.0);
}

static float *floats(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) p[i] = uniform();
    return p;
}

/* the forward's exps (and sincos) alone, over the same deltas and rates */
MF_CLONES
static float exp_work(const float *delta, const float *dangle, const float *A, const float *W,
                      int64_t BT, int64_t E, int64_t K, int cx) {
    vf acc = VZERO;
    for (int64_t i = 0; i < BT; i++) {
        for (int64_t e0 = 0; e0 + MF_VW <= E; e0 += MF_VW) {
            const vf dt = VLOADU(delta + i * E + e0);
            const vf ang = cx ? (vf)VLOADU(dangle + i * E + e0) : VZERO;
            for (int64_t k = 0; k < K; k++) {
                vf z = dt * (A[k] * MF_LOG2E);
                vexp2(&z);
                if (cx) {
                    vf th = ang * W[k], s, c;
                    vsincos(&th, &s, &c);
                    z = z * c + s;
                }
                acc += z;
            }
        }
    }
    return vhsum(&acc);
}

static double fma_now(void) { return cpu_now(); }

#include "fma_peak.h"

/* *bits = the widest FMA width measured (0 without FMA); the rate in G vector FMAs per
 * second */
static double fma_rate(int *bits, float *sink) {
    const int64_t n = 100000000;
    double rate = fma_rate_at(512, n, sink);
    if (rate > 0.0) return *bits = 512, rate;
    rate = fma_rate_at(256, n, sink);
    return *bits = rate > 0.0 ? 256 : 0, rate;
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp);
    return t[n / 2];
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: scan_bound B T E N real|complex repeats [kernels]\n");
        return 2;
    }
    if (argc == 8 && mf_set_kernels(mf_kernels_from_name(argv[7])) != MF_OK) {
        fprintf(stderr, "kernel set %s unknown or not supported by this CPU\n", argv[7]);
        return 2;
    }
    const int64_t B = atoll(argv[1]), T = atoll(argv[2]), E = atoll(argv[3]), N = atoll(argv[4]);
    const int cx = strcmp(argv[5], "complex") == 0, reps = atoi(argv[6]);
    if (B < 1 || T < 1 || E < MF_VW || N < 1 || (cx && N % 2) || reps < 1 || reps > 100) {
        fprintf(stderr, "bad sizes\n");
        return 2;
    }
    const int64_t K = cx ? N / 2 : N, chunk = 256, NC = (T + chunk - 1) / chunk, M = B * T * E;
    float *x = floats(M), *delta = floats(M), *dangle = floats(M), *dy = floats(M);
    float *Bm = floats(B * T * N), *Cm = floats(B * T * N), *D = floats(E);
    float *A = floats(E * K), *W = floats(E * K), *dA = floats(E * K), *dW = floats(E * K);
    float *dD = floats(E), *y = floats(M), *dx = floats(M), *ddelta = floats(M);
    float *ddangle = floats(M), *dBm = floats(B * T * N), *dCm = floats(B * T * N);
    float *states = floats(B * NC * E * N);
    for (int64_t i = 0; i < M; i++) delta[i] = log1pf(expf(delta[i] - 3.0f)); /* ~0.05 */
    for (int64_t e = 0; e < E; e++)
        for (int64_t k = 0; k < K; k++) {
            A[e * K + k] = -(float)(k + 1);
            W[e * K + k] = 6.2831853f * powf(1.0f / 64, (float)k / (float)(K > 1 ? K - 1 : 1));
        }
    MfScanParams p = {.y = y, .states = states, .dx = dx, .ddelta = ddelta,
                      .ddelta_angle = ddangle, .dBm = dBm, .dCm = dCm, .dA = dA,
                      .domega = dW, .dD = dD, .dy = dy, .states_in = states, .x = x,
                      .delta = delta, .delta_angle = dangle, .A = A, .omega = W, .Bm = Bm,
                      .Cm = Cm, .D = D, .B = B, .T = T, .E = E, .K = K, .chunk = chunk,
                      .bbar = MF_BBAR_EULER};
    const int64_t nscratch = cx ? complex_scan_backward_scratch_floats(&p)
                                : selective_scan_backward_scratch_floats(&p);
    p.scratch = aligned_alloc(64, (size_t)mf_scratch_size(nscratch) * sizeof(float));
    p.scratch_floats = nscratch;
    const size_t copy_bytes = (size_t)256 << 20;
    char *src = malloc(copy_bytes), *dst = malloc(copy_bytes);
    if (p.scratch == NULL || src == NULL || dst == NULL) return 1;
    memset(src, 1, copy_bytes);
    memset(dst, 0, copy_bytes);
    double tc[100], tf[100], tb[100], te[100];
    float sink = 0.0f;
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
        double t0 = cpu_now();
        memcpy(dst, src, copy_bytes);
        double t1 = cpu_now();
        const int fw = cx ? complex_scan_forward(&p) : selective_scan_forward(&p);
        double t2 = cpu_now();
        const int bw = cx ? complex_scan_backward(&p) : selective_scan_backward(&p);
        double t3 = cpu_now();
        sink += exp_work(delta, dangle, A, W, B * T, E, K, cx) + (float)dst[r + 1];
        double t4 = cpu_now();
        if (fw != MF_OK || bw != MF_OK) return 1;
        if (r >= 0) tc[r] = t1 - t0, tf[r] = t2 - t1, tb[r] = t3 - t2, te[r] = t4 - t3;
    }
    int fma_bits;
    const double fma_gops = fma_rate(&fma_bits, &sink);
    const double c = median(tc, reps), f = median(tf, reps), b = median(tb, reps),
                 e = median(te, reps);
    const double P = (double)(B * T * N), Q = (double)(B * NC * E * N), Md = (double)M;
    const double fwd_bytes = 4.0 * ((cx ? 4 : 3) * Md + 2 * P + Q);
    const double bwd_bytes = 4.0 * ((cx ? 7 : 5) * Md + 4 * P + Q);
    const double copy_gbps = 2.0 * (double)copy_bytes / c / 1e9;
    printf("{\"bench\": \"scan_bound\", \"kernels\": \"%s\", \"scan\": \"%s\", \"B\": %lld, \"T\": %lld, \"E\": %lld, "
           "\"N\": %lld, \"repeats\": %d, \"copy_gbps\": %.2f, \"forward_ms\": %.2f, "
           "\"backward_ms\": %.2f, \"exp_ms\": %.2f, \"forward_gbps\": %.3f, "
           "\"backward_gbps\": %.3f, \"forward_fraction_of_copy\": %.4f, "
           "\"backward_fraction_of_copy\": %.4f, \"forward_over_exp\": %.2f, "
           "\"backward_over_exp\": %.2f, \"forward_fraction_of_copy_at_exp_bound\": %.4f, "
           "\"fma_bits\": %d, \"fma_gops\": %.2f, \"sink\": %g}\n",
           mf_kernels_name(mf_kernels()), cx ? "complex" : "real", (long long)B, (long long)T, (long long)E, (long long)N, reps,
           copy_gbps, f * 1e3, b * 1e3, e * 1e3, fwd_bytes / f / 1e9, bwd_bytes / b / 1e9,
           fwd_bytes / f / 1e9 / copy_gbps, bwd_bytes / b / 1e9 / copy_gbps, f / e, b / e,
           fwd_bytes / e / 1e9 / copy_gbps, fma_bits, fma_gops, (double)sink);
    return 0;
}
