"""How messages travel between the master and one worker.

``SocketChannel`` pickles each message onto a socket (multiprocessing's
``Connection``): ranks launched by MPI reach the master over TCP this way.

``ShmChannel``, for the workers ``fork()`` spawns on the master's host, carries
each message through shared memory instead: one ring of slots per direction,
counted by two POSIX semaphores (messages waiting, slots free).  Posting and
taking a semaphore stay in user space unless a process has to sleep, so a round
trip makes no system call while both sides are awake, and a small message's
round trip is several times shorter than over a socket pair (see the docs page
"Benchmarks", *Design decisions*).  The socket stays, for what the kernel tells
through it: a peer that died has hung up.  A message too large for a slot goes
on the socket, announced in its slot so that the order holds.

Both poll for ``spin`` seconds before they sleep: a process woken from sleep
runs its first microseconds slowly, so a short poll makes back-to-back calls
much faster, while an idle session still sleeps.
"""

import math
import pickle
import select
import struct
import time

import posix_ipc

from .shared_memory import Segment, segment_name

__all__ = ["SocketChannel", "ShmChannel", "shm_channel_names"]

SLOTS = 128  # messages a ring holds: more than the replies a master may leave unread
SLOT_BYTES = 2048  # a call's command is a few hundred bytes
_LENGTH = struct.Struct("<I")
_ON_SOCKET = 0xFFFFFFFF  # in a slot's length: the message follows on the socket
_SLEEP_SLICE_S = 0.5  # a sleeping process checks this often that its peer is alive
_MODE = 0o600


class SocketChannel:
    """Messages pickled over a socket.

    Parameters
    ----------
    conn : multiprocessing.connection.Connection
    spin : float
        Seconds to poll for a message before sleeping.
    """

    def __init__(self, conn, spin):
        self.conn = conn
        self.spin = spin
        # select.poll, made once: each poll is far cheaper than Connection.poll's.
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLIN)
        self._hup = None

    def send(self, obj):
        self.conn.send(obj)

    def hung_up(self):
        """Whether the other end has closed the connection (its process died),
        seen without reading anything that is still to be read."""
        if self._hup is None:
            self._hup = select.poll()
            self._hup.register(self.conn.fileno(), getattr(select, "POLLRDHUP", 0x2000))
        return bool(self._hup.poll(0))

    def ready(self, timeout=0.0):
        """Whether a message (or the end of the stream) can be read within
        ``timeout`` seconds (None: wait as long as it takes)."""
        ms = -1 if timeout is None else max(0, math.ceil(timeout * 1000))
        return bool(self._poll.poll(ms))

    def wait(self, timeout=None):
        """Poll for up to ``spin`` seconds, then sleep until a message can be
        read or ``timeout`` seconds (counted from now) have passed; returns
        whether one can be read."""
        if self.spin > 0 and not self.ready():
            start = time.perf_counter()
            deadline = start + self.spin
            while time.perf_counter() < deadline:
                if self.ready():
                    return True
            if timeout is not None:
                timeout -= time.perf_counter() - start
        return self.ready(timeout)

    def recv(self):
        """The next message, waiting as long as it takes.

        Raises
        ------
        EOFError
            If the other end has closed the connection.
        """
        self.wait()
        return self.conn.recv()

    def close(self):
        self.conn.close()


def shm_channel_names(token, rank):
    """Names of the shared memory and the semaphores of worker ``rank``'s channel."""
    base = segment_name(token, "c%d" % rank, 0)
    return [base] + ["%s%s" % (base, tag) for tag in ("mi", "ms", "wi", "ws")]


class ShmChannel(SocketChannel):
    """Messages through shared-memory rings (see the module docstring).

    Parameters
    ----------
    conn : multiprocessing.connection.Connection
        The socket to the other process: for hang-ups and oversized messages.
    spin : float
        Seconds to poll for a message before sleeping.
    names : list of str
        From ``shm_channel_names``.
    master : bool
        True in the master, which creates the memory and semaphores (and
        should ``unlink`` them once the worker has opened them).
    """

    def __init__(self, conn, spin, names, master):
        super().__init__(conn, spin)
        self._names = list(names)
        ring = SLOTS * SLOT_BYTES
        self._seg = Segment(names[0], 2 * ring if master else None)
        self._sems = []
        try:
            for k, name in enumerate(names[1:]):
                if master:  # (messages waiting, free slots) for master->worker, then worker->master
                    self._sems.append(posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=_MODE,
                                                          initial_value=SLOTS if k % 2 else 0))
                else:
                    self._sems.append(posix_ipc.Semaphore(name))
        except BaseException:
            for sem in self._sems:
                sem.close()
            self._seg.close()
            if master:
                self.unlink()
            raise
        view = memoryview(self._seg.mmap)
        out, into = (0, 1) if master else (1, 0)
        self._out, self._in = view[out * ring:(out + 1) * ring], view[into * ring:(into + 1) * ring]
        self._out_waiting, self._out_free = self._sems[2 * out], self._sems[2 * out + 1]
        self._in_waiting, self._in_free = self._sems[2 * into], self._sems[2 * into + 1]
        self._next_out = self._next_in = 0
        self._taken = False  # a waiting message's count already taken (by ready)

    def send(self, obj):
        """Put ``obj`` in the next free slot (on the socket if it does not fit).

        Raises
        ------
        BrokenPipeError
            If no slot is free and the other end has hung up.
        """
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        free = self._out_free
        if not self._take(free, 0.0):  # the ring is full: the other end is far behind
            while not self._take(free, _SLEEP_SLICE_S):
                if self.hung_up():
                    raise BrokenPipeError("the other end of the channel has hung up")
        at = self._next_out * SLOT_BYTES
        self._next_out = (self._next_out + 1) % SLOTS
        n = len(data)
        if n + _LENGTH.size <= SLOT_BYTES:
            _LENGTH.pack_into(self._out, at, n)
            self._out[at + _LENGTH.size:at + _LENGTH.size + n] = data
            self._out_waiting.release()  # a full barrier: the slot is written before it counts
        else:
            _LENGTH.pack_into(self._out, at, _ON_SOCKET)
            self._out_waiting.release()
            self.conn.send_bytes(data)

    @staticmethod
    def _take(sem, timeout):
        """Decrement ``sem`` if it becomes positive within ``timeout`` seconds
        (0: now or never); returns whether it did."""
        try:
            sem.acquire(timeout)
            return True
        except posix_ipc.BusyError:
            return False
        except posix_ipc.SignalError:  # Ctrl-C: its handler runs once we are back in Python
            return False

    def ready(self, timeout=0.0):
        """Whether a message can be read within ``timeout`` seconds (None: wait
        as long as it takes)."""
        if self._taken:
            return True
        if timeout is not None and timeout <= 0:
            if not self._in_waiting.value:  # a read of shared memory, no system call
                return False
            timeout = 0
        self._taken = self._take(self._in_waiting, timeout)
        return self._taken

    def recv(self):
        """The next message, waiting as long as it takes.

        Raises
        ------
        EOFError
            If the other end has hung up and left no message.
        """
        while not self.wait(_SLEEP_SLICE_S):
            if self.hung_up() and not self.ready():
                raise EOFError("the other end of the channel has hung up")
        self._taken = False
        at = self._next_in * SLOT_BYTES
        self._next_in = (self._next_in + 1) % SLOTS
        (n,) = _LENGTH.unpack_from(self._in, at)
        try:
            if n == _ON_SOCKET:
                return pickle.loads(self.conn.recv_bytes())
            # Unpickling copies what it keeps: the slot can be reused at once.
            return pickle.loads(self._in[at + _LENGTH.size:at + _LENGTH.size + n])
        finally:
            self._in_free.release()

    def unlink(self):
        """Remove the names of the memory and semaphores: once both processes
        have opened them, they live until both close them, and nothing named is
        left behind whatever happens to either process."""
        try:
            posix_ipc.unlink_shared_memory(self._names[0])
        except posix_ipc.ExistentialError:
            pass
        for name in self._names[1:]:
            try:
                posix_ipc.unlink_semaphore(name)
            except posix_ipc.ExistentialError:
                pass

    def close(self):
        self._out.release()
        self._in.release()
        for sem in self._sems:
            sem.close()
        self._sems = []
        self._seg.close()
        super().close()
