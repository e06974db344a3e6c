/* Quaternions in double (w, x, y, z) for the 4x4 rotation kernels (b4.cu, nc.cu), as
 * csrc/include/mapformer/quat.h: so(4) splits into left and right quaternion products,
 * exp(L(u) + R(v)) p = qexp(u) p qexp(v). */
#ifndef MAPFORMER_CUDA_QUAT_CUH
#define MAPFORMER_CUDA_QUAT_CUH

#include "common.cuh"

struct DQuat {
    double w, x, y, z;
};

__device__ __forceinline__ DQuat dq_mul(DQuat a, DQuat b) {
    return DQuat{a.w * b.w - a.x * b.x - a.y * b.y - a.z * b.z,
                 a.w * b.x + a.x * b.w + a.y * b.z - a.z * b.y,
                 a.w * b.y - a.x * b.z + a.y * b.w + a.z * b.x,
                 a.w * b.z + a.x * b.y - a.y * b.x + a.z * b.w};
}

__device__ __forceinline__ DQuat dq_conj(DQuat a) { return DQuat{a.w, -a.x, -a.y, -a.z}; }

__device__ __forceinline__ DQuat dq_add(DQuat a, DQuat b) {
    return DQuat{a.w + b.w, a.x + b.x, a.y + b.y, a.z + b.z};
}

__device__ __forceinline__ double dq_dot(DQuat a, DQuat b) {
    return a.w * b.w + a.x * b.x + a.y * b.y + a.z * b.z;
}

/* 4 floats at src as a quaternion */
__device__ __forceinline__ DQuat dq_load(const float *src) {
    return DQuat{src[0], src[1], src[2], src[3]};
}

/* qexp(w) = (cos n, sinc(n) w) of the pure quaternion w, n = |w|; *sc = sinc n and *k =
 * (cos n - sinc n) / n^2 (qexp's Jacobian), by their series below n = 0.05 */
__device__ __forceinline__ DQuat dq_exp(double wx, double wy, double wz, double *sc,
                                        double *k) {
    const double n2 = wx * wx + wy * wy + wz * wz, n = sqrt(n2);
    if (n < 0.05) {
        *sc = 1.0 - n2 / 6 + n2 * n2 / 120 - n2 * n2 * n2 / 5040;
        *k = -1.0 / 3 + n2 / 30 - n2 * n2 / 840 + n2 * n2 * n2 / 45360;
    } else {
        *sc = sin(n) / n;
        *k = (cos(n) - *sc) / n2;
    }
    return DQuat{cos(n), *sc * wx, *sc * wy, *sc * wz};
}

/* dw += phi J(phi u)^T h, J the Jacobian of qexp at w = phi u (sc, k of |w|) */
__device__ __forceinline__ void dq_exp_vjp(double *dw, double phi, const double *u, double sc,
                                           double k, DQuat h) {
    const double wx = phi * u[0], wy = phi * u[1], wz = phi * u[2];
    const double dot = wx * h.x + wy * h.y + wz * h.z;
    dw[0] += phi * (sc * (h.x - h.w * wx) + k * wx * dot);
    dw[1] += phi * (sc * (h.y - h.w * wy) + k * wy * dot);
    dw[2] += phi * (sc * (h.z - h.w * wz) + k * wz * dot);
}

#endif
