"""Code usage of a VQ bottleneck (TDB): how many codes a batch uses, how evenly, which lie
dead. NumPy on integer code indices (statistics for the training log, not activations)."""
import numpy as np


def count_codes(indices, n_codes):
    """indices int (N, M) -> counts int64 (M, n_codes): rows choosing each code of each
    codebook."""
    indices = np.asarray(indices)
    return np.stack([np.bincount(indices[:, m], minlength=n_codes)
                     for m in range(indices.shape[1])])


def usage(counts):
    """counts (M, K) -> {"perplexity": [M floats], "dead": [M ints], "used": [M ints]}:
    perplexity = exp(entropy of the code frequencies) (K when every code is used equally, 1
    when one code takes every row), dead = codes no row chose, used = K - dead."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(-1, keepdims=True)
    p = counts / np.maximum(total, 1.0)
    entropy = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)).sum(-1)
    dead = (counts == 0).sum(-1)
    return {"perplexity": [float(x) for x in np.exp(entropy)],
            "dead": [int(x) for x in dead],
            "used": [int(counts.shape[1] - x) for x in dead]}


def restart_choices(counts, n_rows, rng):
    """(codebook, code, row) triples for dead-code restarts: every code of ``counts`` (M, K)
    with count 0 gets a row drawn uniformly from [0, n_rows) by ``rng``."""
    dead = list(zip(*np.nonzero(np.asarray(counts) == 0)))
    rows = rng.integers(0, n_rows, len(dead))
    return [(int(m), int(k), int(r)) for (m, k), r in zip(dead, rows)]
