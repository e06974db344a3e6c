/* The CPU's arithmetic issue rate, the bound a matrix product's flops are judged by:
 * 12 independent chains of v = v m + a per thread in one vector type, so that the loop is
 * limited by how many vector multiply-adds the cores issue per second, not by their latency.
 *   512  AVX-512F FMAs (16 floats; the avx512 kernel set's width)
 *   256  AVX2 FMAs (8 floats; the avx2 set's)
 *   128  SSE multiplies and adds, unfused (4 floats; the portable set's, which x86-64's baseline
 *        compiles without FMA: two instructions per multiply-add)
 * Each rate is in G chain updates per second (one update = `width / 32` multiply-adds, 2 flops
 * each). The includer defines `static double fma_now(void)` (seconds) before including this
 * header. x86-64 only (elsewhere fma_rate answers 0). */
#ifndef MAPFORMER_BENCH_FMA_PEAK_H
#define MAPFORMER_BENCH_FMA_PEAK_H

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define FMA_CHAINS 12
#define FMA_RATE(name, isa, V, SET1, FMADD, ADD, GET0)                                         \
    __attribute__((target(isa))) static double name(int64_t n, float *sink) {                  \
        const V m = SET1(0.999999f), a = SET1(1e-7f);                                          \
        V v0 = SET1(1.00f), v1 = SET1(1.01f), v2 = SET1(1.02f), v3 = SET1(1.03f);              \
        V v4 = SET1(1.04f), v5 = SET1(1.05f), v6 = SET1(1.06f), v7 = SET1(1.07f);              \
        V v8 = SET1(1.08f), v9 = SET1(1.09f), v10 = SET1(1.10f), v11 = SET1(1.11f);            \
        const double t0 = fma_now();                                                           \
        for (int64_t i = 0; i < n; i++) {                                                      \
            v0 = FMADD(v0, m, a), v1 = FMADD(v1, m, a), v2 = FMADD(v2, m, a);                  \
            v3 = FMADD(v3, m, a), v4 = FMADD(v4, m, a), v5 = FMADD(v5, m, a);                  \
            v6 = FMADD(v6, m, a), v7 = FMADD(v7, m, a), v8 = FMADD(v8, m, a);                  \
            v9 = FMADD(v9, m, a), v10 = FMADD(v10, m, a), v11 = FMADD(v11, m, a);              \
        }                                                                                      \
        const double t = fma_now() - t0;                                                       \
        const V s = ADD(ADD(ADD(ADD(v0, v1), ADD(v2, v3)), ADD(ADD(v4, v5), ADD(v6, v7))),     \
                        ADD(ADD(v8, v9), ADD(v10, v11)));                                      \
        *sink += GET0(s);                                                                      \
        return FMA_CHAINS * (double)n / t / 1e9;                                               \
    }
#define FMA_MULADD_128(v, m, a) _mm_add_ps(_mm_mul_ps(v, m), a)
FMA_RATE(fma_rate_512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps,
         _mm512_cvtss_f32)
FMA_RATE(fma_rate_256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps,
         _mm256_cvtss_f32)
FMA_RATE(fma_rate_128, "sse2", __m128, _mm_set1_ps, FMA_MULADD_128, _mm_add_ps, _mm_cvtss_f32)

/* G chain updates per second at `bits` (512, 256 or 128) over n rounds; 0 where this CPU
 * lacks the width */
static double fma_rate_at(int bits, int64_t n, float *sink) {
    __builtin_cpu_init();
    if (bits == 512) return __builtin_cpu_supports("avx512f") ? fma_rate_512(n, sink) : 0.0;
    if (bits == 256)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                   ? fma_rate_256(n, sink) : 0.0;
    if (bits == 128) return fma_rate_128(n, sink);
    return 0.0;
}
#else
static double fma_rate_at(int bits, int64_t n, float *sink) {
    (void)bits, (void)n, (void)sink;
    return 0.0;
}
#endif

#endif
