"""Stall reports: a worker that does not answer within ``fork(timeout=...)``
becomes a ``StallError`` naming the rank, the command and the worker's Python
stack, and the session is closed with nothing left behind.  Work that finishes
within the timeout is never interrupted."""

import os
import signal
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import Leftovers, distribute_unhurried, worker_children
from _sleepy import sleepy

import synkhronos as synk
from synkhronos._session import runtime
from synkhronos._session.fault_injection import FAULT_ENV
from synkhronos._wire.protocol import GetShapes

F32 = "float32"
TIMEOUT = 2.0
REPORT_S = 5.0  # stacks collected and the session closed within this after the timeout


@pytest.fixture
def fresh():
    synk.close()
    yield
    synk.close()


def _sleepy_session(n, timeout, seconds):
    """``f(x)`` sums ``x``, but a rank whose rows hold a negative value first
    sleeps ``seconds`` in a user Op."""
    synk.fork(n, use_gpu=False, timeout=timeout)
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (sleepy(x, seconds).sum(), "sum"), name="slow_sum")
    distribute_unhurried()
    return f


def test_sleeping_user_op_is_reported_with_its_stack(fresh):
    f = _sleepy_session(3, TIMEOUT, seconds=3600)
    rt = runtime.current()
    left = Leftovers(rt)
    assert float(f(synk.data(np.arange(6, dtype=F32)))) == 15.0
    # Rows 2..5 go to ranks 1 and 2: both sleep; the master's rows do not.
    stuck = synk.data(np.array([0, 1, -1, -1, -1, -1], dtype=F32))
    t0 = time.monotonic()
    with pytest.raises(synk.StallError) as info:
        f(stuck)
    elapsed = time.monotonic() - t0
    err = info.value
    assert TIMEOUT <= elapsed < TIMEOUT + REPORT_S
    assert isinstance(err, synk.WorkerError) and err.exc_type == "Stall"
    assert err.ranks == [1, 2] and err.rank == 1
    assert err.command == "call of function 'slow_sum'"
    assert err.commands == {1: err.command, 2: err.command}
    assert err.timeout == TIMEOUT
    for r in (1, 2):
        stack = err.stacks[r]
        assert "_sleepy.py" in stack and "in perform" in stack, stack  # where it is stuck
        assert "in _on_call" in stack  # ... inside the worker's call handler
        assert "_watch_master" not in stack  # the worker's own watchdog is left out
        assert stack.strip() in str(err)
    assert "ranks 1, 2 did not answer call of function 'slow_sum' within 2 s" in str(err)
    assert "timeout=None" in str(err)  # says how to allow longer work
    left.assert_gone()


def test_work_within_the_timeout_is_not_interrupted(fresh):
    f = _sleepy_session(2, TIMEOUT, seconds=TIMEOUT * 0.6)
    data = synk.data(np.array([1, 2, -3, -4], dtype=F32))
    for _ in range(3):  # each call sleeps 0.6 of the timeout on rank 1: 1.8 timeouts in all
        assert float(f(data)) == -4.0
    assert runtime.current() is not None


def test_no_timeout_waits_as_long_as_it_takes(fresh):
    f = _sleepy_session(2, None, seconds=1.5)
    assert runtime.current().timeout is None
    assert float(f(synk.data(np.array([1, 2, -3, -4], dtype=F32)))) == -4.0


def test_default_timeout_is_generous(fresh):
    synk.fork(2, use_gpu=False)
    assert runtime.current().timeout == 300.0


def test_stopped_worker_is_reported_without_a_stack(fresh):
    """A process that cannot run (SIGSTOP) cannot write its stack: the report
    says so and gives its state, and does not wait for it past a few seconds."""
    f = _sleepy_session(2, TIMEOUT, seconds=0)
    rt = runtime.current()
    left = Leftovers(rt)
    d = synk.data(np.arange(4, dtype=F32))
    assert float(f(d)) == 6.0
    pid = rt.workers[1].process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(synk.StallError) as info:
            f(d)
        assert time.monotonic() - t0 < TIMEOUT + REPORT_S
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert info.value.ranks == [1]
    assert "no stack" in info.value.stacks[1] and "stopped" in info.value.stacks[1]
    left.assert_gone()


def _posted_session(monkeypatch, n, fault):
    """``n`` CPU ranks, ``fault`` injected, shared variable 0 (``s``) in a
    function; returns the runtime and what it owns."""
    monkeypatch.setenv(FAULT_ENV, fault)
    synk.fork(n, use_gpu=False, timeout=TIMEOUT)
    monkeypatch.delenv(FAULT_ENV)
    x = pt.vector("x", dtype=F32)
    s = pytensor.shared(np.zeros(3, dtype=F32), name="s")
    synk.function([x], x.sum() + s.sum())
    distribute_unhurried()
    rt = runtime.current()
    return rt, Leftovers(rt)


def test_posted_command_that_stalls(fresh, monkeypatch):
    """Replies read later (posted commands, as GPU collectives are) are held to
    the timeout too: both when the master settles them and while it waits on its
    device (``check_posted``)."""
    rt, left = _posted_session(monkeypatch, 3, "2:get_shapes:1:hang")
    rt.dispatcher.action = "a posted collective"
    rt.dispatcher.post(GetShapes([0]))
    rt.dispatcher.action = None
    rt.dispatcher.check_posted()  # before the timeout: nothing to say
    assert not rt.closed
    time.sleep(TIMEOUT)
    with pytest.raises(synk.StallError) as info:
        rt.dispatcher.check_posted()
    assert info.value.ranks == [2] and info.value.command == "a posted collective"
    assert "in before" in info.value.stacks[2]
    left.assert_gone()


def test_posted_stall_is_raised_when_settling(fresh, monkeypatch):
    rt, left = _posted_session(monkeypatch, 2, "1:get_shapes:1:hang")
    rt.dispatcher.post(GetShapes([0]))
    t0 = time.monotonic()
    with pytest.raises(synk.StallError, match="did not answer get_shapes"):
        synk.synchronize()
    assert TIMEOUT <= time.monotonic() - t0 < TIMEOUT + REPORT_S
    left.assert_gone()


def test_stall_then_fork_again(fresh):
    f = _sleepy_session(2, 1.0, seconds=3600)
    with pytest.raises(synk.StallError):
        f(synk.data(np.array([0, 0, -1, -1], dtype=F32)))
    g = _sleepy_session(2, 1.0, seconds=0)
    assert float(g(synk.data(np.arange(10, dtype=F32)))) == 45.0


@pytest.mark.parametrize("timeout, exc, match", [
    (0, ValueError, "timeout must be a positive.*got 0"),
    (-1.5, ValueError, r"timeout must be a positive.*got -1\.5"),
    (float("inf"), ValueError, "timeout must be .*finite.*got inf"),
    (float("nan"), ValueError, "timeout must be .*got nan"),
    ("60", TypeError, "timeout must be a number of seconds or None, got '60'"),
    (True, TypeError, "timeout must be a number of seconds or None, got True"),
])
def test_fork_timeout_malformed(fresh, timeout, exc, match):
    with pytest.raises(exc, match=match):
        synk.fork(2, use_gpu=False, timeout=timeout)
    assert runtime.current() is None
    assert worker_children() == []
