"""The command channel's transports (``_wire.channel``) and the inline form of arrays
(``_wire.exchange_buffer``), each end in this process: order, sizes that do not fit a slot,
waiting, a full ring, a peer that hangs up, and names that never outlive start-up."""

import os
import socket
import threading
import time
from multiprocessing.connection import Connection

import numpy as np
import pytest

from synkhronos._wire import channel, shared_memory
from synkhronos._wire.exchange_buffer import ExchangeBuffer, unpack


@pytest.fixture
def pair():
    """(master end, worker end) of a shared-memory channel, names already unlinked."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    token = shared_memory.new_token()
    names = channel.shm_channel_names(token, 1)
    master = channel.ShmChannel(Connection(a.detach()), 50e-6, names, master=True)
    worker = channel.ShmChannel(Connection(b.detach()), 50e-6, names, master=False)
    master.unlink()
    assert not [n for n in os.listdir("/dev/shm") if token in n]
    yield master, worker
    master.close()
    worker.close()


def test_messages_arrive_in_order_both_ways_whatever_their_size(pair):
    master, worker = pair
    big = np.arange(100000, dtype="float64")  # 800 kB: on the socket, announced in its slot
    sent = [(2, ("small", k)) if k % 3 else (2, big + k) for k in range(20)]
    # (A large message waits on the socket until it is read: send from another thread.)
    sender = threading.Thread(target=lambda: [master.send(m) for m in sent], daemon=True)
    sender.start()
    for m in sent:
        got = worker.recv()
        assert got[0] == m[0]
        if isinstance(m[1], np.ndarray):
            np.testing.assert_array_equal(got[1], m[1])
        else:
            assert got[1] == m[1]
    sender.join(5)
    worker.send((True, "reply"))
    assert master.recv() == (True, "reply")


def test_ready_and_wait_do_not_consume_and_time_out(pair):
    master, worker = pair
    assert not worker.ready()
    t0 = time.perf_counter()
    assert not worker.wait(0.05)
    assert time.perf_counter() - t0 >= 0.04
    master.send("one")
    assert worker.wait(1.0) and worker.ready() and worker.ready()  # asking twice takes nothing
    assert worker.recv() == "one"
    assert not worker.ready()


def test_sender_waits_for_a_free_slot_when_the_ring_is_full(pair):
    master, worker = pair
    for k in range(channel.SLOTS):
        master.send(k)
    done = threading.Event()

    def one_more():
        master.send("last")
        done.set()

    threading.Thread(target=one_more, daemon=True).start()
    assert not done.wait(0.2)  # no slot is free until the worker reads
    assert worker.recv() == 0
    assert done.wait(5)
    assert [worker.recv() for _ in range(channel.SLOTS)] == list(range(1, channel.SLOTS)) + ["last"]


def test_a_peer_that_hangs_up_ends_waits_with_an_error(pair):
    master, worker = pair
    master.send("left before hanging up")
    master.conn.close()
    assert worker.hung_up()
    assert worker.recv() == "left before hanging up"  # what was sent still arrives
    with pytest.raises(EOFError):
        worker.recv()
    for _ in range(channel.SLOTS):
        worker.send("x")
    with pytest.raises(BrokenPipeError):
        worker.send("no slot, and nobody to free one")


def test_socket_channel_has_the_same_interface():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left = channel.SocketChannel(Connection(a.detach()), 0.0)
    right = channel.SocketChannel(Connection(b.detach()), 0.0)
    assert not right.ready() and not right.wait(0.01)
    left.send((1, "x"))
    assert right.wait(1.0) and right.recv() == (1, "x")
    left.close()
    assert right.hung_up()
    with pytest.raises(EOFError):
        right.recv()
    right.close()


def test_names_of_a_failed_start_are_removed():
    token = shared_memory.new_token()
    names = channel.shm_channel_names(token, 1)
    a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    first = channel.ShmChannel(Connection(a.detach()), 0.0, names, master=True)
    b, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with pytest.raises(FileExistsError):  # the names are taken: nothing is reused
        channel.ShmChannel(Connection(b.detach()), 0.0, names, master=True)
    assert shared_memory.unlink_session(token) == 5  # the memory and four semaphores
    assert not [n for n in os.listdir("/dev/shm") if token in n]
    first.close()


@pytest.mark.parametrize("value", [
    np.float32(2.5), np.arange(6, dtype="int64").reshape(2, 3), np.array([True, False]),
    np.arange(12, dtype="float64").reshape(3, 4)[:, ::2], np.array([1 + 2j], dtype="complex64"),
    np.zeros((0, 3), dtype="uint8")])
def test_inline_arrays_keep_values_dtype_and_shape(value):
    buf = ExchangeBuffer(shared_memory.new_token(), 0)
    try:
        tokens = buf.pack([value])
        assert isinstance(tokens[0], tuple) and len(tokens[0]) == 3  # inline, not a ref
        (got,) = unpack(tokens, cache=None)
        want = np.asarray(value)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    finally:
        buf.close()


def test_object_arrays_travel_as_they_are():
    buf = ExchangeBuffer(shared_memory.new_token(), 0)
    value = np.array([{"a": 1}, None], dtype=object)
    (got,) = unpack(buf.pack([value]), cache=None)
    assert got is value or list(got) == list(value)
    buf.close()


def test_a_segment_cache_keeps_a_bounded_number_of_views_and_each_stays_right():
    """Shapes that change call after call make a new view each: past the cap the
    cache starts again, and every view still reads the memory it names."""
    token = shared_memory.new_token()
    seg = shared_memory.Segment(shared_memory.segment_name(token, "r1", 1), 1 << 16)
    try:
        seg.array("int32", (1 << 14,))[...] = np.arange(1 << 14, dtype="int32")
        cache = shared_memory.SegmentCache()
        for n in range(1, 2 * shared_memory._MAX_VIEWS):
            view = cache.view(shared_memory.array_ref(seg.name, 4 * n, "int32", (n,)))
            np.testing.assert_array_equal(view, np.arange(n, 2 * n))
            assert len(cache._views) <= shared_memory._MAX_VIEWS
        cache.clear()
    finally:
        seg.unlink()
        seg.close()


def test_a_second_layout_before_the_first_is_read_is_refused_at_any_size():
    buf = ExchangeBuffer(shared_memory.new_token(), 0)
    try:
        buf.pack([np.zeros(2)])  # inline, far below the shared-memory threshold
        with pytest.raises(RuntimeError, match="second exchange layout"):
            buf.pack([np.zeros(2)])
        buf.release()
        buf.pack([np.zeros(1 << 15)])  # 256 KiB: through shared memory
    finally:
        buf.close()
