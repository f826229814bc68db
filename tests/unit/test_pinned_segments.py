"""Page-locking of Data segments (``Segment.pin``), against a device that records
what it locks: every segment a Data allocates or a rank maps is offered to the
device once, and each lock is undone exactly once, before the mapping goes
(reallocation, release, a cache's drop or clear), never in a forked child.
The GPU side (``cudaHostRegister`` itself) is tested in ``tests/gpu``."""

import os

import numpy as np
import pytest

from synkhronos._devices.cpu import CpuDevice
from synkhronos._devices.gpu._pinning import PIN_MIN_BYTES, PinningMixin
from synkhronos._wire import shared_memory


class RecordingDevice:
    """Locks every segment of at least ``min_bytes``; records locks and unlocks."""

    def __init__(self, min_bytes=0):
        self.min_bytes = min_bytes
        self.locked = {}  # address -> segment name, while locked
        self.log = []

    def pin_host(self, segment):
        if segment.nbytes < self.min_bytes:
            return None
        address = np.frombuffer(segment.mmap, dtype=np.uint8).ctypes.data
        assert address not in self.locked, "locked twice"
        self.locked[address] = segment.name
        self.log.append(("lock", segment.name))

        def undo():
            assert address in self.locked, "unlocked twice"
            del self.locked[address]
            self.log.append(("unlock", segment.name))

        return undo


@pytest.fixture
def token():
    tok = shared_memory.new_token()
    yield tok
    shared_memory.unlink_session(tok)


def test_a_data_segment_is_locked_once_and_unlocked_when_replaced_or_released(token):
    device = RecordingDevice()
    memory = shared_memory.DataMemory(token, "d1", np.dtype("float32"), device=device)
    first = memory.allocate(1000)
    memory.view((1000,))
    memory.array[:] = 3.0
    assert list(device.locked.values()) == [first]
    second = memory.allocate(5000, keep=memory.array)  # a larger generation, values kept
    memory.view((5000,))
    assert list(device.locked.values()) == [second]
    assert device.log == [("lock", first), ("lock", second), ("unlock", first)]
    np.testing.assert_array_equal(memory.array[:1000], 3.0)
    memory.release()
    assert device.locked == {}
    assert device.log[-1] == ("unlock", second)


def test_a_rank_locks_each_segment_it_maps_once_and_unlocks_it_before_unmapping(token):
    owner = RecordingDevice()  # the master's, which locks its own mapping
    data = shared_memory.DataMemory(token, "d2", np.dtype("float64"), device=owner)
    name = data.allocate(4096)
    data.view((4096,))
    data.array[:] = np.arange(4096)
    rank = RecordingDevice()
    cache = shared_memory.SegmentCache(device=rank)
    ref = shared_memory.array_ref(name, 0, "float64", (4096,))
    np.testing.assert_array_equal(cache.view(ref), np.arange(4096))
    cache.view(ref)
    cache.segment(name)
    assert rank.log == [("lock", name)]  # mapped once, locked once
    cache.drop(name)
    assert rank.log == [("lock", name), ("unlock", name)]
    cache.view(ref)  # mapped again: locked again
    newer = data.allocate(8192)
    data.view((8192,))
    cache.view(shared_memory.array_ref(newer, 0, "float64", (8192,)))  # the slot's next generation
    assert rank.log[2:] == [("lock", name), ("unlock", name), ("lock", newer)]
    cache.clear()
    assert rank.locked == {}
    data.release()
    assert owner.locked == {}


def test_segments_the_device_leaves_alone_are_not_tracked(token):
    device = RecordingDevice(min_bytes=1 << 20)
    memory = shared_memory.DataMemory(token, "d3", np.dtype("uint8"), device=device)
    memory.allocate((1 << 20) - 1)
    assert device.log == []
    name = memory.allocate(1 << 20)  # at the threshold: locked
    assert device.log == [("lock", name)]
    memory.release()
    assert device.locked == {}


def test_cpu_ranks_lock_nothing(token):
    segment = shared_memory.Segment(shared_memory.segment_name(token, "d4", 1), 4 << 20)
    try:
        assert CpuDevice().pin_host(segment) is None
        segment.pin(CpuDevice())
        segment.pin(None)
        assert segment._unpin is None
    finally:
        segment.unlink()
        segment.close()


def test_a_forked_child_never_unlocks_its_parents_lock(token, monkeypatch):
    """CUDA cannot be called in a forked child (PyMC's chains): closing there
    leaves the lock to the parent (whose process end releases it anyway)."""
    device = RecordingDevice()
    segment = shared_memory.Segment(shared_memory.segment_name(token, "d5", 1), 4096)
    segment.pin(device)
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)
    segment.unlink()
    segment.close()
    assert device.log == [("lock", segment.name)]  # not undone in the "child"


class StagingDevice(PinningMixin):
    """``input_rows`` of a GPU rank, with numpy standing in for page-locked memory."""

    def __init__(self):
        self._staging = {}
        self._gather_pool = None
        self.n_parallel = 2


@pytest.fixture
def staging(monkeypatch):
    import sys
    import types

    allocated = []

    def empty_pinned(shape, dtype):
        allocated.append(shape)
        return np.empty(shape, dtype)

    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=empty_pinned))
    return StagingDevice(), allocated


def test_gathered_rows_from_the_threshold_up_land_in_one_kept_buffer_per_input(staging):
    device, allocated = staging
    rng = np.random.default_rng(0)
    rows = PIN_MIN_BYTES // 1024  # float64 rows of 128 values: 1 KiB
    x = rng.standard_normal((3 * rows, 128))
    y = rng.standard_normal((3 * rows, 128))
    small = rng.permutation(3 * rows)[: rows - 1]
    np.testing.assert_array_equal(device.input_rows(0, x, small), x[small])
    assert allocated == []  # below the threshold: an ordinary copy
    seen = []
    for n in (rows, 2 * rows, rows + 5, 2 * rows):  # grows once, then reuses
        idx = rng.permutation(3 * rows)[:n]
        gx, gy = device.input_rows(0, x, idx), device.input_rows(1, y, idx)
        np.testing.assert_array_equal(gx, x[idx])
        np.testing.assert_array_equal(gy, y[idx])  # input 1 did not overwrite input 0's rows
        seen.append((gx.__array_interface__["data"][0], gy.__array_interface__["data"][0]))
    assert allocated == [(rows * 1024,)] * 2 + [(2 * rows * 1024,)] * 2
    assert seen[1] == seen[2] == seen[3] and seen[0] != seen[1]
    view = device.input_rows(0, x, slice(3, 9))
    assert view.base is x or view.base is x.base  # slices stay views


def test_gathered_rows_out_of_range_raise_instead_of_clipping(staging):
    device, _ = staging
    x = np.zeros((PIN_MIN_BYTES // 8 + 1,))
    idx = np.arange(len(x))
    idx[-1] = len(x)
    with pytest.raises(IndexError, match="outside"):
        device.input_rows(0, x, idx)


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 4097])
def test_a_large_gather_split_over_threads_gives_numpys_rows(staging, monkeypatch, n):
    from synkhronos._devices.gpu import _pinning

    device, _ = staging
    monkeypatch.setattr(_pinning, "PIN_MIN_BYTES", 0)
    monkeypatch.setattr(_pinning, "_SPLIT_BYTES", 0)
    monkeypatch.setattr(StagingDevice, "_gather_threads", lambda self: 3)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((5000, 7)).astype(np.float32)
    idx = rng.integers(0, len(x), n)
    np.testing.assert_array_equal(device.input_rows(0, x, idx), x[idx])
    assert device._gather_pool is not None and device._gather_pool._max_workers == 3
    device._gather_pool.shutdown()


def test_a_rank_gathers_with_its_share_of_the_cores(monkeypatch):
    from synkhronos._devices.gpu import _pinning

    device = StagingDevice()
    for cores, ranks, want in ((32, 2, 4), (8, 4, 2), (3, 2, 1), (2, 4, 1), (64, None, 4)):
        monkeypatch.setattr(_pinning.os, "sched_getaffinity", lambda pid, c=cores: set(range(c)))
        device.n_parallel = ranks
        assert device._gather_threads() == want
