"""Template processes: a Python that has imported this package (with NumPy
and PyTensor) and forks a CPU worker on each request of the master, so that a
session's workers start in milliseconds instead of each spending about a second
of a core on its imports.  Once the master's first session has ended, the
template imports JAX and PyTensor's JAX backend too (``serve``).  The master
keeps its templates for its whole life, so a ``fork()`` after ``close()`` pays
nothing to start again.

A template serves only workers whose environment equals the one it was started
with, except for the variables read after start-up (``LATE_VARS``): settings
that libraries read as they are imported (``PYTENSOR_FLAGS``, the BLAS and
OpenMP thread counts, ``JAX_*``, ...) are then the worker's own.  Another
environment gets a template of its own; at most ``KEPT`` live at once.  A forked
worker takes the master's standard streams, working directory and cores of the
moment, draws its random numbers afresh, and reports its exit status through
the template (``ForkedWorker``, which answers as ``subprocess.Popen`` does).

A template ends at the master's exit (``stop_all``), or when the master's end
of its connection closes (the master died).  Where a template cannot start or
answer, the caller spawns its workers as before (``start_worker`` returns None).
"""

import atexit
import collections
import json
import logging
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

__all__ = ["ForkedWorker", "start_worker", "warm_all", "stop_all", "pids", "LATE_VARS", "KEPT", "serve"]

logger = logging.getLogger(__name__)

# Read by a worker after it starts, so a template started without them (or with
# other values) serves it as well: its own configuration and temporary
# directory, the tests' fault injection and test name, and what JAX sets in the
# master's environment as its backend starts (as a worker's JAX does in its own).
LATE_VARS = frozenset({"SYNK_WORKER", "TMPDIR", "SYNKHRONOS_FAULT", "PYTEST_CURRENT_TEST",
                       "TF_CPP_MIN_LOG_LEVEL", "TPU_SKIP_MDS_QUERY"})
KEPT = 2  # templates alive at once (each holds an interpreter with JAX imported)
START_TIMEOUT = 120.0  # seconds for a template's imports, or for it to answer a request
_ENV = "SYNK_TEMPLATE"
_PID = struct.Struct("i")
_MAX_REQUEST = 1 << 20
_WARM = b"warm"  # the master's word that a template may import the rest now

# What a template runs: it finds the package on the master's sys.path.
_BOOTSTRAP = ("import json, os, sys; sys.path[:0] = json.loads(os.environ['%s'])['sys_path']; "
              "from synkhronos._session.worker import serve_template; serve_template()" % _ENV)


class ForkedWorker:
    """The master's handle on a worker that a template forked: ``pid``,
    ``poll()``, ``wait(timeout)``, ``kill()`` and ``returncode`` as
    ``subprocess.Popen`` has them.  The exit status comes from the template,
    the worker's parent, through ``status_fd``; should the template end first,
    the status is unknown (``returncode`` -1)."""

    args = "synkhronos worker"

    def __init__(self, pid, status_fd):
        self.pid = pid
        self.returncode = None
        self._status_fd = status_fd

    def poll(self):
        if self.returncode is None and select.select([self._status_fd], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            if not select.select([self._status_fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_status()
        return self.returncode

    def kill(self):
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _read_status(self):
        data = os.read(self._status_fd, _PID.size)
        os.close(self._status_fd)
        self._status_fd = None
        self.returncode = _PID.unpack(data)[0] if len(data) == _PID.size else -1

    def __del__(self):
        if getattr(self, "_status_fd", None) is not None:
            os.close(self._status_fd)


class _Template:
    """The master's end of one template process."""

    def __init__(self, env, sys_path):
        self.warmed = False
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(env)
        env[_ENV] = json.dumps(dict(fd=theirs.fileno(), sys_path=sys_path))
        try:
            self.process = subprocess.Popen([sys.executable, "-c", _BOOTSTRAP], env=env,
                                            pass_fds=(theirs.fileno(),), close_fds=True,
                                            stdin=subprocess.DEVNULL)
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()
        self._await_ready()

    def _await_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while not select.select([self.sock], [], [], 0.05)[0]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the template process did not start (exit code %s)"
                                   % self.process.returncode)
        if self.sock.recv(16) != b"ready":
            self.close()
            raise RuntimeError("the template process failed to start (exit code %s)" % self.process.poll())

    def fork(self, env, conn_fd):
        """Have the template fork a worker with environment ``env`` and the
        master's connection ``conn_fd``; returns its ``ForkedWorker``."""
        status_r, status_w = os.pipe()
        try:
            affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
            request = pickle.dumps((env, os.getcwd(), affinity))
            socket.send_fds(self.sock, [request], [conn_fd, 0, 1, 2, status_w])
            if not select.select([self.sock], [], [], START_TIMEOUT)[0]:  # at most one import away
                raise OSError("the template process did not answer within %.0f s" % START_TIMEOUT)
            reply = self.sock.recv(_PID.size)
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        if len(reply) != _PID.size:
            os.close(status_r)
            raise OSError("the template process ended")
        return ForkedWorker(_PID.unpack(reply)[0], status_r)

    def warm(self):
        """Let the template import the rest of what workers import."""
        if not self.warmed:
            self.warmed = True
            try:
                self.sock.send(_WARM)
            except OSError:
                pass

    def close(self):
        """End the template: it holds nothing but imports, and its workers
        have left with their sessions."""
        self.sock.close()
        self.process.kill()
        self.process.wait()


# --------------------------------------------------------------- the master's side
_lock = threading.Lock()
_templates = collections.OrderedDict()  # key -> _Template, most recently used last
_owner = [os.getpid()]  # the process these templates belong to (a forked child has none)


def _adopt():
    """Make this process the owner of the templates (under ``_lock``): in a
    forked child of the master, the master's templates are not its own."""
    if _owner[0] != os.getpid():
        _templates.clear()
        _owner[0] = os.getpid()


def _key(env, sys_path):
    return (sys.executable, tuple(sys_path),
            tuple(sorted((k, v) for k, v in env.items() if k not in LATE_VARS)))


def start_worker(env, conn_fd, sys_path):
    """A worker forked by the template for ``env`` (started if need be), with
    ``conn_fd`` its connection to the master; returns its ``ForkedWorker``, or
    None where no template can serve (the caller then spawns the worker)."""
    key = _key(env, sys_path)
    with _lock:
        _adopt()
        template = _templates.pop(key, None)
        try:
            if template is None:
                template = _Template({k: v for k, v in env.items() if k not in LATE_VARS}, sys_path)
            worker = template.fork(env, conn_fd)
        except (OSError, RuntimeError) as exc:
            logger.debug("no template process (%s): spawning the worker", exc)
            if template is not None:
                template.close()
            return None
        _templates[key] = template
        while len(_templates) > KEPT:
            _templates.popitem(last=False)[1].close()
    return worker


def warm_all():
    """After a session: let every template import the rest (``serve``)."""
    with _lock:
        _adopt()
        for template in _templates.values():
            template.warm()


def stop_all():
    """End every template of this process (at exit)."""
    with _lock:
        _adopt()
        while _templates:
            _templates.popitem()[1].close()


def pids():
    """The process ids of this process's templates."""
    with _lock:
        _adopt()
        return [t.process.pid for t in _templates.values()]


atexit.register(stop_all)


# --------------------------------------------------------------- the template's side
def serve(preload, run_worker):
    """Run as a template process: say so to the master, then fork a worker for
    each request, the child calling ``run_worker(conn_fd)``, and report each
    child's exit status; returns once the master's end closes.  Modules
    ``preload`` are imported once the master says that its first session has
    ended (``warm``), one at a time between requests: the first workers start
    as spawned ones would (importing them themselves) without a template
    importing beside them, and later ones find everything imported."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's to handle
    config = json.loads(os.environ.pop(_ENV))
    sock = socket.socket(fileno=config["fd"])
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    children = {}  # pid -> the write end of its status pipe
    pending, warm = list(preload), False
    sock.send(b"ready")
    while True:
        readable = select.select([sock, wake_r], [], [], 0 if warm and pending else None)[0]
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(children)
        if sock in readable:
            served = _serve_request(sock, children, (sock, wake_r, wake_w), run_worker)
            if served is None:
                return
            warm = warm or served == _WARM
        elif pending:
            _preload(pending.pop(0))


def _preload(name):
    try:
        __import__(name)
    except Exception:  # the worker imports it again, and reports what fails
        pass


def _serve_request(sock, children, template_fds, run_worker):
    """Fork the worker of the master's next request; returns what it read
    (``_WARM``, or the request), or None once the master's end has closed."""
    try:
        request, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 8)
    except OSError:
        return None
    if not request:
        return None
    if request == _WARM:
        return request
    conn_fd, *stdio, status_fd = fds  # as _Template.fork sends them
    pid = _fork_child(pickle.loads(request), conn_fd, stdio, status_fd, (*template_fds, *children.values()),
                      run_worker)
    children[pid] = status_fd
    for fd in (conn_fd, *stdio):
        os.close(fd)
    sock.send(_PID.pack(pid))
    return request


def _reap(children):
    """Send the exit status of every ended child to the master."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, _PID.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            os.close(fd)


def _fork_child(request, conn_fd, stdio, status_fd, template_fds, run_worker):
    """Fork a worker; in the child, take the master's standard streams,
    environment, working directory and cores of the moment, and run the worker
    on its connection (never returns there)."""
    env, cwd, affinity = request
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in template_fds:
            fd.close() if hasattr(fd, "close") else os.close(fd)
        os.close(status_fd)
        for target, fd in zip((0, 1, 2), stdio):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # TMPDIR is the session's
        try:
            os.chdir(cwd)
        except OSError:  # gone since: the template's, as a spawned worker keeps a gone one
            pass
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        _fresh_random()
        run_worker(conn_fd)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _fresh_random():
    """Draw new seeds, as a worker spawned afresh would: a fork copies the
    template's random state to every worker."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
