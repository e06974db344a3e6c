/* The machine's multiply-add peak per vector width (benchmarks/fma_peak.h), on every OpenMP
 * thread at once: what bench_train_step.py judges a step's matrix flops by.
 *
 * Build and run (bench_train_step.py does this itself, into a temporary folder):
 *   gcc -std=c11 -O2 -fopenmp benchmarks/fma_peak.c -o /tmp/fma_peak
 *   OMP_NUM_THREADS=2 /tmp/fma_peak
 * Prints one JSON line: the threads, and per width (512, 256, 128) the GFLOP/s of all threads
 * together (each thread's rate from its own wall clock, summed; best of `repeats`, 5 by
 * default), 0 where the CPU lacks the width. A multiply-add is 2 flops: an update of a 512-bit
 * chain is 32. */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double fma_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#include "fma_peak.h"

int main(int argc, char **argv) {
    const int repeats = argc > 1 ? atoi(argv[1]) : 5;
    if (argc > 2 || repeats < 1 || repeats > 1000) {
        fprintf(stderr, "usage: fma_peak [repeats]\n");
        return 2;
    }
    const int widths[3] = {512, 256, 128};
    const int64_t rounds = 50000000;
    double gflops[3] = {0, 0, 0};
    float sink = 0.0f;
    int threads = 1;
    for (int w = 0; w < 3; w++) {
        for (int r = 0; r < repeats; r++) {
            double total = 0.0;
#pragma omp parallel reduction(+ : total, sink)
            {
#pragma omp single
                threads = omp_get_num_threads();
                float s = 0.0f;
#pragma omp barrier
                total += fma_rate_at(widths[w], rounds, &s) * (widths[w] / 32) * 2.0;
                sink += s;
            }
            if (total > gflops[w]) gflops[w] = total;
        }
    }
    printf("{\"bench\": \"fma_peak\", \"threads\": %d, \"repeats\": %d, "
           "\"gflops\": {\"512\": %.1f, \"256\": %.1f, \"128\": %.1f}, \"sink\": %g}\n",
           threads, repeats, gflops[0], gflops[1], gflops[2], (double)sink);
    return 0;
}
