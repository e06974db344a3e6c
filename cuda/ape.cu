/* APE's multiplicative distance decay on the GPU (csrc/ops/ape.c's ape_decay math): per token
 * t of q and k, q_out = gamma^(t - c) q, k_out = gamma^(c - t) k, c = (T - 1) / 2, each
 * scale exp(+-(t - c) ln gamma) computed in double and rounded to float; the backward scales
 * dq_out and dk_out the same way (gamma a constant). One thread per element (grid-stride).
 * ape_apply (per-token maps): chunk a (E = D / A) of token (b, t) times
 * maps[a, index[tb, t, a], h] (tb = b when TB = B, else 0); backward dx = M^T dy chunk by chunk
 * (=), dmaps[a, p, h] += sum over the tokens at position p, in (tb, t, b) order, of dy x^T.
 * One thread per output element (forward, dx) or per map entry (dmaps: it scans the index for
 * its position, no atomics). The index is device memory that the host check cannot read: an
 * entry outside [0, P) is skipped (its rows give 0); the Python wrapper checks the range.
 * The generator-side APE ops have no CUDA kernels yet. */
#include "common.cuh"

#define APE_THREADS 256

__global__ void ape_decay_kernel(float *qo, float *ko, const float *q, const float *k,
                                 int64_t n, int64_t T, int64_t R, double lg) {
    const double c = (double)(T - 1) / 2.0;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const double e = ((double)((i / R) % T) - c) * lg;
        qo[i] = (float)exp(e) * q[i];
        ko[i] = (float)exp(-e) * k[i];
    }
}

static int ape_decay_ok(const MfApeDecayParams *p) {
    return p->B >= 1 && p->T >= 1 && p->H >= 1 && p->D >= 1 && p->gamma > 0.0f
           && isfinite(p->gamma)
           && fabs(log((double)p->gamma)) * (double)(p->T - 1) / 2.0 <= APE_DECAY_MAX_LOG;
}

static int ape_decay_launch(float *qo, float *ko, const float *q, const float *k,
                            const MfApeDecayParams *p, cudaStream_t stream) {
    const int64_t n = p->B * p->T * p->H * p->D;
    const unsigned grid = mf_blocks(n, APE_THREADS);
    return MF_LAUNCH(ape_decay_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(APE_THREADS), 0, stream, qo, ko, q, k, n, p->T, p->H * p->D,
                     log((double)p->gamma));
}

extern "C" int ape_decay_forward_cuda(const MfApeDecayParams *p, cudaStream_t stream) {
    if (!ape_decay_ok(p)) return MF_EINVAL;
    return ape_decay_launch(p->q_out, p->k_out, p->q, p->k, p, stream);
}

extern "C" int ape_decay_backward_cuda(const MfApeDecayParams *p, cudaStream_t stream) {
    if (!ape_decay_ok(p)) return MF_EINVAL;
    return ape_decay_launch(p->dq, p->dk, p->dq_out, p->dk_out, p, stream);
}

__device__ __forceinline__ int64_t ape_index(const MfApeParams &p, int64_t b, int64_t t,
                                            int64_t a) {
    return p.index[((p.TB == 1 ? 0 : b) * p.T + t) * p.A + a];
}

/* y = M x (forward) or dx = M^T dy (backward), one element each */
__global__ void ape_apply_kernel(MfApeParams p, int backward) {
    const int64_t E = p.D / p.A, n = p.B * p.T * p.H * p.D;
    const float *in = backward ? p.dy : p.x;
    float *out = backward ? p.dx : p.y;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const int64_t c = i % p.D, row = i / p.D, h = row % p.H, bt = row / p.H;
        const int64_t a = c / E, e = c - a * E, t = bt % p.T, b = bt / p.T;
        const int64_t pos = ape_index(p, b, t, a);
        float s = 0.0f;
        if (pos >= 0 && pos < p.P) {
            const float *m = p.maps + ((a * p.P + pos) * p.H + h) * E * E;
            const float *x = in + row * p.D + a * E;
            for (int64_t j = 0; j < E; j++) s += (backward ? m[j * E + e] : m[e * E + j]) * x[j];
        }
        out[i] = s;
    }
}

/* dmaps[a, pos, h, i, j] += sum over tokens at pos of dy_i x_j, one thread per entry */
__global__ void ape_apply_dmaps_kernel(MfApeParams p) {
    const int64_t E = p.D / p.A, n = p.A * p.P * p.H * E * E;
    for (int64_t k = MF_GRID_START; k < n; k += MF_GRID_STRIDE) {
        const int64_t j = k % E, i = (k / E) % E, h = (k / (E * E)) % p.H;
        const int64_t pos = (k / (E * E * p.H)) % p.P, a = k / (E * E * p.H * p.P);
        float s = 0.0f;
        for (int64_t tb = 0; tb < p.TB; tb++)
            for (int64_t t = 0; t < p.T; t++) {
                if (ape_index(p, tb, t, a) != pos) continue;
                for (int64_t b = p.TB == 1 ? 0 : tb; b < (p.TB == 1 ? p.B : tb + 1); b++) {
                    const int64_t base = ((b * p.T + t) * p.H + h) * p.D + a * E;
                    s += p.dy[base + i] * p.x[base + j];
                }
            }
        p.dmaps[k] += s;
    }
}

static int ape_apply_ok(const MfApeParams *p) {
    return p->B >= 1 && p->T >= 1 && p->H >= 1 && p->A >= 1 && p->P >= 1 && p->D >= p->A
           && p->D % p->A == 0 && (p->TB == 1 || p->TB == p->B) && p->x != NULL
           && p->maps != NULL && p->index != NULL;
}

static unsigned ape_grid(int64_t n) {
    const unsigned grid = mf_blocks(n, APE_THREADS);
    return grid < MF_MAX_GRID ? grid : MF_MAX_GRID;
}

extern "C" int ape_apply_forward_cuda(const MfApeParams *p, cudaStream_t stream) {
    if (!ape_apply_ok(p) || p->y == NULL) return MF_EINVAL;
    return MF_LAUNCH(ape_apply_kernel, dim3(ape_grid(p->B * p->T * p->H * p->D)),
                     dim3(APE_THREADS), 0, stream, *p, 0);
}

extern "C" int ape_apply_backward_cuda(const MfApeParams *p, cudaStream_t stream) {
    if (!ape_apply_ok(p) || p->dx == NULL || p->dy == NULL || p->dmaps == NULL)
        return MF_EINVAL;
    const int64_t E = p->D / p->A;
    const int status = MF_LAUNCH(ape_apply_kernel, dim3(ape_grid(p->B * p->T * p->H * p->D)),
                                 dim3(APE_THREADS), 0, stream, *p, 1);
    if (status != MF_OK) return status;
    return MF_LAUNCH(ape_apply_dmaps_kernel, dim3(ape_grid(p->A * p->P * p->H * E * E)),
                     dim3(APE_THREADS), 0, stream, *p);
}
