/* CUDA's execution model on the CPU (the rules are in cuda/common.cuh, which includes this
 * file when no CUDA compiler is compiling). C++17 and OpenMP (-fopenmp). */
#ifndef MAPFORMER_CUDA_EMULATE_H
#define MAPFORMER_CUDA_EMULATE_H

#include <omp.h>
#include <semaphore.h>
#include <string.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

typedef struct MfEmuStream *cudaStream_t;

namespace mf_emu {

enum Schedule { CONCURRENT = 0, SERIAL_FORWARD = 1, SERIAL_REVERSE = 2 };

/* the block being run: its barrier, the serial schedule's token ring, its dynamic shared
 * memory */
struct Block {
    int n = 0, schedule = CONCURRENT;
    /* barrier (concurrent schedule): `exited` threads have returned from the kernel */
    std::mutex mutex;
    std::condition_variable cv;
    int arrived = 0, exited = 0;
    unsigned long generation = 0;
    /* token ring (serial schedules): thread t runs while it holds the token, sems[t] */
    std::vector<sem_t> sems;
    std::atomic<int> finished{0};
    std::vector<unsigned char> shared;

    int next(int t) const { return schedule == SERIAL_REVERSE ? (t + n - 1) % n : (t + 1) % n; }
    int first() const { return schedule == SERIAL_REVERSE ? n - 1 : 0; }

    void release_locked() {
        arrived = 0;
        generation++;
        cv.notify_all();
    }
    void arrive() {
        std::unique_lock<std::mutex> lock(mutex);
        const unsigned long g = generation;
        if (++arrived + exited == n)
            release_locked();
        else
            cv.wait(lock, [&] { return generation != g; });
    }
    void exit() {
        std::lock_guard<std::mutex> lock(mutex);
        if (++exited + arrived == n && arrived > 0) release_locked();
    }
    /* serial: hand the token on, wait for it to come back */
    void pass(int t) { sem_post(&sems[next(t)]); }
    void take(int t) {
        while (sem_wait(&sems[t]) != 0) {
        }
    }
    /* serial: a thread that returned from the kernel keeps handing the token on until every
     * thread has returned */
    void finish(int t) {
        const int done = ++finished;
        pass(t);
        if (done == n) return;
        for (;;) {
            take(t);
            const bool all = finished.load() == n;
            pass(t);
            if (all) return;
        }
    }
};

struct Thread {
    dim3 threadIdx, blockIdx, blockDim, gridDim;
    int rank = 0;
    Block *block = nullptr;
    void *dynamic_shared = nullptr;
};

inline thread_local Thread self;
inline std::atomic<int> schedule{CONCURRENT};
inline std::mutex launch_lock;
/* the launch configuration limits of sm_80 / sm_90 without opt-ins */
constexpr long MAX_THREADS = 1024, MAX_SHARED = 48 * 1024;

inline void syncthreads() {
    Block *b = self.block;
    if (b->schedule == CONCURRENT) {
        b->arrive();
    } else {
        b->pass(self.rank);
        b->take(self.rank);
    }
}

/* run body() as the kernel of a <<<grid, block, shared>>> launch; returns an MfStatus */
template <class F>
int launch(dim3 grid, dim3 block, size_t shared_bytes, const F &body) {
    const long n = (long)block.x * block.y * block.z;
    if (n < 1 || n > MAX_THREADS || block.z > 64 || grid.x < 1 || grid.y < 1 || grid.z < 1
        || grid.y > 65535 || grid.z > 65535 || (long)shared_bytes > MAX_SHARED)
        return 4; /* MF_ECUDA: CUDA's invalid configuration */
    std::lock_guard<std::mutex> guard(launch_lock);
    Block b;
    b.n = (int)n;
    b.schedule = schedule.load();
    b.sems.resize(n);
    b.shared.resize(shared_bytes > 0 ? shared_bytes : 1);
    for (auto &s : b.sems) sem_init(&s, 0, 0);
    int team_ok = 1;
    const int dynamic = omp_get_dynamic();
    omp_set_dynamic(0);
#pragma omp parallel num_threads((int)n)
    {
        if (omp_get_num_threads() != (int)n) {
#pragma omp atomic write
            team_ok = 0;
        } else {
            const int t = omp_get_thread_num();
            self.block = &b;
            self.rank = t;
            self.blockDim = block;
            self.gridDim = grid;
            self.threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            self.dynamic_shared = b.shared.data();
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
#pragma omp barrier
#pragma omp single
                        {
                            memset(b.shared.data(), 0xff, b.shared.size());
                            b.arrived = b.exited = 0;
                            b.finished = 0;
                            for (auto &s : b.sems) {
                                while (sem_trywait(&s) == 0) {
                                }
                            }
                            if (b.schedule != CONCURRENT) sem_post(&b.sems[b.first()]);
                        } /* implicit barrier */
                        self.blockIdx = dim3(x, y, z);
                        if (b.schedule != CONCURRENT) b.take(t);
                        body();
                        if (b.schedule != CONCURRENT)
                            b.finish(t);
                        else
                            b.exit();
                    }
            self.block = nullptr;
        }
    }
    omp_set_dynamic(dynamic);
    for (auto &s : b.sems) sem_destroy(&s);
    return team_ok ? 0 : 4;
}

} /* namespace mf_emu */

#define threadIdx (mf_emu::self.threadIdx)
#define blockIdx (mf_emu::self.blockIdx)
#define blockDim (mf_emu::self.blockDim)
#define gridDim (mf_emu::self.gridDim)

inline void __syncthreads() { mf_emu::syncthreads(); }

inline float atomicAdd(float *address, float value) {
    float old;
#pragma omp atomic capture
    {
        old = *address;
        *address += value;
    }
    return old;
}

inline int atomicAdd(int *address, int value) {
    int old;
#pragma omp atomic capture
    {
        old = *address;
        *address += value;
    }
    return old;
}

inline double atomicAdd(double *address, double value) {
    double old;
#pragma omp atomic capture
    {
        old = *address;
        *address += value;
    }
    return old;
}

#define MF_DYNAMIC_SHARED(type, name) type *name = (type *)mf_emu::self.dynamic_shared
#define MF_LAUNCH(kernel, grid, block, shared, stream, ...) \
    ((void)(stream), mf_emu::launch((grid), (block), (shared), [&] { kernel(__VA_ARGS__); }))

#endif
