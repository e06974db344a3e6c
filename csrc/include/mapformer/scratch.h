/* Carving the caller's scratch (mapformer/params.h) into an op's regions: each region starts
 * on a 64-byte boundary (16 floats) when the scratch does, and per-thread regions are sized
 * for mf_max_threads() threads, an op running on as many as its scratch serves. */
#ifndef MAPFORMER_SCRATCH_H
#define MAPFORMER_SCRATCH_H

#include <stdint.h>

#include "mapformer/threads.h"

/* floats a region of n floats (or n / 2 doubles) takes, rounded up to 64 bytes */
static inline int64_t mf_scratch_size(int64_t n) { return (n + 15) / 16 * 16; }

/* the region of n floats at *at; *at moves past it */
static inline float *mf_scratch_take(float **at, int64_t n) {
    float *region = *at;
    *at += mf_scratch_size(n);
    return region;
}

/* threads that `available` floats of scratch serve at `per_thread` floats each (per_thread
 * already rounded by mf_scratch_size), at most mf_max_threads(); 0 when not even one */
static inline int mf_scratch_threads(int64_t available, int64_t per_thread) {
    const int64_t n = per_thread > 0 ? available / per_thread : mf_max_threads();
    return (int)(n < mf_max_threads() ? (n > 0 ? n : 0) : mf_max_threads());
}

#endif
