/* The coefficients of MapEM-SLN's closed form exp(Phi A) = C I + S A and their derivatives
 * (csrc/ops/sln.c's header comment has the math), in double: shared by the C op and its CUDA
 * kernel (cuda/sln.cu). */
#ifndef MAPFORMER_SLN_COEF_H
#define MAPFORMER_SLN_COEF_H

#include <math.h>

#ifdef __CUDACC__
#define MF_HOST_DEVICE __host__ __device__
#else
#define MF_HOST_DEVICE
#endif

typedef struct {
    double C, S, dC_dphi, dS_dphi, dC_dq, dS_dq;
} SlnCoef;

MF_HOST_DEVICE static inline SlnCoef sln_coef(double phi, double q, double clamp) {
    SlnCoef r;
    const double x = phi * phi * q;
    if (x > clamp * clamp) {
        const double sq = sqrt(q);
        r.C = cosh(clamp);
        r.S = copysign(sinh(clamp) / sq, phi);
        r.dC_dphi = r.dS_dphi = r.dC_dq = 0.0;
        r.dS_dq = -r.S / (2.0 * q);
        return r;
    }
    if (fabs(x) < 1e-3) {
        const double f = 1.0 + x * (1.0 / 2 + x * (1.0 / 24 + x * (1.0 / 720)));
        const double g = 1.0 + x * (1.0 / 6 + x * (1.0 / 120 + x * (1.0 / 5040)));
        const double gp = 1.0 / 6 + x * (1.0 / 60 + x * (1.0 / 1680 + x * (1.0 / 90720)));
        r.C = f;
        r.S = phi * g;
        r.dS_dq = phi * phi * phi * gp;
    } else {
        if (x > 0) {
            const double sq = sqrt(q);
            r.C = cosh(phi * sq);
            r.S = sinh(phi * sq) / sq;
        } else {
            const double sq = sqrt(-q);
            r.C = cos(phi * sq);
            r.S = sin(phi * sq) / sq;
        }
        r.dS_dq = (phi * r.C - r.S) / (2.0 * q);
    }
    r.dC_dphi = q * r.S;
    r.dS_dphi = r.C;
    r.dC_dq = 0.5 * phi * r.S;
    return r;
}

#endif
