/* SiLU and softplus (the Mamba block's activations), elementwise.
 *
 * Forward saves nothing: backward recomputes from x. dx is an activation gradient (=).
 *   silu:     y = x s, s = sigmoid(x);        dx = dy s (1 + x (1 - s))
 *   softplus: y = log(1 + e^x) (x <= 20);     dx = dy s
 *             y = x              (x > 20);    dx = dy      (Mamba's / PyTorch's threshold)
 * SiLU's sigmoid is simd.h's vsigmoid (the core's one exponential), compiled for AVX-512,
 * AVX2 and baseline x86-64 (target_clones). softplus uses log1pf(expf(x)) (no cancellation:
 * log1p of the small e^x for x << 0) and the same sigmoid for its derivative.
 */
#include <math.h>
#include <stdint.h>

#include "mapformer/clones.h"
#include "mapformer/mapformer.h"

#define MF_VW MF_CLONES_VW
#include "mapformer/simd.h"

#define ACT_CHUNK 8192 /* elements per OpenMP work item */
#define SOFTPLUS_THRESHOLD 20.0f

MF_CLONES
static void silu_kernel(float *restrict y, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i += MF_VW) {
        const int64_t m = n - i < MF_VW ? n - i : MF_VW;
        vf v, s;
        vload_part(&v, x + i, m);
        s = v;
        vsigmoid(&s);
        s = v * s;
        vstore_part(y + i, &s, m);
    }
}

MF_CLONES
static void silu_grad_kernel(float *restrict dx, const float *restrict dy,
                             const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i += MF_VW) {
        const int64_t m = n - i < MF_VW ? n - i : MF_VW;
        vf v, d, s;
        vload_part(&v, x + i, m);
        vload_part(&d, dy + i, m);
        s = v;
        vsigmoid(&s);
        d = d * (s * (1.0f + v * (1.0f - s)));
        vstore_part(dx + i, &d, m);
    }
}

MF_CLONES
static void softplus_kernel(float *restrict y, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] > SOFTPLUS_THRESHOLD ? x[i] : log1pf(expf(x[i]));
}

MF_CLONES
static void softplus_grad_kernel(float *restrict dx, const float *restrict dy,
                                 const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i += MF_VW) {
        const int64_t m = n - i < MF_VW ? n - i : MF_VW;
        vf v, d, s;
        vload_part(&v, x + i, m);
        vload_part(&d, dy + i, m);
        s = v;
        vsigmoid(&s);
        s = VSELECT(v > VSPLAT(SOFTPLUS_THRESHOLD), VSPLAT(1.0f), s);
        d = d * s;
        vstore_part(dx + i, &d, m);
    }
}

/* run kernel over n elements in ACT_CHUNK pieces on the OpenMP team */
#define RUN_CHUNKS(call)                                                                   \
    do {                                                                                   \
        const int64_t n = p->n;                                                            \
        if (n < 1) return MF_EINVAL;                                                       \
        const int64_t chunks = (n + ACT_CHUNK - 1) / ACT_CHUNK;                            \
        _Pragma("omp parallel for schedule(dynamic, 1) if (chunks > 1)")                   \
        for (int64_t c = 0; c < chunks; c++) {                                             \
            const int64_t i0 = c * ACT_CHUNK, len = n - i0 < ACT_CHUNK ? n - i0 : ACT_CHUNK; \
            call;                                                                          \
        }                                                                                  \
        return MF_OK;                                                                      \
    } while (0)

int silu_forward(const MfActivationParams *p) {
    RUN_CHUNKS(silu_kernel(p->y + i0, p->x + i0, len));
}

int silu_backward(const MfActivationParams *p) {
    RUN_CHUNKS(silu_grad_kernel(p->dx + i0, p->dy + i0, p->x + i0, len));
}

int softplus_forward(const MfActivationParams *p) {
    RUN_CHUNKS(softplus_kernel(p->y + i0, p->x + i0, len));
}

int softplus_backward(const MfActivationParams *p) {
    RUN_CHUNKS(softplus_grad_kernel(p->dx + i0, p->dy + i0, p->x + i0, len));
}
