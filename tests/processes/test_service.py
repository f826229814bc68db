"""The session's service for its child processes (``synkhronos._session.child_service``).

The service: a forked child and a spawned one (given the route in a pickle) get
the owner's results; the owner's exceptions reach the child; a peer without the
key is refused and the service goes on; after close, a child gets an error that
names the closed session, and nothing of the service is left on disk."""

import multiprocessing
import os
import pickle
import stat
import threading
import time
from multiprocessing.connection import wait

import numpy as np
import pytest

from synkhronos._session.child_service import Route, Service, call


def _each(fn):
    """A service handler (a list of requests' arguments) from a function of one request's."""
    return lambda requests: [fn(*args) for args in requests]


def _square_plus_one(x, y):
    return np.asarray(x) ** 2 + y


_square_plus = _each(_square_plus_one)


@_each
def _fails(x):
    raise ValueError("bad x %r" % (x,))


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("no")


@_each
def _fails_unpicklably():
    raise _Unpicklable("local state")


@pytest.fixture
def service():
    s = Service()
    yield s
    s.close()


def _in_fork(fn):
    """``fn()``'s result (or exception text) computed in a forked child."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()

    def target():
        try:
            child.send(("ok", fn()))
        except Exception as exc:
            child.send(("error", "%s: %s" % (type(exc).__name__, exc)))

    p = ctx.Process(target=target)
    p.start()
    try:
        assert parent.poll(60), "the child did not answer within 60 s"
        return parent.recv()
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()


def _call_route(route, *args):
    return call(route, *args)


def test_a_forked_child_gets_the_owners_results(service):
    route = service.route(_square_plus)
    kind, got = _in_fork(lambda: call(route, np.arange(4.0), 1.0))
    assert kind == "ok"
    np.testing.assert_array_equal(got, np.arange(4.0) ** 2 + 1)


def test_a_spawned_child_calls_through_a_pickled_route(service):
    route = pickle.loads(pickle.dumps(service.route(_square_plus)))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        got = pool.apply(_call_route, (route, np.ones(3), 2.0))
    np.testing.assert_array_equal(got, np.full(3, 3.0))


def test_the_owners_exception_reaches_the_child(service):
    bad = service.route(_fails)
    odd = service.route(_fails_unpicklably)
    assert _in_fork(lambda: call(bad, 7)) == ("error", "ValueError: bad x 7")
    kind, text = _in_fork(lambda: call(odd))
    assert kind == "error" and text.startswith("RuntimeError: _Unpicklable: local state")
    good = service.route(_square_plus)
    assert _in_fork(lambda: float(call(good, 2.0, 0.5))) == ("ok", 4.5), "the service goes on"


def test_a_peer_without_the_key_is_refused_and_the_service_goes_on(service):
    route = service.route(_square_plus)
    stranger = Route(route.address, b"x" * 32, route.key, route.owner)
    kind, text = _in_fork(lambda: call(stranger, 1.0, 1.0))
    assert kind == "error" and "AuthenticationError" in text, text
    assert _in_fork(lambda: float(call(route, 3.0, 0.0))) == ("ok", 9.0)


def test_the_socket_is_private_and_gone_after_close():
    s = Service()
    route = s.route(_square_plus)
    folder = os.path.dirname(route.address)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert os.stat(folder).st_uid == os.getuid()
    s.close()
    s.close()  # idempotent
    assert not os.path.exists(folder)
    kind, text = _in_fork(lambda: call(route, 1.0, 1.0))
    assert kind == "error" and "cannot reach the Synkhronos session of pid %d" % os.getpid() in text
    with pytest.raises(RuntimeError, match="closed"):
        s.route(_square_plus)


def test_a_child_asking_when_the_session_closes_is_told():
    s = Service()
    started = threading.Event()

    @_each
    def slow(x):
        started.set()
        time.sleep(0.5)
        return x

    route = s.route(slow)
    closer = threading.Thread(target=lambda: (started.wait(10), s.close()))
    closer.start()
    kind, got = _in_fork(lambda: call(route, 5))
    closer.join()
    # The call under way when close() came either finished or was told why it ended.
    assert (kind, got) == ("ok", 5) or (kind == "error" and "closed" in got)


def _forked_callers(route, children, calls, think_s=0.0):
    """What each of ``children`` forked processes got from ``calls`` calls of
    ``route``, child ``c``'s ``i``-th with argument ``100 * c + i``, each after
    ``think_s`` of a chain's own work."""
    ctx = multiprocessing.get_context("fork")
    pipes, procs = [], []
    for c in range(children):
        parent, child = ctx.Pipe()

        def target(c=c, child=child):
            out = []
            for i in range(calls):
                if think_s:
                    time.sleep(think_s)
                out.append(call(route, 100 * c + i))
            child.send(out)

        procs.append(ctx.Process(target=target))
        pipes.append(parent)
    for p in procs:
        p.start()
    try:
        results = []
        for c, parent in enumerate(pipes):
            assert parent.poll(60), "child %d did not answer" % c
            results.append(parent.recv())
        return results
    finally:
        for p in procs:
            p.join(30)


def test_children_asking_at_once_share_one_call_and_get_their_own_results(service):
    """Four forked children asking again and again: each gets the results of
    its own arguments, and the handler was called with several children's
    requests at once (one thread serves them all)."""
    sizes = []

    def tenfold(requests):
        sizes.append(len(requests))
        time.sleep(0.002)  # a run: the others ask meanwhile
        return [10 * x for (x,) in requests]

    route = service.route(tenfold, linger=0.5)
    got = _forked_callers(route, children=4, calls=40)
    assert got == [[10 * (100 * c + i) for i in range(40)] for c in range(4)]
    assert sum(sizes) == 160
    assert max(sizes) > 1 and len(sizes) < 160, sizes


def test_a_result_that_does_not_pickle_is_an_error_in_the_child_and_the_service_goes_on(service):
    odd = service.route(lambda requests: [threading.Lock() for _ in requests])
    kind, text = _in_fork(lambda: call(odd))
    assert kind == "error" and "did not pickle" in text, text
    good = service.route(_square_plus)
    assert _in_fork(lambda: float(call(good, 2.0, 0.5))) == ("ok", 4.5)


def test_requests_and_replies_larger_than_a_sockets_buffer(service):
    """A point of 2.4 MB each way (a socket's buffer holds a few hundred KB):
    the child's send and the service's reply each wait for the other side to
    read, and nothing is cut short."""
    route = service.route(_each(lambda x: 2 * x))
    kind, got = _in_fork(lambda: call(route, np.arange(300_000.0)))
    assert kind == "ok"
    np.testing.assert_array_equal(got, 2 * np.arange(300_000.0))


def _lingering_polls(ranks_here, monkeypatch):
    """(The service's polls: its waits with no timeout, each child's results)
    for two forked children that think 8 ms between requests, served one 40 ms
    run at a time with ``linger`` 0.5, by a service whose host has
    ``ranks_here`` ranks."""
    from synkhronos._session import child_service

    polls = []

    def counted(conns, timeout=None):
        if timeout == 0:
            polls.append(1)
        return wait(conns, timeout)

    monkeypatch.setattr(child_service, "wait", counted)
    service = Service(ranks_here)
    try:
        def tenfold_slowly(requests):
            time.sleep(0.04)
            return [10 * x for (x,) in requests]

        route = service.route(tenfold_slowly, linger=0.5)
        results = _forked_callers(route, children=2, calls=15, think_s=0.008)
        return len(polls), results
    finally:
        service.close()


def test_where_cores_are_fewer_than_ranks_and_children_the_service_waits_without_polling(monkeypatch):
    """With a core for every rank and child the service polls for the children
    expected back (they are due sooner than a core wakes); with fewer cores it
    waits in the kernel instead, and leaves the cores to the chains and ranks."""
    want = [[10 * (100 * c + i) for i in range(15)] for c in range(2)]
    polled, got = _lingering_polls(0, monkeypatch)  # two children, at least two cores: it polls
    assert got == want and polled > 0
    polled, got = _lingering_polls(10**6, monkeypatch)
    assert got == want and polled == 0
