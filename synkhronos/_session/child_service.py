"""Evaluations for the session's child processes.

A process forked from the session's owner (PyMC's chains under ``fork``) or
started by it with a pickled copy of a model (``spawn``, ``forkserver``) cannot
drive the workers itself.  It asks the owner instead: the owner's ``Service``
listens on a Unix socket in a private directory, and each child connection gets
a thread there that runs the child's requests as calls of the owner's own
(through the session's lock, like any other thread's call).  Only handlers the
owner registered can be called, and only by a peer holding the session's random
key (``multiprocessing.connection``'s challenge), which the children inherit or
receive in the pickled copy.
"""

import collections
import os
import pickle
import shutil
import socket
import tempfile
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener

from .._wire.protocol import failure

__all__ = ["Service", "Route", "call"]

_POLL_S = 0.5  # how often a connection's thread looks whether the service closed


# Where a child sends its requests for one handler: the service's address and key,
# the handler's number, and the pid of the session's process.  Plain data: it pickles.
Route = collections.namedtuple("Route", "address authkey key owner")


class Service:
    """The owner's side: handlers by number, a listener started at the first
    ``route``, a thread per connected child."""

    def __init__(self):
        self._handlers = []
        self._lock = threading.Lock()
        self._listener = None
        self._dir = None
        self._authkey = None
        self._closed = False

    def route(self, handler):
        """Register ``handler(*args) -> picklable result``; the ``Route`` a child calls it by."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Synkhronos is closed: call synkhronos.fork() to start again")
            if self._listener is None:
                self._start()
            self._handlers.append(handler)
            return Route(self._listener.address, self._authkey, len(self._handlers) - 1, os.getpid())

    def _start(self):
        self._dir = tempfile.mkdtemp(prefix="synkhronos_service_")  # mode 0700: this user only
        self._authkey = os.urandom(32)
        self._listener = Listener(os.path.join(self._dir, "socket"), "AF_UNIX", authkey=self._authkey)
        threading.Thread(target=self._accept, name="synkhronos-service", daemon=True).start()

    def _accept(self):
        listener = self._listener
        while not self._closed:
            try:
                conn = listener.accept()
            except Exception:  # a peer without the key, or the listener closed
                continue
            if self._closed:
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn,), name="synkhronos-child", daemon=True).start()

    def _serve(self, conn):
        with conn:
            while not self._closed:
                try:
                    if not conn.poll(_POLL_S):
                        continue
                    key, args = conn.recv()
                    reply = self._run(key, args)
                    conn.send(reply)
                except (EOFError, OSError):  # the child ended
                    return

    def _run(self, key, args):
        try:
            return True, self._handlers[key](*args)
        except Exception as exc:
            return False, _portable(exc)

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
        try:  # wake the accepting thread (a bare connection: no handshake that could wait)
            with socket.socket(socket.AF_UNIX) as wake:
                wake.connect(listener.address)
        except OSError:
            pass
        listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


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
            conn.send((route.key, args))
            okay, result = conn.recv()
        except (EOFError, OSError) as exc:
            with _connections_lock:
                _connections.pop((os.getpid(), route.address), None)
            raise RuntimeError("the Synkhronos session of pid %d closed while this process (pid %d) "
                               "waited for it" % (route.owner, os.getpid())) from exc
    if not okay:
        raise result
    return result
