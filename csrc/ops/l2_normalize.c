/* L2 normalisation of rows (TDB's enc objective: a head's output and the teacher's code, each
 * scaled to unit length).
 *
 *   forward:  norm = sqrt(sum_d x_d^2 + eps),  y = x / norm      (norm saved)
 *   backward: dx = (dy - y (y . dy)) / norm                      (=)
 * eps > 0 keeps a zero row finite (y = 0, dx = dy / sqrt(eps)).
 *
 * The row sums (x . x, y . dy) take each product in double (exact for float32 factors) and
 * add them in MF_VW double lanes, the lanes summed in lane order: no overflow or underflow of
 * the squares, and the same order in every target clone. The scaling multiplies by 1 / norm
 * rounded once to float32 (y within about one ulp of x / norm). Rows are independent and each
 * is computed whole by one thread, so the bits do not depend on the thread count. The row
 * loops run on simd.h's vectors at MF_CLONES_VW floats, compiled for AVX-512, AVX2 and
 * baseline x86-64 (clones.h).
 */
#include <math.h>
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#define MF_VW MF_CLONES_VW
#include "mapformer/simd.h"

/* about this many floats of a row block per OpenMP work item */
#define L2_CHUNK 16384

/* MF_VW doubles (a vf widened; simd.h's vd holds half as many): the lanes of the row sums */
typedef double vd2 __attribute__((vector_size(8 * MF_VW)));

/* the MF_VW lanes of acc summed in lane order */
#define HSUM(acc)                                          \
    __extension__({                                        \
        double s_ = 0.0;                                   \
        for (int l_ = 0; l_ < MF_VW; l_++) s_ += (acc)[l_]; \
        s_;                                                \
    })

MF_CLONES
static void forward_rows(float *restrict y, float *restrict norm, const float *restrict x,
                         int64_t r0, int64_t r1, int64_t D, double eps) {
    for (int64_t n = r0; n < r1; n++) {
        const float *xr = x + n * D;
        float *yr = y + n * D;
        vd2 acc = {0};
        MF_VLOOP(D, {
            vf xv;
            VLOADN(xv, xr + i);
            const vd2 xd = __builtin_convertvector(xv, vd2);
            acc += xd * xd;
        });
        const double nrm = sqrt(HSUM(acc) + eps);
        const vf inv = VSPLAT((float)(1.0 / nrm));
        MF_VLOOP(D, {
            vf xv;
            VLOADN(xv, xr + i);
            const vf yv = xv * inv;
            VSTOREN(yr + i, yv);
        });
        norm[n] = (float)nrm;
    }
}

MF_CLONES
static void backward_rows(float *restrict dx, const float *restrict dy, const float *restrict y,
                          const float *restrict norm, int64_t r0, int64_t r1, int64_t D) {
    for (int64_t n = r0; n < r1; n++) {
        const float *dyr = dy + n * D, *yr = y + n * D;
        float *dxr = dx + n * D;
        vd2 acc = {0};
        MF_VLOOP(D, {
            vf yv, gv;
            VLOADN(yv, yr + i);
            VLOADN(gv, dyr + i);
            acc += __builtin_convertvector(yv, vd2) * __builtin_convertvector(gv, vd2);
        });
        const vf dot = VSPLAT((float)HSUM(acc));
        const vf inv = VSPLAT((float)(1.0 / (double)norm[n]));
        MF_VLOOP(D, {
            vf yv, gv;
            VLOADN(yv, yr + i);
            VLOADN(gv, dyr + i);
            const vf d = (gv - yv * dot) * inv;
            VSTOREN(dxr + i, d);
        });
    }
}

/* rows per work item and the item count for N rows of D floats */
static int64_t row_block(int64_t D) { return D >= L2_CHUNK ? 1 : L2_CHUNK / D; }

int l2_normalize_forward(const MfL2NormalizeParams *p) {
    const int64_t N = p->N, D = p->D;
    if (N < 1 || D < 1 || !(p->eps > 0.0f) || !isfinite(p->eps)) return MF_EINVAL;
    const int64_t rows = row_block(D), items = (N + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int64_t b = 0; b < items; b++) {
        const int64_t r0 = b * rows, r1 = r0 + rows < N ? r0 + rows : N;
        forward_rows(p->y, p->norm, p->x, r0, r1, D, (double)p->eps);
    }
    return MF_OK;
}

int l2_normalize_backward(const MfL2NormalizeParams *p) {
    const int64_t N = p->N, D = p->D;
    if (N < 1 || D < 1) return MF_EINVAL;
    const int64_t rows = row_block(D), items = (N + rows - 1) / rows;
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int64_t b = 0; b < items; b++) {
        const int64_t r0 = b * rows, r1 = r0 + rows < N ? r0 + rows : N;
        backward_rows(p->dx, p->dy, p->y_in, p->norm_in, r0, r1, D);
    }
    return MF_OK;
}
