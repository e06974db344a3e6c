/* The vq family (csrc/ops/vq.c): its parameter struct and its ops, included
 * through mapformer/params.h (the structs' conventions). */
#ifndef MAPFORMER_OPS_VQ_H
#define MAPFORMER_OPS_VQ_H

#include <stdint.h>

/* vq: M parallel codebooks of K codes of width D; row n's slice m is snapped to the nearest
 * code of codebook m */
typedef struct {
    float *codes;              /* forward (N, M, D): codebook[m, indices[n, m]] */
    int32_t *indices;          /* forward (N, M): the nearest code, lowest index on ties */
    float *dist;               /* forward (N, M): ||z[n, m] - codes[n, m]||^2 (in double) */
    double *total;             /* forward: the sum of dist */
    float *dz;                 /* backward (N, M, D) (=) */
    float *dcodebook;          /* backward (M, K, D) += */
    const float *dcodes;       /* backward (N, M, D): the gradient reaching the codes */
    const int32_t *indices_in; /* backward (N, M), each in [0, K) (checked by the op) */
    const float *z;            /* (N, M, D) */
    const float *codebook;     /* (M, K, D) */
    int64_t N, M, K, D;
    float codebook_weight;     /* backward: the weight of sum ||codebook[idx] - sg(z)||^2 */
    float commitment_weight;   /* backward: the weight of sum ||sg(codebook[idx]) - z||^2 */
    float *scratch;
    int64_t scratch_floats;
} MfVqParams;

/* ---- vq.c: vector quantisation, M parallel codebooks (TDB's bottleneck) ------------------ */
/* For each row n and codebook m: indices[n, m] = argmin_k ||z[n, m] - codebook[m, k]||^2, the
 * lowest k on ties, found from one product z codebook^T per codebook (the comparison is
 * ||e_k||^2 - 2 z.e_k: ||z||^2, the same for every k, is left out); codes[n, m] =
 * codebook[m, indices[n, m]]; dist[n, m] = ||z[n, m] - codes[n, m]||^2 recomputed exactly (in
 * double) for the chosen code, *total = the sum of dist. Reads z, codebook.
 * Scratch: vq_forward_scratch_floats(p) floats. */
int64_t vq_forward_scratch_floats(const MfVqParams *p);
int vq_forward(const MfVqParams *p);
/* The gradients of L(codes(z)) + codebook_weight sum ||codebook[idx] - sg(z)||^2 +
 * commitment_weight sum ||sg(codebook[idx]) - z||^2, codes taken straight through:
 *   dz = dcodes + 2 commitment_weight (z - codebook[idx])                       (=)
 *   dcodebook[m, k] += 2 codebook_weight sum_{n: idx[n, m] = k} (codebook[m, k] - z[n, m])
 * the sum per code in double, in row order (the same bits for any thread count). Reads
 * dcodes, z, codebook, indices_in (each checked: MF_EINDEX), the weights.
 * Scratch: vq_backward_scratch_floats(p) floats. */
int64_t vq_backward_scratch_floats(const MfVqParams *p);
int vq_backward(const MfVqParams *p);

#endif
