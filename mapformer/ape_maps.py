"""APE's parameter-side arithmetic (no C op: H small matrices per step, float64 on the host on
every backend): the orthogonal maps W = expm(A - A^T) of the generators A, their powers
(APE-seq, APE-grid), their products along tree paths (APE-tree) and the change of basis, each
with its gradient. ``backend`` runs it for every backend; ``reference`` re-exports it, so the
tests' oracle and the models share one copy.
"""
import numpy as np


def _cast(dtype, *arrays):
    return [np.asarray(a, dtype=dtype) for a in arrays]


def expm(x, dtype=np.float64):
    """Matrix exponential of a stack x (..., n, n): scaling and squaring, Taylor degree 18 on
    x / 2^s with ||x / 2^s||_1 <= 1/2 (truncation below 1e-22 relative)."""
    (x,) = _cast(dtype, x)
    norm = np.abs(x).sum(-2).max() if x.size else 0.0
    s = max(0, int(np.ceil(np.log2(norm))) + 1) if norm > 0 else 0
    y = x / 2.0 ** s
    eye = np.broadcast_to(np.eye(x.shape[-1], dtype=dtype), x.shape)
    result, term = eye.copy(), eye.copy()
    for k in range(1, 19):
        term = term @ y / k
        result = result + term
    for _ in range(s):
        result = result @ result
    return result


def expm_frechet(x, g, dtype=np.float64):
    """The Frechet derivative of expm at x (..., n, n) in the direction g: the upper-right
    block of expm([[x, g], [0, x]]) (the block-triangular identity)."""
    x, g = _cast(dtype, x, g)
    n = x.shape[-1]
    big = np.zeros(x.shape[:-2] + (2 * n, 2 * n), dtype)
    big[..., :n, :n] = big[..., n:, n:] = x
    big[..., :n, n:] = g
    return expm(big, dtype=dtype)[..., :n, n:]


def _swap(m):
    return np.swapaxes(m, -1, -2)


def _times(table, m):
    """table (G, n, H, E, E) times m (G, H, E, E) on the right, every entry: a stack of
    E x E products (each below the size at which NumPy's BLAS starts threads: one large
    product per (g, h) ran 5-30x slower with two threads on a busy 2-core machine)."""
    return table @ m[:, None]


def ape_powers_forward(generator, steps, dtype=np.float64):
    """generator (G, H, E, E) (any real matrices A) -> maps (G, steps, H, E, E) with
    maps[g, p, h] = W^p, W = expm(A - A^T) (orthogonal, det +1), p = 0..steps-1, by doubling:
    table[0..2n) = [table[0..n), table[0..n) W^n], W^2n = W^n W^n (ceil(log2 steps) batched
    products)."""
    (a,) = _cast(dtype, generator)
    w = expm(a - _swap(a), dtype=dtype)  # (G, H, E, E)
    table = np.broadcast_to(np.eye(a.shape[-1], dtype=dtype), a.shape)[:, None].copy()
    power = w
    while table.shape[1] < steps:
        table = np.concatenate([table, _times(table, power)], axis=1)
        power = power @ power
    return table[:, :steps].copy()


def ape_powers_backward(dmaps, generator, dtype=np.float64):
    """dmaps (G, P, H, E, E), generator (G, H, E, E) -> dgenerator (G, H, E, E): the doubling
    undone level by level (d table[:n] += d table[n:] (W^n)^T, d W^n = sum_j table[j]^T
    d table[n + j], d W^n += dW^2n (W^n)^T + (W^n)^T dW^2n), then through expm by its Frechet
    derivative at S^T (dS = L(S^T, dW)) and dA = dS - dS^T."""
    dmaps, a = _cast(dtype, dmaps, generator)
    steps = dmaps.shape[1]
    s = a - _swap(a)
    w = expm(s, dtype=dtype)
    tables, powers = [], []
    table = np.broadcast_to(np.eye(a.shape[-1], dtype=dtype), a.shape)[:, None].copy()
    power = w
    while table.shape[1] < steps:
        tables.append(table)
        powers.append(power)
        table = np.concatenate([table, _times(table, power)], axis=1)
        power = power @ power
    dtable = np.zeros_like(table)
    dtable[:, :steps] = dmaps
    dpower = np.zeros_like(w)  # the gradient of the last (unused) power
    for table, power in zip(reversed(tables), reversed(powers)):
        n = table.shape[1]
        dpower = dpower @ _swap(power) + _swap(power) @ dpower  # power @ power
        dpower = dpower + (_swap(table) @ dtable[:, n:]).sum(1)  # sum_j table[j]^T d[n + j]
        dtable = dtable[:, :n] + _times(dtable[:, n:], _swap(power))
    ds = expm_frechet(_swap(s), dpower, dtype=dtype)
    return ds - _swap(ds)


def skew_eig(generator, dtype=np.float64):
    """generator A (..., n, n) real -> (lam (..., n) real, U (..., n, n) unitary) with the
    skew S = A - A^T = U diag(i lam) U^H (from the Hermitian -i S)."""
    (a,) = _cast(dtype, generator)
    return np.linalg.eigh(-1j * (a - _swap(a)))


def ape_basis_forward(generator, eig=None, dtype=np.float64):
    """generator (..., E, E) (any real A) -> M = expm(A - A^T) (..., E, E), orthogonal with
    det +1: ape_seq's change of basis (APE's canonical form W = M^T R(theta) M). Through the
    eigendecomposition ``eig`` = skew_eig(A) (computed when not given): M = U diag(e^(i lam))
    U^H (real up to rounding)."""
    lam, u = skew_eig(generator, dtype) if eig is None else eig
    return ((u * np.exp(1j * lam)[..., None, :]) @ _swap(u).conj()).real.astype(dtype)


def ape_basis_backward(dbasis, generator, eig=None, dtype=np.float64):
    """dbasis (..., E, E), generator A (..., E, E) (or its ``eig`` = skew_eig(A)) -> dA
    (..., E, E). M = expm(S), S = A - A^T normal, so expm's Frechet derivative is diagonal in
    S's eigenbasis: L(S, G) = U (Phi o (U^H G U)) U^H with Phi_jk = (e^(i lam_j) -
    e^(i lam_k)) / (i (lam_j - lam_k)) = e^(i (lam_j + lam_k) / 2) sinc((lam_j - lam_k) / 2)
    (e^(i lam_j) when equal: the form used, stable for close eigenvalues). Its adjoint is
    L(S^T, .) = L(-S, .): conj(Phi); then dS = L(S^T, dM) and dA = dS - dS^T (the same number
    as expm_frechet(S^T, dM), without the 2E x 2E exponential)."""
    (dbasis,) = _cast(dtype, dbasis)
    lam, u = skew_eig(generator, dtype) if eig is None else eig
    half = (lam[..., :, None] - lam[..., None, :]) / 2
    phi = np.exp(0.5j * (lam[..., :, None] + lam[..., None, :])) * np.sinc(half / np.pi)
    uh = _swap(u).conj()
    ds = (u @ (phi.conj() * (uh @ dbasis @ u)) @ uh).real
    return (ds - _swap(ds)).astype(dtype)


def ape_tree_forward(generator, depth, dtype=np.float64):
    """generator (2, H, E, E) (one per branch: 0 left, 1 right) -> maps (1, 2^(depth+1), H, E,
    E): the operator of every node of a binary tree of ``depth`` levels below the root, by heap
    number h (root 1, children 2h and 2h + 1; entry 0 unused, the identity):
    maps[0, 1] = I, maps[0, h] = maps[0, h // 2] W_(h % 2), W_b = expm(A_b - A_b^T), the
    ordered product of the branches' operators along the root-to-node path (non-commutative:
    left-then-right differs from right-then-left). Built level by level (2 batched products
    per level)."""
    (a,) = _cast(dtype, generator)
    w = expm(a - _swap(a), dtype=dtype)  # (2, H, E, E)
    h, e = a.shape[1], a.shape[-1]
    table = np.empty((1, 2 ** (depth + 1), h, e, e), dtype)
    table[0, :2] = np.eye(e, dtype=dtype)
    for level in range(1, depth + 1):
        parents = table[:, 2 ** (level - 1):2 ** level]
        for b in (0, 1):
            table[:, 2 ** level + b:2 ** (level + 1):2] = _times(parents, w[b][None])
    return table


def ape_tree_backward(dmaps, generator, dtype=np.float64):
    """dmaps (1, 2^(depth+1), H, E, E), generator (2, H, E, E) -> dgenerator (2, H, E, E): the
    levels undone from the deepest (dW_b += sum over branch-b children of M_parent^T
    dM_child; dM_parent += dM_child W_b^T), then each W_b through expm's Frechet derivative."""
    dmaps, a = _cast(dtype, dmaps, generator)
    depth = dmaps.shape[1].bit_length() - 2
    s = a - _swap(a)
    w = expm(s, dtype=dtype)
    table = ape_tree_forward(a, depth, dtype=dtype)
    d = dmaps.copy()
    dw = np.zeros_like(w)
    for level in range(depth, 0, -1):
        lo, hi = 2 ** (level - 1), 2 ** level
        parents = table[:, lo:hi]
        for b in (0, 1):
            children = d[:, 2 ** level + b:2 ** (level + 1):2]
            dw[b] += (_swap(parents) @ children).sum(1)[0]
            d[:, lo:hi] += _times(children, _swap(w[b])[None])
    ds = expm_frechet(_swap(s), dw, dtype=dtype)
    return ds - _swap(ds)
