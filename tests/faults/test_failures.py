"""Failures: errors raised in workers or in the master's share, dead workers,
workers that fail to start, wrong call order and malformed arguments.

Every error must leave the session in a known state: usable after an exception
(in a worker or in the master), closed and fully cleaned up after a dead worker.
"""

import gc
import os
import re
import signal
import threading
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import our_segments as _our_segments
from _procs import proc_exists as _exists
from _procs import proc_stat as _stat
from _procs import segments as _segments
from _procs import worker_children as _worker_children

import synkhronos as synk
from synkhronos._session import runtime

F32 = "float32"
GUARD_S = 30.0  # a call that takes longer than this is a hang
PROMPT_S = 10.0  # a dead worker must be reported well within this


# --------------------------------------------------------------------------- helpers


def _worker_ids():
    """{rank: (pid, start time)} of the live session's workers."""
    rt = runtime.current()
    return {r: (w.process.pid, _stat(w.process.pid)[1]) for r, w in rt.workers.items()}


def _kill_worker(rank):
    """SIGKILL worker ``rank`` and wait until it is dead (a zombie: the runtime
    has not reaped it yet)."""
    pid = runtime.current().workers[rank].process.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        st = _stat(pid)
        if st is None or st[0] in "ZX":
            return
        time.sleep(0.01)
    pytest.fail("worker rank %d (pid %d) did not die after SIGKILL" % (rank, pid))


def _guarded(fn, timeout=GUARD_S):
    """Run ``fn()`` in a thread; fail the test if it does not return in time.

    Returns (result, exception, seconds)."""
    box = {}

    def target():
        t0 = time.monotonic()
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the test
            box["exc"] = exc
        box["elapsed"] = time.monotonic() - t0

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        pytest.fail("call did not return within %.0f s (hang)" % timeout)
    return box.get("result"), box.get("exc"), box["elapsed"]


def _expect_worker_died(fn, rank):
    _, exc, elapsed = _guarded(fn)
    assert isinstance(exc, synk.WorkerError), "expected WorkerError, got %r" % (exc,)
    assert exc.exc_type == "WorkerDied"
    assert exc.rank == rank
    assert "rank %d" % rank in str(exc)
    assert elapsed < PROMPT_S, "the dead worker was reported only after %.1f s" % elapsed
    return exc


def _assert_cleaned_up(token, workers):
    """No session, no worker process, no segment of ``token`` left."""
    assert runtime.current() is None
    for rank, (pid, start) in workers.items():
        assert not _exists(pid, start), "worker rank %d (pid %d) survived" % (rank, pid)
    assert _worker_children() == []
    assert _segments(token) == []


def _check_fresh_session_works(n=2):
    """fork() again and run a function correctly."""
    synk.fork(n, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (x.sum(), "sum"))
    synk.distribute()
    assert float(f(synk.data(np.arange(10, dtype=F32)))) == 45.0


@pytest.fixture
def fresh():
    """No session before the test; whatever the test leaves is closed after it."""
    synk.close()
    yield
    synk.close()


@pytest.fixture(scope="module", autouse=True)
def _close_at_module_end():
    yield
    synk.close()


# ---------------------------------------------------- exceptions raised in a worker
def test_worker_shape_error_becomes_worker_error(fresh):
    # 5 rows over 3 ranks: 2, 2, 1.  The broadcast y has 2 entries, so only rank 2 fails.
    synk.fork(3, use_gpu=False)
    x, y = pt.vector("x", dtype=F32), pt.vector("y", dtype=F32)
    f = synk.function([x], ((x * y).sum(), "sum"), bcast_inputs=[y])
    synk.distribute()
    dy = synk.data(np.array([1, 2], dtype=F32))
    with pytest.raises(synk.WorkerError) as info:
        f(synk.data(np.arange(5, dtype=F32)), dy)
    err = info.value
    assert err.rank == 2
    assert "rank 2" in str(err)
    assert err.exc_type == "ValueError"
    assert "Traceback (most recent call last)" in err.worker_traceback
    assert "broadcast" in err.worker_traceback.lower()  # the worker's own error message
    assert err.worker_traceback.strip() in str(err)
    # The session is still usable, with correct results (no stale replies).
    dx = synk.data(np.arange(6, dtype=F32))  # rows [0,1] [2,3] [4,5]
    assert float(f(dx, dy)) == (0 + 2) + (2 + 6) + (4 + 10)
    assert float(f(dx, dy)) == 24.0


def test_lowest_failing_worker_rank_is_reported(fresh):
    # master_rank=2 gets the single row; workers 0 and 1 get 2 rows each and both fail.
    synk.fork(3, use_gpu=False, master_rank=2)
    x, y = pt.vector("x", dtype=F32), pt.vector("y", dtype=F32)
    f = synk.function([x], ((x * y).sum(), "sum"), bcast_inputs=[y])
    synk.distribute()
    with pytest.raises(synk.WorkerError, match="rank 0") as info:
        f(synk.data(np.arange(5, dtype=F32)), synk.data(np.ones(1, dtype=F32)))
    assert info.value.rank == 0
    assert info.value.worker_traceback
    y2 = synk.data(np.ones(2, dtype=F32))
    assert float(f(synk.data(np.arange(6, dtype=F32)), y2)) == 15.0


def test_batch_s_out_of_range_on_shorter_worker(fresh):
    synk.fork(2, use_gpu=False)
    s = pytensor.shared(np.arange(6, dtype=F32), name="s")
    g = synk.function([], (s.sum(), "sum"), sliceable_shareds=[s])
    synk.distribute()
    synk.set_value(1, s, np.array([10, 20], dtype=F32))  # rank 1 holds only 2 rows
    with pytest.raises(synk.WorkerError, match=r"rank 1") as info:
        g(batch_s=slice(0, 4))
    err = info.value
    assert err.rank == 1
    assert err.exc_type == "ValueError"
    assert "has only 2" in str(err)
    assert err.worker_traceback and err.worker_traceback.strip() in str(err)
    # Usable afterwards: rows 0..1 on each rank.
    assert float(g(batch_s=slice(0, 2))) == (0 + 1) + (10 + 20)
    assert float(g(batch_s=[1])) == 1 + 20


def test_collective_value_that_fits_no_rank_changes_none(fresh):
    """A value that does not fit a shared variable's static shape is refused
    before any rank is changed (it used to fail in each rank on its own)."""
    synk.fork(3, use_gpu=False)
    t = pytensor.shared(np.arange(3, dtype=F32), shape=(3,), name="t")  # static shape
    h = synk.function([], (t.sum(), "sum"))
    synk.distribute()
    with pytest.raises(TypeError, match=r"values: a value of shape \(5,\) does not fit t, whose shape is "
                                        r"fixed to \(3,\)") as info:
        synk.set_value(2, t, np.zeros(5, dtype=F32))
    assert not isinstance(info.value, synk.WorkerError)
    for r in range(3):
        np.testing.assert_array_equal(synk.get_value(r, t), np.arange(3, dtype=F32))
    synk.broadcast(t, np.array([1, 2, 3], dtype=F32))
    assert synk.get_shapes(t) == [(3,)] * 3
    assert float(h()) == 3 * 6.0


def test_error_in_master_share_is_raised_as_itself(fresh):
    # 3 rows over 2 ranks: the master gets 2, the worker 1; a 1-entry y fails only
    # on the master (no runtime broadcasting), while the worker succeeds.
    synk.fork(2, use_gpu=False)
    x, y = pt.vector("x", dtype=F32), pt.vector("y", dtype=F32)
    f = synk.function([x], ((x * y).sum(), "sum"), bcast_inputs=[y])
    synk.distribute()
    with pytest.raises(ValueError) as info:
        f(synk.data(np.arange(3, dtype=F32)), synk.data(np.full(1, 100, dtype=F32)))
    assert not isinstance(info.value, synk.WorkerError)
    # The worker's reply to the failed call was consumed: the next results are right.
    dx, dy = synk.data(np.arange(4, dtype=F32)), synk.data(np.array([1, 2], dtype=F32))
    assert float(f(dx, dy)) == (0 + 2) + (2 + 6)
    assert float(f(dx, dy)) == 10.0


def test_error_in_master_share_of_collective(fresh):
    """The master's own part of a collective fails (a value that its own copy
    cannot take): raised as itself, after the workers answered, and the session
    goes on in step."""
    synk.fork(2, use_gpu=False, master_rank=1)
    t = pytensor.shared(np.zeros(3, dtype=F32), name="t")
    h = synk.function([], (t.sum(), "sum"))
    synk.distribute()
    rt = runtime.current()

    def refuse(var, value):
        raise MemoryError("no room for %s on the master" % var)

    original = rt.device.set_value
    rt.device.set_value = refuse
    try:
        with pytest.raises(MemoryError, match="no room for t") as info:
            synk.scatter(t, np.arange(6, dtype=F32))
    finally:
        rt.device.set_value = original
    assert not isinstance(info.value, synk.WorkerError)
    np.testing.assert_array_equal(synk.get_value(0, t), [0, 1, 2])  # the worker (rank 0) took its rows
    np.testing.assert_array_equal(synk.get_value(1, t), [0, 0, 0])
    assert float(h()) == 3.0
    synk.scatter(t, np.arange(6, dtype=F32))
    assert float(h()) == 15.0


# ------------------------------------------------------------------- dead workers
def _action(kind, f, s):
    if kind == "call":
        return lambda: f(synk.data(np.arange(4, dtype=F32)))
    if kind == "data":
        return lambda: synk.data(np.arange(4, dtype=F32))
    return lambda: synk.broadcast(s, np.arange(3, dtype=F32))


@pytest.mark.parametrize("kind", ["call", "data", "collective"])
def test_dead_worker_raises_and_cleans_up(fresh, kind):
    synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    s = pytensor.shared(np.zeros(3, dtype=F32), name="s")
    f = synk.function([x], x.sum() + s.sum())
    synk.distribute()
    keep = synk.data(np.arange(4, dtype=F32))
    assert float(f(keep)) == 3.0  # avg of the per-rank sums 1 and 5
    rt = runtime.current()
    token, workers = rt.token, _worker_ids()
    assert _segments(token)  # there is something to clean up
    _kill_worker(1)
    err = _expect_worker_died(_action(kind, f, s), rank=1)
    assert err.worker_traceback == ""
    _assert_cleaned_up(token, workers)
    assert rt.closed
    with pytest.raises(RuntimeError, match="not forked"):
        f(keep)
    _check_fresh_session_works()


def test_worker_killed_during_call(fresh):
    """The worker dies after taking the command, while the master waits for its reply."""
    synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (x.sum(), "sum"))
    synk.distribute()
    d = synk.data(np.arange(4, dtype=F32))
    assert float(f(d)) == 6.0
    token, workers = runtime.current().token, _worker_ids()
    pid = workers[1][0]
    os.kill(pid, signal.SIGSTOP)  # the command is delivered but never answered
    box = {}
    caller = threading.Thread(target=lambda: box.update(r=_guarded(lambda: f(d))), daemon=True)
    try:
        caller.start()
        time.sleep(0.5)
        assert caller.is_alive()  # waiting for the stopped worker
    finally:
        os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    caller.join(GUARD_S + 5)
    assert not caller.is_alive()
    _, exc, _ = box["r"]
    assert time.monotonic() - t0 < PROMPT_S
    assert isinstance(exc, synk.WorkerError), "expected WorkerError, got %r" % (exc,)
    assert exc.exc_type == "WorkerDied" and exc.rank == 1 and "rank 1" in str(exc)
    _assert_cleaned_up(token, workers)
    _check_fresh_session_works()


def test_dead_worker_among_three(fresh):
    synk.fork(3, use_gpu=False)
    s = pytensor.shared(np.zeros((2, 2), dtype=F32), name="s")
    synk.function([], s.sum())
    synk.distribute()
    synk.data(np.zeros((5, 2), dtype=F32))
    token, workers = runtime.current().token, _worker_ids()
    _kill_worker(2)
    _expect_worker_died(lambda: synk.get_shapes(s), rank=2)
    _assert_cleaned_up(token, workers)  # rank 1 was stopped too
    _check_fresh_session_works(3)


def test_lowest_dead_worker_rank_is_reported(fresh):
    synk.fork(3, use_gpu=False, master_rank=1)
    s = pytensor.shared(np.zeros(2, dtype=F32), name="s")
    synk.function([], s.sum())
    synk.distribute()
    token, workers = runtime.current().token, _worker_ids()
    _kill_worker(0)
    _kill_worker(2)
    try:
        _expect_worker_died(lambda: synk.get_shapes(s), rank=0)
    finally:
        _assert_cleaned_up(token, workers)


def test_close_after_worker_died(fresh):
    synk.fork(2, use_gpu=False)
    s = pytensor.shared(np.zeros(2, dtype=F32), name="s")
    synk.function([], s.sum())
    synk.distribute()
    synk.data(np.zeros(4, dtype=F32))
    token, workers = runtime.current().token, _worker_ids()
    _kill_worker(1)
    _, exc, elapsed = _guarded(synk.close)
    assert exc is None
    assert elapsed < PROMPT_S
    _assert_cleaned_up(token, workers)
    _check_fresh_session_works()


def test_worker_failing_to_start(fresh, monkeypatch, tmp_path):
    from synkhronos._devices import cpu

    original = cpu.CpuDevice.worker_env

    def broken_rank_2(self, rank, n_parallel):
        env = original(self, rank, n_parallel)
        if rank == 2:  # this interpreter cannot start
            env["PYTHONHOME"] = str(tmp_path / "no-python-home")
        return env

    monkeypatch.setattr(cpu.CpuDevice, "worker_env", broken_rank_2)
    before = set(_our_segments())
    _, exc, elapsed = _guarded(lambda: synk.fork(3, use_gpu=False))
    assert isinstance(exc, RuntimeError), "expected RuntimeError, got %r" % (exc,)
    assert "rank 2" in str(exc)
    assert elapsed < PROMPT_S
    assert runtime.current() is None
    assert _worker_children() == []  # the healthy rank 1 was stopped
    assert set(_our_segments()) <= before
    monkeypatch.undo()
    _check_fresh_session_works(3)


# -------------------------------------------------------------- wrong call order
def _collective_calls(s):
    v = np.zeros(3, dtype=F32)
    return {
        "broadcast": lambda: synk.broadcast(s),
        "scatter": lambda: synk.scatter(s, v),
        "gather": lambda: synk.gather(s),
        "all_gather": lambda: synk.all_gather(s),
        "reduce": lambda: synk.reduce(s),
        "all_reduce": lambda: synk.all_reduce(s),
        "set_value": lambda: synk.set_value(0, s, v),
        "get_value": lambda: synk.get_value(0, s),
        "get_shapes": lambda: synk.get_shapes(s),
        "get_lengths": lambda: synk.get_lengths(s),
    }


COLLECTIVES = sorted(_collective_calls(None))


def test_before_fork_is_runtime_error(fresh):
    x = pt.vector("x", dtype=F32)
    with pytest.raises(RuntimeError, match="fork"):
        synk.function([x], x.sum())
    with pytest.raises(RuntimeError, match="fork"):
        synk.distribute()
    with pytest.raises(RuntimeError, match="fork"):
        synk.data(np.zeros(3, dtype=F32))
    with pytest.raises(RuntimeError, match="fork"):
        synk.data(dtype=F32, ndim=1)


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_before_fork_is_runtime_error(fresh, name):
    s = pytensor.shared(np.zeros(3, dtype=F32), name="s")
    with pytest.raises(RuntimeError, match="fork"):
        _collective_calls(s)[name]()


def test_wrong_order_after_fork(fresh):
    synk.fork(2, use_gpu=False)
    with pytest.raises(RuntimeError, match="already forked"):
        synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    s = pytensor.shared(np.zeros(3, dtype=F32), name="s")
    f = synk.function([x], x.sum() + s.sum())
    d = synk.data(np.arange(4, dtype=F32))
    with pytest.raises(RuntimeError, match="distribute"):
        f(d)
    for name, call in _collective_calls(s).items():
        with pytest.raises(RuntimeError, match="distribute"):
            call()
        assert name
    synk.distribute()
    synk.distribute()  # nothing new: nothing sent
    t = pytensor.shared(np.ones(2, dtype=F32), name="t")
    g = synk.function([x], x.max() + t.sum())  # built after distribute(): needs another
    with pytest.raises(RuntimeError, match="built after the last synkhronos.distribute"):
        g(d)
    with pytest.raises(RuntimeError, match="distribute\\(\\) again"):
        synk.get_value(0, t)
    with pytest.raises(RuntimeError, match="already forked"):
        synk.fork(2, use_gpu=False)
    assert float(f(d)) == 3.0  # all of that left the session intact


def test_use_after_close_is_runtime_error(fresh):
    synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    s = pytensor.shared(np.zeros(3, dtype=F32), name="s")
    f = synk.function([x], x.sum() + s.sum())
    synk.distribute()
    d = synk.data(np.arange(4, dtype=F32))
    assert float(f(d)) == 3.0
    synk.close()
    with pytest.raises(RuntimeError, match="fork"):
        f(d)
    with pytest.raises(RuntimeError, match="fork"):
        synk.distribute()
    with pytest.raises(RuntimeError, match="fork"):
        synk.data(np.zeros(3, dtype=F32))
    with pytest.raises(RuntimeError, match="fork"):
        synk.function([x], x.sum())
    for call in _collective_calls(s).values():
        with pytest.raises(RuntimeError, match="fork"):
            call()
    with pytest.raises(RuntimeError, match="closed"):
        d.set_value(np.zeros(3, dtype=F32))
    with pytest.raises(RuntimeError, match="closed"):
        d.set_shape((5,))


def test_reading_data_after_close_is_runtime_error(fresh):
    synk.fork(2, use_gpu=False)
    d = synk.data(np.arange(4, dtype=F32))
    synk.close()
    with pytest.raises(RuntimeError, match="close"):
        d[0]
    with pytest.raises(RuntimeError, match="close"):
        np.asarray(d)


def test_function_of_closed_session_in_new_session(fresh):
    synk.fork(2, use_gpu=False)
    x = pt.vector("x", dtype=F32)
    old = synk.function([x], (x.sum(), "sum"))
    synk.distribute()
    synk.close()
    synk.fork(2, use_gpu=False)
    y = pt.vector("y", dtype=F32)
    new = synk.function([y], (y.max(), "sum"))
    synk.distribute()
    d = synk.data(np.arange(4, dtype=F32))
    assert float(new(d)) == 1 + 3
    with pytest.raises(RuntimeError, match="close"):
        old(d)  # must not run the new session's function of the same index


def test_data_of_closed_session_in_new_session(fresh):
    synk.fork(2, use_gpu=False)
    old = synk.data(np.arange(4, dtype=F32))
    synk.close()
    synk.fork(2, use_gpu=False)
    y = pt.vector("y", dtype=F32)
    f = synk.function([y], y.sum())
    synk.distribute()
    with pytest.raises(RuntimeError, match="close"):
        f(old)


# ------------------------------------------------------------ malformed arguments
# fork(): checked before anything starts, so nothing is left behind.
FORK_CASES = [
    ("n_parallel=0", dict(n_parallel=0), ValueError, "n_parallel.*got 0"),
    ("n_parallel=-2", dict(n_parallel=-2), ValueError, "n_parallel.*got -2"),
    ("n_parallel='x'", dict(n_parallel="x"), TypeError, "n_parallel.*got 'x'"),
    ("n_parallel=2.0", dict(n_parallel=2.0), TypeError, r"n_parallel.*got 2\.0"),
    ("n_parallel=True", dict(n_parallel=True), TypeError, "n_parallel.*got True"),
    ("master_rank=2", dict(n_parallel=2, master_rank=2), ValueError, "master_rank.*got 2"),
    ("master_rank=-1", dict(n_parallel=2, master_rank=-1), ValueError, "master_rank.*got -1"),
    ("master_rank='0'", dict(n_parallel=2, master_rank="0"), TypeError, "master_rank.*got '0'"),
    ("use_gpu='yes'", dict(n_parallel=2, use_gpu="yes"), TypeError, "use_gpu.*got 'yes'"),
    ("max_n_var=0", dict(n_parallel=2, use_gpu=False, max_n_var=0), ValueError, "max_n_var.*got 0"),
    ("max_dim='a'", dict(n_parallel=2, use_gpu=False, max_dim="a"), TypeError, "max_dim.*got 'a'"),
    ("precision='fp16'", dict(n_parallel=2, precision="fp16"), ValueError,
     "precision.*'tf32' or 'bf16', got 'fp16'"),
    ("precision=None", dict(n_parallel=2, precision=None), ValueError, "precision.*got None"),
]


@pytest.mark.parametrize("kwargs, exc, match", [c[1:] for c in FORK_CASES], ids=[c[0] for c in FORK_CASES])
def test_fork_malformed(fresh, kwargs, exc, match):
    kwargs.setdefault("use_gpu", False)
    with pytest.raises(exc, match=match):
        synk.fork(**kwargs)
    assert runtime.current() is None
    assert _worker_children() == []


def test_fork_use_gpu_without_gpus(fresh):
    with pytest.raises(RuntimeError, match="use_gpu=False"):
        synk.fork(2, use_gpu=True)
    assert runtime.current() is None
    assert _worker_children() == []


class _Session:
    """One session shared by the argument tests that do not change it.

    ``kind`` "forked": forked, not distributed (for ``synk.function``);
    "distributed": functions built and distributed, with Data objects.
    """

    def __init__(self, kind):
        synk.close()
        synk.fork(2, use_gpu=False)
        self.kind = kind
        self.rt = runtime.current()
        self.x = pt.vector("x", dtype=F32)
        self.z = pt.vector("z", dtype=F32)
        self.y = pt.vector("y", dtype=F32)
        self.a = pt.scalar("a", dtype=F32)
        self.s = pytensor.shared(np.arange(6, dtype=F32), name="s")
        self.u = pytensor.shared(np.zeros(6, dtype=F32), name="u")
        self.unused = pytensor.shared(np.zeros(6, dtype=F32), name="unused")
        self.free = pytensor.shared(np.zeros(3, dtype=F32), name="free")
        self.s0 = pytensor.shared(np.float32(0), name="s0")
        if kind == "forked":
            return
        x, y, z, s, u = self.x, self.y, self.z, self.s, self.u
        self.f = synk.function([x], [(x * y).sum(), x.max()], bcast_inputs=[y])
        self.h = synk.function([x], x.sum())
        self.p = synk.function([x, z], (x + z).sum())
        self.g = synk.function([], s.sum(), sliceable_shareds=[s])
        self.k = synk.function([], s.mean() + u.mean())
        synk.distribute()
        self.dx = synk.data(np.arange(4, dtype=F32))
        self.dx3 = synk.data(np.arange(3, dtype=F32))
        self.dy = synk.data(np.ones(2, dtype=F32))
        self.dm = synk.data(np.ones((4, 2), dtype=F32))
        self.d64 = synk.data(np.ones(4, dtype="float64"))
        self.empty = synk.data(dtype=F32, ndim=1)

    def alive(self):
        return runtime.current() is self.rt and not self.rt.closed


_SESSION = {}


def _session(kind):
    s = _SESSION.get("s")
    if s is None or s.kind != kind or not s.alive():
        _SESSION["s"] = s = _Session(kind)
    return s


@pytest.fixture
def forked():
    return _session("forked")


@pytest.fixture
def dist():
    return _session("distributed")


FUNCTION_CASES = [
    ("inputs='x'", lambda e: synk.function("x", e.x.sum()), TypeError, "inputs.*got 'x'"),
    ("inputs=[x, 3]", lambda e: synk.function([e.x, 3], e.x.sum()), TypeError, r"inputs.*got \[x, 3\]"),
    ("inputs 0-d", lambda e: synk.function([e.a], e.a * 2), TypeError, "scattered input a is 0-d"),
    ("bcast_inputs='y'", lambda e: synk.function([e.x], e.x.sum(), bcast_inputs="y"), TypeError,
     "bcast_inputs.*got 'y'"),
    ("outputs=(z, 'mean')", lambda e: synk.function([e.x], (e.x.sum(), "mean")), ValueError,
     "output reduce operation.*got 'mean'"),
    ("outputs=[z, (z, 'median')]", lambda e: synk.function([e.x], [e.x.sum(), (e.x.max(), "median")]),
     ValueError, "got 'median'"),
    ("outputs=5", lambda e: synk.function([e.x], 5), TypeError, "outputs.*got 5"),
    ("outputs=[z, 7]", lambda e: synk.function([e.x], [e.x.sum(), 7]), TypeError, "output.*got 7"),
    ("updates non-shared", lambda e: synk.function([e.x], e.x.sum(), updates=[(e.z, e.x + 1)]),
     TypeError, "update target must be a shared variable, got z"),
    ("updates op 'mean'", lambda e: synk.function([e.x], e.x.sum(), updates=[(e.s, e.s + 1, "mean")]),
     ValueError, "update reduce operation.*got 'mean'"),
    ("updates op None", lambda e: synk.function([e.x], e.x.sum(), updates=[(e.s, e.s + 1, None)]),
     ValueError, "update reduce operation.*got None"),
    ("updates='s'", lambda e: synk.function([e.x], e.x.sum(), updates="s"), TypeError, "updates.*got 's'"),
    ("updates=[(s,)]", lambda e: synk.function([e.x], e.x.sum(), updates=[(e.s,)]), TypeError,
     r"update.*got \(s,\)"),
    ("sliceable unused", lambda e: synk.function([e.x], e.x.sum() + e.s.sum(), sliceable_shareds=[e.unused]),
     ValueError, "sliceable shared variable unused is not used"),
    ("sliceable non-shared", lambda e: synk.function([e.x], e.x.sum(), sliceable_shareds=[e.x]), TypeError,
     r"sliceable_shareds.*got \[x\]"),
    ("sliceable 0-d", lambda e: synk.function([], e.s0 * 2, sliceable_shareds=[e.s0]), TypeError,
     "s0 is 0-d"),
    ("givens='g'", lambda e: synk.function([e.x], e.x.sum(), givens="g"), TypeError, "givens.*got 'g'"),
]


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in FUNCTION_CASES],
                         ids=[c[0] for c in FUNCTION_CASES])
def test_function_malformed(forked, call, exc, match):
    n = len(forked.rt.registry.functions)
    with pytest.raises(exc, match=match):
        call(forked)
    assert forked.alive()
    assert len(forked.rt.registry.functions) == n  # nothing half-registered


CALL_CASES = [
    ("no inputs", lambda e: e.h(), TypeError, "takes 1 data inputs, got 0"),
    ("too many inputs", lambda e: e.h(e.dx, e.dx), TypeError, "takes 1 data inputs, got 2"),
    ("too few inputs", lambda e: e.f(e.dx), TypeError, "takes 2 data inputs, got 1"),
    ("ndarray input", lambda e: e.h(np.arange(4, dtype=F32)), TypeError,
     r"input 0 \(x\) must be a synkhronos.Data, got ndarray"),
    ("list input", lambda e: e.h([1.0, 2.0]), TypeError, "must be a synkhronos.Data, got list"),
    ("float64 Data", lambda e: e.h(e.d64), TypeError, "needs dtype float32, got Data of dtype float64"),
    ("2-d Data", lambda e: e.h(e.dm), TypeError, "needs ndim 1, got Data of ndim 2"),
    ("unknown keyword", lambda e: e.h(q=e.dx), TypeError, "unknown input name 'q'"),
    ("Data without memory", lambda e: e.h(e.empty), ValueError, "no memory allocated"),
    ("unequal lengths", lambda e: e.p(e.dx, e.dx3), ValueError, r"different lengths \[4, 3\]"),
    ("batch='a'", lambda e: e.h(e.dx, batch="a"), TypeError, "batch must be .*got str: 'a'"),
    ("batch=1.5", lambda e: e.h(e.dx, batch=1.5), TypeError, r"batch must be .*got float: 1\.5"),
    ("batch=True", lambda e: e.h(e.dx, batch=True), TypeError, "batch must be .*got bool: True"),
    ("batch=-1", lambda e: e.h(e.dx, batch=-1), ValueError, "batch must be non-negative, got -1"),
    ("batch=10", lambda e: e.h(e.dx, batch=10), ValueError, "needs 10 rows but input .* has only 4"),
    ("batch slice too long", lambda e: e.h(e.dx, batch=slice(1, 9)), ValueError, "needs 9 rows"),
    ("batch slice step", lambda e: e.h(e.dx, batch=slice(0, 4, 2)), ValueError,
     re.escape("step None, got slice(0, 4, 2)")),
    ("batch index -3", lambda e: e.h(e.dx, batch=[0, -3]), ValueError, "non-negative, got -3"),
    ("batch index 7", lambda e: e.h(e.dx, batch=[0, 7]), ValueError, "largest index 7"),
    ("batch float indices", lambda e: e.h(e.dx, batch=[0.5, 1.5]), TypeError, "dtype float64"),
    ("batch 2-d indices", lambda e: e.h(e.dx, batch=np.array([[0, 1]])), TypeError,
     re.escape("1-d when given as indices, got shape (1, 2)")),
    ("batch without scattered inputs", lambda e: e.k(batch=2), TypeError,
     "batch=2 given but the function has no scattered inputs"),
    ("batch_s without sliceable", lambda e: e.h(e.dx, batch_s=slice(0, 2)), TypeError,
     re.escape("batch_s=slice(0, 2, None) given but the function has no sliceable_shareds")),
    ("batch_s per rank, 3 for 2 ranks", lambda e: e.g(batch_s=[slice(0, 1)] * 3), ValueError,
     "each of the 2 ranks, got 3"),
    ("batch_s per rank, 1 for 2 ranks", lambda e: e.g(batch_s=[[0, 1]]), ValueError,
     "each of the 2 ranks, got 1"),
    ("batch_s='a'", lambda e: e.g(batch_s="a"), TypeError, "batch_s must be .*got str: 'a'"),
    ("batch_s=3", lambda e: e.g(batch_s=3), TypeError, "batch_s must be .*got int: 3"),
    ("batch_s slice step", lambda e: e.g(batch_s=slice(0, 4, 2)), ValueError,
     re.escape("batch_s slice must have step None, got slice(0, 4, 2)")),
    ("batch_s index -1", lambda e: e.g(batch_s=[-1, 0]), ValueError,
     "batch_s indices must be non-negative, got -1"),
    ("batch_s bad entry", lambda e: e.g(batch_s=["a", "b"]), TypeError,
     r"batch_s indices must be integers, got dtype <U1: \['a', 'b'\]"),
    ("batch_s bad per-rank entry", lambda e: e.g(batch_s=[[0], "ab"]), TypeError,
     "batch_s entry .*got str: 'ab'"),
    ("batch_s beyond the rows", lambda e: e.g(batch_s=slice(0, 10)), ValueError,
     "needs 10 rows but sliceable shared variable s has only 6"),
    ("num_slices=0", lambda e: e.h(e.dx, num_slices=0), ValueError,
     "num_slices must be a positive int, got 0"),
    ("num_slices=-2", lambda e: e.h(e.dx, num_slices=-2), ValueError, "num_slices .*got -2"),
    ("num_slices=1.5", lambda e: e.h(e.dx, num_slices=1.5), ValueError, r"num_slices .*got 1\.5"),
    ("num_slices='a'", lambda e: e.h(e.dx, num_slices="a"), TypeError, "num_slices .*got 'a'"),
    ("num_slices=True", lambda e: e.h(e.dx, num_slices=True), TypeError, "num_slices .*got True"),
    ("num_slices nothing to slice", lambda e: e.k(num_slices=2), ValueError,
     "num_slices=2 but the function has nothing to slice"),
    ("output_subset=[5]", lambda e: e.f(e.dx, e.dy, output_subset=[5]), ValueError,
     "output_subset entry 5 out of range for 2 outputs"),
    ("output_subset=[-1]", lambda e: e.f(e.dx, e.dy, output_subset=[-1]), ValueError,
     "output_subset entry -1 out of range"),
    ("output_subset='a'", lambda e: e.f(e.dx, e.dy, output_subset="a"), TypeError,
     "output_subset must be a list of ints, got 'a'"),
    ("output_subset=0", lambda e: e.f(e.dx, e.dy, output_subset=0), TypeError,
     "output_subset must be a list of ints, got 0"),
    ("output_subset=[0.5]", lambda e: e.f(e.dx, e.dy, output_subset=[0.5]), TypeError,
     r"output_subset must be a list of ints, got \[0\.5\]"),
]


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in CALL_CASES], ids=[c[0] for c in CALL_CASES])
def test_call_malformed(dist, call, exc, match):
    with pytest.raises(exc, match=match):
        call(dist)
    assert dist.alive()


def test_session_still_right_after_malformed_calls(dist):
    """The argument tests share one session: it must still compute correctly."""
    # rank 0 gets rows [0, 1], rank 1 rows [2, 3]; "avg" weighs each rank by its rows
    assert [float(v) for v in dist.f(dist.dx, dist.dy)] == [(1 + 5) / 2, (1 + 3) / 2]
    # rows [0, 1, 3]: rank 0 sums [0, 1] (2 rows), rank 1 sums [3] (1 row)
    assert float(dist.h(dist.dx, batch=[0, 1, 3])) == pytest.approx((1 * 2 + 3 * 1) / 3)
    assert float(dist.g(batch_s=slice(0, 2))) == 1.0


DATA_CASES = [
    ("no spec", lambda e: synk.data(), TypeError, "incomplete specification.*dtype=None, ndim=None"),
    ("dtype only", lambda e: synk.data(dtype=F32), TypeError, "incomplete specification.*ndim=None"),
    ("ndim only", lambda e: synk.data(ndim=1), TypeError, "incomplete specification.*dtype=None"),
    ("oversize=3", lambda e: synk.data(np.zeros(3, dtype=F32), oversize=3), ValueError,
     r"oversize must be a number in \[1, 2\], got 3"),
    ("oversize=0.5", lambda e: synk.data(dtype=F32, shape=(3,), oversize=0.5), ValueError,
     r"oversize.*got 0\.5"),
    ("oversize='a'", lambda e: synk.data(np.zeros(3, dtype=F32), oversize="a"), (TypeError, ValueError),
     "oversize.*got 'a'"),
    ("dtype unknown", lambda e: synk.data(dtype="notadtype", ndim=1), TypeError, "'notadtype'"),
    ("ndim=-1", lambda e: synk.data(dtype=F32, ndim=-1), (TypeError, ValueError), "ndim.*got -1"),
    ("ndim=1.5", lambda e: synk.data(dtype=F32, ndim=1.5), TypeError, r"ndim.*got 1\.5"),
    ("shape=5", lambda e: synk.data(dtype=F32, shape=5), TypeError, "shape must be .*got 5"),
    ("shape=(2, -1)", lambda e: synk.data(dtype=F32, shape=(2, -1)), TypeError, re.escape("got (2, -1)")),
    ("var='x'", lambda e: synk.data(var="x"), TypeError, "var must be a PyTensor tensor variable, got 'x'"),
    ("var vs dtype", lambda e: synk.data(var=e.x, dtype="int32"), TypeError, "'int32' conflicts"),
    ("var vs ndim", lambda e: synk.data(var=e.x, ndim=2), TypeError, "ndim 2 conflicts"),
    ("value vs ndim", lambda e: synk.data(np.zeros(3, dtype=F32), ndim=2), TypeError,
     "ndim=2, got a value with ndim=1"),
    ("set_value float64", lambda e: synk.data(np.zeros(3, dtype=F32)).set_value(np.zeros(3)), TypeError,
     r"Data\.set_value\(input_data\): cannot store float64 data in Data #\d+ of dtype float32 without "
     "loss.*force_cast"),
    # Every dtype error names the argument and the Data it is about.
    ("set_value int64 into named", lambda e: synk.data(np.zeros(3, "int32"), name="g").set_value(
        np.arange(3, dtype="int64")), TypeError,
     r"Data\.set_value\(input_data\): cannot store int64 data in Data 'g' of dtype int32"),
    ("data int64 as int32", lambda e: synk.data(np.arange(3, dtype="int64"), dtype="int32", name="g"),
     TypeError, r"synkhronos\.data\(value\): cannot store int64 data in Data 'g' of dtype int32"),
    ("condition_data", lambda e: synk.data(np.zeros(3, "int32")).condition_data(np.zeros(3)), TypeError,
     r"Data\.condition_data\(input_data\): cannot store float64 data in Data #\d+ of dtype int32"),
    ("build_inputs complex64 for float32", lambda e: e.h.build_inputs(np.zeros(4, "complex64")), TypeError,
     r"Function\.build_inputs: input 0 \(x\): cannot store complex64 data in Data 'x' of dtype float32"),
    ("set_value ndim", lambda e: synk.data(np.zeros(3, dtype=F32)).set_value(np.zeros((2, 2), dtype=F32)),
     TypeError, "ndim=1, got a value with ndim=2"),
    ("set_value oversize", lambda e: synk.data(np.zeros(3, F32)).set_value(np.zeros(3, F32), oversize=5),
     ValueError, "oversize.*got 5"),
    ("set_shape ndim", lambda e: synk.data(np.zeros((2, 2), dtype=F32)).set_shape((3,)), TypeError,
     re.escape("ndim=2, got shape (3,)")),
    ("set_shape 'ab'", lambda e: synk.data(np.zeros(2, dtype=F32)).set_shape("ab"), TypeError, "got 'ab'"),
    ("set_shape negative", lambda e: synk.data(np.zeros(2, dtype=F32)).set_shape((-1,)), TypeError,
     re.escape("got (-1,)")),
    ("set_length -1", lambda e: synk.data(np.zeros(2, dtype=F32)).set_length(-1), ValueError,
     "length must be a non-negative int, got -1"),
    ("set_length 'a'", lambda e: synk.data(np.zeros(2, dtype=F32)).set_length("a"), (TypeError, ValueError),
     "length .*got 'a'"),
]


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in DATA_CASES], ids=[c[0] for c in DATA_CASES])
def test_data_malformed(dist, call, exc, match):
    with pytest.raises(exc, match=match):
        call(dist)
    assert dist.alive()
    gc.collect()


def test_data_force_cast(dist):
    d = synk.data(np.zeros(3, dtype=F32))
    d.set_value(np.array([1.5, 2.5, 3.5]), force_cast=True)
    assert d.dtype == F32
    np.testing.assert_array_equal(d.data, np.array([1.5, 2.5, 3.5], dtype=F32))
    # rank 0 sums [1.5, 2.5] (2 rows), rank 1 sums [3.5] (1 row); "avg" weighs by rows
    assert float(dist.h(d)) == pytest.approx((4.0 * 2 + 3.5 * 1) / 3)


COLLECTIVE_CASES = [
    ("broadcast unused shared", lambda e: synk.broadcast(e.free), ValueError,
     "shared variable free is not used in any Synkhronos function"),
    ("gather unused shared", lambda e: synk.gather([e.s, e.free]), ValueError, "free is not used"),
    ("scatter unused shared", lambda e: synk.scatter(e.free, np.zeros(4, F32)), ValueError,
     "free is not used"),
    ("get_value unused shared", lambda e: synk.get_value(0, e.free), ValueError, "free is not used"),
    ("broadcast 'x'", lambda e: synk.broadcast("x"), TypeError,
     "shared_vars must be a shared variable or a non-empty list of them, got 'x'"),
    ("gather []", lambda e: synk.gather([]), TypeError, r"shared_vars.*got \[\]"),
    ("scatter 1 value for 2", lambda e: synk.scatter([e.s, e.u], [np.zeros(6, F32)]), ValueError,
     "one value for each of the 2 shared variables"),
    ("broadcast 1 value for 2", lambda e: synk.broadcast([e.s, e.u], np.zeros(6, F32)), ValueError,
     "one value for each of the 2 shared variables"),
    ("set_value 3 values for 2", lambda e: synk.set_value(0, [e.s, e.u], [np.zeros(6, F32)] * 3),
     ValueError, "one value for each of the 2 shared variables"),
    ("reduce op='mean'", lambda e: synk.reduce(e.s, op="mean"), ValueError, "op must be one of .*got 'mean'"),
    ("all_reduce op='mean'", lambda e: synk.all_reduce(e.s, op="mean"), ValueError, "got 'mean'"),
    ("reduce op=None", lambda e: synk.reduce(e.s, op=None), ValueError, "op must be one of .*got None"),
    ("gather nd_up=2", lambda e: synk.gather(e.s, nd_up=2), ValueError, "nd_up must be 0 or 1, got 2"),
    ("gather nd_up=True", lambda e: synk.gather(e.s, nd_up=True), ValueError, "nd_up .*got True"),
    ("get_value rank=5", lambda e: synk.get_value(5, e.s), ValueError, r"rank must be in \[0, 2\), got 5"),
    ("set_value rank=5", lambda e: synk.set_value(5, e.s, np.zeros(6, F32)), ValueError,
     r"rank must be in \[0, 2\), got 5"),
    ("get_value rank=-1", lambda e: synk.get_value(-1, e.s), ValueError, "rank .*got -1"),
    ("get_value rank='a'", lambda e: synk.get_value("a", e.s), TypeError, "rank must be an int, got 'a'"),
    ("gather nccl='yes'", lambda e: synk.gather(e.s, nccl="yes"), TypeError,
     "nccl must be True or False, got 'yes'"),
    ("reduce in_place='no'", lambda e: synk.reduce(e.s, in_place="no"), TypeError,
     "in_place must be True or False, got 'no'"),
    ("set_value 2-d value", lambda e: synk.set_value(0, e.s, np.zeros((2, 3), F32)), TypeError,
     r"values: value of ndim 2 does not fit shared variable s \(ndim 1\)"),
    ("set_value float64 value", lambda e: synk.set_value(0, e.s, np.zeros(6)), TypeError, "float64"),
    ("set_value batch=10", lambda e: synk.set_value(1, e.s, np.zeros(6, F32), batch=10), ValueError,
     "needs 10 rows"),
    ("scatter batch='a'", lambda e: synk.scatter(e.s, np.zeros(6, F32), batch="a"), TypeError,
     "batch must be .*got str: 'a'"),
    ("scatter 2-d Data", lambda e: synk.scatter(e.s, e.dm), TypeError,
     r"values: <synkhronos.Data #\d+ dtype=float32 shape=\(4, 2\)> \(dtype float32, ndim 2\) does not fit "
     r"shared variable s \(dtype float32, ndim 1\)"),
    # With several values, the one that is wrong is named by its place.
    ("scatter second value int64", lambda e: synk.scatter([e.s, e.u], [np.zeros(6, F32), np.arange(6)]),
     TypeError, r"values\[1\]: .* does not fit shared variable u \(dtype float32\)"),
    ("broadcast empty Data", lambda e: synk.broadcast(e.s, e.empty), ValueError, "holds no memory"),
]


@pytest.mark.parametrize("call, exc, match", [c[1:] for c in COLLECTIVE_CASES],
                         ids=[c[0] for c in COLLECTIVE_CASES])
def test_collective_malformed(dist, call, exc, match):
    with pytest.raises(exc, match=match):
        call(dist)
    assert dist.alive()


def test_session_still_right_after_malformed_collectives(dist):
    np.testing.assert_array_equal(synk.gather(dist.s), np.tile(np.arange(6, dtype=F32), (2, 1)))
    np.testing.assert_array_equal(synk.gather(dist.u), np.zeros((2, 6), dtype=F32))
