"""The CPU execution of CUDA's model (cuda/common.cuh, cuda/emulate/) against what CUDA
guarantees, with the small kernels of tests/cuda/emulator_tests.cu: barriers order a block's
threads, a missing barrier is a race the two serial schedules expose deterministically,
blocks and threads are numbered as CUDA numbers them, threads that return early do not hold a
barrier up, __shared__ memory is per block, atomics are atomic, and a launch CUDA would refuse
is refused."""
import ctypes

import numpy as np
import pytest

from cuda_emulation import SCHEDULES, Emulation, build


@pytest.fixture(scope="module")
def emu():
    e = Emulation(build())
    yield e
    e.schedule("concurrent")


def neighbour(emu, schedule, n, sync):
    emu.schedule(schedule)
    out = np.zeros(n, np.float32)
    assert emu.lib.mf_test_neighbour(ctypes.c_void_p(out.ctypes.data), n, int(sync)) == 0
    return out


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("n", [1, 2, 33, 256])
def test_barrier_orders_the_block(emu, schedule, n):
    """With __syncthreads every thread reads its neighbour's write, on every schedule."""
    t = np.arange(n)
    assert np.array_equal(neighbour(emu, schedule, n, True), ((t + 1) % n + 1).astype(np.float32))


def test_missing_barrier_is_detected(emu):
    """Without the barrier, thread t reads s[t + 1] before (forward order: the poison NaN of
    the block's fresh shared memory) or after (reverse order) thread t + 1 wrote it (and the
    wrap-around pair the other way round): the two serial schedules disagree, so the race is
    found whatever the real threads happen to do."""
    n = 64
    forward = neighbour(emu, "serial_forward", n, False)
    reverse = neighbour(emu, "serial_reverse", n, False)
    t = np.arange(n)
    assert np.all(np.isnan(forward[:-1])) and forward[-1] == 1.0
    assert np.array_equal(reverse[:-1], (t[:-1] + 2).astype(np.float32))
    assert np.isnan(reverse[-1])
    assert not np.array_equal(forward, reverse, equal_nan=True)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("grid,block", [((1, 1, 1), (1, 1, 1)), ((3, 1, 1), (64, 1, 1)),
                                        ((2, 3, 2), (8, 4, 2)), ((5, 1, 1), (2, 1, 1))])
def test_blocks_threads_and_early_exit(emu, schedule, grid, block):
    emu.schedule(schedule)
    nb, n = int(np.prod(grid)), int(np.prod(block))
    sums = np.zeros(nb, np.float32)
    coords = np.zeros((nb, n, 4), np.int32)
    after = np.full((nb, n), -1.0, np.float32)
    g, b = np.array(grid, np.int32), np.array(block, np.int32)
    assert emu.lib.mf_test_blocks(*(ctypes.c_void_p(a.ctypes.data)
                                    for a in (sums, coords, after, g, b))) == 0
    assert np.array_equal(sums, np.full(nb, n * (n + 1) / 2, np.float32))
    t = np.arange(n)
    expected = np.stack([t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1])], -1)
    for k in range(nb):
        assert np.array_equal(coords[k, :, :3], expected) and np.all(coords[k, :, 3] == k)
        # even threads saw the even neighbour's write of this block; odd ones wrote nothing
        even = t % 2 == 0
        assert np.all(after[k, even] == np.where(((t + 2) % n)[even] % 2 == 0, k, np.nan)
                      ) or n == 1, after[k]
        assert np.all(after[k, ~even] == -1.0)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_atomic_add(emu, schedule):
    emu.schedule(schedule)
    count = np.zeros(1, np.float32)
    assert emu.lib.mf_test_count(ctypes.c_void_p(count.ctypes.data), 7, 96) == 0
    assert count[0] == 7 * 96


@pytest.mark.parametrize("n", [1, 255, 256, 1000])
def test_block_reduce_same_bits_on_every_schedule(emu, rng, n):
    x = rng.standard_normal(n).astype(np.float32)
    results = []
    for schedule in SCHEDULES:
        emu.schedule(schedule)
        out = np.zeros(1, np.float32)
        assert emu.lib.mf_test_reduce(ctypes.c_void_p(out.ctypes.data),
                                      ctypes.c_void_p(x.ctypes.data), n) == 0
        results.append(out[0])
    assert results[0] == results[1] == results[2]
    assert abs(results[0] - x.astype(np.float64).sum()) <= 1e-5 * np.abs(x).sum()


def test_refused_launches(emu):
    """More than 1024 threads per block, or none: CUDA's invalid configuration (MF_ECUDA 4)."""
    out = np.zeros(2048, np.float32)
    assert emu.lib.mf_test_neighbour(ctypes.c_void_p(out.ctypes.data), 2048, 1) == 4
    assert emu.lib.mf_test_neighbour(ctypes.c_void_p(out.ctypes.data), 0, 1) == 4
    assert emu.lib.mf_test_count(ctypes.c_void_p(out.ctypes.data), 0, 32) == 4


def test_threads_of_a_block_run_concurrently(emu):
    """Thread 0 spins, with no barrier, until the last thread sets a flag: it returns only
    because the block's threads are real concurrent threads (as on a GPU)."""
    emu.schedule("concurrent")
    for threads in (2, 64):
        flag, out = np.zeros(1, np.int32), np.full(1, -1, np.int32)
        assert emu.lib.mf_test_concurrency(ctypes.c_void_p(flag.ctypes.data),
                                           ctypes.c_void_p(out.ctypes.data), threads) == 0
        assert out[0] == 1 and flag[0] == 1
