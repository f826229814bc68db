"""The master's runtime: one object, created by ``fork()`` and cleared by
``close()``, that owns the workers (started and stopped by ``_workers``), the
command channels, the shared memory and the registry of functions, shared
variables and Data objects.

Only the process that called ``fork()`` (the owner) may drive the session.  A
child it forks (``os.fork``, ``multiprocessing``'s fork, PyMC's chains) inherits
a copy of the runtime marked ``foreign``: every call that would talk to the
workers or change shared memory raises ``RuntimeError`` naming that rule, and
nothing the child does, its exit included, reaches the owner's workers or
segments.  ``close()`` in the child only lets go of its copy (``fork()`` may
then start a session of the child's own).
"""

import atexit
import contextlib
import functools
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref

from . import _shmem, _stacks, _workers
from ._core import dumps_cores, reseed_generators
from ._devices import cpu
from ._exchange import ExchangeBuffer
from ._protocol import Command, spin_seconds
from .exceptions import StallError, WorkerError

__all__ = ["Runtime", "current", "require", "start", "shutdown", "default_device", "action"]

_MAX_OWED = 64  # posted commands a worker may be behind before post() waits for a reply
_DEATH_CHECK_S = 1.0  # while waiting for one worker, how often to check that none died

_runtime = None

logger = logging.getLogger(__name__)


def current():
    """The live runtime, or None."""
    return _runtime


def require(distributed=None):
    """The live runtime; raise RuntimeError if it is not in the needed state.

    Parameters
    ----------
    distributed : bool or None
        True: ``distribute()`` must have run; False: it must not have; None: either.
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
    if distributed is False and rt.distributed:
        raise RuntimeError(
            "Synkhronos is already distributed: build every function before calling "
            "synkhronos.distribute() (it can be called once per fork())"
        )
    return rt


def action(name):
    """Decorator for a public call: while it runs, commands it sends are
    described as ``name`` (in stall reports and errors of posted commands)."""

    def decorate(fn):
        @functools.wraps(fn)
        def named(*args, **kwargs):
            rt = _runtime
            if rt is None or rt.action is not None:
                return fn(*args, **kwargs)
            rt.action = name
            try:
                return fn(*args, **kwargs)
            finally:
                rt.action = None

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
    """Close the live runtime, if any (idempotent)."""
    global _runtime
    rt, _runtime = _runtime, None
    if rt is not None:
        rt.close()


atexit.register(shutdown)


def _after_fork_in_child():
    """In a child that ``os.fork()`` made: the inherited session is not this
    process's to drive (see the module docstring)."""
    if _runtime is not None:
        _runtime.foreign = True


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


class _InterruptCloses:
    """A context in which Ctrl-C closes the session ``rt``: while the master talks
    to the workers, replies may still be in flight, so the channels cannot be
    trusted any more.  A class made once, not a generator per use: every call and
    collective enters it."""

    __slots__ = ("rt",)

    def __init__(self, rt):
        self.rt = rt

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is KeyboardInterrupt:
            self.rt._fail_closed()
        return False


class Runtime:
    """All state of a forked Synkhronos session (see module docstring)."""

    def __init__(self, n_parallel, master_rank, device, profile_workers, timeout=None, cluster=None):
        self.n_parallel = n_parallel
        self.cluster = cluster  # the ranks of an MPI launch (synkhronos._mpi.Cluster), or None
        self.master_rank = master_rank
        self.device = device
        self.profile_workers = profile_workers
        self.timeout = timeout  # seconds a worker may take to answer (None: no limit)
        self.action = None  # the public call under way (see ``action``)
        self.tmpdir = None  # the workers' private temporary directory
        self.spin = spin_seconds()
        self._interrupt_closes = _InterruptCloses(self)
        self.token = _shmem.new_token()
        self.exchange = ExchangeBuffer(self.token, master_rank)
        self.cache = _shmem.SegmentCache()
        self.workers = {}
        self.functions = []
        self.shareds = []
        self._shared_ids = {}  # id(var) -> index in shareds (shareds keeps each var alive)
        self.datas = weakref.WeakValueDictionary()  # ID -> live Data
        self.next_data_id = 0
        self.distributed = False
        self.closed = False
        self.owner = os.getpid()  # the process that drives the session
        self.foreign = False  # True in a child forked from the owner (see the module docstring)
        # Per-rank shapes of shared variables, by ID, as far as the master knows them
        # (for device collectives, which need every rank's sizes before they start).
        self.shapes = {}

    @property
    def worker_ranks(self):
        return [r for r in range(self.n_parallel) if r != self.master_rank]

    # ----------------------------------------------------------------- processes
    def spawn(self):
        if self.cluster is not None:
            self.workers = _workers.connect_mpi_ranks(self)
        else:
            self.tmpdir, self.workers = _workers.spawn_processes(self)
        if self.device.nccl:
            t0 = time.monotonic()
            uid = self.device.new_uid()
            m = self.master_rank
            self.request(Command.NCCL_INIT, uid,
                         local=lambda: self.device.init_comm(self.n_parallel, m, uid))
            self.device.wait_hook = self.check_posted
            logger.debug("collective communicator of %d ranks ready after %.2f s", self.n_parallel,
                         time.monotonic() - t0)


    # ------------------------------------------------------------------ requests
    def request(self, cmd, payload=None, ranks=None, local=None):
        """One round trip: send ``cmd`` to workers, run ``local()`` here, collect.

        Replies still owed for earlier ``post()`` commands are read first, so a
        failure there is raised here, before anything new runs.

        Parameters
        ----------
        cmd : Command
        payload : object or dict
            One payload for all, or a dict rank -> payload (``ranks`` defaults
            to its keys then).
        ranks : list of int, optional
            Worker ranks to ask (default: all workers).
        local : callable, optional
            The master's own share, run while the workers work.

        Returns
        -------
        (local_result, replies)
            ``replies`` maps rank -> result.

        Raises
        ------
        WorkerError
            If a worker raised (the lowest such rank is reported) or died.
        StallError
            If a worker did not answer within ``timeout`` seconds.
        """
        self._check_open()
        with self._interrupt_closes:
            self._settle()
            return self._round_trip(cmd, payload, ranks, local)

    def post(self, cmd, payload=None, ranks=None, local=None, binding=True):
        """Send ``cmd`` to workers and run ``local()`` here without waiting for
        the workers' replies: they are read by the next ``request()`` or
        ``settle()``, which raise any failure then.  For device work that the
        ranks only queue (NCCL collectives, function calls without results): the
        device orders it, so no barrier is needed.  Arguments as for ``request``;
        returns ``local()``'s result.

        If ``local()`` raises and the command is ``binding`` (a collective), the
        session is closed: the workers are already committed to a collective
        that the master will not join.  Otherwise the error is raised as it is.
        """
        self._check_open()
        with self._interrupt_closes:
            ranks = self._ranks_for(payload, ranks)
            for r in ranks:
                w = self.workers[r]
                if len(w.owed) >= _MAX_OWED:
                    self._read_owed(w)
            _, dead = self._send(cmd, payload, ranks, posted=True)
            if dead is not None:
                self._died(dead)
            if local is None:
                return None
            if not binding:
                return local()
            try:
                return local()
            except Exception:
                self._fail_closed()
                raise

    def settle(self):
        """Read every reply still owed for posted commands; raise the first failure."""
        self._check_open()
        with self._interrupt_closes:
            self._settle()

    def check_posted(self):
        """Read owed replies that have already arrived, without waiting; raise a
        failure at once (closing the session, whose devices may now be stuck in
        a collective), and a ``StallError`` if a worker is past its timeout.
        For the master to call while it waits on its device."""
        for w in self.workers.values():
            while w.owed and w.channel.ready():
                try:
                    self._read_owed(w)
                except WorkerError:
                    self._fail_closed()
                    raise
        self._check_alive()
        if self.timeout is not None:
            now = time.monotonic()
            if any(w.busy and now - w.since >= self.timeout for w in self.workers.values()):
                self._stall()

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

    def _settle(self):
        """Read every owed reply; then raise the failure of the lowest rank, if any."""
        failure = None
        for w in self.workers.values():
            while w.owed:
                try:
                    self._read_owed(w)
                except WorkerError as exc:
                    if exc.exc_type in ("WorkerDied", "Stall"):
                        raise
                    if failure is None or exc.rank < failure.rank:
                        failure = exc
        if failure is not None:
            raise failure

    def _read_owed(self, w):
        """Read worker ``w``'s oldest owed reply; raise WorkerError if it failed."""
        try:
            (okay, result), label = self._reply(w)
        except (EOFError, OSError):
            self._died(w.rank)
        if not okay:
            exc_type, message, tb = result
            raise WorkerError(w.rank, exc_type, "%s (during an earlier %s, which returned before "
                              "the workers finished it)" % (message, label), tb)

    def _reply(self, w):
        """Worker ``w``'s next reply and the label of its command; raises
        ``StallError`` once ``w`` is past the timeout, and EOFError or OSError
        when it died."""
        # Waits in slices, checking meanwhile that no other rank died: a rank may be
        # stuck in a collective with a dead one and never answer.
        while True:
            left = None if self.timeout is None else w.since + self.timeout - time.monotonic()
            if w.channel.wait(_DEATH_CHECK_S if left is None else min(left, _DEATH_CHECK_S)):
                break
            self._check_alive()
            if left is not None and left <= _DEATH_CHECK_S:
                self._stall()
        msg = w.channel.recv()
        if w.owed:  # replies come in the order of the commands: posted ones first
            label = w.owed.popleft()
        else:
            label, w.asked = w.asked, None
        if w.busy:
            w.since = time.monotonic()
        return msg, label

    def _stall(self):
        """Close the session and raise StallError for every worker that is past
        the timeout without a reply (none: return, a reply has just come)."""
        now = time.monotonic()
        stuck = {r: w for r, w in self.workers.items()
                 if w.busy and now - w.since >= self.timeout and not w.channel.ready()}
        if not stuck:
            return
        labels = {r: (w.owed[0] if w.owed else w.asked) for r, w in stuck.items()}
        waited = {r: now - w.since for r, w in stuck.items()}
        stacks = _stacks.take({r: w.process.pid for r, w in stuck.items() if w.process is not None},
                              self.tmpdir)
        self._fail_closed()
        raise StallError(stuck, labels, self.timeout, stacks, waited)

    def _ranks_for(self, payload, ranks):
        """The worker ranks a command goes to: ``ranks``, else the keys of a
        per-rank ``payload``, else every worker."""
        if ranks is not None:
            return ranks
        return sorted(payload) if isinstance(payload, dict) else self.worker_ranks

    def _send(self, cmd, payload, ranks, posted=False):
        per_rank = isinstance(payload, dict)
        label = self.action or cmd.name.lower()
        now = time.monotonic()
        sent = []
        dead = None
        for r in ranks:
            w = self.workers[r]
            drops, w.pending_drops = w.pending_drops, []
            try:
                w.channel.send((int(cmd), payload[r] if per_rank else payload, drops))
            except OSError:
                dead = r if dead is None else min(dead, r)
                continue
            sent.append(r)
            if not w.busy:
                w.since = now
            if posted:
                w.owed.append(label)
            else:
                w.asked = label
        return sent, dead

    def _check_alive(self):
        """Raise WorkerError for the lowest rank whose process has died."""
        for w in self.workers.values():
            if w.channel.hung_up() and not w.channel.ready():
                self._died(w.rank)

    def _died(self, rank):
        w = self.workers[rank]
        code = stack = None
        if w.process is not None:
            try:  # its channel closed, so it is exiting: let it finish, for the exit code
                code = w.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            stack = _stacks.crash_stack(self.tmpdir, rank)
        self._fail_closed()
        how = "" if w.process is None else " (exit code %s)" % code  # an MPI rank's is the launcher's
        raise WorkerError(rank, "WorkerDied", "worker process on %s exited unexpectedly%s; "
                          "Synkhronos has been closed" % (w.where, how), stack)

    def _round_trip(self, cmd, payload, ranks, local):
        sent, dead = self._send(cmd, payload, self._ranks_for(payload, ranks))
        local_result, local_exc = None, None
        if local is not None:
            try:
                local_result = local()
            except Exception as exc:  # re-raised once the workers have answered
                local_exc = exc
        replies, failures = {}, []
        for r in sent:
            try:
                (okay, result), _ = self._reply(self.workers[r])
            except (EOFError, OSError):
                dead = r if dead is None else min(dead, r)
                continue
            if okay:
                replies[r] = result
            else:
                failures.append((r, result))
        if dead is not None:
            self._died(dead)
        if local_exc is not None:
            raise local_exc
        if failures:
            rank, (exc_type, message, tb) = min(failures, key=lambda f: f[0])
            raise WorkerError(rank, exc_type, message, tb)
        return local_result, replies

    def _fail_closed(self):
        global _runtime
        if _runtime is self:
            _runtime = None
        self.close(failed=True)

    # ----------------------------------------------------------------- lifecycle
    def distribute(self):
        t0 = time.monotonic()
        cores = self.functions_cores()
        payload = dumps_cores((cores, self.shareds))
        logger.debug("distribute: %d functions and %d shared variables pickled (%.1f MB) in %.2f s",
                     len(cores), len(self.shareds), len(payload) / 1e6, time.monotonic() - t0)

        def local():
            reseed_generators(self.shareds, cores, self.master_rank)
            self.device.place_shareds(self.shareds)

        try:
            flags = _workers.pytensor_flags(_workers.SYNCED_FLAGS, changed_only=False)
            self.request(Command.DISTRIBUTE, (flags, payload), local=local)
        except Exception:
            # Some ranks may hold the functions and others not: no call could
            # be trusted, and distribute() cannot simply run again.
            self._fail_closed()
            raise
        logger.debug("distribute: every rank loaded the functions %.2f s after pickling began",
                     time.monotonic() - t0)
        if self.device.nccl:
            self.device.numpy_interface(self.shareds, on_set=self.forget_shape,
                                        before_get=self._settle_if_open)
        self.distributed = True

    def remote(self, rank):
        """Whether worker ``rank`` runs on another host (MPI launch): it cannot
        map this host's memory, so arrays travel to it inline."""
        return self.cluster is not None and self.cluster.remote(rank)

    def publish(self, datas):
        """Bring the other hosts' copies of ``datas`` (Data objects) up to date:
        those whose memory or values may have changed since they last travelled
        (a writable view handed out since, or still alive) go to every other
        host's leader rank over MPI (see ``_mpi``)."""
        if self.cluster is None:
            return
        leaders = self.cluster.remote_leaders()
        for d in datas:
            if not leaders or d._seg is None or (d._published == (d._seg.name, d._version)
                                                 and not d._exposed()):
                continue
            used = d._array.reshape(-1).view("u1")
            self.request(Command.HOST_DATA, (d._seg.name, d._seg.nbytes, used.size), ranks=leaders,
                         local=functools.partial(self.cluster.bcast_to_leaders, used, self.check_posted))
            d._published = (d._seg.name, d._version)

    def forget_segment(self, name):
        """A Data segment was released in the master without a round trip (the
        object was garbage-collected): workers unmap it with their next command."""
        for w in self.workers.values():
            w.pending_drops.append(name)

    def forget_shape(self, var):
        """``var``'s value was replaced in the master: its recorded shapes may be stale."""
        i = self.shared_id(var)
        if i is not None:
            self.shapes.pop(i, None)

    def _settle_if_open(self):
        if not self.closed:
            self.settle()

    def functions_cores(self):
        return [f._core for f in self.functions]

    def shared_id(self, var):
        """Index of ``var`` among the registered shared variables, or None.
        A dict, not a scan: every collective looks its variables up."""
        return self._shared_ids.get(id(var))

    def register_shareds(self, variables):
        for v in variables:
            if self.shared_id(v) is None:
                self._shared_ids[id(v)] = len(self.shareds)
                self.shareds.append(v)

    def close(self, failed=False):
        """Stop the workers and release everything (idempotent).  ``failed``: the
        session broke (a worker died, stalled or failed inside a collective, or
        Ctrl-C came while the master waited): workers still busy with a command
        are killed at once, and device communicators are aborted instead of shut
        down in order."""
        if self.closed:
            return
        self.closed = True
        if self.foreign:  # the workers, channels and segments are the owner's: let go of them only
            return
        t0 = time.monotonic()
        with _sigint_deferred():
            _workers.stop(self.workers, failed, self.cluster)
            for data in list(self.datas.values()):
                data._release()
            self.datas.clear()
            self.exchange.close()
            self.cache.clear()
            self.device.close(abort=failed)
            _shmem.unlink_session(self.token)
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
        logger.debug("closed%s in %.2f s", " after a failure" if failed else "", time.monotonic() - t0)


def default_device(use_gpu, precision="highest"):
    """The device layer for ``use_gpu`` (None: GPUs if present, else CPU), with
    float32 products at ``precision`` (see ``fork``)."""
    if use_gpu is False:
        return cpu.CpuDevice(precision)
    from ._devices import gpu

    stack = gpu.gpu_stack_available()
    ids = gpu.visible_gpus() if stack or use_gpu else []
    if stack and ids:
        return gpu.GpuDevice(ids, precision)
    if use_gpu is None:
        return cpu.CpuDevice(precision)
    why = "no GPU was found" if not ids else "JAX and CuPy are not installed (pip install synkhronos[gpu])"
    raise RuntimeError("use_gpu=True but %s; use synkhronos.fork(use_gpu=False) for CPU workers" % why)

