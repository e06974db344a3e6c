/* A block of Tq new queries on the keys of a cache (csrc/ops/attention_decode.c's math) on the
 * GPU, forward only: query i sits at position t_i = Tk - Tq + i of sequences whose keys and
 * values (B, Tmax, H, D) hold the Tk positions first, and sees the keys j <= t_i:
 *   out[b,i,h] = sum_{j <= t_i} softmax_j(scale q_i . k_j) v_j,  lse[b,h,i] = log sum_j exp(..)
 * Tiled as cuda/attention.cu's forward: a block per (tile of DEC_BR query rows, b h), one
 * thread per query row, key and value tiles of DEC_BC rows in shared memory, the online
 * softmax's running max and sum per row. Scratch: none (the struct's is unused).
 * First version: scalar dot products, no split over keys (one decoding query is one thread:
 * a split-K kernel would use the GPU better at Tq = 1); its speed is unmeasured. */
#include "common.cuh"

#define DEC_MAX_D 128
#define DEC_BR 64 /* query rows per block: its threads */
#define DEC_BC 32 /* key rows per shared tile */

/* rows [t0, t0 + DEC_BC) of x (B, Tx, H, D) for head bh into s, zeros past the limit n */
__device__ __forceinline__ void dec_load(float *s, const float *x, const MfAttentionDecodeParams &p,
                                         int64_t Tx, int64_t bh, int64_t t0, int64_t n) {
    const int64_t b = bh / p.H, h = bh - b * p.H;
    for (int64_t e = threadIdx.x; e < DEC_BC * p.D; e += blockDim.x) {
        const int64_t r = e / p.D, d = e - r * p.D, t = t0 + r;
        s[e] = t < n ? x[((b * Tx + t) * p.H + h) * p.D + d] : 0.0f;
    }
}

__global__ void attention_decode_forward_kernel(MfAttentionDecodeParams p) {
    MF_DYNAMIC_SHARED(float, smem); /* K tile, V tile: DEC_BC x D each */
    const int64_t D = p.D;
    float *ks = smem, *vs = smem + DEC_BC * D;
    const int64_t bh = blockIdx.y, b = bh / p.H, h = bh - b * p.H;
    const int64_t i0 = (int64_t)blockIdx.x * DEC_BR, i = i0 + threadIdx.x;
    const int64_t off = p.Tk - p.Tq; /* position of query 0 */
    const int64_t last = off + (i0 + DEC_BR < p.Tq ? i0 + DEC_BR : p.Tq) - 1;
    const bool row = i < p.Tq;
    const int64_t t = off + i, qrow = ((b * p.Tq + i) * p.H + h) * D;
    float q[DEC_MAX_D], acc[DEC_MAX_D], s[DEC_BC];
    for (int64_t d = 0; d < D; d++) {
        q[d] = row ? p.q[qrow + d] * p.scale : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j0 = 0; j0 <= last; j0 += DEC_BC) {
        dec_load(ks, p.k, p, p.Tmax, bh, j0, p.Tk);
        dec_load(vs, p.v, p, p.Tmax, bh, j0, p.Tk);
        __syncthreads();
        if (row && j0 <= t) {
            const int64_t n = t - j0 + 1 < DEC_BC ? t - j0 + 1 : DEC_BC;
            const float mt = mf_tile_scores(s, q, ks, n, D, m);
            mf_softmax_tile(m, l, acc, mt, s, vs, n, D, false);
        }
        __syncthreads();
    }
    if (row) {
        const float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++) p.out[qrow + d] = acc[d] * inv;
        p.lse[bh * p.Tq + i] = m + logf(l);
    }
}

extern "C" int attention_decode_forward_cuda(const MfAttentionDecodeParams *p,
                                             cudaStream_t stream) {
    if (p->B < 1 || p->Tq < 1 || p->Tk < p->Tq || p->Tmax < p->Tk || p->H < 1 || p->D < 16
        || p->D > DEC_MAX_D || p->D % 2 != 0 || !isfinite(p->scale) || p->B * p->H > 65535
        || p->q == NULL || p->k == NULL || p->v == NULL || p->out == NULL || p->lse == NULL)
        return MF_EINVAL;
    const dim3 grid(mf_blocks(p->Tq, DEC_BR), (unsigned)(p->B * p->H));
    return MF_LAUNCH(attention_decode_forward_kernel, grid, dim3(DEC_BR),
                     2 * DEC_BC * p->D * sizeof(float), stream, *p);
}
