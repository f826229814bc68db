"""Worker process: waits for the master's commands and carries them out.

Started by the master as a fresh interpreter (not with ``multiprocessing``, so the
user's main script is never re-imported).  Its configuration arrives in the
``SYNK_WORKER`` environment variable; the command channel is an inherited socket.

A worker outlives nothing: it exits when the master closes the session, when the
command channel ends (the master died), and, checked by a watchdog thread, when
it is orphaned while busy with a command; then it removes the session's shared
memory and temporary directory itself.

What each command does is in ``_session.handlers``.  Faults can be injected
for tests (see ``_session.fault_injection``).
"""

import faulthandler
import functools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from .._common import log
from .._devices import select_device
from .._devices.cpu import limit_threads, thread_share, worker_jax_cores
from .._wire import shared_memory
from .._wire.channel import ShmChannel, SocketChannel
from .._wire.exchange_buffer import ExchangeBuffer
from .._wire.protocol import Command, failure, from_wire, ok
from . import stacks, template
from .fault_injection import FAULT_ENV, Faults
from .handlers import HANDLERS

_WATCH_S = 0.5  # how often a worker checks that its master is alive

__all__ = ["main"]

logger = logging.getLogger(__name__)


class _WorkerState:
    def __init__(self, config, cluster=None):
        self.rank = config["rank"]
        self.token = config["token"]
        self.n_parallel = config["n_parallel"]
        self.spin = config["spin"]
        self.master_rank = config["master_rank"]
        self.cluster = cluster
        remote = cluster is not None and cluster.remote(self.rank)
        self.device = select_device(config["device"] == "gpu", cluster=cluster, worker=True)
        if config["device"] != "gpu":
            self.device.jax_cores = worker_jax_cores(config, cluster)
        self.exchange = ExchangeBuffer(self.token, self.rank, inline=remote)
        self.cache = shared_memory.SegmentCache(host=cluster.host if remote else None, device=self.device)
        self.host_copies = {}  # slot -> Segment: this host's copies of Data (host leaders, MPI)
        self.cores = None
        self.shareds = None
        # Import PyTensor (and JAX) while the master is still building graphs.
        self._importer = threading.Thread(target=_import_libraries, args=(self.device.name,), daemon=True)
        self._importer.start()

    def shared(self, ID):
        if self.shareds is None:
            raise RuntimeError("functions have not been distributed to this worker")
        return self.shareds[ID]

    def drop(self, name):
        """Forget Data segment ``name``: its mapping, and this host's copy of it."""
        self.cache.drop(name)
        if self.cluster is not None and self.cluster.remote(self.rank):
            local = shared_memory.host_copy_name(name, self.cluster.host)
            seg = self.host_copies.pop(shared_memory.slot_of(local), None)
            if seg is not None:
                seg.unlink()
                seg.close()

    def close(self):
        self.device.close()
        self.exchange.close()
        self.cache.clear()
        for seg in self.host_copies.values():
            seg.unlink()
            seg.close()
        self.host_copies.clear()


def _import_libraries(device):
    """Import PyTensor, and on a CPU rank whose functions compile with JAX by
    default, JAX and PyTensor's JAX backend: most of a second that the first
    ``distribute()`` would otherwise wait for.  Importing starts no JAX backend:
    ``Device.start_jax_pool`` still chooses its platform and cores first.  (A GPU
    rank imports JAX as it joins the NCCL communicator.)"""
    try:
        import pytensor  # noqa: F401

        from .._devices.cpu import jax_by_default

        if device == "cpu" and jax_by_default():
            import pytensor.link.jax.dispatch  # noqa: F401
    except Exception:  # reported when DISTRIBUTE imports it again
        pass


def serve_commands(channel, state, faults):
    """Answer commands until EXIT; returns None if the master vanished, else
    EXIT's payload (whether the session failed)."""
    while True:
        try:
            cmd, fields, drops, *spin = channel.recv()
            payload = from_wire(cmd, fields)
            if spin:  # how long to poll for the command after this one (``WorkerSpin``)
                channel.spin = spin[0]
        except (EOFError, OSError):
            return None
        state.exchange.release()  # the master has read our last reply (see _wire.exchange_buffer)
        for name in drops:
            state.drop(name)
        if cmd == Command.EXIT:
            return bool(payload.failed)
        try:
            if faults:
                faults.before(Command(cmd))
            reply = ok(HANDLERS[cmd](state, payload))
        except Exception as exc:
            reply = failure(exc)
        try:
            channel.send(reply)
        except (EOFError, OSError):
            return None


def _remove_session(token, tmpdir, slot_prefix=""):
    """What the master would have removed: the session's segments (those whose
    slot starts with ``slot_prefix``) and the temporary directory."""
    shared_memory.unlink_session(token, slot_prefix)
    shutil.rmtree(tmpdir, ignore_errors=True)


def _remove_rank_session(token, tmpdir, slot_prefix=None):
    """What an MPI rank leaves behind: its own temporary directory, those of
    the session's ranks on its host that crashed, and, given ``slot_prefix``,
    the segments whose slot starts with it."""
    from . import mpi

    if slot_prefix is not None:
        shared_memory.unlink_session(token, slot_prefix)
    shutil.rmtree(tmpdir, ignore_errors=True)
    mpi.remove_dead_ranks_tmpdirs(token, os.path.dirname(tmpdir))


def _watch_master(master_pid, token, tmpdir):
    """Exit once the master is gone, even while a command keeps the main thread
    busy (it notices on its own only when it next reads the channel)."""
    while True:
        time.sleep(_WATCH_S)
        if os.getppid() != master_pid:
            _remove_session(token, tmpdir)
            os._exit(1)


def _watch_connection(channel, done, remove):
    """For ranks launched by MPI, whose parent is the launcher: exit once the
    master's end of the connection is closed (it died, or closed the session
    while this rank was stuck, say in a collective with a dead rank), unless
    the main thread is already leaving in order (``done`` set)."""
    while not channel.hung_up():
        time.sleep(_WATCH_S)
    if done.wait(2.0):
        return
    remove()
    os._exit(1)


def run_worker(config, conn, cluster=None, prepare=None):
    """Serve the master on ``conn`` until it closes the session; returns EXIT's
    payload (whether the session failed), or None if the master vanished.
    ``prepare()``, if given, sets this process up first (its failure, like any
    at start-up, is sent to the master, which is waiting for this rank)."""
    rank = config["rank"]
    log.set_level(config["log_level"])  # the master's, which may differ from SYNKHRONOS_LOG_LEVEL
    stack_file = stacks.enable(config["tmpdir"], rank)
    faults = Faults(os.environ.get(FAULT_ENV), rank)
    state, channel = _set_up(config, conn, cluster, prepare)
    done = threading.Event()
    if cluster is not None:
        _start_connection_watchdog(config, cluster, channel, done)
    profiler = _start_profiler(config)
    conn.send(ok(os.getpid()))
    logger.debug("worker rank %d (pid %d) ready", rank, os.getpid())
    ended = None
    try:
        ended = serve_commands(channel, state, faults)
        done.set()
    finally:
        _write_profile(profiler, config)
        _tear_down(config, cluster, state, channel, ended, stack_file)
    return ended


def _set_up(config, conn, cluster, prepare):
    """Prepare this process, and make the worker's state and its command channel;
    returns ``(state, channel)``."""
    try:
        if prepare is not None:
            prepare()
        state = _WorkerState(config, cluster)
        if config.get("channel"):  # spawned on the master's host: shared-memory rings
            channel = ShmChannel(conn, state.spin, config["channel"], master=False)
        else:
            channel = SocketChannel(conn, state.spin)
    except Exception as exc:  # say why to the master, which is waiting for this rank
        conn.send(failure(exc))
        raise
    return state, channel


def _start_connection_watchdog(config, cluster, channel, done):
    """Have an MPI rank exit, removing its own segments, once the master's end of
    ``channel`` closes (see ``_watch_connection``)."""
    rank, token, tmpdir = config["rank"], config["token"], config["tmpdir"]
    own = "h%d" % cluster.host if cluster.remote(rank) else "r%d" % rank
    threading.Thread(target=_watch_connection, daemon=True, name="synkhronos-watchdog",
                     args=(channel, done, lambda: _remove_rank_session(token, tmpdir, own))).start()


def _start_profiler(config):
    """A running ``cProfile.Profile`` if the master asked for profiles, else None."""
    if not config["profile"]:
        return None
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _write_profile(profiler, config):
    """Stop ``profiler`` (if any) and write its statistics to the profile directory."""
    if profiler is None:
        return
    profiler.disable()
    rank = config["rank"]
    name = "synkhronos_worker_%d_%d.prof" % (rank, os.getpid())
    path = os.path.join(config["profile_dir"], name)
    profiler.dump_stats(path)
    logger.info("Synkhronos worker rank %d profile written to %s", rank, path)


def _tear_down(config, cluster, state, channel, ended, stack_file):
    """Release the worker's state and channel, and remove what nobody else will;
    ``ended``: what ``serve_commands`` returned (None if the master vanished)."""
    state.close()
    _remove_leftovers(config["token"], config["tmpdir"], cluster, ended)
    channel.close()
    faulthandler.disable()
    stack_file.close()


def _remove_leftovers(token, tmpdir, cluster, ended):
    """Remove what the master will not: an MPI rank's temporary directory (its
    own), or, for a spawned worker whose master died, the whole session's."""
    if cluster is not None:
        _remove_rank_session(token, tmpdir)
    elif ended is None:
        # The master died without closing: nobody else will clean up.
        _remove_session(token, tmpdir)


def _exit_now(code=0):
    # Everything is released: skip the interpreter's teardown of every loaded
    # module (slow with PyTensor loaded: see the docs page "Benchmarks", *Design decisions*),
    # as multiprocessing's children do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(fd=None):
    """Entry point of a worker that ``fork()`` spawned on the master's host, or
    that a template forked (``fd``: its connection to the master there)."""
    # Ctrl-C reaches the whole process group; only the master handles it and
    # then closes the workers in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from multiprocessing.connection import Connection

    config = json.loads(os.environ.pop("SYNK_WORKER"))
    # The parent: the master, or the template, which ends with the master.
    threading.Thread(target=_watch_master, args=(os.getppid(), config["token"], config["tmpdir"]),
                     daemon=True, name="synkhronos-watchdog").start()
    run_worker(config, Connection(config["fd"] if fd is None else fd))
    _exit_now()


# What a template imports before it forks workers: what a CPU worker imports
# (``_import_libraries``; PyTensor's JAX backend imports JAX).
_TEMPLATE_PRELOAD = ("pytensor", "pytensor.link.jax.dispatch")


def serve_template():
    """Entry point of a template process (``_session.template``)."""
    template.serve(_TEMPLATE_PRELOAD, main)
    _exit_now()


def _use_node_gpu(precision, cluster):
    """See only the GPU at this rank's position among the ranks of its node."""
    device = select_device(True, precision)
    device.one_node = cluster.one_node(cluster.size)
    if cluster.node_index >= len(device.gpu_ids):
        raise RuntimeError("MPI rank %d is rank %d on node %s, which has only %d visible GPUs: launch at "
                           "most one rank per GPU on each node" % (cluster.rank, cluster.node_index,
                                                                   cluster.nodes[cluster.rank],
                                                                   len(device.gpu_ids)))
    device.setup_master(cluster.node_index)


def _share_node_threads(threads, cluster, n_parallel):
    """Take this rank's share of its host's cores for BLAS and OpenMP (as
    ``fork()`` gives the master and the workers it spawns)."""
    limit_threads(thread_share(cluster.ranks_on_my_node(n_parallel), threads))


def mpi_main(cluster):
    """Entry point of an MPI rank other than 0, inside ``fork()``: serve the
    master, then end the process (never returns).

    Parameters
    ----------
    cluster : synkhronos._session.mpi.Cluster
    """
    from . import mpi

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master closes the session on Ctrl-C
    config, conn = mpi.connect_master(cluster)
    failed = False
    if conn is not None:
        tmpdir = mpi.rank_tmpdir(config["token"])
        config = dict(config, rank=cluster.rank, tmpdir=tmpdir)
        os.environ["TMPDIR"] = tempfile.tempdir = tmpdir  # PyTensor's generated sources go there
        if config["device"] == "gpu":
            prepare = functools.partial(_use_node_gpu, config["precision"], cluster)
        else:
            prepare = functools.partial(_share_node_threads, config["threads"], cluster, config["n_parallel"])
        ended = run_worker(config, conn, cluster, prepare)
        failed = ended is None or ended
    if not failed:
        mpi.finalize()  # MPI's finalize waits for the master's, at its exit
    _exit_now()
