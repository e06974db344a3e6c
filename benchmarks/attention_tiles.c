/* Times one shape of the attention family's kernels (csrc/ops/kernels/attention.h) on its own:
 * compiled by benchmarks/attention_tiles.py once per candidate shape with
 *   -DMF_VW=<8|4|16> -DMF_ATTN_BT=<block> -DMF_ATTN_MR=<rows> -DMF_ATTN_NV=<vectors>
 *   -DMF_ATTN_TABLE=tiles_kernels
 * and the ISA flags of the kernel set being tuned.
 * Usage: attention_tiles B T H D kind repeats threads (kind: 3 plain attention, 0, 1, 2 the
 * conjunctive modes, mapformer.h). Prints one line: the minimum and median milliseconds of the
 * forward and the backward over `repeats` calls, by the wall clock and by the CPU time of the
 * process (all its threads: on a shared machine, one thread's CPU time does not count the
 * time it waited for a core), and checksums of out and of the first gradient (so that a
 * driver can tell that every shape computes the same thing). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../csrc/ops/kernels/attention.h"

static double now(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* n floats, uniform on [-sqrt(3), sqrt(3)) (unit variance) */
static float *rand_like(int64_t n, uint64_t *state) {
    float *x = aligned_alloc(64, (size_t)((n + 15) / 16 * 16) * sizeof(float));
    for (int64_t i = 0; x != NULL && i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)((*state >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f) * 3.4641016f;
    }
    return x;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s B T H D kind repeats threads\n", argv[0]);
        return 2;
    }
    const int64_t B = atoll(argv[1]), T = atoll(argv[2]), H = atoll(argv[3]), D = atoll(argv[4]);
    const int kind = atoi(argv[5]), repeats = atoi(argv[6]), threads = atoi(argv[7]);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    const int64_t n = B * T * H * D, nl = 2 * B * H * T;
    uint64_t state = 1234;
    float *qx = rand_like(n, &state), *kx = rand_like(n, &state), *qp = rand_like(n, &state);
    float *kp = rand_like(n, &state), *v = rand_like(n, &state), *dout = rand_like(n, &state);
    float *out = rand_like(n, &state), *lse = rand_like(nl, &state);
    float *g[5];
    for (int i = 0; i < 5; i++) g[i] = rand_like(n, &state);
    MfAttnJob j;
    mf_attn_job_init(&j, B, T, H, D, 1.0f / sqrtf((float)D), kind);
    j.qx = qx, j.kx = kx, j.qp = qp, j.kp = kp, j.v = v, j.out = out, j.lse = lse;
    j.dout = dout, j.o = out, j.lse_in = lse;
    j.dqx = g[0], j.dkx = g[1], j.dqp = g[2], j.dkp = g[3], j.dv = g[4];
    const int64_t per = mf_attn_slice(tiles_kernels.bwd_floats(&j)) >
                                mf_attn_slice(tiles_kernels.fwd_floats(&j))
                            ? mf_attn_slice(tiles_kernels.bwd_floats(&j))
                            : mf_attn_slice(tiles_kernels.fwd_floats(&j));
    float *scratch = aligned_alloc(64, (size_t)(per * threads) * sizeof(float));
    double *t[4]; /* wall forward, wall backward, CPU forward, CPU backward */
    for (int i = 0; i < 4; i++) t[i] = malloc((size_t)repeats * sizeof(double));
    for (int r = -1; r < repeats; r++) { /* one warm-up call */
        const double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (mf_attn_run(&tiles_kernels, &j, 0, scratch, per * threads) != MF_OK) return 1;
        const double w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (mf_attn_run(&tiles_kernels, &j, 1, scratch, per * threads) != MF_OK) return 1;
        const double w2 = now(CLOCK_MONOTONIC), c2 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (r >= 0) {
            t[0][r] = (w1 - w0) * 1e3;
            t[1][r] = (w2 - w1) * 1e3;
            t[2][r] = (c1 - c0) * 1e3;
            t[3][r] = (c2 - c1) * 1e3;
        }
    }
    double so = 0.0, sg = 0.0;
    for (int64_t i = 0; i < n; i++) {
        so += fabs(out[i]);
        sg += fabs(g[0][i]);
    }
    for (int i = 0; i < 4; i++) qsort(t[i], (size_t)repeats, sizeof(double), cmp);
    printf("fwd_min %.3f fwd_med %.3f bwd_min %.3f bwd_med %.3f fwd_cpu_min %.3f "
           "bwd_cpu_min %.3f out %.6e grad %.6e\n",
           t[0][0], t[0][repeats / 2], t[1][0], t[1][repeats / 2], t[2][0], t[3][0], so, sg);
    return 0;
}
