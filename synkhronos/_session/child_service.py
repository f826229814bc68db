"""Evaluations for the session's child processes.

A process forked from the session's owner (PyMC's chains under ``fork``) or
started by it with a pickled copy of a model (``spawn``, ``forkserver``) cannot
drive the workers itself.  It asks the owner instead: the owner's ``Service``
listens on a Unix socket in a private directory.  Only handlers the owner
registered can be called, and only by a peer holding the session's random key
(``multiprocessing.connection``'s challenge), which the children inherit or
receive in the pickled copy.

One thread serves every child: it reads the requests that are ready, waits a
little for the children it served last that are expected back soon (chains ask
again within a fraction of a run, ``_common.returns``), and calls each handler
once with all its requests (so one run of the ranks computes every chain's
point), then sends the replies.  A thread per child would hand each request
over to the thread that runs it, and their wake-ups would slow that run.
"""

import collections
import os
import pickle
import shutil
import socket
import tempfile
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener, wait

from .._common.returns import Returns
from .._devices.cpu import usable_cores
from .._wire.protocol import failure

__all__ = ["Service", "Route", "call"]

_POLL_S = 0.5  # how often the serving thread looks whether the service closed


# Where a child sends its requests for one handler: the service's address and key,
# the handler's number, and the pid of the session's process.  Plain data: it pickles.
Route = collections.namedtuple("Route", "address authkey key owner")


class Service:
    """The owner's side: handlers by number, a listener started at the first
    ``route``, one thread that serves every connected child."""

    def __init__(self, ranks_here=1):
        self._ranks_here = ranks_here  # this host's ranks: they and the children share its cores
        self._handlers = []
        self._lingers = []
        self._lock = threading.Lock()
        self._listener = None
        self._dir = None
        self._authkey = None
        self._closed = False
        self._joined = []  # connections accepted, not yet served
        self._wake_r = self._wake_w = None
        self.lingered_s = 0.0  # time spent waiting for children expected back (read by benchmarks)
        self._n_children = 0  # connected children (the serving thread's count)

    def children(self):
        """How many child processes are connected (they share this host's cores)."""
        return self._n_children

    def route(self, handler, linger=0.0):
        """Register ``handler(list of args) -> list of picklable results`` (one
        call for the requests of every child that asked meanwhile; what it raises
        reaches each of them); the ``Route`` a child calls it by.  ``linger``:
        see ``_common.returns``; the children a call of it served are waited for
        that long after it."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Synkhronos is closed: call synkhronos.fork() to start again")
            if self._listener is None:
                self._start()
            self._handlers.append(handler)
            self._lingers.append(linger)
            return Route(self._listener.address, self._authkey, len(self._handlers) - 1, os.getpid())

    def _start(self):
        self._dir = tempfile.mkdtemp(prefix="synkhronos_service_")  # mode 0700: this user only
        self._authkey = os.urandom(32)
        self._listener = Listener(os.path.join(self._dir, "socket"), "AF_UNIX", authkey=self._authkey)
        self._wake_r, self._wake_w = socket.socketpair()
        threading.Thread(target=self._accept, name="synkhronos-service-accept", daemon=True).start()
        threading.Thread(target=self._serve, name="synkhronos-service", daemon=True).start()

    def _accept(self):
        listener = self._listener
        while not self._closed:
            try:
                conn = listener.accept()
            except Exception:  # a peer without the key, or the listener closed
                continue
            with self._lock:
                self._joined.append(conn)
            self._wake()

    def _wake(self):
        try:
            self._wake_w.send(b"w")
        except OSError:  # closed
            pass

    def _serve(self):
        conns, returns = [], Returns()
        pending = {}
        try:
            while not self._closed:
                self._linger(conns, pending, returns)  # (after a run: for the children it served)
                if pending:
                    self._answer(pending, conns, returns)
                    pending = {}
                else:
                    self._read(wait(conns + [self._wake_r], _POLL_S), conns, pending, returns)
                self._n_children = len(conns)
        finally:
            for conn in conns:
                conn.close()
            self._wake_r.close()

    def _read(self, ready, conns, pending, returns):
        """Take the requests of the ready connections into ``pending``."""
        if self._wake_r in ready:
            self._wake_r.recv(4096)
            with self._lock:
                conns += self._joined
                self._joined = []
        for conn in ready:
            if conn is self._wake_r:
                continue
            try:
                key, args, sent = pickle.loads(conn.recv_bytes())
            except Exception:  # the child ended (or sent what no child of ours sends)
                conns.remove(conn)
                conn.close()
                continue
            pending[conn] = key, args
            returns.arrived(conn, sent)  # (a request read after a run arrived during it)

    def _linger(self, conns, pending, returns):
        """Read requests until the children expected back soon have asked, or
        are late.  It polls where every rank of this host and every child has a
        core of its own: they are due within a fraction of a run, less than an
        idle core takes to wake up from a blocking wait.  Where cores are fewer,
        a poll would take the core a chain or a rank needs: it waits instead."""
        start = time.monotonic()
        expected, until = returns.expected(start)
        expected.intersection_update(conns)
        poll = self._ranks_here + len(conns) <= usable_cores()
        while True:
            expected.difference_update(pending)
            left = until - time.monotonic()
            if not expected or left <= 0 or self._closed:
                break
            ready = wait([c for c in conns if c not in pending] + [self._wake_r], 0 if poll else left)
            if ready:
                self._read(ready, conns, pending, returns)
            elif poll:
                os.sched_yield()  # (a chain on this core goes first)
        self.lingered_s += time.monotonic() - start

    def _answer(self, pending, conns, returns):
        """Run each handler once on its pending requests; send the replies."""
        start = time.monotonic()
        by_key = collections.defaultdict(list)
        for conn, (key, args) in pending.items():
            by_key[key].append((conn, args))
        replies = []
        for key, asked in by_key.items():
            replies += zip((c for c, _ in asked), self._run(key, [a for _, a in asked]))
        returns.linger = max(self._lingers[k] if k in range(len(self._lingers)) else 0.0 for k in by_key)
        returns.released(pending, start, time.monotonic())
        for conn, reply in replies:
            try:
                conn.send_bytes(_reply_bytes(reply))
            except OSError:  # the child ended
                conns.remove(conn)
                conn.close()

    def _run(self, key, requests):
        try:
            if key not in range(len(self._handlers)):
                raise KeyError("no handler %r in this session's service" % (key,))
            results = self._handlers[key](requests)
            if len(results) != len(requests):
                raise AssertionError("%d results for %d requests" % (len(results), len(requests)))
            return [(True, r) for r in results]
        except Exception as exc:
            return [(False, _portable(exc))] * len(requests)

    def close(self):
        """Stop listening and remove the socket (idempotent).  Children still
        asking get an error naming the closed session."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            listener, self._listener = self._listener, None
        if listener is None:
            return
        self._wake()
        try:  # wake the accepting thread (a bare connection: no handshake that could wait)
            with socket.socket(socket.AF_UNIX) as wake:
                wake.connect(listener.address)
        except OSError:
            pass
        listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _dumps(message):
    # (plain pickle: ``Connection.send``'s pickler copies a table of reducers for every message)
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def _reply_bytes(reply):
    try:
        return _dumps(reply)
    except Exception as exc:  # a result that does not pickle: the child is told, the service goes on
        return _dumps((False, RuntimeError("the result for this process did not pickle (%s: %s)"
                                           % (type(exc).__name__, exc))))


def _portable(exc):
    """``exc`` if it survives pickling, else a RuntimeError with its text and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        _, (name, message, tb) = failure(exc)
        return RuntimeError("%s: %s\n(in the session's process)\n%s" % (name, message, tb))


_connections = {}  # (pid, address) -> (Connection, lock): one connection per process and service
_connections_lock = threading.Lock()


def _connection(route):
    key = (os.getpid(), route.address)
    with _connections_lock:
        found = _connections.get(key)
        if found is None:
            try:
                conn = Client(route.address, "AF_UNIX", authkey=route.authkey)
            except (OSError, EOFError, AuthenticationError) as exc:
                raise RuntimeError(
                    "this process (pid %d) cannot reach the Synkhronos session of pid %d, which computes "
                    "its data-parallel terms (%s: %s): the session was closed, or its process ended"
                    % (os.getpid(), route.owner, type(exc).__name__, exc)) from exc
            found = _connections[key] = (conn, threading.Lock())
        return found


def call(route, *args):
    """Run the owner's handler of ``route`` with ``args`` (from a child process)
    and return its result; its exception is raised here."""
    conn, lock = _connection(route)
    with lock:  # one request in flight per connection: replies come back in order
        try:
            conn.send_bytes(_dumps((route.key, args, time.monotonic())))  # one clock for a host's processes
            okay, result = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:
            with _connections_lock:
                _connections.pop((os.getpid(), route.address), None)
            raise RuntimeError("the Synkhronos session of pid %d closed while this process (pid %d) "
                               "waited for it" % (route.owner, os.getpid())) from exc
    if not okay:
        raise result
    return result
