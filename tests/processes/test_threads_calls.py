"""Calls from several threads of the master at once, each with its own inputs and
results: the regression test of the issue in which they were not serialized.

Each thread calls ONE shared ``synk.function`` with its own Data (a scattered
matrix and a broadcast scalar ``c``), and after each call runs collectives on a
shared variable of its own (``broadcast``, then ``gather`` to read it back).
Without the session's lock (``Runtime.lock``, held by every public call) the
threads' commands and replies interleaved on the workers' channels and in the
master's exchange buffer: a thread got another call's result or a reply meant
for another command (201 of 600 results wrong in the report), or an internal
error ("a second exchange layout for one message would overwrite the first",
"cannot unpack non-iterable NoneType object").  Here every result is compared
with numpy, wrong ones are counted, and the count must be 0 with no exception
in any thread.

The values are whole numbers, so float64 sums are exact in any order and every
comparison is ``==``.  Each thread's ``c`` (``500 * thread``) and row count
differ, so a result that reached the wrong thread does not pass for right.
"""

import sys
import threading
import time
import traceback

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk
from synkhronos._session import runtime

CALLS = 200  # function calls per thread, each followed by a broadcast and a gather
MAX_THREADS = 4
WIDTH = 3
JOIN_S = 240.0  # all threads together; far more than they need (a hang fails the test, not blocks it)
STALL_S = 60.0  # fork(timeout=...): a call stuck this long raises StallError


@pytest.fixture(scope="module")
def session():
    """Two CPU ranks, the shared function and one shared variable per thread."""
    n = synk.fork(2, use_gpu=False, timeout=STALL_S)
    x = pt.matrix("x", dtype="float64")
    c = pt.scalar("c", dtype="float64")
    f = synk.function([x], [(x.sum() + c * x.shape[0], "sum")], bcast_inputs=[c], name="f")
    owned = [pytensor.shared(np.zeros(WIDTH, "float64"), name="t%d" % t) for t in range(MAX_THREADS)]
    # Shared variables reach the workers as those of a function: this one holds them.
    synk.function([], [(v.sum(), "sum") for v in owned], name="holds")
    synk.distribute()
    yield n, f, owned
    synk.close()


def _drive(t, n, f, var, start, wrong, errors):
    """Thread ``t``: CALLS rounds of ``f`` and collectives on ``var``.  A result
    that differs from numpy goes to ``wrong[t]``, an exception to ``errors[t]``;
    the thread goes on after either (to count them all) until the session closes."""
    rng = np.random.default_rng(t)
    rows = 40 + 7 * t
    c = 500.0 * t
    try:
        xd = synk.data(rng.integers(-100, 100, (rows, WIDTH)).astype("float64"))
        cd = synk.data(np.asarray(c))
        want_f = xd.data.sum() + c * rows
    except Exception as exc:
        errors[t].append(("data", exc))
        return
    finally:
        start.wait()  # all threads begin calling at once (a failed one too: no one waits for it)
    for i in range(CALLS):
        value = np.full(WIDTH, 1000.0 * t + i)
        try:
            synk.broadcast(var, value)
            (got,) = f(xd, cd)  # outputs given as a list: results come as one
            if not np.array_equal(got, want_f):
                wrong[t].append("call %d: f gave %r, expected %r" % (i, got, want_f))
            got = synk.gather(var, nd_up=1)
            if not np.array_equal(got, np.stack([value] * n)):
                wrong[t].append("call %d: gather of %s gave %r, expected %r" % (i, var, got, value))
        except Exception as exc:
            errors[t].append((i, exc))
            if runtime.current() is None:  # closed by the failure: later calls only say so
                return


def _run(threads, session):
    n, f, owned = session
    start = threading.Barrier(threads)  # all threads begin calling at once
    wrong = {t: [] for t in range(threads)}
    errors = {t: [] for t in range(threads)}
    workers = [threading.Thread(target=_drive, args=(t, n, f, owned[t], start, wrong, errors),
                                name="caller %d" % t, daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + JOIN_S
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    hung = [w for w in workers if w.is_alive()]
    if hung:  # daemon threads: the test fails with their stacks instead of hanging the suite
        frames = sys._current_frames()
        pytest.fail("threads still running after %.0f s:\n%s" % (JOIN_S, "\n".join(
            "%s:\n%s" % (w.name, "".join(traceback.format_stack(frames[w.ident]))) for w in hung)))
    return wrong, errors


@pytest.mark.parametrize("threads", [2, 4])
def test_calls_from_threads_each_get_their_own_results(session, threads):
    wrong, errors = _run(threads, session)
    count = sum(len(w) for w in wrong.values())
    failed = {t: e for t, e in errors.items() if e}
    assert count == 0 and not failed, "%d of %d results wrong, %d calls raised; first of each thread:\n%s" % (
        count, 2 * CALLS * threads, sum(len(e) for e in failed.values()), "\n".join(
            ["thread %d: %s" % (t, w[0]) for t, w in wrong.items() if w] +
            ["thread %d, call %s: %s" % (t, e[0][0], "".join(traceback.format_exception(e[0][1])))
             for t, e in failed.items()]))


def test_distribute_while_another_thread_compiles(session):
    """While PyTensor rewrites a graph it sets ``config.mode`` to that function's
    Mode object, for the whole process: a thread distributing meanwhile must
    not send it to the workers as their mode (a worker could not read it)."""
    from pytensor.compile.mode import Mode

    x = pt.vector("x", dtype="float64")
    with pytensor.config.change_flags(mode=Mode(linker="py", optimizer="fast_compile")):
        g = synk.function([x], [(2 * x.sum(), "sum")], name="while compiling")
        synk.distribute()
    assert not isinstance(pytensor.config.mode, Mode)
    np.testing.assert_allclose(g(synk.data(np.arange(5.0))), 20.0)
