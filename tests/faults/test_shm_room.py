"""A /dev/shm too small for the arrays (64 MB in a Docker container by
default): every allocation raises ``OSError`` (ENOSPC) that says what to do,
the session goes on, and nothing is left behind, where the first write past
the tmpfs's end used to kill the process with SIGBUS.

The session's cases run in a child process with a mount namespace and a
64 MB tmpfs of its own (``unshare``, as root or in a user namespace); the
reservation's own cases run here, with ``posix_fallocate`` made to fail."""

import errno
import os
import pickle

import numpy as np
import pytest
from _shm_room import in_small_dev_shm

from synkhronos._wire import shared_memory
from synkhronos._wire.exchange_buffer import ExchangeBuffer


@pytest.fixture(scope="module")
def room():
    return in_small_dev_shm()


def _no_room(raised, kind="OSError"):
    assert raised is not None, "nothing raised"
    assert raised["type"] == kind, raised
    assert "No space left on device" in raised["message"] and "/dev/shm" in raised["message"], raised
    assert "--shm-size" in raised["message"], raised


def test_data_too_large_for_dev_shm_raises(room):
    _no_room(room["data"])
    assert room["data"]["errno"] == errno.ENOSPC


def test_scatter_too_large_raises_and_the_session_goes_on(room):
    _no_room(room["scatter"])
    got, want = room["after"]
    assert got == pytest.approx(want, rel=1e-6)


def test_a_workers_outputs_too_large_reach_the_master(room):
    _no_room(room["outputs"], kind="WorkerError")
    assert "rank 1" in room["outputs"]["message"]


def test_oversized_data_hold_only_their_rows(room):
    held, used = room["oversized"]
    assert used <= held < 1.1 * used  # not the 2x room oversize=2 keeps
    held, used = room["grown"]
    assert used <= held < 1.1 * used


def test_data_too_large_to_grow_keep_their_values(room):
    _no_room(room["regrown"])
    shape, got, want = room["kept"]
    assert shape == [1_900_000, 3] and got == want


def test_fork_on_a_full_dev_shm_raises_and_leaves_nothing(room):
    _no_room(room["fork_full"])
    assert room["left_after_close"] == [] and room["left_after_fork"] == []


# ----------------------------------------------------- the reservation itself


def _fallocate_fails(monkeypatch, code):
    def fallocate(fd, offset, length):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(os, "posix_fallocate", fallocate)


def test_a_segment_without_room_is_unlinked_and_the_error_pickles(monkeypatch):
    name = shared_memory.segment_name(shared_memory.new_token(), "t0", 1)
    _fallocate_fails(monkeypatch, errno.ENOSPC)
    with pytest.raises(OSError) as info:
        shared_memory.Segment(name, 1 << 20)
    assert info.value.errno == errno.ENOSPC and "1.0 MB" in str(info.value)
    assert not os.path.exists("/dev/shm" + name)
    again = pickle.loads(pickle.dumps(info.value))
    assert again.errno == errno.ENOSPC and str(again) == str(info.value)


def test_a_file_system_that_cannot_reserve_still_maps(monkeypatch):
    name = shared_memory.segment_name(shared_memory.new_token(), "t1", 1)
    _fallocate_fails(monkeypatch, errno.EOPNOTSUPP)
    seg = shared_memory.Segment(name, 1 << 16)
    try:
        seg.array("u1", (1 << 16,))[:] = 7
        assert seg.array("u1", (1 << 16,)).sum() == 7 << 16
    finally:
        seg.unlink()
        seg.close()


def test_an_exchange_buffer_without_room_lays_out_the_next_message(monkeypatch):
    buf = ExchangeBuffer(shared_memory.new_token(), 0)
    try:
        big = np.ones(1 << 18)  # 2 MB: past the inline size and the first segment
        with monkeypatch.context() as m:
            _fallocate_fails(m, errno.ENOSPC)
            with pytest.raises(OSError):
                buf.pack([big])
        tokens = buf.pack([big])  # not refused as a second layout of one message
        assert isinstance(tokens[0], tuple) and tokens[0][0].startswith("/synk_")
        buf.release()
        tokens = buf.pack([np.ones(3 << 17)])  # 3 MB: a segment of 4 MB, 3 of them held
        held = os.stat("/dev/shm" + tokens[0][0]).st_blocks * 512
        assert 3 << 20 <= held < 4 << 20
    finally:
        buf.close()
