"""Nothing accumulates over many sessions: ``--leak-cycles`` fork/close cycles in
one process (default 12), ending in every way a session ends (close(), a
killed worker, Ctrl-C, a stall, a crash, an exception on one rank), leave no
process, shared-memory segment, temporary directory, file descriptor or thread
behind."""

import collections
import gc
import os
import signal
import sys
import threading
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import Leftovers, our_segments, our_tmpdirs, worker_children

import synkhronos as synk
from synkhronos._session import runtime
from synkhronos._session.fault_injection import FAULT_ENV

F32 = "float32"
ENDINGS = ["close", "kill", "ctrl_c", "stall", "crash", "raise"]


def _fds():
    """Open descriptors by number and what each points to."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink("/proc/self/fd/%s" % name)
        except OSError:  # the one listdir itself held
            pass
    return found


def _new_fds(before):
    """Descriptors open now that were not open before; one closed meanwhile by
    someone else (a file an earlier test left to the collector) is no leak."""
    return {fd: path for fd, path in _fds().items() if before.get(fd) != path}


def _rss_kb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _later(delay, fn):
    th = threading.Timer(delay, fn)
    th.daemon = True
    th.start()
    return th


def _cycle(ending, n, monkeypatch):
    """One session that ends with ``ending``; returns what it owned."""
    fault = {"kill": "hang", "ctrl_c": "hang", "stall": "hang", "crash": "crash", "raise": "raise"}
    if ending in fault:
        monkeypatch.setenv(FAULT_ENV, "1:call:2:%s" % fault[ending])
    # (stall: long enough for distribute() on a loaded 2-core machine, where a worker's first
    # import of PyTensor's JAX backend once took over 2 s)
    synk.fork(n, use_gpu=False, timeout=8.0 if ending == "stall" else 30)
    monkeypatch.delenv(FAULT_ENV, raising=False)
    rt = runtime.current()
    left = Leftovers(rt)
    x = pt.matrix("x", dtype=F32)
    s = pytensor.shared(np.zeros(3, dtype=F32), name="s")
    f = synk.function([x], [(x.sum() + s.sum(), "sum"), (x * 2, None)], updates=[(s, s + x.sum(axis=0))])
    synk.distribute()
    d = synk.data(np.ones((40000, 3), dtype=F32))  # outputs go through the exchange buffers
    total, parts = f(d)
    assert float(total) == 120000 and sum(len(p) for p in parts) == 40000
    synk.all_reduce(s)
    assert synk.gather(s).shape == (n, 3)
    if ending == "close":
        f(d)
        synk.close()
    elif ending == "kill":
        pid = rt.workers[1].process.pid
        timer = _later(0.2, lambda: os.kill(pid, signal.SIGKILL))
        with pytest.raises(synk.WorkerError, match="WorkerDied"):
            f(d)
        timer.join()
    elif ending == "ctrl_c":
        main = threading.main_thread().ident
        timer = _later(0.2, lambda: signal.pthread_kill(main, signal.SIGINT))
        with pytest.raises(KeyboardInterrupt):
            try:
                f(d)
                time.sleep(10)
            finally:
                timer.join()
    elif ending == "stall":
        # The session's timeout, long enough for distribute() on a loaded machine, is cut
        # for the call that stalls: the stall is what is under test, not its wait.
        rt.dispatcher.timeout = 1.0
        with pytest.raises(synk.StallError):
            f(d)
    elif ending == "crash":
        with pytest.raises(synk.WorkerError, match="WorkerDied"):
            f(d)
    else:
        with pytest.raises(synk.WorkerError, match="fault injected"):
            f(d)
        synk.close()
    assert runtime.current() is None
    return left


def test_fork_close_cycles_leave_nothing(request, monkeypatch):
    cycles = request.config.getoption("--leak-cycles")
    synk.close()
    synk.fork(2, use_gpu=False)  # this process's first fork starts the template process that
    synk.close()  # forks its workers, kept (with its socket) for the process's life: no leak
    gc.collect()
    fds, threads = _fds(), threading.active_count()
    endings = collections.Counter()
    rss = []
    t0 = time.monotonic()
    for i in range(cycles):
        ending = ENDINGS[i % len(ENDINGS)]
        left = _cycle(ending, 2 + i % 2, monkeypatch)
        deadline = time.monotonic() + 5
        while left.remaining() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert left.remaining() == [], "cycle %d (%s) left %s" % (i, ending, left.remaining())
        endings[ending] += 1
        rss.append(_rss_kb())
    elapsed = time.monotonic() - t0
    assert worker_children() == []
    assert our_segments() == []
    assert our_tmpdirs() == []
    assert _new_fds(fds) == {}, "file descriptors left open: %s" % _new_fds(fds)
    assert threading.active_count() == threads
    print("leaks after %d fork/close cycles in %.0f s (%s): 0 processes, 0 segments, 0 directories, "
          "%+d file descriptors, %+d threads; master RSS %d MB after the first cycle, %d MB after the last"
          % (cycles, elapsed, ", ".join("%s %d" % kv for kv in sorted(endings.items())),
             len(_new_fds(fds)), threading.active_count() - threads, rss[0] // 1024, rss[-1] // 1024),
          file=sys.stderr)
