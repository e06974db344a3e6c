/* GridPE's complex form on the GPU (csrc/ops/gridpe.c's math): per channel d of x
 * (B, T, H, E = W/2), y[.., 2d] = x_d cos theta_d, y[.., 2d + 1] = x_d sin theta_d, theta
 * (TB, T, H, E) broadcast over b when TB = 1; backward dx_d = cos theta_d dy[2d] +
 * sin theta_d dy[2d + 1] (=; theta fixed). cos and sin in double of the float angle, rounded
 * once, as the C op. One thread per channel (grid-stride). */
#include "common.cuh"

#define GRIDPE_THREADS 256

__global__ void gridpe_complex_kernel(MfGridpeParams p, int backward) {
    const int64_t R = p.H * (p.W / 2), n = p.B * p.T * R;
    for (int64_t i = MF_GRID_START; i < n; i += MF_GRID_STRIDE) {
        const int64_t row = i / R, j = i - row * R, t = row % p.T;
        const int64_t tb = p.TB == 1 ? 0 : row / p.T;
        const double a = (double)p.theta[(tb * p.T + t) * R + j];
        if (backward) {
            p.dx[i] = (float)(cos(a) * (double)p.dy[2 * i] + sin(a) * (double)p.dy[2 * i + 1]);
        } else {
            const double v = (double)p.x[i];
            p.y[2 * i] = (float)(v * cos(a));
            p.y[2 * i + 1] = (float)(v * sin(a));
        }
    }
}

static int gridpe_launch(const MfGridpeParams *p, int backward, cudaStream_t stream) {
    if (p->B < 1 || p->T < 1 || p->H < 1 || p->W < 2 || p->W % 2 != 0
        || (p->TB != 1 && p->TB != p->B) || p->theta == NULL
        || (backward ? p->dx == NULL || p->dy == NULL : p->y == NULL || p->x == NULL))
        return MF_EINVAL;
    const unsigned grid = mf_blocks(p->B * p->T * p->H * (p->W / 2), GRIDPE_THREADS);
    return MF_LAUNCH(gridpe_complex_kernel, dim3(grid < MF_MAX_GRID ? grid : MF_MAX_GRID),
                     dim3(GRIDPE_THREADS), 0, stream, *p, backward);
}

extern "C" int gridpe_complex_forward_cuda(const MfGridpeParams *p, cudaStream_t stream) {
    return gridpe_launch(p, 0, stream);
}

extern "C" int gridpe_complex_backward_cuda(const MfGridpeParams *p, cudaStream_t stream) {
    return gridpe_launch(p, 1, stream);
}
