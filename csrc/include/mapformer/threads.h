/* OpenMP thread counts and ids: 1 and 0 in a build without OpenMP. */
#ifndef MAPFORMER_THREADS_H
#define MAPFORMER_THREADS_H

#ifdef _OPENMP
#include <omp.h>
#endif

static inline int mf_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* threads of the current team */
static inline int mf_num_threads(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

static inline int mf_thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

#endif
