"""The coefficients of simd.h's exact GELU (vnormal): float64 least-squares fits, weighted for
relative error, on Chebyshev nodes, then evaluated as the kernel does (float32 Horner) against
math.erf / math.erfc. Prints both coefficient lists and the measured errors.

    python benchmarks/fit_erf.py

z = |x| / sqrt 2. Below z = 0.9: erf(z) = z P(z^2), P of degree 6. From 0.9 on:
erfc(z) = exp(-z^2) t Q(t), t = 1 / (1 + z / 2), Q of degree 9 (fitted up to z = 14, past
which the result is below float32's subnormals)."""
import math

import numpy as np

T, ZMAX, NODES = 0.9, 14.0, 6000


def chebyshev_nodes(lo, hi, n):
    k = np.arange(n)
    return lo + (hi - lo) * (1 - np.cos(np.pi * (k + 0.5) / n)) / 2


def fit(points, values, degree):
    """Coefficients, lowest first, minimising the relative error in least squares."""
    return np.polynomial.polynomial.polyfit(points, values, degree, w=1 / np.abs(values))


def horner32(coefficients, x):
    r = np.full_like(x, np.float32(coefficients[-1]))
    for c in coefficients[-2::-1]:
        r = (r * x + np.float32(c)).astype(np.float32)
    return r


def main():
    w = chebyshev_nodes(0.0, T * T, NODES)
    small = fit(w, np.array([math.erf(math.sqrt(v)) / math.sqrt(v) for v in w]), 6)
    t = chebyshev_nodes(1 / (1 + 0.5 * ZMAX), 1 / (1 + 0.5 * T), NODES)
    z = (1 / t - 1) / 0.5
    large = fit(t, np.array([math.erfc(v) * math.exp(v * v) for v in z]) / t, 9)
    zs = np.linspace(0, T, 20001).astype(np.float32)[1:]
    got = zs * horner32(small, (zs * zs).astype(np.float32))
    want = np.array([math.erf(float(v)) for v in zs])
    print(f"z < {T}: erf, max relative error {np.max(np.abs(got / want - 1)):.3g}")
    zl = np.linspace(T, ZMAX, 200001).astype(np.float32)
    tl = (np.float32(1) / (np.float32(1) + np.float32(0.5) * zl)).astype(np.float32)
    got = tl * horner32(large, tl)
    want = np.array([math.erfc(float(v)) * math.exp(float(v) ** 2) for v in zl])
    print(f"z >= {T}: erfc(z) exp(z^2), max relative error {np.max(np.abs(got / want - 1)):.3g}")
    print("P (z^2), highest first:", ", ".join(f"{np.float32(c):.9e}f" for c in small[::-1]))
    print("Q (t), highest first:", ", ".join(f"{np.float32(c):.9e}f" for c in large[::-1]))


if __name__ == "__main__":
    main()
