"""The session: one object, created by ``fork()`` and cleared by ``close()``,
that holds all runtime state: the workers and the command engine
(``_session.dispatch``), the registry of functions, shared variables and Data
(``_session.registry``), the per-host Data copies of an MPI launch (``_session.host_copies``), the
device, and the shared memory.  This module starts, distributes and closes it.

Only the process that called ``fork()`` (the owner) may drive the session.  A
child it forks (``os.fork``, ``multiprocessing``'s fork, PyMC's chains) inherits
a copy of the session marked ``foreign``: every call that would talk to the
workers or change shared memory raises ``RuntimeError`` naming that rule, and
nothing the child does, its exit included, reaches the owner's workers or
segments.  ``close()`` in the child only lets go of its copy (``fork()`` may
then start a session of the child's own).

Threads: every public call holds the session's lock (``Runtime.lock``, see
``locked``) from start to end, so calls from the threads of the owner run one at
a time, each with its own inputs and results.
"""

import contextlib
import functools
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time

from .._common import log
from .._common.env import spin_seconds
from .._common.reduce import ChunkPool
from .._common.waiting import WorkerSpin, cores_crowded
from .._devices.cpu import usable_cores
from .._graph.function_core import reseed_generators, uses_jax
from .._graph.precompile import compile_shares, graph_size, is_numba, precompile
from .._wire import shared_memory
from .._wire.exchange_buffer import ExchangeBuffer
from .._wire.pickling import dumps_cores, sendable
from .._wire.protocol import CommInit, Distribute
from . import launch
from .child_service import Service
from .dispatch import Dispatcher
from .host_copies import HostPublisher
from .registry import Registry

__all__ = ["Runtime", "current", "require", "start", "shutdown", "action", "locked"]

_runtime = None

logger = logging.getLogger(__name__)


def current():
    """The live session, or None."""
    return _runtime


def require(distributed=None):
    """The live session; raise RuntimeError if it is not in the needed state.

    Parameters
    ----------
    distributed : bool or None
        True: ``distribute()`` must have run; None: either.
    """
    rt = _runtime
    if rt is None:
        hint = ""
        if multiprocessing.parent_process() is not None:
            hint = (" (this is a child process, pid %d: a session belongs to the process that called "
                    "fork(), and its functions and collectives run only there)" % os.getpid())
        raise RuntimeError("Synkhronos is not forked: call synkhronos.fork() first" + hint)
    rt.check_owner()
    if distributed is True and not rt.distributed:
        raise RuntimeError("Synkhronos functions are not distributed: call synkhronos.distribute() first")
    return rt


def _hold():
    """``(session, held)``: the live session with its lock taken (``held``; the
    caller releases it), or, unheld, no session or a forked child's copy, whose
    calls raise the rule.  A session that closed and was replaced while this
    thread waited is not the one to hold."""
    while True:
        rt = _runtime
        if rt is None or rt.foreign:
            return rt, False
        rt.lock.acquire()
        if _runtime is rt:
            return rt, True
        rt.lock.release()


@contextlib.contextmanager
def locked():
    """Hold the live session's lock (none when there is no session, or in a
    forked child, where the calls inside raise the rule); yields the session."""
    rt, held = _hold()
    try:
        yield rt
    finally:
        if held:
            rt.lock.release()


def action(name):
    """Decorator for a public call: it runs holding the session's lock (see
    ``locked``), and the commands it sends are described as ``name`` (in stall
    reports and errors of posted commands)."""

    def decorate(fn):
        @functools.wraps(fn)
        def named(*args, **kwargs):
            # (``_hold`` rather than ``locked()``: a generator per collective costs microseconds)
            rt, held = _hold()
            try:
                if not held or rt.dispatcher.action is not None:
                    return fn(*args, **kwargs)
                rt.dispatcher.action = name
                try:
                    return fn(*args, **kwargs)
                finally:
                    rt.dispatcher.action = None
            finally:
                if held:
                    rt.lock.release()

        return named

    return decorate


def start(n_parallel, master_rank, device, profile_workers, timeout=None, cluster=None):
    global _runtime
    rt = Runtime(n_parallel, master_rank, device, profile_workers, timeout, cluster)
    _runtime = rt
    try:
        rt.spawn()
    except BaseException:
        shutdown()
        raise
    return rt


def shutdown():
    """Close the live session, if any (idempotent).  A call under way in another
    thread finishes first, unless it is still running after the session's
    timeout: then the session is closed as failed under it."""
    global _runtime
    rt = _runtime
    if rt is None:
        return
    if rt.foreign:
        _runtime = None
        rt.close()
        return
    held = rt.lock.acquire(timeout=-1 if rt.timeout is None else rt.timeout + 10)
    try:
        if _runtime is rt:
            _runtime = None
        rt.close(failed=not held)
    finally:
        if held:
            rt.lock.release()


def _after_fork_in_child():
    """In a child that ``os.fork()`` made: the inherited session is not this
    process's to drive (see the module docstring)."""
    if _runtime is not None:
        _runtime.foreign = True
        _runtime.lock = threading.RLock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def _sigint_deferred():
    """Let a Ctrl-C that arrives inside the block raise only after it, so that
    cleanup is not cut short (only the main thread can handle signals)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


class Runtime:
    """All state of a forked Synkhronos session (see module docstring)."""

    def __init__(self, n_parallel, master_rank, device, profile_workers, timeout=None, cluster=None):
        self.n_parallel = n_parallel
        self.cluster = cluster  # the ranks of an MPI launch (synkhronos._session.mpi.Cluster), or None
        self.master_rank = master_rank
        # Every call sends to these: a tuple made once, not a list per call.
        self.worker_ranks = tuple(r for r in range(n_parallel) if r != master_rank)
        self.device = device
        self.profile_workers = profile_workers
        self.spin = spin_seconds(device.spin_s)
        self.token = shared_memory.new_token()
        self.exchange = ExchangeBuffer(self.token, master_rank)
        self.cache = shared_memory.SegmentCache()
        self.dispatcher = Dispatcher(self._check_open, self.fail, timeout)
        self.registry = Registry()
        self.publisher = HostPublisher(self.dispatcher, cluster)
        self.distributed = False
        self.closed = False
        self.failed = False  # closed after a failure (see ``close``)
        self.owner = os.getpid()  # the process that drives the session
        self.foreign = False  # True in a child forked from the owner (see the module docstring)
        self.lock = threading.RLock()  # held by every public call (see ``locked``)
        # evaluations for child processes (see ``_session.child_service``)
        ranks_here = n_parallel if cluster is None else cluster.ranks_on_my_node(n_parallel)
        self.service = Service(ranks_here)
        # Fixed where the user set it (``spin_seconds(None)``: None when unset or blank).
        self.dispatcher.spin = WorkerSpin(self.spin, fixed=spin_seconds(None) is not None,
                                          crowded=lambda: cores_crowded(ranks_here + self.service.children(),
                                                                        usable_cores()))
        self.reduce_pool = ChunkPool()  # the master's threads for reducing large outputs

    # ------------------------------------------------------------- queries
    @property
    def workers(self):
        """rank -> ``launch.WorkerHandle``."""
        return self.dispatcher.workers

    @property
    def tmpdir(self):
        """The workers' private temporary directory (None without workers)."""
        return self.dispatcher.tmpdir

    @property
    def timeout(self):
        return self.dispatcher.timeout

    def remote(self, rank):
        """Whether worker ``rank`` runs on another host (MPI launch)."""
        return self.cluster is not None and self.publisher.remote(rank)

    def local_workers(self):
        """The worker ranks that map this host's memory."""
        return [r for r in self.worker_ranks if not self.remote(r)]

    # ---------------------------------------------------------------- rule
    def _check_open(self):
        self.check_owner()
        if self.closed:
            raise RuntimeError("Synkhronos is closed: call synkhronos.fork() to start again")

    def check_owner(self):
        """Raise RuntimeError in a process other than the session's owner (see
        the module docstring), naming the rule."""
        if not self.foreign:
            return
        raise RuntimeError(
            "this process (pid %d) was forked from pid %d, which runs the Synkhronos session: only the "
            "process that called synkhronos.fork() may call its functions and collectives or change its "
            "Data. The session goes on in pid %d. Here, call plain PyTensor functions "
            "(Function.as_pytensor() runs one in this process), or call synkhronos.close() to leave "
            "the session and synkhronos.fork() to start one of this process's own."
            % (os.getpid(), self.owner, self.owner))

    # ----------------------------------------------------------- lifecycle
    def spawn(self):
        if self.cluster is not None:
            self.dispatcher.workers.update(launch.connect_mpi_ranks(self))
        else:
            self.dispatcher.tmpdir, workers = launch.spawn_processes(self)
            self.dispatcher.workers.update(workers)
        if self.device.has_collectives:
            t0 = time.monotonic()
            uid = self.device.new_uid()
            n, m = self.n_parallel, self.master_rank
            self.dispatcher.request(CommInit(uid), local=lambda: self.device.init_comm(n, m, uid))
            # The hook watches the workers while the master waits on its device.  With
            # none (one GPU) there is nothing to watch: it blocks on the device, one
            # wake-up instead of polls and sleeps (docs page "PyMC", Chains, measured it).
            self.device.wait_hook = self.dispatcher.check_posted if self.dispatcher.workers else None
            logger.debug("collective communicator of %d ranks ready after %.2f s", self.n_parallel,
                         time.monotonic() - t0)

    def distribute(self):
        """Send the workers the functions and shared variables registered since
        the last distribution (all of them the first time)."""
        t0 = time.monotonic()
        functions, shareds = self.registry.undistributed()
        known = self.registry.shareds[:self.registry.n_distributed_shareds]
        cores, refused = [f._core for f in functions], {}
        try:
            payload = dumps_cores((cores, shareds), known)
        except Exception:  # pickle raises TypeError, AttributeError, PicklingError, ...
            # The rest go; each function that cannot is refused alone (a None in its place).
            cores, refused = sendable(functions, known)
            payload = dumps_cores((cores, shareds), known)
        logger.debug("distribute: %d functions and %d shared variables pickled (%.1f MB) in %.2f s",
                     len(cores), len(shareds), len(payload) / 1e6, time.monotonic() - t0)

        jit = [i for i, c in enumerate(cores) if c is not None and is_numba(c.plain)]
        shares = compile_shares({i: graph_size(cores[i].plain) for i in jit}, self._hosts())

        def local():  # (the master's JAX pool started with its first JAX function)
            reseed_generators(shareds, cores, self.master_rank, known)
            self.device.place_shareds(shareds)
            for i in shares.get(self.master_rank, ()):
                precompile(cores[i].plain)

        notice = self._compile_notice([cores[i].plain for i in jit])
        try:
            flags = launch.pytensor_flags(launch.SYNCED_FLAGS, changed_only=False)
            self.dispatcher.request(Distribute(flags, payload, shares, uses_jax([c for c in cores if c])),
                                    local=local)
        except Exception:
            if notice is not None:
                notice.close(failed=True)
            # Some ranks may hold the functions and others not: no call could
            # be trusted, and distribute() cannot simply run again.
            self.fail()
            raise
        if notice is not None:
            notice.close()
        logger.debug("distribute: every rank loaded the functions %.2f s after pickling began",
                     time.monotonic() - t0)
        if self.device.has_collectives:
            self.device.numpy_interface(shareds, on_set=self.registry.forget_shape,
                                        before_get=self._settle_if_open)
        self.registry.mark_distributed(refused)
        self.distributed = True
        if refused:
            raise next(iter(refused.values())) if len(refused) == 1 else TypeError(
                "\n".join(str(e) for e in refused.values()))

    def _compile_notice(self, jit):
        """A started notice for the Numba functions ``jit`` that ``distribute()``
        compiles (see ``_graph.precompile``), or None when there are none."""
        if not jit:
            return None
        label = "%d function%s" % (len(jit), "" if len(jit) == 1 else "s")
        return log.compile_notice(label, jit[0], self.n_parallel, when="for distribute()")

    def _hosts(self):
        """The session's ranks by host (ranks of one host share its compile cache)."""
        ranks = range(self.n_parallel)
        if self.cluster is None:
            return [list(ranks)]
        nodes = self.cluster.nodes[:self.n_parallel]
        return [[r for r in ranks if nodes[r] == node] for node in dict.fromkeys(nodes)]

    def _settle_if_open(self):
        with self.lock:
            if not self.closed:
                self.dispatcher.settle()

    def fail(self):
        """Close after a failure that left the ranks out of step (see ``close``)."""
        global _runtime
        if _runtime is self:
            _runtime = None
        self.close(failed=True)

    def close(self, failed=False):
        """Stop the workers and release everything (idempotent).  ``failed``: the
        session broke (a worker died, stalled or failed inside a collective, or
        Ctrl-C came while the master waited): workers still busy with a command
        are killed at once, and device communicators are aborted instead of shut
        down in order."""
        if self.closed:
            return
        self.closed = True
        self.failed = failed
        if self.foreign:  # the workers, channels and segments are the owner's: let go of them only
            return
        t0 = time.monotonic()
        with _sigint_deferred():
            self.service.close()
            self.reduce_pool.close()
            launch.stop(self.workers, failed, meanwhile=lambda: self.device.close(abort=failed))
            for data in self.registry.datas:
                data._release()
            self.registry.clear_datas()
            self.exchange.close()
            self.cache.clear()
            shared_memory.unlink_session(self.token)
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
            if self.cluster is not None:  # a rank on this host that crashed left its own
                from . import mpi

                mpi.remove_dead_ranks_tmpdirs(self.token, tempfile.gettempdir())
        logger.debug("closed%s in %.2f s", " after a failure" if failed else "", time.monotonic() - t0)
