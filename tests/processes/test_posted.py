"""Commands posted without waiting for replies (how device collectives are
queued), ``synchronize()``, and the master's record of every rank's shapes.

The posting machinery is the runtime's, not the GPU's, so it is tested here on CPU
workers with an ordinary command: what matters is that a worker's failure is
raised at the next round trip with its rank and traceback, that the channel stays
in step however many replies are owed, and that nothing hangs or leaks.
"""

import os

os.environ["PYTENSOR_FLAGS"] = "mode=FAST_COMPILE"  # before PyTensor is imported

import time  # noqa: E402

import numpy as np  # noqa: E402
import pytensor  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
import pytest  # noqa: E402
from _procs import segments  # noqa: E402

import synkhronos as synk  # noqa: E402
from synkhronos._collectives import transfer  # noqa: E402
from synkhronos._session import dispatch, runtime
from synkhronos._wire.protocol import GetShapes  # noqa: E402

F32 = "float32"
BAD_ID = 999  # no such shared variable: GET_SHAPES raises IndexError in a worker


@pytest.fixture
def session():
    """3 CPU ranks, a 4-vector shared variable ``s`` and a function using it."""
    synk.close()
    synk.fork(3, use_gpu=False)
    s = pytensor.shared(np.arange(4, dtype=F32), name="s")
    x = pt.vector("x", dtype=F32)
    f = synk.function([x], (x.sum() + s.sum(), "sum"))
    synk.distribute()
    yield runtime.current(), s, f
    synk.close()


def _wait_for_replies(rt, ranks):
    deadline = time.monotonic() + 10
    while not all(rt.workers[r].channel.ready() for r in ranks):
        assert time.monotonic() < deadline, "workers did not answer"
        time.sleep(0.01)


def test_post_returns_before_replies_and_failure_comes_at_next_request(session):
    rt, s, f = session
    rt.dispatcher.post(GetShapes([BAD_ID]))
    assert all(len(w.owed) == 1 for w in rt.workers.values())
    with pytest.raises(synk.WorkerError) as info:
        synk.get_shapes(s)
    err = info.value
    assert err.rank == 1 and err.exc_type == "IndexError"  # lowest failing rank
    assert "during an earlier get_shapes" in str(err)
    assert "IndexError" in err.worker_traceback
    # Every owed reply was read: the session goes on in step.
    assert all(not w.owed for w in rt.workers.values())
    assert synk.get_shapes(s) == [(4,)] * 3
    assert float(f(synk.data(np.ones(6, dtype=F32)))) == 6.0 + 3 * 6.0


def test_synchronize_raises_a_posted_failure_then_succeeds(session):
    rt, s, _ = session
    rt.dispatcher.post(GetShapes([BAD_ID]), ranks=[2])
    with pytest.raises(synk.WorkerError, match="rank 2"):
        synk.synchronize()
    assert synk.synchronize() is None
    assert synk.get_value(2, s).tolist() == [0, 1, 2, 3]


def test_many_posted_commands_stay_in_step(session):
    rt, s, _ = session
    most = 0
    for _ in range(3 * dispatch._MAX_OWED):
        rt.dispatcher.post(GetShapes([0]))
        most = max(most, max(len(w.owed) for w in rt.workers.values()))
    assert most == dispatch._MAX_OWED  # post() reads old replies instead of letting them pile up
    synk.set_value(1, s, np.arange(7, dtype=F32))
    assert synk.get_shapes(s) == [(4,), (7,), (4,)]


def test_check_posted_raises_a_failure_that_arrived_and_closes(session):
    rt, _, _ = session
    token = rt.token
    rt.dispatcher.post(GetShapes([BAD_ID]))
    _wait_for_replies(rt, rt.worker_ranks)
    with pytest.raises(synk.WorkerError, match="IndexError in worker rank 1"):
        rt.dispatcher.check_posted()
    # A failure while the master waits on its device may leave the devices stuck
    # in a collective: the session is closed.
    assert rt.closed and runtime.current() is None
    assert segments(token) == []


def test_check_posted_reads_successes_without_waiting(session):
    rt, s, _ = session
    rt.dispatcher.post(GetShapes([0]))
    _wait_for_replies(rt, rt.worker_ranks)
    rt.dispatcher.check_posted()
    assert all(not w.owed for w in rt.workers.values())
    assert not rt.closed


def test_failure_in_masters_part_of_a_post_closes_the_session(session):
    rt, _, _ = session

    def local():
        raise MemoryError("no room for the master's buffer")

    with pytest.raises(MemoryError, match="no room"):
        rt.dispatcher.post(GetShapes([0]), local=local)
    assert rt.closed and runtime.current() is None


def test_dead_worker_with_replies_owed(session):
    rt, s, _ = session
    rt.dispatcher.post(GetShapes([0]))
    rt.workers[2].process.kill()
    rt.workers[2].process.wait()
    with pytest.raises(synk.WorkerError) as info:
        synk.get_shapes(s)
    assert info.value.exc_type == "WorkerDied" and info.value.rank == 2
    assert rt.closed


def test_synchronize_needs_a_session():
    synk.close()
    with pytest.raises(RuntimeError, match="call synkhronos.fork"):
        synk.synchronize()


# ----------------------------------------------------------- the record of shapes


def _table(rt, var):
    return transfer.shape_table(rt, [var], [rt.registry.shared_id(var)])[0]


def _shapes_asked(rt, monkeypatch):
    """Count the GET_SHAPES round trips from now on."""
    asked = []
    real = rt.dispatcher.request

    def counting(message, *args, **kwargs):
        if isinstance(message, GetShapes):
            asked.append(message)
        return real(message, *args, **kwargs)

    monkeypatch.setattr(rt.dispatcher, "request", counting)
    return asked


def test_shape_record_is_reused_until_something_may_change_it(monkeypatch):
    synk.close()
    synk.fork(2, use_gpu=False)
    try:
        fixed = pytensor.shared(np.zeros(3, dtype=F32), name="fixed", shape=(3,))
        free = pytensor.shared(np.zeros(3, dtype=F32), name="free")
        grow = synk.function([], updates=[(free, pt.concatenate([free, free[:1]])), (fixed, fixed + 1)])
        x = pt.vector("x", dtype=F32)
        # 3 rows: 2 on the master (rank 0), 1 on the worker; only the worker's shape changes.
        resize = synk.function([x], updates=[(free, pt.zeros(2 * x.shape[0], dtype=F32))])
        synk.distribute()
        rt = runtime.current()
        asked = _shapes_asked(rt, monkeypatch)
        assert _table(rt, fixed) == [(3,), (3,)] and _table(rt, free) == [(3,), (3,)]
        assert len(asked) == 2
        _table(rt, fixed), _table(rt, free)
        assert len(asked) == 2  # recorded
        grow()
        # The update of `free` has no static shape, so its record is dropped; `fixed` keeps its own.
        assert _table(rt, free) == [(4,), (4,)]
        assert _table(rt, fixed) == [(3,), (3,)]
        assert len(asked) == 3
        resize(synk.data(np.zeros(3, dtype=F32)))
        assert _table(rt, free) == [(4,), (2,)]
        assert len(asked) == 4
        synk.scatter(free, np.zeros(5, dtype=F32))
        assert _table(rt, free) == [(3,), (2,)]
        synk.set_value(0, fixed, np.zeros(3, dtype=F32))
        free.set_value(np.zeros(9, dtype=F32))  # the master's own value, outside Synkhronos
        assert _table(rt, free) == [(9,), (2,)]
        assert len(asked) == 6
        assert _table(rt, fixed) == [(3,), (3,)]
        assert len(asked) == 7
        assert synk.get_shapes([free, fixed]) == [[(9,), (2,)], [(3,), (3,)]]
    finally:
        synk.close()


# ------------------------------------------------- function calls queued like collectives


@pytest.fixture
def queued_session(monkeypatch):
    """3 CPU ranks whose device claims to queue its work (as GPU ranks do), so
    that calls with nothing to return are posted; ``d`` is a sliceable 4-vector."""
    synk.close()
    synk.fork(3, use_gpu=False)
    rt = runtime.current()
    monkeypatch.setattr(rt.device, "queued", True)
    d = pytensor.shared(np.arange(4, dtype=F32), name="d")
    acc = pytensor.shared(np.zeros((), dtype=F32), name="acc")
    add = synk.function([], updates=[(acc, acc + d.sum())], sliceable_shareds=[d])
    x = pt.vector("x", dtype=F32)
    add_x = synk.function([x], updates=[(acc, acc + x.sum())])
    synk.distribute()
    yield rt, acc, add, add_x
    synk.close()


def test_call_without_results_is_posted_and_computes_the_same(queued_session):
    rt, acc, add, add_x = queued_session
    assert add() == []
    assert all(len(w.owed) == 1 for w in rt.workers.values())
    add(batch_s=[slice(1, 3)] * 3)
    assert [float(synk.get_value(r, acc)) for r in range(3)] == [6.0 + 3.0] * 3
    assert all(not w.owed for w in rt.workers.values())
    # A call reading Data is not posted: the user may overwrite the Data once it returns.
    add_x(synk.data(np.ones(6, dtype=F32)))
    assert all(not w.owed for w in rt.workers.values())


def test_posted_call_failure_in_a_worker_comes_at_the_next_round_trip(queued_session):
    rt, acc, add, _ = queued_session
    add(batch_s=[slice(0, 2), slice(0, 9), slice(0, 2)])  # rank 1 has no 9 rows
    with pytest.raises(synk.WorkerError) as info:
        synk.get_value(0, acc)
    assert info.value.rank == 1 and "during an earlier call" in str(info.value)
    assert "sliceable shared variable" in str(info.value)
    add()  # the session goes on
    assert [float(synk.get_value(r, acc)) for r in range(3)] == [1.0 + 6.0, 6.0, 1.0 + 6.0]


def test_posted_call_failure_in_the_master_keeps_the_session(queued_session):
    rt, acc, add, _ = queued_session
    with pytest.raises(ValueError, match="sliceable shared variable"):
        add(batch_s=[slice(0, 9), slice(0, 2), slice(0, 2)])
    # No collective was involved, so nothing is stuck: the workers' parts ran.
    assert not rt.closed
    assert [float(synk.get_value(r, acc)) for r in range(3)] == [0.0, 1.0, 1.0]
