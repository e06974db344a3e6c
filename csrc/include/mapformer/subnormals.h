/* Subnormal floats in the ops: flushed to zero (the default) or kept (IEEE).
 *
 * A product or an elementwise pass whose operands are subnormal (below FLT_MIN: a trained
 * model's confident softmax leaves gradients there) runs many times slower on CPUs that
 * handle them in microcode; measured on an Intel Xeon (Sapphire Rapids), a TDB training step
 * at step 2400 took 1.9x its time with them kept. With the mode on, every op flushes them:
 * its inputs are read as zero (x86 MXCSR.DAZ) and its results written as zero (MXCSR.FTZ;
 * aarch64 FPCR.FZ does both), a change below float32's smallest normal number.
 *
 * The mode is process-wide and applies inside the ops only: the binding's one call path sets
 * it on the calling thread for the op's run and restores the thread's own mode after
 * (mf_subnormals_enter / mf_subnormals_leave), so NumPy and the rest of the process keep
 * IEEE arithmetic; OpenMP's worker threads, which run nothing but the ops' parallel regions,
 * are set when the mode is set (and a worker created later starts with the mode of the op's
 * thread that creates it). MAPFORMER_SUBNORMALS=keep in the environment starts the module
 * with the mode off. */
#ifndef MAPFORMER_SUBNORMALS_H
#define MAPFORMER_SUBNORMALS_H

/* 1 where this build can flush (x86-64, aarch64), else 0 */
int mf_subnormals_flushable(void);
/* set the mode (1: flush, 0: keep): MF_OK, or MF_EINVAL for 1 where the build cannot flush */
int mf_set_flush_subnormals(int on);
/* the mode: 1 flush, 0 keep */
int mf_flush_subnormals(void);
/* the calling thread's floating-point control state, after setting the mode on it */
unsigned long long mf_subnormals_enter(void);
/* restore a state mf_subnormals_enter returned */
void mf_subnormals_leave(unsigned long long saved);

#endif
