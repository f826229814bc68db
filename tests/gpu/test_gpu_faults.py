"""Faults on GPU ranks: a worker stuck or killed while the others wait inside an
NCCL collective must end in an error (the communicators are aborted), leave
nothing behind, and let a new session start in the same process.  And the
NCCL bootstrap listens on loopback only."""

import os
import signal
import threading
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import Leftovers, socket_inodes

import synkhronos as synk
from synkhronos._session import runtime
from synkhronos._session.worker import FAULT_ENV

F32 = "float32"
TIMEOUT = 20.0  # fork(timeout=...): enough for NCCL to start and JAX to compile here
STALL_S = 3.0  # the stall tests' timeout once that is done
REPORT_S = 15.0  # the master reports and closes within this after the fault


def _session(monkeypatch, fault=None, timeout=TIMEOUT, stall=None):
    """A 2-rank session with fault ``fault`` injected, its function compiled and
    called once; ``stall``: the session's timeout from then on."""
    if fault:
        monkeypatch.setenv(FAULT_ENV, fault)
    synk.fork(2, use_gpu=True, timeout=timeout)
    monkeypatch.delenv(FAULT_ENV, raising=False)
    s = pytensor.shared(np.ones(1 << 20, dtype=F32), name="s")
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (x.sum() + s.sum(), "sum"), name="f")
    synk.distribute()
    d = synk.data(np.arange(8, dtype=F32))
    assert float(f(d)) == 28 + 2 * (1 << 20)
    rt = runtime.current()
    if stall is not None:
        rt.dispatcher.timeout = stall
    return rt, s, f, d


def _new_session_works():
    synk.fork(2, use_gpu=True)
    try:
        a = pytensor.shared(np.arange(4, dtype=F32), name="a")
        g = synk.function([], (a.sum(), "sum"))
        synk.distribute()
        synk.all_reduce(a, op="sum")
        assert float(g()) == 2 * 2 * 6.0
    finally:
        synk.close()


@pytest.fixture
def fresh():
    synk.close()
    yield
    synk.close()


def test_stuck_worker_in_a_collective_is_a_stall(fresh, monkeypatch):
    """Rank 1 never joins the all-reduce; the master, which queued its part,
    reports a StallError naming the collective, and the NCCL communicators are
    aborted rather than left waiting."""
    rt, s, _, _ = _session(monkeypatch, "1:collective:1:hang", stall=STALL_S)
    left = Leftovers(rt)
    t0 = time.monotonic()
    with pytest.raises(synk.StallError) as info:
        synk.all_reduce(s)
        synk.synchronize()  # the all-reduce only queued: wait for it
    assert time.monotonic() - t0 < STALL_S + REPORT_S
    err = info.value
    assert err.ranks == [1] and err.command == "all_reduce"
    assert "in before" in err.stacks[1]
    left.assert_gone()
    _new_session_works()


def test_stuck_worker_in_a_call_is_a_stall(fresh, monkeypatch):
    """The call's outputs are reduced over NCCL into the master: rank 1 hangs
    before its share, so the master's reduction waits on its GPU."""
    rt, _, f, d = _session(monkeypatch, "1:call:2:hang", stall=STALL_S)
    left = Leftovers(rt)
    with pytest.raises(synk.StallError) as info:
        f(d)
    assert info.value.ranks == [1] and info.value.command == "call of function 'f'"
    left.assert_gone()
    _new_session_works()


def test_worker_killed_inside_a_collective(fresh, monkeypatch):
    rt, s, _, _ = _session(monkeypatch, "1:collective:1:hang")
    left = Leftovers(rt)
    pid = rt.workers[1].process.pid
    threading.Timer(1.0, lambda: os.kill(pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(synk.WorkerError) as info:
        synk.all_reduce(s)
        synk.synchronize()
    assert info.value.exc_type == "WorkerDied" and info.value.rank == 1
    assert time.monotonic() - t0 < REPORT_S
    left.assert_gone()
    _new_session_works()


def _listening_tcp():
    """(local address, port) of every listening TCP socket, by socket inode."""
    found = {}
    for table in ("tcp", "tcp6"):
        with open("/proc/net/%s" % table) as fh:
            for row in fh.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A":  # LISTEN
                    found[cols[9]] = cols[1]
    return found


def test_nccl_listens_on_loopback_only(fresh, monkeypatch):
    rt, _, _, _ = _session(monkeypatch)
    listening = _listening_tcp()
    pids = [os.getpid()] + [w.process.pid for w in rt.workers.values()]
    addresses = [listening[i] for pid in pids for i in socket_inodes(pid) if i in listening]
    loopback = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1, ::1
    assert all(a.startswith(loopback) for a in addresses), addresses
