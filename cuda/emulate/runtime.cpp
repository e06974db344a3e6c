/* The emulation's controls, exported for the tests (tests/cuda_emulation.py). */
#include "emulate.h"

/* 0 concurrent, 1 serial in increasing thread order, 2 serial in decreasing order; returns
 * the previous schedule, or -1 (unchanged) for an unknown one */
extern "C" int mf_emu_set_schedule(int schedule) {
    if (schedule < mf_emu::CONCURRENT || schedule > mf_emu::SERIAL_REVERSE) return -1;
    return mf_emu::schedule.exchange(schedule);
}
