/* The one vector dialect of the C core: GCC/clang vector extensions over MF_VW floats.
 *
 * A file that includes this header first defines MF_VW, the vector width in floats: 16 in the
 * AVX-512 kernel files (csrc/ops/x86/<family>_avx512.c, compiled with -mavx512f ...), 8 in the
 * AVX2 ones (x86/<family>_avx2.c, -mavx2 -mfma), 4 in the portable ones (csrc/ops/portable/,
 * baseline flags: SSE2 on x86-64, NEON on aarch64). The elementwise ops, compiled as
 * target_clones copies (mapformer/clones.h), use MF_CLONES_VW: 8 on x86-64 (GCC lowers the
 * comparisons of vectors wider than a clone's registers lane by lane), 4 elsewhere. It
 * defaults to 16.
 * Kernels are written once over this header, with the width and their tile shapes as
 * parameters, and compiled once per width.
 *
 * Arithmetic is plain C on the vector types (+ - * /, comparisons give vi masks). The whole
 * core compiles with -ffp-contract=off, so a * b + c is two roundings everywhere, and the
 * only fused multiply-adds are the explicit VFMA of the product loops (one rounding where the
 * target has FMA, two where it does not): a result never depends on what a compiler chose to
 * contract. Functions take and return vectors through pointers (a function passing a 64-byte
 * vector by value draws -Wpsabi notes where the target lacks AVX-512); tiny ones are macros.
 */
#ifndef MAPFORMER_SIMD_H
#define MAPFORMER_SIMD_H

#include <stdint.h>
#include <string.h>

#ifndef MF_VW
#define MF_VW 16
#endif
#if MF_VW != 4 && MF_VW != 8 && MF_VW != 16
#error "MF_VW must be 4, 8 or 16"
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

/* vf: MF_VW floats, aligned to its size (scratch); vfu: the same at any float address;
 * vi: the lane masks of comparisons (all ones or zero) and integer lanes. */
typedef float vf __attribute__((vector_size(4 * MF_VW)));
typedef float vfu __attribute__((vector_size(4 * MF_VW), __may_alias__, aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * MF_VW)));

#define MF_INLINE static inline __attribute__((always_inline))

#define VSPLAT(x) ((float)(x) - (vf){0})
#define ISPLAT(x) ((int32_t)(x) + (vi){0})
#define VZERO ((vf){0})
#define VLOAD(p) (*(const vf *)(p))     /* aligned to 4 * MF_VW bytes (scratch) */
#define VLOADU(p) (*(const vfu *)(p))   /* any float address */
#define VSTORE(p, x) (*(vf *)(p) = (x))
#define VSTOREU(p, x) (*(vfu *)(p) = (x))
#define VSELECT(mask, a, b) ((vf)(((mask) & (vi)(a)) | (~(mask) & (vi)(b))))
/* VMAX(a, b) = a > b ? a : b (b where either is NaN): x86's max instruction is exactly that */
#if MF_VW == 16 && defined(__AVX512F__)
#define VMAX(a, b) ((vf)_mm512_max_ps((__m512)(a), (__m512)(b)))
#elif MF_VW == 8 && defined(__AVX__)
#define VMAX(a, b) ((vf)_mm256_max_ps((__m256)(a), (__m256)(b)))
#elif MF_VW == 4 && defined(__SSE__)
#define VMAX(a, b) ((vf)_mm_max_ps((__m128)(a), (__m128)(b)))
#else
#define VMAX(a, b) VSELECT((a) > (b), (a), (b))
#endif
#define VAND(mask, a) ((vf)((mask) & (vi)(a))) /* a where mask, else +0 */

/* VFMA(a, b, c) = a * b + c, one rounding where the target has fused multiply-adds */
#if MF_VW == 16 && defined(__AVX512F__)
#define VFMA(a, b, c) ((vf)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif MF_VW == 8 && defined(__FMA__)
#define VFMA(a, b, c) ((vf)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#elif MF_VW == 4 && defined(__FMA__)
#define VFMA(a, b, c) ((vf)_mm_fmadd_ps((__m128)(a), (__m128)(b), (__m128)(c)))
#elif MF_VW == 4 && defined(__aarch64__)
#define VFMA(a, b, c) \
    ((vf)vfmaq_f32((float32x4_t)(c), (float32x4_t)(a), (float32x4_t)(b)))
#else
#define VFMA(a, b, c) ((a) * (b) + (c))
#endif

/* VCLAMP(x, lo, hi) = x limited to [lo, hi] (lo <= hi, neither NaN), NaN lanes kept: the
 * bits of VSELECT(x < lo, lo, x) then VSELECT(x > hi, hi, x), as one max and one min where
 * the target has them (their operand order returns x for NaN; the selects take a compare
 * and a blend each). On aarch64 a signalling NaN comes back quiet, as the callers'
 * arithmetic would make it anyway. */
#if MF_VW == 16 && defined(__AVX512F__)
#define VCLAMP(x, lo, hi) \
    ((vf)_mm512_min_ps((__m512)(hi), _mm512_max_ps((__m512)(lo), (__m512)(x))))
#elif MF_VW == 8 && defined(__AVX__)
#define VCLAMP(x, lo, hi) \
    ((vf)_mm256_min_ps((__m256)(hi), _mm256_max_ps((__m256)(lo), (__m256)(x))))
#elif MF_VW == 4 && defined(__SSE__)
#define VCLAMP(x, lo, hi) ((vf)_mm_min_ps((__m128)(hi), _mm_max_ps((__m128)(lo), (__m128)(x))))
#elif MF_VW == 4 && defined(__aarch64__)
#define VCLAMP(x, lo, hi) \
    ((vf)vminq_f32((float32x4_t)(hi), vmaxq_f32((float32x4_t)(lo), (float32x4_t)(x))))
#else
#define VCLAMP(x, lo, hi)                                            \
    __extension__({                                                  \
        const vf cx_ = (x), clo_ = (lo), chi_ = (hi);                \
        const vf cl_ = VSELECT(cx_ < clo_, clo_, cx_);               \
        VSELECT(cl_ > chi_, chi_, cl_);                              \
    })
#endif

/* VFMAF(a, b, c) = a * b + c with one rounding on every target (unlike VFMA). Where the
 * file's flags give the target FMA, it is VFMA's instruction: left to the vectoriser, the
 * lane loop below became scalar fmaf's in the AVX-512 scan's backward after an unrelated
 * change to an inlined function (1.65x its time). Elsewhere fmaf lane by lane, which the
 * compiler makes one vector FMA in the target_clones copies that have it
 * (mapformer/clones.h MF_CLONES_FMA) and a libm call per lane where the target has none. */
#if (MF_VW == 16 && defined(__AVX512F__)) || (MF_VW == 8 && defined(__FMA__)) || \
    (MF_VW == 4 && (defined(__FMA__) || defined(__aarch64__)))
#define VFMAF(a, b, c) VFMA(a, b, c)
#else
#define VFMAF(a, b, c)                                                    \
    __extension__({                                                       \
        const vf fa_ = (a), fb_ = (b), fc_ = (c);                         \
        vf fr_;                                                           \
        for (int fl_ = 0; fl_ < MF_VW; fl_++)                             \
            fr_[fl_] = __builtin_fmaf(fa_[fl_], fb_[fl_], fc_[fl_]);      \
        fr_;                                                              \
    })
#endif

/* lane indices 0 .. MF_VW-1 */
#if MF_VW == 16
#define VLANES ((vi){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
#elif MF_VW == 8
#define VLANES ((vi){0, 1, 2, 3, 4, 5, 6, 7})
#else
#define VLANES ((vi){0, 1, 2, 3})
#endif

/* the first n lanes (all for n >= MF_VW, none for n <= 0) */
#define VFIRST(n) (VLANES < ISPLAT(n))

/* store x to p with non-temporal hints where the target has them (p aligned to the vector) */
MF_INLINE void vstream(float *p, const vf *x) {
#if MF_VW == 16 && defined(__AVX512F__)
    _mm512_stream_ps(p, (__m512)*x);
#elif MF_VW == 8 && defined(__AVX__)
    _mm256_stream_ps(p, (__m256)*x);
#elif MF_VW == 4 && defined(__SSE__)
    _mm_stream_ps(p, (__m128)*x);
#else
    VSTORE(p, *x);
#endif
}

/* *x = the lanes base[idx[l]] for the MF_VW int32 indices at idx (any int32 address): a
 * hardware gather where the target has one (AVX-512, AVX2), else lane by lane */
MF_INLINE void vgather(vf *x, const float *base, const int32_t *idx) {
#if MF_VW == 16 && defined(__AVX512F__)
    *x = (vf)_mm512_i32gather_ps(_mm512_loadu_si512((const void *)idx), base, 4);
#elif MF_VW == 8 && defined(__AVX2__)
    *x = (vf)_mm256_i32gather_ps(base, _mm256_loadu_si256((const __m256i *)idx), 4);
#else
    for (int l = 0; l < MF_VW; l++) (*x)[l] = base[idx[l]];
#endif
}

/* make stream stores visible before returning */
MF_INLINE void vstream_fence(void) {
#if defined(__SSE__)
    _mm_sfence();
#endif
}

MF_INLINE float vhsum(const vf *x) {
    float s = 0.0f;
    for (int l = 0; l < MF_VW; l++) s += (*x)[l];
    return s;
}

MF_INLINE float vhmax(const vf *x) {
    float m = (*x)[0];
    for (int l = 1; l < MF_VW; l++) m = (*x)[l] > m ? (*x)[l] : m;
    return m;
}

/* the first n floats of p (n < MF_VW), zero beyond; and the store of the first n lanes */
MF_INLINE void vload_part(vf *x, const float *p, int64_t n) {
    float t[MF_VW] __attribute__((aligned(4 * MF_VW))) = {0};
    for (int64_t l = 0; l < n; l++) t[l] = p[l];
    *x = VLOAD(t);
}
MF_INLINE void vstore_part(float *p, const vf *x, int64_t n) {
    for (int64_t l = 0; l < n; l++) p[l] = (*x)[l];
}
/* the first n <= MF_VW floats of p (a whole unaligned vector when n = MF_VW, else
 * vload_part's zeros beyond), and the store of the first n lanes */
MF_INLINE void vload_n(vf *x, const float *p, int64_t n) {
    if (n == MF_VW)
        *x = VLOADU(p);
    else
        vload_part(x, p, n);
}
MF_INLINE void vstore_n(float *p, const vf *x, int64_t n) {
    if (n == MF_VW)
        VSTOREU(p, *x);
    else
        vstore_part(p, x, n);
}

/* The elementwise loop over n floats: the full vectors (m = MF_VW lanes valid, a constant the
 * compiler folds), then the last partial one (m = n - i); the body (a statement list) reads
 * the lanes at i through VLOADN and writes through VSTOREN (vload_n / vstore_n of m lanes). */
#define MF_VLOOP(n, ...)                       \
    do {                                       \
        int64_t i = 0;                         \
        for (; i + MF_VW <= (n); i += MF_VW) { \
            const int64_t m = MF_VW;           \
            __VA_ARGS__                        \
        }                                      \
        if (i < (n)) {                         \
            const int64_t m = (n) - i;         \
            __VA_ARGS__                        \
        }                                      \
    } while (0)
#define VLOADN(v, p) vload_n(&(v), p, m)
#define VSTOREN(p, v) vstore_n(p, &(v), m)

/* a * b + c fused (VFMAF: one rounding) or as a multiply and an add (two), by `fused`, a
 * constant at every use (the compiler keeps one branch): the one switch of the FMA twins */
#define VMADD(a, b, c, fused) ((fused) ? VFMAF(a, b, c) : (a) * (b) + (c))

/* *x = 2^*x: Cephes exp2f, about 2 ulp. n = round(x) by the 1.5 * 2^23 trick, 2^f on
 * [-1/2, 1/2] by a degree-6 polynomial, 2^n put into the exponent bits. x is clamped to
 * [-127, 127]: lanes below -126.5 (and -inf) give 0, lanes above 127 give 2^127 (finite),
 * NaN stays NaN. The polynomial is written with separate multiplies
 * and adds, so every width, ISA and compiler gives the same bits. vexp, the GELU and every
 * softmax and sigmoid go through it; vexp_expm1 (an exp with its expm1: the scans' ZOH,
 * softplus) reduces by ln 2 itself. */
MF_INLINE void vexp2_as(vf *x, int fused) {
    const vf y = VCLAMP(*x, VSPLAT(-127.0f), VSPLAT(127.0f));
    const vf t = y + 12582912.0f; /* 1.5 * 2^23: the low mantissa bits of t hold round(y) */
    const vf f = y - (t - 12582912.0f);
    vf p = VSPLAT(1.535336188319500e-4f);
    p = VMADD(p, f, VSPLAT(1.339887440266574e-3f), fused);
    p = VMADD(p, f, VSPLAT(9.618437357674640e-3f), fused);
    p = VMADD(p, f, VSPLAT(5.550332471162809e-2f), fused);
    p = VMADD(p, f, VSPLAT(2.402264791363012e-1f), fused);
    p = VMADD(p, f, VSPLAT(6.931472028550421e-1f), fused);
    p = VMADD(p, f, VSPLAT(1.0f), fused);
    const vi e = ((vi)t - 0x4B400000 + 127) << 23; /* 2^round(y); 0.0f for round(y) = -127 */
    *x = p * (vf)e;
}
MF_INLINE void vexp2(vf *x) { vexp2_as(x, 0); }

/* vexp2 with the polynomial's multiply-adds fused (VFMAF): other bits than vexp2's, the same
 * on every target; for loops compiled with MF_CLONES_FMA (the selective scans), where it
 * takes 6 fewer vector operations of about 20 */
MF_INLINE void vexp2_fused(vf *x) { vexp2_as(x, 1); }

#define MF_LOG2E 1.4426950408889634f
#define MF_LN2_HI 0.693145751953125f      /* ln 2's top 16 bits: n MF_LN2_HI is exact */
#define MF_LN2_LO 1.428606765330187e-06f  /* ln 2 - MF_LN2_HI */

/* *x = exp(*x) through vexp2 (0 below about -88, 2^127-capped above 88) */
MF_INLINE void vexp(vf *x) {
    *x = *x * MF_LOG2E;
    vexp2(x);
}

/* *x = 1 / (1 + exp(-*x)) */
MF_INLINE void vsigmoid(vf *x) {
    vf e = -*x;
    vexp(&e);
    *x = 1.0f / (1.0f + e);
}

/* *e = exp(x) and *m = expm1(x), both to about 1 ulp (plus the |x| ulps of x's own rounding),
 * from one Cody-Waite reduction x = n ln2 + r (ln2 in two parts, |r| <= ln2 / 2): expm1(r) =
 * r + r^2 Q(r) by Taylor to r^8 / 8! (the rest below 1.6e-9 r^2), then e = 2^n + 2^n expm1(r)
 * and m = 2^n expm1(r) + (2^n - 1) (exact products, one rounding each; no cancellation for
 * n = +-1, and m = expm1(r) for n = 0). x is clamped to [-88, 88]: e is 0 below (where
 * exp(x) is subnormal; m = -1), finite above. Separate multiplies and adds. */
MF_INLINE void vexp_expm1(const vf *x, vf *e, vf *m) {
    const vf v = VCLAMP(*x, VSPLAT(-88.0f), VSPLAT(88.0f));
    const vf t = v * MF_LOG2E + 12582912.0f; /* 1.5 * 2^23: round(v log2 e) in its low bits */
    const vf n = t - 12582912.0f;
    const vf r = (v - n * MF_LN2_HI) - n * MF_LN2_LO;
    vf q = VSPLAT(2.48015873015873e-5f);   /* 1 / 8! */
    q = q * r + 1.984126984126984e-4f;     /* 1 / 7! */
    q = q * r + 1.388888888888889e-3f;     /* 1 / 6! */
    q = q * r + 8.333333333333333e-3f;     /* 1 / 5! */
    q = q * r + 4.166666666666667e-2f;     /* 1 / 4! */
    q = q * r + 1.666666666666667e-1f;     /* 1 / 3! */
    q = q * r + 0.5f;
    const vf pm = r + (r * r) * q;
    const vf s = (vf)(((vi)t - 0x4B400000 + 127) << 23); /* 2^n; 0 for n = -127 */
    const vf sp = s * pm;
    *e = s + sp;
    *m = sp + (s - 1.0f);
}

/* *x = log1p(*x) for *x in [0, 1]: u + u^2 Q(u), Q of degree 8 fitted (Lawson's iteration)
 * for the least maximum relative error of the sum: 5.2e-9 (0.09 of 2^-24) before rounding,
 * within 2.8 x 2^-24 of the float64 value with float32 arithmetic (every u of a 2e5-point grid;
 * u itself is exact, the polynomial's part at most 0.31 of the sum). No exponent split and no
 * division. Separate multiplies and adds. */
MF_INLINE void vlog1p_unit(vf *x) {
    const vf u = *x;
    vf q = VSPLAT(-0.0033185675f);
    q = q * u + 0.020204982f;
    q = q * u - 0.057665132f;
    q = q * u + 0.10680619f;
    q = q * u - 0.1535543f;
    q = q * u + 0.19695412f;
    q = q * u - 0.2495859f;
    q = q * u + 0.33330512f;
    q = q * u - 0.4999993f;
    *x = u + (u * u) * q;
}

#define MF_SOFTPLUS_THRESHOLD 20.0f /* Mamba's (PyTorch's softplus default): x above it -> x */

/* softplus(x) = max(x, 0) + log1p(u) and its slope sigmoid(x) = (x > 0 ? 1 : u) / (1 + u),
 * both from one u = exp(-|x|) (vexp_expm1, about 1 ulp; 0 below -87, where exp is about to
 * turn subnormal): *x = softplus(x), and *slope = sigmoid(x) unless slope is NULL; x above the
 * threshold: x and 1. The bits of softplus_forward / softplus_backward (csrc/ops/activation.c)
 * wherever they are used. */
MF_INLINE void vsoftplus(vf *x, vf *slope) {
    const vf v = *x, a = (vf)((vi)v | (vi)VSPLAT(-0.0f));
    vf u, m1;
    vexp_expm1(&a, &u, &m1);
    u = VSELECT(a < VSPLAT(-87.0f), VZERO, u);
    const vi above = v > VSPLAT(MF_SOFTPLUS_THRESHOLD), positive = v > VSPLAT(0.0f);
    if (slope)
        *slope = VSELECT(above, VSPLAT(1.0f), VSELECT(positive, VSPLAT(1.0f), u) / (1.0f + u));
    vlog1p_unit(&u);
    u = VSELECT(positive, v + u, u);
    *x = VSELECT(above, v, u);
}

/* *d = expm1(x) - x = x^2 Q(x) for |x| < 1, Q(x) = sum_k x^k / (k + 2)! by Taylor to
 * x^9 / 11! (the rest below 2.3e-9, 0.04 ulp of Q >= 0.36) */
MF_INLINE void vexpm1_minus_x(vf *d, const vf *x) {
    const vf v = *x;
    vf q = VSPLAT(2.505210838544172e-8f);  /* 1 / 11! */
    q = q * v + 2.755731922398589e-7f;      /* 1 / 10! */
    q = q * v + 2.755731922398589e-6f;      /* 1 / 9! */
    q = q * v + 2.48015873015873e-5f;       /* 1 / 8! */
    q = q * v + 1.984126984126984e-4f;      /* 1 / 7! */
    q = q * v + 1.388888888888889e-3f;      /* 1 / 6! */
    q = q * v + 8.333333333333333e-3f;      /* 1 / 5! */
    q = q * v + 4.166666666666667e-2f;      /* 1 / 4! */
    q = q * v + 1.666666666666667e-1f;      /* 1 / 3! */
    q = q * v + 0.5f;
    *d = (v * v) * q;
}

/* *s = sin(*x), *c = cos(*x), branch-free: Cody-Waite reduction by pi/2 (three-part constant,
 * exact products for |x| < 2^15 pi/2), Cephes' sinf/cosf polynomials on [-pi/4, pi/4] (about
 * 1 ulp), the quadrant by selects and sign flips. For |x| < 2^22 (the rounding trick); the
 * scans' per-step angles are far smaller. Separate multiplies and adds: the same bits on every
 * width, ISA and compiler. */
/* vsincos and *v = 1 - cos x (the versine) without cancellation, to about 1.5 ulps: where x
 * reduces to quadrant 0 mod 4 (cos x = 1 - r^2 / 2 + r^4 P(r^2)) it is r^2 / 2 - r^4 P(r^2)
 * from the polynomial, elsewhere 1 - cos x >= 1 - cos(pi / 4) (cos x within an ulp: 1 - cos x
 * within 3) */
MF_INLINE void vsincos_vers(const vf *x, vf *s, vf *c, vf *v) {
    const vf xv = *x;
    const vf t = xv * 0.636619772367581343f + 12582912.0f;
    const vf n = t - 12582912.0f;
    const vf r = ((xv - n * 1.5703125f) - n * 4.837512969970703125e-4f) -
                 n * 7.54978995489188216e-8f;
    const vf z = r * r;
    const vf ps = r + r * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z *
                                                        -1.9515295891e-4f));
    const vf pq = z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f + z *
                                                         2.443315711809948e-5f));
    const vf pc = 1.0f - 0.5f * z + pq;
    const vi q = (vi)t - 0x4B400000, sign = (vi)VSPLAT(-0.0f);
    const vi odd = (q & 1) != 0;
    const vf ss = VSELECT(odd, pc, ps), cc = VSELECT(odd, ps, pc);
    *s = (vf)((vi)ss ^ (((q & 2) != 0) & sign));
    *c = (vf)((vi)cc ^ ((((q + 1) & 2) != 0) & sign));
    *v = VSELECT((q & 3) == 0, 0.5f * z - pq, 1.0f - *c);
}

MF_INLINE void vsincos(const vf *x, vf *s, vf *c) {
    vf v;
    vsincos_vers(x, s, c, &v);
}

/* vsincos with its multiply-adds fused (VFMAF): the same reduction and polynomials, other
 * bits (about 1 ulp as well), for the scans' Euler steps' rotations */
MF_INLINE void vsincos_fused(const vf *x, vf *s, vf *c) {
    const vf xv = *x;
    const vf t = VFMAF(xv, VSPLAT(0.636619772367581343f), VSPLAT(12582912.0f));
    const vf n = t - 12582912.0f, mn = -n;
    vf r = VFMAF(mn, VSPLAT(1.5703125f), xv);
    r = VFMAF(mn, VSPLAT(4.837512969970703125e-4f), r);
    r = VFMAF(mn, VSPLAT(7.54978995489188216e-8f), r);
    const vf z = r * r;
    vf p = VFMAF(z, VSPLAT(-1.9515295891e-4f), VSPLAT(8.3321608736e-3f));
    p = VFMAF(z, p, VSPLAT(-1.6666654611e-1f));
    const vf ps = VFMAF(r * z, p, r);
    vf q = VFMAF(z, VSPLAT(2.443315711809948e-5f), VSPLAT(-1.388731625493765e-3f));
    q = VFMAF(z, q, VSPLAT(4.166664568298827e-2f));
    const vf pc = VFMAF(z * z, q, VFMAF(z, VSPLAT(-0.5f), VSPLAT(1.0f)));
    const vi qd = (vi)t - 0x4B400000, sign = (vi)VSPLAT(-0.0f);
    const vi odd = (qd & 1) != 0;
    const vf ss = VSELECT(odd, pc, ps), cc = VSELECT(odd, ps, pc);
    *s = (vf)((vi)ss ^ (((qd & 2) != 0) & sign));
    *c = (vf)((vi)cc ^ ((((qd + 1) & 2) != 0) & sign));
}

/* -2 sqrt(2/pi) log2(e): exp(-2u) = 2^(MF_GELU_EXP2 (x + 0.044715 x^3)) */
#define MF_GELU_EXP2 -2.302208198144325f

/* *x = gelu(*x), the tanh approximation 0.5 x (1 + tanh(u)) = x s, s = 1 / (1 + exp(-2u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3); never forms 1 - tanh (no cancellation for negative x) */
MF_INLINE void vgelu(vf *x) {
    const vf v = *x;
    const vf x2 = v * v;
    vf e = (v + 0.044715f * x2 * v) * MF_GELU_EXP2; /* -2u log2(e) */
    vexp2(&e);
    *x = v * (1.0f / (1.0f + e));
}

/* *dy *= gelu'(x) and *g = gelu(x) (the bits of vgelu) from one exponential:
 * gelu'(x) = s + 2 x s (1 - s) u'(x), with 1 - s = e s (no cancellation as s -> 1) */
MF_INLINE void vgelu_grad(vf *g, vf *dy, const vf *x) {
    const vf v = *x;
    const vf x2 = v * v;
    vf e = (v + 0.044715f * x2 * v) * MF_GELU_EXP2;
    vexp2(&e);
    const vf s = 1.0f / (1.0f + e);
    const vf du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x2);
    *g = v * s;
    *dy = *dy * (s + 2.0f * v * (e * s) * s * du);
}

/* ---- the exact GELU: x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)) ------------------------------
 * Own fits (float64 weighted least squares on Chebyshev nodes: benchmarks/fit_erf.py, which
 * also measures them in float32), z = |x| / sqrt 2:
 *   z < 0.9:  erf(z) = z P(z^2), P of degree 6 (relative error of the fit 3e-10);
 *   z >= 0.9: erfc(z) = exp(-z^2) t Q(t), t = 1 / (1 + z / 2), Q of degree 9 (7e-10), so the
 *             lower tail Phi(-|x|) = erfc(z) / 2 keeps its relative precision (never 1 - erf).
 * exp(-z^2) = exp(-x^2 / 2) is taken with its argument split, x^2 / 2 = xh^2 / 2 + (|x| - xh)
 * (|x| + xh) / 2 with xh = |x|'s top 12 bits (xh^2 exact), and reduced by n ln 2 in two parts
 * (Cody-Waite), so it keeps a few ulp at any |x| where vexp's x log2(e) would lose |x|^2 / 2
 * ulp. Measured through gelu_forward/backward against float64 math.erf (tests/test_gelu.py):
 * a few ulp, plus the condition of Phi at large negative x (about x^2 ulp of x's rounding). */
#define MF_INV_SQRT2 0.7071067811865476f
#define MF_INV_SQRT2PI 0.3989422804014327f

/* *cdf = Phi(x) and *e = exp(-x^2 / 2) (subnormal past x^2 / 2 of about 87, 0 past 175) */
MF_INLINE void vnormal(vf *cdf, vf *e, const vf *x) {
    const vf v = *x;
    const vf a = VSELECT(v < 0.0f, -v, v);
    const vf ac = VSELECT(a > VSPLAT(20.0f), VSPLAT(20.0f), a); /* exp(-200) is 0 already */
    const vf xh = (vf)((vi)ac & ISPLAT(0xfffff000));
    const vf hi = 0.5f * (xh * xh), lo = 0.5f * ((ac - xh) * (ac + xh));
    /* exp(-hi - lo) = 2^n exp(r), n = round(-hi / ln 2) >= -126, r = (-hi - n ln 2) - lo */
    vf nf = -hi * MF_LOG2E;
    nf = VSELECT(nf < VSPLAT(-126.0f), VSPLAT(-126.0f), nf);
    const vf tn = nf + 12582912.0f; /* 1.5 * 2^23: round(nf) in the low mantissa bits */
    const vf n = tn - 12582912.0f;
    vf p = (((-hi - n * MF_LN2_HI) - n * MF_LN2_LO) - lo) * MF_LOG2E;
    vexp2(&p);
    const vf ex = p * (vf)(((vi)tn - 0x4B400000 + 127) << 23);
    /* z < 0.9: Phi = 1/2 + (x / sqrt 2) P(z^2) / 2 */
    const vf zs = v * MF_INV_SQRT2, z = a * MF_INV_SQRT2, w = z * z;
    vf ps = VSPLAT(8.508394967e-05f);
    ps = ps * w + -8.174483664e-04f;
    ps = ps * w + 5.203752778e-03f;
    ps = ps * w + -2.686046250e-02f;
    ps = ps * w + 1.128371432e-01f;
    ps = ps * w + -3.761263490e-01f;
    ps = ps * w + 1.128379226e+00f;
    const vf small = 0.5f + 0.5f * (zs * ps);
    /* z >= 0.9: the tail erfc(z) / 2 = exp(-z^2) t Q(t) / 2 */
    const vf t = 1.0f / (1.0f + 0.5f * z);
    vf q = VSPLAT(-7.370206714e-02f);
    q = q * t + 2.352137715e-01f;
    q = q * t + -2.205279320e-01f;
    q = q * t + -7.402108167e-04f;
    q = q * t + -9.794928133e-03f;
    q = q * t + 8.109979331e-02f;
    q = q * t + 1.774212718e-01f;
    q = q * t + 2.466445714e-01f;
    q = q * t + 2.821104527e-01f;
    q = q * t + 2.820942700e-01f;
    const vf tail = 0.5f * (ex * (t * q));
    const vf large = VSELECT(v < 0.0f, tail, 1.0f - tail);
    *cdf = VSELECT(z < VSPLAT(0.9f), small, large);
    *e = ex;
}

/* *x = gelu(*x), exact: x Phi(x) */
MF_INLINE void vgelu_erf(vf *x) {
    vf cdf, e;
    vnormal(&cdf, &e, x);
    *x = *x * cdf;
}

/* *dy *= gelu'(x) = Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi), and *g = gelu(x) (vgelu_erf's bits) */
MF_INLINE void vgelu_erf_grad(vf *g, vf *dy, const vf *x) {
    vf cdf, e;
    vnormal(&cdf, &e, x);
    *g = *x * cdf;
    *dy = *dy * (cdf + *x * (e * MF_INV_SQRT2PI));
}

/* ---- doubles: VDL = MF_VW / 2 lanes, the same bytes as a vf ----------------------------------
 * vd holds VDL doubles, vdi their lane masks; vfh and vih are VDL floats and int32s (half a vf),
 * the lanes a vd converts from and to with __builtin_convertvector. The *u types are the same
 * at any float (int32) address. For sums that must run in double (cumulative sums of many
 * floats). */
#define VDL (MF_VW / 2)
typedef double vd __attribute__((vector_size(4 * MF_VW)));
typedef int64_t vdi __attribute__((vector_size(4 * MF_VW)));
typedef float vfh __attribute__((vector_size(2 * MF_VW)));
typedef float vfhu __attribute__((vector_size(2 * MF_VW), __may_alias__, aligned(4)));
typedef int32_t vih __attribute__((vector_size(2 * MF_VW)));
typedef int32_t vihu __attribute__((vector_size(2 * MF_VW), __may_alias__, aligned(4)));
#define DSELECT(mask, a, b) ((vd)(((mask) & (vdi)(a)) | (~(mask) & (vdi)(b))))

/* __builtin_shufflevector of two vd with lane l taken from F(s, l) (0 .. VDL-1: a's lanes,
 * VDL .. 2 VDL-1: b's) */
#if MF_VW == 16
#define MF_DSHUF(a, b, F, s)                                                                 \
    __builtin_shufflevector(a, b, F(s, 0), F(s, 1), F(s, 2), F(s, 3), F(s, 4), F(s, 5),     \
                            F(s, 6), F(s, 7))
#elif MF_VW == 8
#define MF_DSHUF(a, b, F, s) __builtin_shufflevector(a, b, F(s, 0), F(s, 1), F(s, 2), F(s, 3))
#else
#define MF_DSHUF(a, b, F, s) __builtin_shufflevector(a, b, F(s, 0), F(s, 1))
#endif
#define MF_UP(s, l) ((l) + (s))         /* lane l + s of (x, 0): 0 past the end */
#define MF_DOWN(s, l) (VDL + (l) - (s)) /* lane l - s of (0, x): 0 before the start */

/* *x[l] = sum_{m >= l} x[m] (a suffix sum within the vector), in log2(VDL) shift-and-add
 * steps: shifts of 1, 2, 4 lanes, each add one rounding, in that order */
MF_INLINE void vd_suffix_sum(vd *x) {
    const vd z = {0};
    *x += MF_DSHUF(*x, z, MF_UP, 1);
#if VDL > 2
    *x += MF_DSHUF(*x, z, MF_UP, 2);
#endif
#if VDL > 4
    *x += MF_DSHUF(*x, z, MF_UP, 4);
#endif
}

/* *x[l] = sum_{m <= l} x[m] (a prefix sum within the vector), as vd_suffix_sum */
MF_INLINE void vd_prefix_sum(vd *x) {
    const vd z = {0};
    *x += MF_DSHUF(z, *x, MF_DOWN, 1);
#if VDL > 2
    *x += MF_DSHUF(z, *x, MF_DOWN, 2);
#endif
#if VDL > 4
    *x += MF_DSHUF(z, *x, MF_DOWN, 4);
#endif
}

/* Transpose in registers: dst[c * ldd + r] = src[r * lds + c] for r, c < MF_VW; butterfly
 * stages, each swapping one bit of the row and column index. */
#define MF_LO(h, l) (((l) & (h)) ? (l) - (h) + MF_VW : (l))
#define MF_HI(h, l) (((l) & (h)) ? (l) + MF_VW : (l) + (h))
#if MF_VW == 16
#define MF_SHUF(a, b, F, h)                                                                  \
    __builtin_shufflevector(a, b, F(h, 0), F(h, 1), F(h, 2), F(h, 3), F(h, 4), F(h, 5),     \
                            F(h, 6), F(h, 7), F(h, 8), F(h, 9), F(h, 10), F(h, 11), F(h, 12), \
                            F(h, 13), F(h, 14), F(h, 15))
#elif MF_VW == 8
#define MF_SHUF(a, b, F, h)                                                                 \
    __builtin_shufflevector(a, b, F(h, 0), F(h, 1), F(h, 2), F(h, 3), F(h, 4), F(h, 5),    \
                            F(h, 6), F(h, 7))
#else
#define MF_SHUF(a, b, F, h) __builtin_shufflevector(a, b, F(h, 0), F(h, 1), F(h, 2), F(h, 3))
#endif
#define MF_STAGE(x, h)                                \
    for (int i = 0; i < MF_VW; i++) {                 \
        if (i & (h)) continue;                        \
        const vf a = x[i], b = x[i + (h)];            \
        x[i] = MF_SHUF(a, b, MF_LO, h);               \
        x[i + (h)] = MF_SHUF(a, b, MF_HI, h);         \
    }

/* x[r] = row r of an MF_VW x MF_VW tile -> x[c] = its column c, in registers */
MF_INLINE void vtranspose_regs(vf *x) {
#if MF_VW == 16
    MF_STAGE(x, 8)
#endif
#if MF_VW >= 8
    MF_STAGE(x, 4)
#endif
    MF_STAGE(x, 2)
    MF_STAGE(x, 1)
}

MF_INLINE void vtranspose(float *dst, int64_t ldd, const float *src, int64_t lds) {
    vf x[MF_VW];
    for (int i = 0; i < MF_VW; i++) x[i] = VLOADU(src + i * lds);
    vtranspose_regs(x);
    for (int i = 0; i < MF_VW; i++) VSTOREU(dst + i * ldd, x[i]);
}

/* dst[c * ldd + r] = src[r * lds + c] for r < nr, c < nc: MF_VW x MF_VW blocks in registers,
 * the ragged edges element by element */
MF_INLINE void mf_transpose(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t nr,
                            int64_t nc) {
    const int64_t nrv = nr / MF_VW * MF_VW, ncv = nc / MF_VW * MF_VW;
    for (int64_t r0 = 0; r0 < nrv; r0 += MF_VW) {
        for (int64_t c0 = 0; c0 < ncv; c0 += MF_VW)
            vtranspose(dst + c0 * ldd + r0, ldd, src + r0 * lds + c0, lds);
        for (int64_t r = r0; r < r0 + MF_VW; r++)
            for (int64_t c = ncv; c < nc; c++) dst[c * ldd + r] = src[r * lds + c];
    }
    for (int64_t r = nrv; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) dst[c * ldd + r] = src[r * lds + c];
}

#endif
