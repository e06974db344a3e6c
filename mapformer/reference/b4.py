"""Float64 NumPy reference of the b4 ops (csrc/ops/b4.c):
MapEM-b4 positions, 4x4 blocks with one skew generator (quaternion split)."""
import numpy as np

from .common import _cast, returns


def qmul(a, b):
    """Hamilton product of quaternions (..., 4) = (w, x, y, z)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw],
                    axis=-1)


def qconj(a):
    return a * np.array([1.0, -1.0, -1.0, -1.0])


def _qexp_parts(w):
    """w (..., 3) -> qexp(w) = (cos n, sinc(n) w) (..., 4), sinc = sin n / n and
    k = (cos n - sinc n) / n^2 (..., 1), by series for n < 0.05."""
    n2 = (w * w).sum(-1, keepdims=True)
    n = np.sqrt(n2)
    small = n < 0.05
    safe = np.where(small, 1.0, n)
    sc = np.where(small, 1 - n2 / 6 + n2**2 / 120 - n2**3 / 5040, np.sin(safe) / safe)
    k = np.where(small, -1 / 3 + n2 / 30 - n2**2 / 840 + n2**3 / 45360,
                 (np.cos(safe) - np.sin(safe) / safe) / safe**2)
    return np.concatenate([np.cos(n), sc * w], axis=-1), sc, k


def quaternion_generator(u, v):
    """The skew 4x4 generator S = L(u) + R(v) (..., 4, 4) of pure quaternions u, v (..., 3):
    S p = u p + p v (quaternion products)."""
    basis = np.eye(4)
    pu = np.concatenate([np.zeros(u.shape[:-1] + (1,)), u], -1)
    pv = np.concatenate([np.zeros(v.shape[:-1] + (1,)), v], -1)
    cols = [qmul(pu, np.broadcast_to(e, pu.shape)) + qmul(np.broadcast_to(e, pv.shape), pv)
            for e in basis]
    return np.stack(cols, axis=-1)


@returns("p")
def b4_forward(delta, gen, start, dtype=np.float64):
    """delta (B, T, H, NB), gen (H, NB, 6) = (u, v), start (H, D = 4 NB) -> p (B, T, H, D):
    per 4-block p[t] = exp(Phi_t S) p* = qexp(Phi_t u) p* qexp(Phi_t v) (quaternion products),
    S = L(u) + R(v), Phi_t = cumsum_t(delta)."""
    delta, gen, start = _cast(dtype, delta, gen, start)
    phi = np.cumsum(delta, axis=1)[..., None]
    s = start.reshape(start.shape[0], -1, 4)
    a, _, _ = _qexp_parts(phi * gen[..., :3])
    c, _, _ = _qexp_parts(phi * gen[..., 3:])
    return qmul(qmul(a, s), c).reshape(delta.shape[:-1] + (start.shape[-1],))


@returns("ddelta", "dgen", "dstart")
def b4_backward(dp, delta, gen, start, dtype=np.float64):
    """dp (B, T, H, D) -> ddelta (B, T, H, NB), dgen (H, NB, 6), dstart (H, D): the
    gradients of :func:`b4_forward`. dPhi = <g, u p + p v>; dp* = conj(a) g conj(c);
    du = Phi J(Phi u)^T (g conj(p* c)), dv = Phi J(Phi v)^T (conj(a p*) g), J the Jacobian of
    qexp: J^T g = sinc n (g_vec - g_0 w) + k w (w . g_vec)."""
    dp, delta, gen, start = _cast(dtype, dp, delta, gen, start)
    phi = np.cumsum(delta, axis=1)[..., None]
    s = start.reshape(start.shape[0], -1, 4)
    g = dp.reshape(delta.shape + (4,))
    u, v = gen[..., :3], gen[..., 3:]
    zero = np.zeros(u.shape[:-1] + (1,))
    pu, pv = np.concatenate([zero, u], -1), np.concatenate([zero, v], -1)
    wu, wv = phi * u, phi * v
    a, sca, ka = _qexp_parts(wu)
    c, scc, kc = _qexp_parts(wv)
    p = qmul(qmul(a, s), c)
    dphi = (g * (qmul(pu, p) + qmul(p, pv))).sum(-1)
    ddelta = np.flip(np.cumsum(np.flip(dphi, 1), 1), 1)
    dstart = qmul(qmul(qconj(a), g), qconj(c)).sum((0, 1)).reshape(start.shape)

    def jt(w, sc, k, ga):
        return sc * (ga[..., 1:] - ga[..., :1] * w) + k * w * (w * ga[..., 1:]).sum(-1,
                                                                                  keepdims=True)
    da = qmul(g, qconj(qmul(s, c)))
    dc = qmul(qconj(qmul(a, s)), g)
    du = (phi * jt(wu, sca, ka, da)).sum((0, 1))
    dv = (phi * jt(wv, scc, kc, dc)).sum((0, 1))
    return ddelta, np.concatenate([du, dv], -1), dstart
