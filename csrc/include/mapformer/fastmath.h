/* Fast float exp shared by the elementwise ops (static inline: each file's target_clones
 * copies inline it and compile it for their ISA). */
#ifndef MAPFORMER_FASTMATH_H
#define MAPFORMER_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* exp(z) for z clamped to [-87, 88], so results stay normal floats (a NaN z comes out
 * finite: callers keep NaN through their other factors of x). The clamp compares the float's
 * bits as integers: a float clamp here lets GCC's PRE split the loop into branches that it then
 * refuses to if-convert (floating ops may trap), which stops vectorisation. Round-to-nearest
 * n = z log2(e) by the 1.5 * 2^23 trick, r = z - n ln2 in two parts, exp(r) by Cephes'
 * polynomial, 2^n from the exponent bits. */
#if defined(__GNUC__)
__attribute__((always_inline)) /* inlined into each clone, so compiled for its ISA */
#endif
static inline float mf_expf(float z) {
    uint32_t zu;
    memcpy(&zu, &z, sizeof zu);
    int32_t zi = (int32_t)zu;
    zi = zi > 0x42B00000 ? 0x42B00000 : zi; /* z > 88 (as signed ints, negatives stay below) */
    zu = (uint32_t)zi;
    zu = zu > 0xC2AE0000u ? 0xC2AE0000u : zu; /* z < -87 (negatives sort above as unsigned) */
    memcpy(&z, &zu, sizeof z);
    const float shift = 12582912.0f; /* 1.5 * 2^23 */
    float t = z * 1.44269504088896341f + shift;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    float n = t - shift;
    float r = z - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* the low mantissa bits of t hold n (two's complement, |n| <= 127) */
    int32_t e = (int32_t)((uint32_t)(ti - 0x4B400000 + 127) << 23);
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

#endif
