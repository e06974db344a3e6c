/* Quaternions in double (w, x, y, z) for the 4x4 rotation ops (b4.c, nc.c): so(4) splits into
 * left and right quaternion products, exp(L(u) + R(v)) p = qexp(u) p qexp(v). */
#ifndef MAPFORMER_QUAT_H
#define MAPFORMER_QUAT_H

#include <math.h>

typedef struct {
    double w, x, y, z;
} Quat;

static inline Quat qmul(Quat a, Quat b) {
    Quat r = {a.w * b.w - a.x * b.x - a.y * b.y - a.z * b.z,
              a.w * b.x + a.x * b.w + a.y * b.z - a.z * b.y,
              a.w * b.y - a.x * b.z + a.y * b.w + a.z * b.x,
              a.w * b.z + a.x * b.y - a.y * b.x + a.z * b.w};
    return r;
}

static inline Quat qconj(Quat a) {
    Quat r = {a.w, -a.x, -a.y, -a.z};
    return r;
}

static inline Quat qadd(Quat a, Quat b) {
    Quat r = {a.w + b.w, a.x + b.x, a.y + b.y, a.z + b.z};
    return r;
}

static inline Quat qnormalize(Quat a) {
    const double inv = 1.0 / sqrt(a.w * a.w + a.x * a.x + a.y * a.y + a.z * a.z);
    Quat r = {a.w * inv, a.x * inv, a.y * inv, a.z * inv};
    return r;
}

/* qexp(w) = (cos n, sinc(n) w) for the pure quaternion w = (wx, wy, wz), n = |w|; sinc(n)
 * through *sc and k = (cos n - sinc n) / n^2 (what qexp's Jacobian needs) through *k, by their
 * series below n = 0.05 */
static inline Quat qexp(double wx, double wy, double wz, double *sc, double *k) {
    const double n2 = wx * wx + wy * wy + wz * wz, n = sqrt(n2);
    if (n < 0.05) {
        *sc = 1.0 - n2 / 6 + n2 * n2 / 120 - n2 * n2 * n2 / 5040;
        *k = -1.0 / 3 + n2 / 30 - n2 * n2 / 840 + n2 * n2 * n2 / 45360;
    } else {
        *sc = sin(n) / n;
        *k = (cos(n) - *sc) / n2;
    }
    Quat r = {cos(n), *sc * wx, *sc * wy, *sc * wz};
    return r;
}

#endif
