/* MapEM-NC positions on the GPU (csrc/ops/nc.c's math): per 4x4 block the ordered product
 * p_t = exp(S_t) ... exp(S_1) p*, S_t = L(u_t) + R(v_t), i.e. p_t = A_t p* C_t with the
 * unit-quaternion prefix products A_t = a_t A_{t-1}, C_t = C_{t-1} c_t, a_t = qexp(u_t),
 * c_t = qexp(v_t) (A_0 = C_0 = 1).
 * Forward: one thread per independent sequence (b, h, k), sequential in t (the product is
 * associative, but B H NB chains per call fill a GPU at the sizes the model uses), in double:
 * p_t = a_t p_{t-1} c_t, rounded to float on store (the C op works in float with a
 * renormalisation each step; in double the norm drifts by about T 1e-16, nothing to correct).
 * Backward: a block per (h, k), its threads over batch rows b. Each thread runs its chain
 * forward to A_T, C_T, then in reverse with the adjoints of the two prefix products
 * (mapformer/reference.py's nc_backward):
 *   lam_t = g_t conj(p* C_t) + conj(a_{t+1}) lam_{t+1},  da_t = lam_t conj(A_{t-1}),
 *   mu_t = conj(A_t p*) g_t + mu_{t+1} conj(c_{t+1}),    dc_t = conj(C_{t-1}) mu_t,
 *   dw_t = (J(u_t)^T da_t, J(v_t)^T dc_t) (=),  dp* += sum_t conj(A_t) g_t conj(C_t),
 * stepping A, C back by the unit steps' inverses, A_{t-1} = conj(a_t) A_t, C_{t-1} = C_t
 * conj(c_t) (in double: an error of about T 1e-16, no scratch). dp* is summed per thread in
 * double, then over the block's threads by a fixed tree (mf_block_reduce) and added once
 * (+=): deterministic, no atomics; the struct's scratch is not used.
 * Layout (the C op's): feature-major within a head, w (B, T, H, 6, NB) and p, p*, dp
 * (..., H, 4 NB) with component f of block k at f NB + k; a thread's features are NB apart,
 * and consecutive threads read consecutive blocks. */
#include "quat.cuh"

#define NC_THREADS 128 /* forward threads per block */
#define NC_BTHREADS 32 /* backward threads (over b) per block, a power of two */

/* w: coordinate 0 of one block's (u, v), its coordinates NB apart */
static __device__ DQuat nc_step(const float *w, int64_t NB, int half, double *sc, double *k) {
    return dq_exp(w[3 * half * NB], w[(3 * half + 1) * NB], w[(3 * half + 2) * NB], sc, k);
}

/* the quaternion of one block at x, its components NB apart */
static __device__ DQuat nc_load(const float *x, int64_t NB) {
    return DQuat{x[0], x[NB], x[2 * NB], x[3 * NB]};
}

/* where feature 0 of block j = h NB + k of row r (nb = H NB blocks a row, F floats a block)
 * is: F (r nb + h NB) + k */
static __device__ int64_t nc_at(int64_t r, int64_t j, int64_t nb, int64_t NB, int64_t F) {
    return F * (r * nb + j - j % NB) + j % NB;
}

__global__ void nc_forward_kernel(MfNcParams p) {
    const int64_t n = p.B * p.H * p.NB, nb = p.H * p.NB;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const int64_t j = i % nb, bb = i / nb;
        DQuat q = nc_load(p.start + nc_at(0, j, nb, p.NB, 4), p.NB); /* (H, 4, NB) = (H, D) */
        double sc, kk;
        for (int64_t t = 0; t < p.T; t++) {
            const int64_t r = bb * p.T + t;
            const float *w = p.w + nc_at(r, j, nb, p.NB, 6);
            q = dq_mul(dq_mul(nc_step(w, p.NB, 0, &sc, &kk), q), nc_step(w, p.NB, 1, &sc, &kk));
            float *out = p.p + nc_at(r, j, nb, p.NB, 4);
            out[0] = (float)q.w, out[p.NB] = (float)q.x, out[2 * p.NB] = (float)q.y;
            out[3 * p.NB] = (float)q.z;
        }
    }
}

/* the 3 floats of dw = J(w)^T d (qexp's Jacobian at the pure quaternion w: sinc n (d_vec -
 * d_0 w) + k w (w . d_vec)); w's and dw's coordinates NB apart */
static __device__ void nc_vjp(float *dw, const float *w, int64_t NB, double sc, double k,
                              DQuat d) {
    const double wx = w[0], wy = w[NB], wz = w[2 * NB];
    const double dot = wx * d.x + wy * d.y + wz * d.z;
    dw[0] = (float)(sc * (d.x - d.w * wx) + k * wx * dot);
    dw[NB] = (float)(sc * (d.y - d.w * wy) + k * wy * dot);
    dw[2 * NB] = (float)(sc * (d.z - d.w * wz) + k * wz * dot);
}

__global__ void nc_backward_kernel(MfNcParams p) {
    __shared__ double buf[NC_BTHREADS];
    const int64_t j = blockIdx.x, nb = p.H * p.NB;
    const DQuat s = nc_load(p.start + nc_at(0, j, nb, p.NB, 4), p.NB);
    double acc[4] = {0, 0, 0, 0};
    for (int64_t bb = threadIdx.x; bb < p.B; bb += blockDim.x) {
        DQuat A = {1, 0, 0, 0}, C = {1, 0, 0, 0};
        double sc, kk;
        for (int64_t t = 0; t < p.T; t++) {
            const float *w = p.w + nc_at(bb * p.T + t, j, nb, p.NB, 6);
            A = dq_mul(nc_step(w, p.NB, 0, &sc, &kk), A);
            C = dq_mul(C, nc_step(w, p.NB, 1, &sc, &kk));
        }
        DQuat lam = {0, 0, 0, 0}, mu = {0, 0, 0, 0}, an = {1, 0, 0, 0}, cn = {1, 0, 0, 0};
        for (int64_t t = p.T - 1; t >= 0; t--) {
            const int64_t r = bb * p.T + t, wo = nc_at(r, j, nb, p.NB, 6);
            const float *w = p.w + wo;
            const DQuat g = nc_load(p.dp + nc_at(r, j, nb, p.NB, 4), p.NB);
            double sca, ka, scc, kc;
            const DQuat a = nc_step(w, p.NB, 0, &sca, &ka), c = nc_step(w, p.NB, 1, &scc, &kc);
            lam = dq_add(dq_mul(g, dq_conj(dq_mul(s, C))), dq_mul(dq_conj(an), lam));
            mu = dq_add(dq_mul(dq_conj(dq_mul(A, s)), g), dq_mul(mu, dq_conj(cn)));
            const DQuat ds = dq_mul(dq_mul(dq_conj(A), g), dq_conj(C));
            acc[0] += ds.w, acc[1] += ds.x, acc[2] += ds.y, acc[3] += ds.z;
            A = dq_mul(dq_conj(a), A); /* A_{t-1}, C_{t-1} */
            C = dq_mul(C, dq_conj(c));
            float *dw = p.dw + wo;
            nc_vjp(dw, w, p.NB, sca, ka, dq_mul(lam, dq_conj(A)));
            nc_vjp(dw + 3 * p.NB, w + 3 * p.NB, p.NB, scc, kc, dq_mul(dq_conj(C), mu));
            an = a, cn = c;
        }
    }
    for (int i = 0; i < 4; i++) acc[i] = mf_block_reduce(acc[i], buf, MfSum());
    if (threadIdx.x != 0) return;
    float *ds = p.dstart + nc_at(0, j, nb, p.NB, 4);
    for (int i = 0; i < 4; i++) ds[i * p.NB] += (float)acc[i];
}

static int nc_bad(const MfNcParams *p) {
    return p->B < 0 || p->T < 0 || p->H < 0 || p->NB < 0 || p->D != 4 * p->NB || p->F != 6 ||
           p->H * p->NB > MF_MAX_GRID;
}

extern "C" int nc_forward_cuda(const MfNcParams *p, cudaStream_t stream) {
    if (nc_bad(p)) return MF_EINVAL;
    const int64_t n = p->B * p->H * p->NB;
    if (n == 0 || p->T == 0) return MF_OK;
    const unsigned grid =
        mf_blocks(n, NC_THREADS) < MF_MAX_GRID ? mf_blocks(n, NC_THREADS) : MF_MAX_GRID;
    return MF_LAUNCH(nc_forward_kernel, dim3(grid), dim3(NC_THREADS), 0, stream, *p);
}

extern "C" int nc_backward_cuda(const MfNcParams *p, cudaStream_t stream) {
    if (nc_bad(p)) return MF_EINVAL;
    if (p->H * p->NB == 0) return MF_OK;
    return MF_LAUNCH(nc_backward_kernel, dim3((unsigned)(p->H * p->NB)), dim3(NC_BTHREADS), 0,
                     stream, *p);
}
