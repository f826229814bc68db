"""Several hosts: the same script on every rank, launched by MPI.

Under ``mpirun -n N python train.py`` (or ``srun``, or MPICH's ``mpiexec``) every
rank runs the user's unchanged script.  ``fork()`` notices the launch: global
rank 0 becomes the master and returns, every other rank serves the master's
commands inside ``fork()`` and ends its process when the master closes.

What travels how:

* Start-up: MPI (``bcast``) hands every rank the master's address and a random
  key; each worker then opens a connection to the master (``multiprocessing``'s
  authenticated ``Connection`` over TCP), which carries the commands and their
  replies exactly as the socket pairs of a single host do.  A TCP connection
  tells the master at once when a rank's process dies (the kernel closes it),
  which MPI point-to-point messages cannot do without fault-tolerance
  extensions.
* Data: one shared-memory segment per host, as on one host.  The host's
  lowest rank (its leader) creates a copy of each ``Data`` segment the first
  time a call needs it and whenever the master changed it through ``Data``'s
  methods; the contents travel once per host by ``MPI.Ibcast`` among the
  leaders.  Ranks on the master's host map the master's own segment.
* Arrays a worker returns (outputs, shared values) come inline on its
  connection when it is on another host, through shared memory otherwise.
* Collectives: on GPUs one NCCL communicator across all hosts; on CPU hosts
  MPI collectives on the shared variables' numpy buffers (``cpu_mpi``).

``SYNKHRONOS_HOST_PER_RANK=1`` makes every rank its own "host" (separate
segments, data copies and inline transfers), so the cross-host paths run, and
can be tested, on one machine; ``SYNKHRONOS_RANKS_PER_HOST=k`` makes every k
consecutive ranks of a machine one "host" (2 "hosts" of 2 GPUs on a 4-GPU
machine: ``k=2``).
"""

import os
import pickle
import re
import secrets
import shutil
import socket
import struct
import tempfile
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from .._common.env import env_flag
from .._common.waiting import wait_requests
from .stacks import process_state

__all__ = ["Cluster", "cluster", "launched", "connect_workers", "connect_master", "refuse_workers",
           "finalize", "check_unused", "start_session", "rank_tmpdir", "remove_dead_ranks_tmpdirs",
           "HOST_ENV", "MPI_ENV",
           "ADDR_ENV", "RANKS_PER_HOST_ENV", "ranks_per_host"]

MPI_ENV = "SYNKHRONOS_MPI"  # 0: ignore an MPI launch (fork() spawns workers as without MPI)
HOST_ENV = "SYNKHRONOS_HOST_PER_RANK"  # 1: every rank its own host (for tests)
RANKS_PER_HOST_ENV = "SYNKHRONOS_RANKS_PER_HOST"  # k: every k ranks of a machine one host (for tests)
ADDR_ENV = "SYNKHRONOS_MASTER_ADDR"  # the address workers reach the master at
# Variables that MPI launchers set in every rank's environment: Open MPI's mpirun,
# MPICH's Hydra and Slurm's PMI-2, PMIx (Open MPI 5, Slurm's --mpi=pmix).
_LAUNCH_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
# A launched rank's pid, recorded when Synkhronos is imported: processes that a rank
# starts inherit the launcher's variables but are not ranks (they see another pid).
_PID_ENV = "SYNKHRONOS_MPI_RANK_PID"
_CONNECT_TIMEOUT = 120.0
_HANDSHAKE_S = 10  # seconds a connecting process has to prove it knows the key

# The MPI launch outlives sessions: one per process, and one session per launch
# (its workers end with it).  How a launch ends (the session first, then MPI's
# finalize) is the business of the session's owner, ``_api``.
_state = {"cluster": None, "session": False}
def _mark_rank():
    if any(v in os.environ for v in _LAUNCH_VARS):
        os.environ.setdefault(_PID_ENV, str(os.getpid()))


_mark_rank()


def launched():
    """Whether this process is one rank of several started by an MPI launcher
    (and ``SYNKHRONOS_MPI`` does not say 0): not a process that a rank started,
    which inherits the launcher's variables.  Imports mpi4py only then."""
    if not env_flag(MPI_ENV, True) or not any(v in os.environ for v in _LAUNCH_VARS):
        return False
    if os.environ.get(_PID_ENV, str(os.getpid())) != str(os.getpid()):
        return False
    MPI = _mpi()
    return MPI.COMM_WORLD.Get_size() > 1


def _mpi():
    """mpi4py's MPI module, imported so that MPI is finalized by us (after the
    session closes, and not after a failure, when a dead rank would never join)."""
    try:
        import mpi4py
    except ImportError:
        found = [v for v in _LAUNCH_VARS if v in os.environ]
        raise RuntimeError("this process was started by an MPI launcher (%s is set) but mpi4py is not "
                           "installed: pip install 'synkhronos[mpi]', or set %s=0 to ignore the launch"
                           % (found[0] if found else "its environment", MPI_ENV)) from None
    try:
        mpi4py.rc.finalize = False
    except AttributeError:
        pass
    try:
        from mpi4py import MPI
    except ImportError as exc:  # mpi4py without an MPI library
        raise RuntimeError("synkhronos was launched by MPI but mpi4py cannot load MPI (%s); "
                           "pip install 'synkhronos[mpi]'" % exc) from None
    return MPI


def finalize():
    """Finalize MPI (a fence: it returns once every rank has called it)."""
    MPI = _mpi()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def rank_tmpdir(token):
    """Make a launched rank's private temporary directory, named by the rank's
    pid and the session's ``token``, so that the session's other processes on
    its host can tell it apart once the rank is gone (``remove_dead_ranks_tmpdirs``)."""
    return tempfile.mkdtemp(prefix="synkhronos_%d_%s_" % (os.getpid(), _tag(token)))


def _tag(token):
    """48 of the token's random bits: enough to tell sessions apart on a host,
    and short, as Unix socket paths under the directory are (108 bytes at most)."""
    return token[-12:]


def remove_dead_ranks_tmpdirs(token, root):
    """Remove the temporary directories in ``root`` of session ``token``'s
    ranks whose process has ended: a rank that crashed could not remove its own,
    and its launcher does not know of it.  A live rank removes its own."""
    pattern = re.compile(r"synkhronos_(\d+)_%s_" % re.escape(_tag(token)))
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = pattern.match(name)
        if m and not _running(int(m.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _running(pid):
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped by its
    launcher, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not process_state(pid).startswith("Z")


def cluster():
    """This launch's ``Cluster`` (made on first use, by every rank together)."""
    if _state["cluster"] is None:
        _state["cluster"] = Cluster(_mpi().COMM_WORLD, ranks_per_host())
    return _state["cluster"]


def ranks_per_host():
    """How many consecutive ranks of a machine count as one host: 1 under
    ``SYNKHRONOS_HOST_PER_RANK=1``, k under ``SYNKHRONOS_RANKS_PER_HOST=k``, None
    (the machines themselves) otherwise."""
    raw = os.environ.get(RANKS_PER_HOST_ENV, "").strip()
    if not raw:
        return 1 if env_flag(HOST_ENV, False) else None
    try:
        k = int(raw)
    except ValueError:
        k = 0
    if k < 1:
        raise ValueError("%s=%r: give a whole number of ranks >= 1 (unset: one host per machine)"
                         % (RANKS_PER_HOST_ENV, raw))
    return k


def check_unused():
    """Raise RuntimeError if this launch already had its session."""
    if _state["session"]:
        raise RuntimeError("under an MPI launch fork() starts one session per launch, and this one's "
                           "has ended (its workers have exited); launch the script again")


def start_session():
    """The master is about to start the workers' session."""
    _state["session"] = True


class Cluster:
    """The ranks of an MPI launch, and where each one runs.

    Synkhronos rank = MPI rank; the master is rank 0.  A session may use the
    first ``n_parallel`` ranks only (``activate``); the others wait for the end.

    Parameters
    ----------
    world : mpi4py communicator
        All ranks (``MPI.COMM_WORLD``).
    ranks_per_host : int or None
        Treat every ``ranks_per_host`` consecutive ranks of a machine as one
        host (``ranks_per_host()``); None: each machine is one host.
    """

    def __init__(self, world, ranks_per_host=None):
        MPI = _mpi()
        self.world = world
        self.rank = world.Get_rank()
        self.nodes = world.allgather(MPI.Get_processor_name())
        # GPUs are chosen by the position among ranks of the same physical node.
        self._node_indices = [self.nodes[:r].count(n) for r, n in enumerate(self.nodes)]
        self.node_index = self._node_indices[self.rank]
        if ranks_per_host is None:
            self._keys = self.nodes
        elif ranks_per_host == 1:
            self._keys = ["%s/rank%d" % (n, r) for r, n in enumerate(self.nodes)]
        else:
            groups = [i // ranks_per_host for i in self._node_indices]
            self._keys = ["%s/host%d" % key for key in zip(self.nodes, groups)]

    def activate(self, n_parallel):
        """Use ranks ``0 .. n_parallel - 1`` (collective: every rank calls it, once,
        when the master's start-up message says how many ranks the session uses)."""
        MPI = _mpi()
        self.size = n_parallel
        active = self.rank < n_parallel
        self.comm = self.world if n_parallel == self.world.Get_size() else \
            self.world.Split(0 if active else MPI.UNDEFINED, self.rank)
        keys = self._keys[:n_parallel]
        self.host_names = list(dict.fromkeys(keys))
        self.host_of = [self.host_names.index(k) for k in keys]
        self.leaders = [self.host_of.index(h) for h in range(len(self.host_names))]
        self.leaders_comm = self.world.Split(0 if self.rank in self.leaders else MPI.UNDEFINED, self.rank)

    def hosts_of_first(self, n_parallel):
        """How many hosts ranks ``0 .. n_parallel - 1`` run on."""
        return len(set(self._keys[:n_parallel]))

    def ranks_on_my_node(self, n_parallel):
        """How many of ranks ``0 .. n_parallel - 1`` run on this rank's physical
        node (they share its cores)."""
        return self.nodes[:n_parallel].count(self.nodes[self.rank])

    def one_node(self, n_parallel):
        """Whether ranks ``0 .. n_parallel - 1`` all run on one physical node."""
        return len(set(self.nodes[:n_parallel])) == 1

    @property
    def active(self):
        return self.rank < self.size

    @property
    def host(self):
        return self.host_of[self.rank]

    def remote(self, rank):
        """Whether ``rank`` runs on another host than the master."""
        return self.host_of[rank] != self.host_of[0]

    def remote_leaders(self):
        """The lowest rank of every host but the master's."""
        return [r for r in self.leaders if self.remote(r)]

    def where(self, rank):
        return "host %s" % self.host_names[self.host_of[rank]]

    def bcast_to_leaders(self, array, hook=None):
        """Every host leader's ``array`` takes the master's (rank 0's) contents."""
        if self.leaders_comm == _mpi().COMM_NULL or array.size == 0:
            return
        wait_requests([self.leaders_comm.Ibcast(array.reshape(-1).view("u1"), root=0)], hook)


def _master_address(cluster, n_parallel):
    """Where workers reach the master: ``$SYNKHRONOS_MASTER_ADDR``, else loopback
    when the session's ranks share the master's node, else the address of the
    interface that routes off this host."""
    addr = os.environ.get(ADDR_ENV, "").strip()
    if addr:
        return addr
    if cluster.one_node(n_parallel):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def connect_workers(cluster, config, timeout=_CONNECT_TIMEOUT):
    """Master side of start-up: send ``config`` (a dict) with the master's address
    to every rank over MPI, and accept one authenticated connection per worker.

    Returns
    -------
    dict
        rank -> ``multiprocessing.connection.Connection``.

    Raises
    ------
    RuntimeError
        If some ranks did not connect within ``timeout`` seconds.
    """
    authkey = secrets.token_bytes(32)
    server = socket.create_server(("", 0))
    conns = {}
    try:
        server.settimeout(1.0)
        address = (_master_address(cluster, config["n_parallel"]), server.getsockname()[1])
        cluster.world.bcast(dict(config, address=address, authkey=authkey), root=0)
        cluster.activate(config["n_parallel"])
        deadline = time.monotonic() + timeout
        while len(conns) < cluster.size - 1:
            try:
                sock, _ = server.accept()
            except TimeoutError:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(1, cluster.size)) - set(conns))
                    raise RuntimeError("MPI ranks %s did not connect to the master at %s:%d within %.0f s; "
                                       "set %s to an address they can reach"
                                       % (missing, address[0], address[1], timeout, ADDR_ENV)) from None
                continue
            conn = _handshake(sock, authkey)
            if conn is not None:
                rank, conn = conn
                conns[rank] = conn
    except BaseException:
        for c in conns.values():
            c.close()
        raise
    finally:
        server.close()
    return conns


def _no_delay(sock):
    """Send each message at once: commands and replies are small, and Nagle's
    algorithm would hold one back until the previous one is acknowledged."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _handshake(sock, authkey):
    """``(rank, Connection)`` of a worker that proved it knows ``authkey`` within
    ``_HANDSHAKE_S`` seconds; None (connection dropped) for anyone else, so that
    a stranger's connection can neither stall nor abort ``fork()``."""
    sock.settimeout(None)
    _no_delay(sock)
    # A kernel receive timeout on the blocking socket (the Connection reads it directly).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(_HANDSHAKE_S), 0))
    conn = Connection(sock.detach())
    try:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
        rank = conn.recv()
    except (AuthenticationError, OSError, EOFError, ValueError, pickle.UnpicklingError):
        conn.close()
        return None
    with socket.socket(fileno=os.dup(conn.fileno())) as view:
        view.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
    return rank, conn


def refuse_workers(cluster):
    """Master side at exit when no session started: release the workers."""
    cluster.world.bcast(None, root=0)


def connect_master(cluster):
    """Worker side of start-up: the master's config and a connection to it;
    ``(config, None)`` for a rank the session does not use, ``(None, None)`` if
    the master ended without a session."""
    config = cluster.world.bcast(None, root=0)
    if config is None:
        return None, None
    cluster.activate(config["n_parallel"])
    if not cluster.active:
        return config, None
    sock = socket.create_connection(tuple(config["address"]), timeout=_CONNECT_TIMEOUT)
    sock.settimeout(None)
    _no_delay(sock)
    conn = Connection(sock.detach())
    answer_challenge(conn, config["authkey"])
    deliver_challenge(conn, config["authkey"])
    conn.send(cluster.rank)
    return config, conn
