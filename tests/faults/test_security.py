"""What another user of the machine can reach: nothing.

Shared-memory segments are the user's alone (mode 0600, created exclusively
under names with 128 random bits), the workers' temporary directory is private
(mode 0700), and no process of a session listens on a network socket: the
command channels are unnamed socket pairs.  (Under an MPI launch the master listens
on TCP while the ranks connect; a connection that does not know the session's key
is dropped: tested here too.)
"""

import os
import re
import socket
import stat
import tempfile
import threading
import time

import numpy as np
import posix_ipc
import pytensor
import pytensor.tensor as pt
import pytest
from _procs import SHM_DIR, segments, socket_inodes

import synkhronos as synk
from synkhronos._session import runtime
from synkhronos._wire import shared_memory

F32 = "float32"


@pytest.fixture
def session():
    """3 CPU ranks, with segments of every kind: a Data, and exchange buffers of
    the master and the workers (outputs and values over 64 kB travel in them)."""
    synk.close()
    synk.fork(3, use_gpu=False)
    x = pt.matrix("x", dtype=F32)
    s = pytensor.shared(np.zeros((4, 3), dtype=F32), name="s")
    f = synk.function([x], [(x * 2, None), (x.sum() + s.sum(), "sum")])
    synk.distribute()
    d = synk.data(np.ones((30000, 3), dtype=F32))
    f(d)
    synk.broadcast(s, np.zeros((30000, 3), dtype=F32))
    yield runtime.current(), d
    synk.close()


def _slots(names):
    return {n.rsplit("_", 2)[1] for n in names}


def test_segments_are_private_to_the_user(session):
    rt, _ = session
    names = segments(rt.token)
    assert {"d0", "r0", "r1", "r2"} <= _slots(names)
    for name in names:
        st = os.stat(os.path.join(SHM_DIR, name))
        assert stat.S_IMODE(st.st_mode) == 0o600, "%s has mode %o" % (name, stat.S_IMODE(st.st_mode))
        assert st.st_uid == os.getuid()


def test_segment_names_are_unguessable():
    tokens = {shared_memory.new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        match = re.fullmatch(r"(\d+)([0-9a-f]{32})", token)  # the pid, then 128 random bits
        assert match and int(match.group(1)) == os.getpid()


def test_a_segment_made_by_someone_else_is_never_used(session):
    """Segments are created with O_CREAT | O_EXCL: if the name exists (another
    user made it first), Synkhronos refuses instead of using that memory."""
    rt, _ = session
    name = shared_memory.segment_name(rt.token, "d%d" % rt.registry._next_data_id, 1)
    planted = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=4096)
    try:
        with pytest.raises(FileExistsError, match="already exists"):
            synk.data(np.zeros(10, dtype=F32))
    finally:
        planted.close_fd()
        planted.unlink()
    # The session is unharmed.
    assert synk.data(np.arange(3, dtype=F32)).data.tolist() == [0, 1, 2]


def test_workers_temporary_directory_is_private(session):
    rt, _ = session
    st = os.stat(rt.tmpdir)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert os.path.dirname(rt.tmpdir) == tempfile.gettempdir()
    assert os.path.basename(rt.tmpdir).startswith("synkhronos_%d_" % os.getpid())


def _inet_inodes():
    """Inodes of every TCP and UDP socket of this machine (network namespace)."""
    found = set()
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open("/proc/net/%s" % table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            found.add(row.split()[9])
    return found


def _named_unix_inodes():
    """Inodes of Unix sockets bound to a name (a path or an abstract name)."""
    named = set()
    with open("/proc/net/unix") as fh:
        for row in fh.read().splitlines()[1:]:
            cols = row.split()
            if len(cols) >= 8:
                named.add(cols[6])
    return named


def test_no_network_listener(session):
    rt, _ = session
    inet, named = _inet_inodes(), _named_unix_inodes()
    for rank, w in rt.workers.items():
        socks = socket_inodes(w.process.pid)
        assert socks, "worker rank %d has no command channel?" % rank
        assert not socks & inet, "worker rank %d has a TCP/UDP socket" % rank
        assert not socks & named, "worker rank %d has a named Unix socket" % rank
    # The master's ends of the channels are unnamed Unix sockets too.
    channels = {os.readlink("/proc/self/fd/%d" % w.channel.conn.fileno())[len("socket:["):-1]
                for w in rt.workers.values()}
    assert not channels & inet and not channels & named


def _tcp_pair():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    server.close()
    return accepted, client


@pytest.mark.parametrize("stranger", ["garbage", "silent", "wrong key"])
def test_mpi_master_drops_a_connection_that_does_not_know_the_key(monkeypatch, stranger):
    """Under MPI the master listens on TCP while ranks connect: anyone else is dropped
    (not unpickled, and neither stalls nor aborts fork())."""
    from multiprocessing.connection import Connection, answer_challenge

    from synkhronos._session import mpi

    monkeypatch.setattr(mpi, "_HANDSHAKE_S", 1)
    accepted, client = _tcp_pair()
    if stranger == "garbage":
        client.sendall(b"\x00\x00\x00\x05hello" * 3)
    elif stranger == "wrong key":
        threading.Thread(target=lambda: _ignore(answer_challenge, Connection(client.detach()), b"x" * 32),
                         daemon=True).start()
    t0 = time.monotonic()
    assert mpi._handshake(accepted, b"k" * 32) is None
    assert time.monotonic() - t0 < 5


def _ignore(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass


def test_mpi_master_accepts_a_rank_that_knows_the_key():
    from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

    from synkhronos._session import mpi

    accepted, client = _tcp_pair()
    key = b"k" * 32

    def rank_side():
        conn = Connection(client.detach())
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
        conn.send(3)
        assert conn.recv() == "hello"

    t = threading.Thread(target=rank_side, daemon=True)
    t.start()
    rank, conn = mpi._handshake(accepted, key)
    assert rank == 3
    conn.send("hello")  # no receive timeout is left on the connection
    t.join(5)
    assert not t.is_alive()
    with socket.socket(fileno=os.dup(conn.fileno())) as view:  # the handshake's read timeout is off
        assert view.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) == bytes(16)
