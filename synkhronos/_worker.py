"""Worker process: waits for the master's commands and carries them out.

Started by the master as a fresh interpreter (not with ``multiprocessing``, so the
user's main script is never re-imported).  Its configuration arrives in the
``SYNK_WORKER`` environment variable; the command channel is an inherited socket.

A worker outlives nothing: it exits when the master closes the session, when the
command channel ends (the master died), and, checked by a watchdog thread, when
it is orphaned while busy with a command; then it removes the session's shared
memory and temporary directory itself.

For fault-injection tests, ``SYNKHRONOS_FAULT="rank:command:nth:action"`` (several
joined by ``;``) makes worker ``rank`` act up on the ``nth`` (1-based) command
named ``command`` (``call``, ``set_shareds``, ... as in ``Command``), before
carrying it out: ``hang`` sleeps forever, ``raise`` raises RuntimeError,
``crash`` dies of a segmentation fault.
"""

import faulthandler
import functools
import json
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time

from . import _log, _shmem, _stacks
from ._channel import ShmChannel, SocketChannel
from ._core import reseed_generators
from ._exchange import ExchangeBuffer, receive
from ._plan import take_rows
from ._protocol import Command, failure, ok

_WATCH_S = 0.5  # how often a worker checks that its master is alive
FAULT_ENV = "SYNKHRONOS_FAULT"

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
        if config["device"] == "gpu":
            from ._devices import gpu

            self.device = gpu.GpuDevice(gpu_ids=[])
        elif cluster is not None:
            from ._devices import cpu_mpi

            self.device = cpu_mpi.MpiCpuDevice(lambda: cluster.comm)
        else:
            from ._devices import cpu

            self.device = cpu.CpuDevice()
        self.exchange = ExchangeBuffer(self.token, self.rank, inline=remote)
        self.cache = _shmem.SegmentCache(host=cluster.host if remote else None)
        self.host_copies = {}  # slot -> Segment: this host's copies of Data (host leaders, MPI)
        self.cores = None
        self.shareds = None
        # Import PyTensor while the master is still building graphs.
        self._importer = threading.Thread(target=_import_pytensor, daemon=True)
        self._importer.start()

    def shared(self, ID):
        if self.shareds is None:
            raise RuntimeError("functions have not been distributed to this worker")
        return self.shareds[ID]

    def drop(self, name):
        """Forget Data segment ``name``: its mapping, and this host's copy of it."""
        self.cache.drop(name)
        if self.cluster is not None and self.cluster.remote(self.rank):
            local = _shmem.host_copy_name(name, self.cluster.host)
            seg = self.host_copies.pop(_shmem.slot_of(local), None)
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


def _import_pytensor():
    try:
        import pytensor  # noqa: F401
    except Exception:  # reported when DISTRIBUTE imports it again
        pass


def _distribute(state, payload):
    flags, blob = payload
    t0 = time.monotonic()
    state._importer.join()
    import pytensor

    for name, value in flags.items():
        if str(getattr(pytensor.config, name)) != value:
            setattr(pytensor.config, name, value)
    state.device.configure_jax()
    state.cores, state.shareds = pickle.loads(blob)
    reseed_generators(state.shareds, state.cores, state.rank)
    state.device.place_shareds(state.shareds)
    logger.debug("worker rank %d: loaded %d functions and %d shared variables in %.2f s", state.rank,
                 len(state.cores), len(state.shareds), time.monotonic() - t0)


def _call(state, payload):
    fn_id, scattered, bcast, share_sel, subset, num_slices, weighted = payload
    view = state.cache.view
    core = state.cores[fn_id]
    args = ([(view(ref), sel) for ref, sel in scattered], [view(ref) for ref in bcast],
            share_sel, subset, num_slices)
    specs = core.device_reduction(state.device, subset, num_slices)
    if specs is not None:  # reduced into the master on the device: nothing to send
        weight, had_rows, _ = core.run_reduced(state.device, specs, state.master_rank, weighted, *args)
        return weight, had_rows
    weight, outputs = core.run_local(state.device, *args)
    return weight, None if outputs is None else state.exchange.send(state.device.to_host(outputs))


def _map_data(state, name):
    state.cache.segment(name)


def _drop_data(state, name):
    state.drop(name)


def _send_shareds(state, ids):
    return state.exchange.send([state.device.get_value(state.shared(i)) for i in ids])


def _set_shareds(state, items):
    for ID, token, sel in items:
        (value,) = receive([token], state.cache)
        state.device.set_value(state.shared(ID), take_rows(value, sel))


def _get_shapes(state, ids):
    return [state.device.shape(state.shared(i)) for i in ids]


def _nccl_init(state, uid):
    state.device.init_comm(state.n_parallel, state.rank, uid)


def _nccl(state, payload):
    op, ids, args = payload
    return getattr(state.device, "nccl_" + op)([state.shared(i) for i in ids], *args)


def _host_data(state, payload):
    """Take this host's copy of a Data segment from the master, over MPI."""
    name, nbytes, used = payload
    local = _shmem.host_copy_name(name, state.cluster.host)
    slot = _shmem.slot_of(local)
    seg = state.host_copies.get(slot)
    if seg is None or seg.name != local:
        if seg is not None:
            state.cache.drop(name)
            seg.unlink()
            seg.close()
        seg = state.host_copies[slot] = _shmem.Segment(local, nbytes)
    state.cluster.bcast_to_leaders(seg.array("u1", (used,)))


def _sync(state, payload):
    state.device.synchronize(state.shareds or [])


_HANDLERS = {
    Command.SYNC: _sync,
    Command.NCCL_INIT: _nccl_init,
    Command.NCCL: _nccl,
    Command.DISTRIBUTE: _distribute,
    Command.CALL: _call,
    Command.MAP_DATA: _map_data,
    Command.DROP_DATA: _drop_data,
    Command.SEND_SHAREDS: _send_shareds,
    Command.SET_SHAREDS: _set_shareds,
    Command.GET_SHAPES: _get_shapes,
    Command.HOST_DATA: _host_data,
}


class _Faults:
    """Injected faults for this rank (see the module docstring)."""

    _ACTIONS = ("hang", "raise", "crash")

    def __init__(self, text, rank):
        self._plan = {}  # command -> (nth, action)
        self._seen = {}
        for item in filter(None, (text or "").split(";")):
            r, cmd, nth, act = item.split(":")
            if int(r) == rank:
                if act not in self._ACTIONS:
                    raise ValueError("%s: unknown action %r in %r" % (FAULT_ENV, act, item))
                self._plan[Command[cmd.upper()]] = (int(nth), act)

    def __bool__(self):
        return bool(self._plan)

    def before(self, cmd):
        if cmd not in self._plan:
            return
        self._seen[cmd] = n = self._seen.get(cmd, 0) + 1
        nth, act = self._plan[cmd]
        if n != nth:
            return
        if act == "hang":
            while True:
                time.sleep(3600)
        if act == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        raise RuntimeError("fault injected by %s into %s #%d" % (FAULT_ENV, cmd.name.lower(), n))


def _serve(channel, state, faults):
    """Answer commands until EXIT; returns None if the master vanished, else
    EXIT's payload (whether the session failed)."""
    while True:
        try:
            cmd, payload, drops = channel.recv()
        except (EOFError, OSError):
            return None
        state.exchange.release()  # the master has read our last reply (see _exchange)
        for name in drops:
            state.drop(name)
        if cmd == Command.EXIT:
            return bool(payload)
        try:
            if faults:
                faults.before(Command(cmd))
            reply = ok(_HANDLERS[cmd](state, payload))
        except Exception as exc:
            reply = failure(exc)
        try:
            channel.send(reply)
        except (EOFError, OSError):
            return None


def _remove_session(token, tmpdir, slot_prefix=""):
    """What the master would have removed: the session's segments (those whose
    slot starts with ``slot_prefix``) and the temporary directory."""
    _shmem.unlink_session(token, slot_prefix)
    shutil.rmtree(tmpdir, ignore_errors=True)


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


def _run(config, conn, cluster=None, prepare=None):
    """Serve the master on ``conn`` until it closes the session; returns EXIT's
    payload (whether the session failed), or None if the master vanished.
    ``prepare()``, if given, sets this process up first (its failure, like any
    at start-up, is sent to the master, which is waiting for this rank)."""
    rank, token, tmpdir = config["rank"], config["token"], config["tmpdir"]
    _log.set_level(config["log_level"])  # the master's, which may differ from SYNKHRONOS_LOG_LEVEL
    stack_file = _stacks.enable(tmpdir, rank)
    faults = _Faults(os.environ.get(FAULT_ENV), rank)
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
    done = threading.Event()
    if cluster is not None:
        own = "h%d" % cluster.host if cluster.remote(rank) else "r%d" % rank
        threading.Thread(target=_watch_connection, daemon=True, name="synkhronos-watchdog",
                         args=(channel, done, lambda: _remove_session(token, tmpdir, own))).start()
    profiler = None
    if config["profile"]:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    conn.send(ok(os.getpid()))
    logger.debug("worker rank %d (pid %d) ready", rank, os.getpid())
    ended = None
    try:
        ended = _serve(channel, state, faults)
        done.set()
    finally:
        if profiler is not None:
            profiler.disable()
            name = "synkhronos_worker_%d_%d.prof" % (rank, os.getpid())
            path = os.path.join(config["profile_dir"], name)
            profiler.dump_stats(path)
            logger.info("Synkhronos worker rank %d profile written to %s", rank, path)
        state.close()
        if ended is None and cluster is None:
            # The master died without closing: nobody else will clean up.
            _remove_session(token, tmpdir)
        elif cluster is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        channel.close()
        faulthandler.disable()
        stack_file.close()
    return ended


def _exit_now(code=0):
    # Everything is released: skip the interpreter's teardown of every loaded
    # module (a quarter of a second with PyTensor loaded), as multiprocessing's
    # children do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    """Entry point of a worker that ``fork()`` spawned on the master's host."""
    # Ctrl-C reaches the whole process group; only the master handles it and
    # then closes the workers in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from multiprocessing.connection import Connection

    config = json.loads(os.environ.pop("SYNK_WORKER"))
    threading.Thread(target=_watch_master, args=(os.getppid(), config["token"], config["tmpdir"]),
                     daemon=True, name="synkhronos-watchdog").start()
    _run(config, Connection(config["fd"]))
    _exit_now()


def _use_node_gpu(precision, cluster):
    """See only the GPU at this rank's position among the ranks of its node."""
    from ._devices import gpu

    device = gpu.GpuDevice(precision=precision)
    device.one_node = cluster.one_node(cluster.size)
    if cluster.node_index >= len(device.gpu_ids):
        raise RuntimeError("MPI rank %d is rank %d on node %s, which has only %d visible GPUs: launch at "
                           "most one rank per GPU on each node" % (cluster.rank, cluster.node_index,
                                                                   cluster.nodes[cluster.rank],
                                                                   len(device.gpu_ids)))
    device.setup_master(cluster.node_index)


def mpi_main(cluster):
    """Entry point of an MPI rank other than 0, inside ``fork()``: serve the
    master, then end the process (never returns).

    Parameters
    ----------
    cluster : synkhronos._mpi.Cluster
    """
    from . import _mpi

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master closes the session on Ctrl-C
    config, conn = _mpi.connect_master(cluster)
    failed = False
    if conn is not None:
        tmpdir = tempfile.mkdtemp(prefix="synkhronos_%d_" % os.getpid())
        config = dict(config, rank=cluster.rank, tmpdir=tmpdir)
        os.environ["TMPDIR"] = tempfile.tempdir = tmpdir  # PyTensor's generated sources go there
        prepare = None
        if config["device"] == "gpu":
            prepare = functools.partial(_use_node_gpu, config["precision"], cluster)
        ended = _run(config, conn, cluster, prepare)
        failed = ended is None or ended
    if not failed:
        _mpi.finalize()  # MPI's finalize waits for the master's, at its exit
    _exit_now()
