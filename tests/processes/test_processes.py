"""Other processes than the session's own: the library's exceptions pickle intact
(as multiprocessing, PyMC, joblib and concurrent.futures send a child's
exception to its parent), and a child forked or spawned from the master can
neither drive nor break the session.  The rule: only the process that called
``fork()`` may call its functions and collectives; in any other process they
raise RuntimeError saying so, and the master's session goes on."""

import atexit
import concurrent.futures
import copy
import gc
import multiprocessing
import os
import pickle

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest

import synkhronos as synk

RULE = "only the process that called synkhronos.fork()"


def _worker_error():
    return synk.WorkerError(2, "ValueError", "bad value", "Traceback (most recent call last):\n  ...\n")


def _stall_error():
    return synk.StallError([3, 1], {1: "all_reduce", 3: "call of function 'f'"}, 2.5,
                           {1: "Thread 0x1 (most recent call first):\n", 3: "(no stack)"}, {1: 2.6, 3: 3.1})


@pytest.mark.parametrize("make", [_worker_error, _stall_error], ids=["WorkerError", "StallError"])
def test_library_exceptions_pickle_to_the_same_type_message_and_attributes(make):
    exc = make()
    exc.add_note("a note added on the way")
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(exc, protocol=protocol))
        assert type(back) is type(exc) and str(back) == str(exc) and back.args == exc.args
        assert back.__dict__ == exc.__dict__ and back.__notes__ == ["a note added on the way"]
    if isinstance(exc, synk.StallError):
        assert (back.ranks, back.command, back.timeout) == ([1, 3], "all_reduce", 2.5)
        assert back.waited == {1: 2.6, 3: 3.1} and back.stacks[3] == "(no stack)"
    else:
        assert (back.rank, back.exc_type, back.message) == (2, "ValueError", "bad value")


def _raise(make):
    raise make()


@pytest.mark.parametrize("make", [_worker_error, _stall_error], ids=["WorkerError", "StallError"])
def test_an_exception_raised_in_a_child_reaches_the_parent_intact(make):
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        exc = pool.submit(_raise, make).exception(timeout=120)
    assert type(exc) is type(make()) and str(exc) == str(make())


def test_a_function_pickled_before_its_session_closed_says_so():
    """(Placed before the module's session starts: it forks one of its own.)"""
    synk.fork(1, use_gpu=False)
    x = pt.vector("x")
    f = synk.function([x], (x.sum(), "sum"), name="old")
    synk.distribute()
    blob = pickle.dumps(f)
    synk.close()
    with pytest.raises(RuntimeError, match="function 'old' belongs to a closed Synkhronos session"):
        pickle.loads(blob)(None)


# ------------------------------------------------------------------ a session
@pytest.fixture(scope="module")
def session():
    synk.fork(2, use_gpu=False)
    x = pt.matrix("x", dtype="float32")
    s = pytensor.shared(np.zeros(3, "float32"), name="s")
    f = synk.function([x], (x.sum(), "sum"), updates=[(s, s + x.sum(axis=0))], name="f")
    synk.distribute()
    d = synk.data(np.arange(12, dtype="float32").reshape(4, 3))
    yield f, s, d
    synk.close()


def _goes_on(f, s, d):
    """The master's session still computes right."""
    synk.broadcast(s, np.zeros(3, "float32"))
    assert f(d) == 66.0
    np.testing.assert_array_equal(synk.gather(s, nd_up=0), np.array([3, 5, 7, 15, 17, 19], "float32"))


def _attempts(f, s, d):
    """What a child tries: a call and a collective; the messages it got."""
    said = []
    for call in (lambda: f(d), lambda: synk.all_reduce(s)):
        try:
            call()
            said.append("it ran")
        except RuntimeError as exc:
            said.append(str(exc))
    return said


def test_a_forked_child_is_refused_and_its_exit_leaves_the_session_alone(session):
    f, s, d = session
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it runs the exit handlers an ordinary exit runs, then leaves
        code = 1
        try:
            said = _attempts(f, s, d)
            np.testing.assert_array_equal(d.data[1], [3, 4, 5])  # reading the shared memory is fine
            try:
                d[0] = 7  # writing it is the session's business
            except RuntimeError as exc:
                said.append(str(exc))
            del d
            gc.collect()  # a Data collected in the child must not release the master's memory
            os.write(write, repr(said).encode())
            code = 0
        finally:
            os.close(write)
            atexit._run_exitfuncs()  # (sys.exit would unwind into pytest, running on in the child)
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as fh:
        said = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert said.count(RULE) == 3 and "pid %d" % os.getpid() in said
    _goes_on(f, s, d)


def _child(f, s, queue):
    queue.put(_attempts(f, s, None))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_child_is_refused_and_the_session_goes_on(session, method):
    f, s, d = session
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(f, s, queue))  # spawn: f is pickled, s a copy
    child.start()
    said = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    assert "it ran" not in said and all(RULE in m or "child process" in m for m in said), said
    assert RULE in said[0]  # the function names the rule in either kind of child
    _goes_on(f, s, d)


def test_a_forked_child_may_leave_the_session_and_start_its_own(session):
    f, s, d = session
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            synk.close()  # lets go of the parent's session only
            synk.fork(1, use_gpu=False)
            x = pt.vector("x")
            g = synk.function([x], (x.sum(), "sum"))
            synk.distribute()
            code = 0 if g(synk.data(np.ones(5, "float32"))) == 5.0 else 2
            synk.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    _goes_on(f, s, d)


def test_functions_pickle_as_handles_and_data_refuses_with_the_rule(session):
    f, s, d = session
    assert pickle.loads(pickle.dumps(f)) is f and copy.deepcopy(f) is f  # in its own process: itself
    with pytest.raises(TypeError, match="cannot be pickled.*" + RULE.replace("(", r"\(").replace(")", r"\)")):
        pickle.dumps(d)

