/* cuBLAS for the kernels' matrix products (gemm.cuh's mf_gemm: linear, mlp, vq's distances,
 * lstm's gates), loaded at run time: no cuBLAS header or library is needed to build, and a
 * machine without cuBLAS runs gemm.cuh's tiles instead.
 *
 * On the first product: MAPFORMER_CUDA_GEMM (read once) = "cublas" (the default) or "tiled";
 * with "cublas", dlopen of libcublas.so.<CUDA major> (the one CuPy loaded into the process
 * when present: mapformer.cuda.load asks CuPy for its cuBLAS handle first, so the soname
 * resolves to CuPy's copy) and one handle per device, made on that device's first product.
 * Every call sets the handle's stream under a lock (ctypes releases the GIL), so products
 * from several host threads stay on their own streams; cuBLAS gives the same bits run to run
 * while one stream at a time uses a handle (its reproducibility condition). Full float32
 * arithmetic (cuBLAS's default math mode: no TF32). A device whose handle cannot be made
 * runs the tiles. mf_blas_library() says which path products take; mapformer.cuda.load
 * refuses a MAPFORMER_CUDA_GEMM other than cublas or tiled.
 *
 * Under the CPU emulation there is no cuBLAS: mf_blas_sgemm answers MF_BLAS_NONE and the
 * tiles run, which is how the emulated tests check gemm.cuh. */
#include "gemm.cuh"

#ifdef __CUDACC__

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <climits>
#include <mutex>

namespace {

/* cuBLAS's v2 entry points, declared here rather than taken from cublas_v2.h (handles are
 * opaque pointers, enums ints, statuses 0 on success) */
typedef int (*CublasCreate)(void **handle);
typedef int (*CublasSetStream)(void *handle, cudaStream_t stream);
typedef int (*CublasSgemm)(void *handle, int transa, int transb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
const int CUBLAS_OP_N = 0, CUBLAS_OP_T = 1;
const int MAX_DEVICES = 64;

struct Blas {
    std::once_flag once;
    std::mutex lock;
    CublasCreate create = nullptr;
    CublasSetStream set_stream = nullptr;
    CublasSgemm sgemm = nullptr;
    void *handles[MAX_DEVICES] = {};
    bool failed[MAX_DEVICES] = {}; /* cublasCreate refused: the tiles run there */
    int library = MF_BLAS_TILED;
};
Blas blas;

void load() {
    const char *want = getenv("MAPFORMER_CUDA_GEMM");
    if (want != nullptr && strcmp(want, "tiled") == 0) return;
    char name[32];
    snprintf(name, sizeof name, "libcublas.so.%d", CUDART_VERSION / 1000);
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    blas.create = (CublasCreate)dlsym(lib, "cublasCreate_v2");
    blas.set_stream = (CublasSetStream)dlsym(lib, "cublasSetStream_v2");
    blas.sgemm = (CublasSgemm)dlsym(lib, "cublasSgemm_v2");
    if (blas.create && blas.set_stream && blas.sgemm) blas.library = MF_BLAS_CUBLAS;
}

}  // namespace

extern "C" int mf_blas_library(void) {
    std::call_once(blas.once, load);
    return blas.library;
}

extern "C" int mf_blas_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                             int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc,
                             int accumulate, cudaStream_t stream) {
    if (mf_blas_library() != MF_BLAS_CUBLAS || M < 1 || N < 1 || K < 1 || M > INT_MAX ||
        N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX)
        return MF_BLAS_NONE;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return MF_ECUDA;
    if (device < 0 || device >= MAX_DEVICES) return MF_BLAS_NONE;
    std::lock_guard<std::mutex> guard(blas.lock);
    if (blas.failed[device]) return MF_BLAS_NONE;
    if (blas.handles[device] == nullptr && blas.create(&blas.handles[device]) != 0) {
        blas.handles[device] = nullptr;
        blas.failed[device] = true;
        return MF_BLAS_NONE;
    }
    /* row-major C (M, N) = op(A) op(B) is column-major C^T (N, M) = op(B)^T op(A)^T: cuBLAS
     * multiplies B's column-major view by A's */
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (blas.set_stream(blas.handles[device], stream) != 0) return MF_ECUDA;
    const int status = blas.sgemm(blas.handles[device], tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, B,
                                  (int)ldb, A, (int)lda, &beta, C, (int)ldc);
    return status == 0 ? MF_OK : MF_ECUDA;
}

#else /* the emulation: no cuBLAS */

extern "C" int mf_blas_library(void) { return MF_BLAS_TILED; }

extern "C" int mf_blas_sgemm(int, int, int64_t, int64_t, int64_t, const float *, int64_t,
                             const float *, int64_t, float *, int64_t, int, cudaStream_t) {
    return MF_BLAS_NONE;
}

#endif
