"""Float64 NumPy reference of the vq ops (csrc/ops/vq.c):
vector quantisation, M parallel codebooks."""
import numpy as np

from .common import _cast, returns


@returns("codes", "indices", "dist", "total")
def vq_forward(z, codebook, dtype=np.float64):
    """z (N, M, D), codebook (M, K, D) -> (codes (N, M, D), indices int32 (N, M),
    dist (N, M), total).

    indices[n, m] = argmin_k ||z[n, m] - codebook[m, k]||^2 from the expansion
    ||z||^2 - 2 z.e + ||e||^2 (the lowest k on ties: np.argmin), codes = the chosen codes,
    dist = ||z - codes||^2 recomputed directly for the chosen code, total = dist.sum()."""
    z, codebook = _cast(dtype, z, codebook)
    scores = (np.einsum("nmd,nmd->nm", z, z)[:, :, None]
              - 2.0 * np.einsum("nmd,mkd->nmk", z, codebook)
              + np.einsum("mkd,mkd->mk", codebook, codebook)[None])
    indices = np.argmin(scores, axis=-1).astype(np.int32)
    codes = codebook[np.arange(codebook.shape[0])[None, :], indices]
    dist = ((z - codes) ** 2).sum(-1)
    return codes, indices, dist, float(dist.sum())


@returns("dz", "dcodebook")
def vq_backward(dcodes, z, codebook, indices, codebook_weight, commitment_weight,
                dtype=np.float64):
    """-> (dz (N, M, D), dcodebook (M, K, D)): the gradients of
    L(codes) + codebook_weight sum ||codes - sg(z)||^2 + commitment_weight sum ||sg(codes) - z||^2
    with codes = codebook[m, indices] taken straight through (dL/dcodes goes to z unchanged):
    dz = dcodes + 2 commitment_weight (z - codes);
    dcodebook[m, k] = 2 codebook_weight sum_{n: indices[n, m] = k} (codebook[m, k] - z[n, m])."""
    dcodes, z, codebook = _cast(dtype, dcodes, z, codebook)
    M, K, D = codebook.shape
    indices = np.asarray(indices)
    codes = codebook[np.arange(M)[None, :], indices]
    dz = dcodes + 2.0 * commitment_weight * (z - codes)
    dcodebook = np.zeros_like(codebook)
    for m in range(M):
        np.add.at(dcodebook[m], indices[:, m], 2.0 * codebook_weight * (codes[:, m] - z[:, m]))
    return dz, dcodebook
