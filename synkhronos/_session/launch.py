"""Launching and stopping the workers, and the master's handles on them:
processes that ``fork()`` spawns on this host, or the other ranks of an MPI
launch, which connect to the master (see ``_session.mpi``).  The command engine
(``_session.dispatch``) talks to them through these handles; their side is ``_session.worker``.
"""

import collections
import json
import logging
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection

from .._common import log
from .._wire.channel import ShmChannel, SocketChannel, shm_channel_names
from .._wire.protocol import Exit, wire
from ..exceptions import WorkerError
from . import template

__all__ = ["WorkerHandle", "spawn_processes", "connect_mpi_ranks", "stop", "pytensor_flags",
           "SYNCED_FLAGS"]

READY_TIMEOUT = 300.0  # seconds for a worker to start (imports numpy, posix_ipc)
EXIT_TIMEOUT = 5.0
START_ENV = "SYNKHRONOS_WORKER_START"  # "template" (CPU workers forked by one; the default) or "spawn"

logger = logging.getLogger(__name__)

# PyTensor settings that decide how functions compile; workers follow the master's.
SYNCED_FLAGS = ("floatX", "mode", "linker", "optimizer", "optimizer_excluding",
                "optimizer_including", "optimizer_requiring", "allow_gc", "cast_policy")
_STARTUP_FLAGS = SYNCED_FLAGS + ("base_compiledir", "compiledir")


def pytensor_flags(names, changed_only):
    """The master's values of PyTensor flags ``names`` (only those differing from
    PyTensor's defaults if ``changed_only``)."""
    if "pytensor" not in sys.modules:
        return {}
    import pytensor

    flags = {}
    for name in names:
        param = pytensor.config._config_var_dict.get(name)
        if param is None:
            continue
        value = getattr(pytensor.config, name)
        if not isinstance(value, (str, bool, int, float)):
            # A Mode object: PyTensor sets one as ``config.mode``, for the whole
            # process, while it rewrites a graph; another thread's compile then
            # shows it here.  It is no flag a worker can read: left out.
            continue
        if not changed_only or value != param.default:
            flags[name] = str(value)
    return flags


class WorkerHandle:
    """Master's handle on one worker.

    Parameters
    ----------
    rank : int
    process : subprocess.Popen or None
        None for a rank that MPI launched (the launcher owns its process).
    channel : SocketChannel or ShmChannel
        The command channel (see ``_wire.channel``).
    where : str
        Where it runs, for messages (``"host node3"``).
    """

    def __init__(self, rank, process, channel, where="this host"):
        self.rank = rank
        self.process = process
        self.where = where
        self.channel = channel
        self.pending_drops = collections.deque()  # segments of collected Data, dropped with the next command
        self.owed = collections.deque()  # labels of posted commands whose replies are unread
        self.asked = None  # label of the round trip's command while its reply is unread
        self.since = 0.0  # when the master began waiting for its oldest unread reply

    @property
    def busy(self):
        """Whether a reply is still to come."""
        return bool(self.owed) or self.asked is not None


def connect_mpi_ranks(rt):
    """The handles of the other ranks of an MPI launch, once each has connected
    and said it is ready (``rt``: the runtime being started)."""
    from . import mpi

    t0 = time.monotonic()
    config = dict(token=rt.token, n_parallel=rt.n_parallel, master_rank=rt.master_rank,
                  device=rt.device.name, precision=rt.device.precision,
                  profile=bool(rt.profile_workers), profile_dir=tempfile.gettempdir(),
                  spin=rt.spin, log_level=log.worker_level(),
                  threads=getattr(rt.device, "thread_choice", None))
    conns = mpi.connect_workers(rt.cluster, config)
    workers = {rank: WorkerHandle(rank, None, SocketChannel(conn, rt.spin), rt.cluster.where(rank))
               for rank, conn in sorted(conns.items())}
    rt.dispatcher.workers.update(workers)  # closed with the session, should one fail to start
    deadline = time.monotonic() + READY_TIMEOUT
    for w in workers.values():
        _await_ready(w, deadline)
    logger.debug("%d MPI ranks on %d hosts connected after %.2f s", rt.n_parallel,
                 len(rt.cluster.host_names), time.monotonic() - t0)
    return workers


def spawn_processes(rt):
    """Start one worker process per worker rank of ``rt`` and wait until each is
    ready; returns ``(tmpdir, {rank: WorkerHandle})``, ``tmpdir`` being the
    workers' private temporary directory (None without workers)."""
    tmpdir = _make_private_tmpdir(rt)
    rt.dispatcher.tmpdir = tmpdir  # for cleanup, should a worker fail to start
    settings = _shared_worker_settings(rt, tmpdir)
    t0 = time.monotonic()
    workers = {}
    for rank in rt.worker_ranks:
        workers[rank] = rt.dispatcher.workers[rank] = _start_worker(rt, rank, settings)
    _await_all_ready(workers, t0)
    return tmpdir, workers


def _make_private_tmpdir(rt):
    """The workers' private temporary directory, or None without workers."""
    if not rt.worker_ranks:
        return None
    # The workers' temporary files (PyTensor writes the source of every
    # function it generates there) go to a private directory that close()
    # removes; mode 0700, so no other user can read or plant files in it.
    return tempfile.mkdtemp(prefix="synkhronos_%d_" % os.getpid())


def _shared_worker_settings(rt, tmpdir):
    """What every spawned worker is told alike: ``(config, pytensor_flags)``,
    ``config`` lacking only the worker's rank, socket and channel."""
    pkg_parent = str(pathlib.Path(__file__).resolve().parents[2])  # holds synkhronos/
    config = dict(
        token=rt.token, n_parallel=rt.n_parallel,
        master_rank=rt.master_rank, device=rt.device.name,
        profile=bool(rt.profile_workers), profile_dir=tempfile.gettempdir(),
        tmpdir=tmpdir, sys_path=[pkg_parent] + [p for p in sys.path if p], spin=rt.spin,
        log_level=log.worker_level(),
        thread_share=getattr(rt.device, "threads", None),
        threads=getattr(rt.device, "thread_choice", None),
    )
    return config, pytensor_flags(_STARTUP_FLAGS, changed_only=True)


def _start_worker(rt, rank, settings):
    """Spawn worker ``rank`` with its end of a fresh socket pair and shared-memory
    channel; returns its handle (not yet ready)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    names = shm_channel_names(rt.token, rank)
    try:
        channel = ShmChannel(Connection(ours.detach()), rt.spin, names, master=True)
    except BaseException:
        theirs.close()
        raise
    env = _worker_env(rt, rank, theirs.fileno(), names, settings)
    try:
        proc = _forked(rt, env, theirs.fileno(), settings) or subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP], env=env, pass_fds=(theirs.fileno(),), close_fds=True)
    except BaseException:
        channel.unlink()
        channel.close()
        raise
    finally:
        theirs.close()
    logger.debug("worker rank %d started (pid %d)", rank, proc.pid)
    return WorkerHandle(rank, proc, channel)


def _forked(rt, env, fd, settings):
    """Worker process forked by a template (``_session.template``), or None
    where it is to be spawned: on GPUs (each rank's environment names its own
    GPU), or where ``SYNKHRONOS_WORKER_START`` says ``spawn``."""
    how = os.environ.get(START_ENV, "template")
    if how not in ("template", "spawn"):
        raise ValueError("%s=%r: expected 'template' or 'spawn'" % (START_ENV, how))
    if how == "spawn" or rt.device.name != "cpu" or not hasattr(socket, "send_fds"):
        return None
    return template.start_worker(env, fd, settings[0]["sys_path"])


# What a spawned worker runs: it finds the package on the master's sys.path.
_BOOTSTRAP = ("import json, os, sys; sys.path[:0] = json.loads(os.environ['SYNK_WORKER'])"
              "['sys_path']; from synkhronos._session.worker import main; main()")


def _worker_env(rt, rank, fd, channel_names, settings):
    """The environment of worker ``rank``: the master's, the device's settings for
    the rank, and its configuration in ``SYNK_WORKER``."""
    config, flags = settings
    env = dict(os.environ)
    env.update(rt.device.worker_env(rank, rt.n_parallel))
    env["TMPDIR"] = config["tmpdir"]
    env["SYNK_WORKER"] = json.dumps(dict(config, rank=rank, fd=fd, channel=channel_names))
    if flags:
        extra = ",".join("%s=%s" % kv for kv in flags.items())
        env["PYTENSOR_FLAGS"] = ",".join(f for f in (env.get("PYTENSOR_FLAGS"), extra) if f)
    return env


def _await_all_ready(workers, t0):
    """Wait until every spawned worker says it is ready, unlinking each one's
    shared-memory names once it has opened them (or never will)."""
    deadline = time.monotonic() + READY_TIMEOUT
    for w in workers.values():
        try:
            _await_ready(w, deadline)
        finally:
            w.channel.unlink()  # the worker has opened it (or never will)
        logger.debug("worker rank %d ready after %.2f s", w.rank, time.monotonic() - t0)


def _await_ready(w, deadline):
    """Wait for worker ``w``'s first message, which comes on the socket."""
    conn = w.channel.conn
    while True:
        if conn.poll(0.05):
            try:
                okay, result = conn.recv()
            except (EOFError, OSError):
                break
            if okay:
                return
            exc_type, message, tb = result
            raise WorkerError(w.rank, exc_type, "failed to start on %s: %s" % (w.where, message), tb)
        if (w.process is not None and w.process.poll() is not None) or time.monotonic() > deadline:
            break
    code = None if w.process is None else w.process.poll()
    raise RuntimeError(
        "Synkhronos worker rank %d (%s) failed to start (exit code %s); see its output above"
        % (w.rank, w.where, code)
    )


def stop(workers, failed, meanwhile=None):
    """Tell ``workers`` (rank -> handle) to exit, run ``meanwhile()`` and wait for
    the processes we spawned.  ``failed``: the session broke, so a spawned worker
    still busy with a command is killed at once; a busy rank of an MPI launch ends
    when it sees its connection close (the launcher owns its process).

    ``meanwhile`` is the master's share of leaving: NCCL's communicator destroy
    waits for every rank's, so the master's must run while the workers leave, not
    after (a worker then waited in its own until ``EXIT_TIMEOUT`` killed it)."""
    for w in workers.values():
        if failed and w.busy and w.process is not None:
            w.process.kill()
            continue
        try:
            w.channel.send(wire(Exit(failed)))
        except OSError:
            pass
    if meanwhile is not None:
        meanwhile()
    deadline = time.monotonic() + EXIT_TIMEOUT
    for w in workers.values():
        if w.process is not None:
            try:
                w.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait()
        w.channel.close()
    template.warm_all()
