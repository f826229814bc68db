"""Fault injection: a worker killed, stalled or failing, and Ctrl-C in the master,
at every point where the master waits for the workers.

Faults are placed with the worker's failpoints (``SYNKHRONOS_FAULT``, see
``synkhronos._session.worker``): the worker stops inside the very command a public call
sends (hangs, or raises), and the test then kills it, interrupts the master, or
lets the stall timeout pass.  After each fault the session is either closed with
nothing left behind (no process, segment or temporary directory) or, where the
documentation says so, still usable with correct results; a new ``fork()``
works either way.
"""

import os
import signal
import threading
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import Leftovers, distribute_unhurried, our_segments, our_tmpdirs

import synkhronos as synk
from synkhronos._session import runtime
from synkhronos._session.fault_injection import FAULT_ENV

F32 = "float32"
HANG_GUARD_S = 30  # fork(timeout=...) in these tests: a real hang becomes a StallError
PROMPT_S = 5.0  # a fault must be reported within this
STALL_S = 1.0


class _Env:
    """A session of 2 CPU ranks with a function ``f``, a shared ``s`` and a Data
    ``d``; rank 1 (the worker) carries the fault ``fault``."""

    def __init__(self, monkeypatch, fault=None, distributed=True, timeout=HANG_GUARD_S):
        if fault is not None:
            monkeypatch.setenv(FAULT_ENV, fault)
        synk.fork(2, use_gpu=False, timeout=timeout)
        monkeypatch.delenv(FAULT_ENV, raising=False)
        self.rt = runtime.current()
        x = pt.vector("x", dtype=F32)
        self.s = pytensor.shared(np.arange(3, dtype=F32), name="s")
        self.f = synk.function([x], (x.sum() + self.s.sum(), "sum"), name="f")
        if not distributed:
            return
        distribute_unhurried()
        self.d = synk.data(np.arange(4, dtype=F32))  # map_data #1
        assert float(self.f(self.d)) == 6 + 2 * 3  # call #1

    def works(self):
        """The session still computes correctly (whatever the fault changed)."""
        synk.broadcast(self.s, np.array([1, 2, 3], dtype=F32))
        d = synk.data(np.arange(8, dtype=F32))
        assert float(self.f(d)) == 28 + 2 * 6
        np.testing.assert_array_equal(synk.gather(self.s), [[1, 2, 3]] * 2)
        synk.all_reduce(self.s, op="sum")
        np.testing.assert_array_equal(synk.get_value(1, self.s), [2, 4, 6])


# Each public call that waits for the workers: (the command it sends that the
# fault goes into, which of those commands since fork() it is, the call).
V6 = np.arange(6, dtype=F32)
POINTS = {
    "call": ("call", 2, lambda e: e.f(e.d)),
    "distribute": ("distribute", 1, lambda e: synk.distribute()),
    "data": ("map_data", 2, lambda e: synk.data(np.ones(5, dtype=F32))),
    "free_memory": ("drop_data", 1, lambda e: e.d.free_memory()),
    "broadcast": ("set_shareds", 1, lambda e: synk.broadcast(e.s)),
    "scatter": ("set_shareds", 1, lambda e: synk.scatter(e.s, V6)),
    "gather": ("send_shareds", 1, lambda e: synk.gather(e.s)),
    "all_gather/gather": ("send_shareds", 1, lambda e: synk.all_gather(e.s)),
    "all_gather/set": ("set_shareds", 1, lambda e: synk.all_gather(e.s)),
    "reduce": ("send_shareds", 1, lambda e: synk.reduce(e.s)),
    "all_reduce/gather": ("send_shareds", 1, lambda e: synk.all_reduce(e.s)),
    "all_reduce/set": ("set_shareds", 1, lambda e: synk.all_reduce(e.s)),
    "set_value": ("set_shareds", 1, lambda e: synk.set_value(1, e.s, V6)),
    "get_value": ("send_shareds", 1, lambda e: synk.get_value(1, e.s)),
    "get_shapes": ("get_shapes", 1, lambda e: synk.get_shapes(e.s)),
    "get_lengths": ("get_shapes", 1, lambda e: synk.get_lengths(e.s)),
    "synchronize": ("sync", 1, lambda e: synk.synchronize()),
}
# What the stall report calls each of them.
LABELS = {"call": "call of function 'f'", "distribute": "distribute()", "data": "synkhronos.data()",
          "free_memory": "Data.free_memory()", "synchronize": "synchronize()"}


def _fault(point, action):
    command, nth, _ = POINTS[point]
    return "1:%s:%d:%s" % (command, nth, action)


def _env(monkeypatch, point, action, **kwargs):
    return _Env(monkeypatch, _fault(point, action), distributed=point != "distribute", **kwargs)


def _fresh_session_works():
    synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (x.max(), "max"))
    synk.distribute()
    assert float(f(synk.data(np.arange(10, dtype=F32)))) == 9.0
    synk.close()
    assert our_segments() == [] and our_tmpdirs() == []


def _in_a_moment(fn, delay=0.3, once=None):
    """Run ``fn`` ``delay`` seconds after ``once()`` holds (polled; from now if
    None) unless disarmed; returns the disarm call."""
    lock = threading.Lock()
    armed = [True]

    def fire():
        deadline = time.monotonic() + HANG_GUARD_S
        while once is not None and not once() and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay)
        with lock:
            if armed[0]:
                fn()

    th = threading.Thread(target=fire, daemon=True)
    th.start()

    def disarm():
        with lock:
            armed[0] = False
        th.join()

    return disarm


@pytest.fixture
def fresh():
    synk.close()
    yield
    synk.close()


# --------------------------------------------------------------- a worker killed
@pytest.mark.parametrize("point", sorted(POINTS))
def test_worker_killed_inside(fresh, monkeypatch, point):
    e = _env(monkeypatch, point, "hang")
    left = Leftovers(e.rt)
    pid = e.rt.workers[1].process.pid
    disarm = _in_a_moment(lambda: os.kill(pid, signal.SIGKILL))
    t0 = time.monotonic()
    try:
        with pytest.raises(synk.WorkerError) as info:
            POINTS[point][2](e)
    finally:
        disarm()
    assert time.monotonic() - t0 < PROMPT_S
    assert info.value.exc_type == "WorkerDied" and info.value.rank == 1
    assert "rank 1" in str(info.value)
    left.assert_gone()
    _fresh_session_works()


def test_worker_killed_while_idle(fresh, monkeypatch):
    e = _Env(monkeypatch)
    left = Leftovers(e.rt)
    pid = e.rt.workers[1].process.pid
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(synk.WorkerError) as info:
        e.f(e.d)
    assert info.value.exc_type == "WorkerDied" and info.value.rank == 1
    left.assert_gone()
    _fresh_session_works()


def test_worker_crash_reports_its_stack(fresh, monkeypatch):
    """A worker that dies of a fatal signal leaves its Python stack in the error."""
    e = _env(monkeypatch, "call", "crash")
    left = Leftovers(e.rt)
    with pytest.raises(synk.WorkerError) as info:
        e.f(e.d)
    err = info.value
    assert err.exc_type == "WorkerDied" and err.rank == 1
    assert "exit code -%d" % signal.SIGSEGV in str(err)
    assert "Segmentation fault" in err.worker_traceback
    assert "serve_commands" in err.worker_traceback  # where it was
    left.assert_gone()
    _fresh_session_works()


# ------------------------------------------------------------ Ctrl-C in the master
@pytest.mark.parametrize("point", sorted(POINTS))
def test_ctrl_c_inside(fresh, monkeypatch, point):
    """Ctrl-C while the master waits for the workers: KeyboardInterrupt, and the
    session is closed (the worker busy with the command is killed).  The signal
    comes once the command is sent (on a busy machine the call may take longer
    than a fixed delay to get there; before it, Ctrl-C keeps the session)."""
    e = _env(monkeypatch, point, "hang")
    left = Leftovers(e.rt)
    main = threading.main_thread().ident
    disarm = _in_a_moment(lambda: signal.pthread_kill(main, signal.SIGINT), delay=0.05,
                          once=lambda: e.rt.workers[1].busy)
    returned = False
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        try:
            POINTS[point][2](e)
            returned = True
            time.sleep(10)  # an interrupt that comes only now still lands in this block
        finally:
            disarm()
    assert not returned, "%s returned although the worker hung in it" % point
    assert time.monotonic() - t0 < PROMPT_S
    left.assert_gone()
    _fresh_session_works()


def test_ctrl_c_while_idle_keeps_the_session(fresh, monkeypatch):
    e = _Env(monkeypatch)
    main = threading.main_thread().ident
    with pytest.raises(KeyboardInterrupt):
        signal.pthread_kill(main, signal.SIGINT)
        time.sleep(10)
    assert runtime.current() is e.rt
    e.works()


# --------------------------------------------------- an exception on one rank only
@pytest.mark.parametrize("point", sorted(POINTS))
def test_exception_on_one_rank(fresh, monkeypatch, point):
    """The worker's exception reaches the master with its rank and traceback; the
    session stays usable, except after ``distribute()``, which closes it."""
    e = _env(monkeypatch, point, "raise")
    left = Leftovers(e.rt)
    with pytest.raises(synk.WorkerError) as info:
        POINTS[point][2](e)
    err = info.value
    assert err.rank == 1 and err.exc_type == "RuntimeError"
    assert "fault injected" in str(err) and "fault injected" in err.worker_traceback
    if point != "distribute":
        assert runtime.current() is e.rt
        e.works()
        synk.close()
    left.assert_gone()


# ------------------------------------------------------------------ a stuck worker
# Every point waits in the same place (``Runtime._reply``); these cover each kind
# of wait: a call, distribute(), data(), each round trip of a collective.
STALL_POINTS = ["call", "distribute", "data", "all_reduce/gather", "all_reduce/set", "get_shapes",
                "synchronize"]


@pytest.mark.parametrize("point", STALL_POINTS)
def test_stall_inside(fresh, monkeypatch, point):
    e = _env(monkeypatch, point, "hang", timeout=STALL_S)
    left = Leftovers(e.rt)
    t0 = time.monotonic()
    with pytest.raises(synk.StallError) as info:
        POINTS[point][2](e)
    elapsed = time.monotonic() - t0
    err = info.value
    assert STALL_S <= elapsed < STALL_S + PROMPT_S
    assert err.ranks == [1] and err.rank == 1
    name = point.split("/")[0]
    assert err.command == LABELS.get(name, name)
    assert "in before" in err.stacks[1] and "in serve_commands" in err.stacks[1]  # the failpoint, in the loop
    assert "did not answer %s within 1 s" % err.command in str(err)
    left.assert_gone()
    _fresh_session_works()
