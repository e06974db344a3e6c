/* The subnormal mode of the ops (mapformer/subnormals.h). */
#include "mapformer/subnormals.h"

#include "mapformer/mapformer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MF_FLUSH_BITS 0x8040u /* MXCSR: FTZ (bit 15) and DAZ (bit 6) */
static unsigned long long read_state(void) { return _mm_getcsr(); }
static void write_state(unsigned long long s) { _mm_setcsr((unsigned)s); }
#define MF_FLUSHABLE 1
#elif defined(__aarch64__)
#define MF_FLUSH_BITS (1ull << 24) /* FPCR: FZ */
static unsigned long long read_state(void) {
    unsigned long long s;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(s));
    return s;
}
static void write_state(unsigned long long s) { __asm__ __volatile__("msr fpcr, %0" : : "r"(s)); }
#define MF_FLUSHABLE 1
#else
#define MF_FLUSH_BITS 0u
static unsigned long long read_state(void) { return 0; }
static void write_state(unsigned long long s) { (void)s; }
#define MF_FLUSHABLE 0
#endif

static int flush = MF_FLUSHABLE;

static unsigned long long with_mode(unsigned long long s) {
    return flush ? s | MF_FLUSH_BITS : s & ~(unsigned long long)MF_FLUSH_BITS;
}

int mf_subnormals_flushable(void) { return MF_FLUSHABLE; }

int mf_flush_subnormals(void) { return flush; }

int mf_set_flush_subnormals(int on) {
    if (on && !MF_FLUSHABLE) return MF_EINVAL;
    flush = on != 0;
    /* the workers of OpenMP's pool keep their state between regions: set it on each; the
     * calling thread, which takes part in the region, gets its own state back */
    const unsigned long long mine = read_state();
#pragma omp parallel
    write_state(with_mode(read_state()));
    write_state(mine);
    return MF_OK;
}

unsigned long long mf_subnormals_enter(void) {
    const unsigned long long saved = read_state();
    write_state(with_mode(saved));
    return saved;
}

void mf_subnormals_leave(unsigned long long saved) { write_state(saved); }
