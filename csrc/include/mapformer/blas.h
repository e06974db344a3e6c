/* CBLAS as mapformer uses it. The scipy-openblas32 wheel exports its symbols with the prefix
 * `scipy_` (setup.py defines MF_BLAS_PREFIX); a system OpenBLAS has none. Only the routines
 * the ops call are declared, so no cblas.h is needed at build time. */
#ifndef MAPFORMER_BLAS_H
#define MAPFORMER_BLAS_H

#include <stdint.h>

#ifdef MF_BLAS_PREFIX
#define MF_BLAS_LIBRARY "scipy-openblas32" /* the wheel: the only build with a prefix */
#else
#define MF_BLAS_PREFIX
#define MF_BLAS_LIBRARY "system"
#endif
#define MF_BLAS_CAT2(a, b) a##b
#define MF_BLAS_CAT(a, b) MF_BLAS_CAT2(a, b)
#define MF_BLAS(name) MF_BLAS_CAT(MF_BLAS_PREFIX, name)

enum MF_CBLAS_ORDER { MfRowMajor = 101, MfColMajor = 102 };
enum MF_CBLAS_TRANSPOSE { MfNoTrans = 111, MfTrans = 112 };

/* C = alpha * op(A) op(B) + beta * C, row-major; blasint is 32-bit in scipy-openblas32. */
void MF_BLAS(cblas_sgemm)(enum MF_CBLAS_ORDER order, enum MF_CBLAS_TRANSPOSE transa,
                          enum MF_CBLAS_TRANSPOSE transb, int m, int n, int k, float alpha,
                          const float *a, int lda, const float *b, int ldb, float beta, float *c,
                          int ldc);

void MF_BLAS(openblas_set_num_threads)(int num_threads);

/* OpenBLAS's build description ("OpenBLAS 0.3.27 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64") */
char *MF_BLAS(openblas_get_config)(void);
int MF_BLAS(openblas_get_num_threads)(void);

/* Make OpenBLAS single-threaded: the core parallelises with OpenMP only (see core.c). */
void mf_blas_single_thread(void);

/* Row-major sgemm with int64 sizes. Returns MF_EINVAL when a size does not fit BLAS's int.
 * ta/tb: 0 = no transpose, 1 = transpose. */
int mf_sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
             int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* mf_sgemm with the rows of C split over the OpenMP threads (for large products; a call
 * inside a parallel region runs on its thread). Same arguments and result. */
int mf_sgemm_rows(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

#endif
