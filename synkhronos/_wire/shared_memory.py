"""POSIX shared-memory segments and the arrays that live in them.

Every segment of one Synkhronos session is named ``/synk_<token>_<slot>_<gen>``:
``token`` identifies the session, ``slot`` the owner of the memory (``d7`` for the
``Data`` object with ID 7, ``r1`` for the exchange buffer of rank 1) and ``gen``
counts reallocations of that slot.  Readers keep one mapping per slot and drop the
old one when a newer generation shows up, so a reallocation never leaves stale
mappings behind.  Because all names share the session prefix, ``unlink_session``
can remove every segment of a session, even ones whose owner died.

Segments are private to the user who runs the session: created with mode 0600,
exclusively (``O_CREAT | O_EXCL``, so a name that another user created first is
an error, never memory we use), under names that carry 128 random bits.
"""

import gc
import math
import mmap
import os
import secrets
import signal
import sys
import threading

import numpy as np
import posix_ipc

from . import room

__all__ = [
    "collect_garbage",
    "DataMemory",
    "Segment",
    "SegmentCache",
    "array_ref",
    "host_copy_name",
    "new_token",
    "segment_name",
    "slot_of",
    "unlink_session",
]

_SHM_DIR = room.SHM_DIR
_PREFIX = "synk_"
_MODE = 0o600  # read and write for the owner only
_MAX_VIEWS = 512  # views a SegmentCache keeps for reuse (a training loop needs a handful)


def new_token():
    """Return a fresh session token: the pid (so that one can tell whose
    segments these are) and 128 random bits (so that no one can guess them)."""
    return "%d%s" % (os.getpid(), secrets.token_hex(16))


def segment_name(token, slot, gen):
    """Name of generation ``gen`` of ``slot`` in session ``token``."""
    return "/%s%s_%s_%d" % (_PREFIX, token, slot, gen)


def host_copy_name(name, host):
    """Name of host ``host``'s copy of the master's segment ``name`` (ranks
    launched by MPI on other hosts than the master's; see ``_session.mpi``): its own slot,
    ``h<host>`` before the master's, so generations still replace each other."""
    token_slot, gen = name.rsplit("_", 1)
    token, slot = token_slot.rsplit("_", 1)
    return "%s_h%d%s_%s" % (token, host, slot, gen)


def slot_of(name):
    """The slot of segment ``name`` with its session token: generations of one
    slot share it."""
    # "/synk_<token>_<slot>_<gen>" -> "<token>_<slot>"
    return name.rsplit("_", 1)[0]


class Segment:
    """One mapped POSIX shared-memory segment.

    The bytes of a segment this process creates are reserved in ``/dev/shm``
    (``reserve``) before anything is written there: where it has no room,
    ``OSError`` (ENOSPC) says so, instead of SIGBUS at the first write (see
    ``_wire.room``).

    Parameters
    ----------
    name : str
        Segment name, starting with ``/``.
    nbytes : int or None
        Size to create; ``None`` attaches to an existing segment.
    reserve : int or None, optional
        Of a segment created, the bytes to reserve at once (default all; see
        ``reserve``).
    """

    def __init__(self, name, nbytes=None, reserve=None):
        self.name = name
        self._reserved = 0
        self._unpin = None  # (pid, undo) of ``pin``: undone in that process alone, not a forked child
        if nbytes is None:
            shm = posix_ipc.SharedMemory(name)
            self._reserved = shm.size  # another process's: its owner reserves it
        else:
            # mmap cannot map zero bytes: keep at least one page behind every name.
            try:
                shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=_MODE, size=max(int(nbytes), 1))
            except posix_ipc.ExistentialError:
                raise FileExistsError(
                    "shared-memory segment %s already exists; Synkhronos only uses memory it "
                    "created itself (its names are random: another process made this one)" % name
                ) from None
        try:
            self.nbytes = shm.size
            if nbytes is not None:
                self._reserve_with(shm.fd, self.nbytes if reserve is None else min(int(reserve), self.nbytes))
            self.mmap = mmap.mmap(shm.fd, shm.size)
        except BaseException:
            if nbytes is not None:
                self.unlink()
            raise
        finally:
            shm.close_fd()

    def reserve(self, nbytes):
        """Reserve the first ``nbytes`` of this segment (one this process
        created) in ``/dev/shm``, before they are written.

        Raises
        ------
        OSError
            ENOSPC, where ``/dev/shm`` has too little room left.
        """
        if nbytes > self._reserved:
            try:
                shm = posix_ipc.SharedMemory(self.name)
            except posix_ipc.ExistentialError:  # unlinked already: pages come at the first write
                self._reserved = self.nbytes
                return
            try:
                self._reserve_with(shm.fd, nbytes)
            finally:
                shm.close_fd()

    def _reserve_with(self, fd, nbytes):
        if nbytes > self._reserved:
            # Where the file system cannot reserve, nothing is tried again.
            self._reserved = nbytes if room.reserve(fd, self._reserved, nbytes) else self.nbytes

    def pin(self, device):
        """Have ``device`` (if any) page-lock this mapping until ``close`` (``device.pin_host``)."""
        undo = None if device is None or self._unpin else device.pin_host(self)
        if undo is not None:
            self._unpin = (os.getpid(), undo)

    def array(self, dtype, shape, offset=0):
        """A numpy view of the segment's memory."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(self.mmap, dtype=dtype, count=count, offset=offset).reshape(shape)

    def close(self, collect=False):
        """Unmap; views still alive keep the memory until they are collected.

        ``collect``: where a view is still exported, collect garbage once and try
        again, for a view that only a reference cycle still holds (say, the
        frames of a traceback that JAX kept while it traced a rank's share).
        Only where a segment is released (``free_memory``, ``close()``, a
        worker's ``drop``): a segment replaced by a larger one while the user
        holds a view of it would pay a collection each time.  Unlocks first."""
        pinned, self._unpin = self._unpin, None
        if pinned is not None and pinned[0] == os.getpid():
            pinned[1]()
        try:
            self.mmap.close()
        except BufferError:  # a numpy view is still exported
            if not collect:
                return  # the map goes with the last view
            collect_garbage()
            try:
                self.mmap.close()
            except BufferError:
                pass  # the user holds a view

    def unlink(self):
        """Remove the name (the memory lives on while anything maps it)."""
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            pass


def collect_garbage():
    """``gc.collect()``, a Ctrl-C that comes during it raised once it is over.
    Raised inside a finalizer or weakref callback that the collection runs,
    KeyboardInterrupt would be printed as ignored and lost, and the call that
    collected would go on waiting for its workers."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        gc.collect()  # (signals go to the main thread only)
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        gc.collect()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def array_ref(name, offset, dtype, shape):
    """Where an array lives: ``(segment name, byte offset, dtype str, shape)``.

    A plain tuple, so that it pickles small and fast on the command channel.
    """
    return (name, int(offset), np.dtype(dtype).str, tuple(shape))


class DataMemory:
    """The shared memory behind one ``Data`` object: its segment (a new
    generation, under a new name, at every reallocation), the array that views
    it, and whether the other hosts' copies (MPI launch) are still current.

    Parameters
    ----------
    token : str
        The session's token.
    slot : str
        This object's slot among the session's segments.
    dtype : numpy dtype
    device : device layer, optional
        Page-locks each segment where that speeds its rank's inputs (``Segment.pin``).
    """

    def __init__(self, token, slot, dtype, device=None):
        self._token = token
        self._slot = slot
        self._dtype = dtype
        self._device = device
        self._gen = 0
        self.segment = None
        self.array = None  # the view the Data object hands out
        self.ref = None  # array_ref of ``array``, for the workers
        # Counts the chances the user had to change the values (every hand-out of a
        # writable view): other hosts take a new copy when it moved, or while a
        # view handed out earlier is alive (``exposed``).
        self.version = 0
        self._published = None  # (segment name, version) that the other hosts hold

    @property
    def capacity(self):
        """Items the segment holds (0 without one)."""
        return 0 if self.segment is None else self.segment.nbytes // self._dtype.itemsize

    def allocate(self, items, keep=None, used=0):
        """Replace the segment by a new one of ``items`` items, holding the first
        items of array ``keep`` (if given); returns the new segment's name.  The
        array is None until ``view``.  ``/dev/shm`` holds the ``used`` items
        (and the kept ones) at once, the rest of the room as ``view`` needs
        it; where it has no room, ``OSError`` leaves this object as it was."""
        kept = 0 if keep is None else min(keep.size, items)
        seg = Segment(segment_name(self._token, self._slot, self._gen + 1), items * self._dtype.itemsize,
                      reserve=max(kept, min(used, items)) * self._dtype.itemsize)
        self._gen += 1
        if kept:
            seg.array(self._dtype, (items,))[:kept] = keep.reshape(-1)[:kept]
        seg.pin(self._device)
        self._drop_segment()
        self.segment = seg
        return seg.name

    def view(self, shape):
        """View the segment as an array of ``shape`` (reserved in /dev/shm first)."""
        self.segment.reserve(math.prod(shape) * self._dtype.itemsize)
        self.array = self.segment.array(self._dtype, shape)
        self.ref = array_ref(self.segment.name, 0, self._dtype, shape)
        self.version += 1

    def release(self):
        """Drop the array and the segment; returns the segment's name (or None)."""
        name = None if self.segment is None else self.segment.name
        self.array = None
        self.ref = None
        self._drop_segment(collect=True)
        return name

    def _drop_segment(self, collect=False):
        prev, self.segment, self.array = self.segment, None, None
        if prev is not None:
            prev.unlink()
            prev.close(collect)

    def exposed(self):
        """Whether a view of the memory lives outside this object: one handed out
        before the last call may have been written through since, so the other
        hosts' copy cannot be trusted (CPython's reference counts tell)."""
        arr = self.array
        # arr: this object's reference, the local name, the argument; its base (the
        # mapped buffer) is referenced by arr and by the argument alone.
        return sys.getrefcount(arr) > 3 or sys.getrefcount(arr.base) > 2

    def stale_on_hosts(self):
        """Whether the other hosts' copies may differ from this memory."""
        if self.segment is None:
            return False
        return self._published != (self.segment.name, self.version) or self.exposed()

    def published(self):
        """The other hosts now hold this memory's contents."""
        self._published = (self.segment.name, self.version)

    def used_bytes(self):
        """The bytes of the array, as a flat uint8 view (what travels)."""
        return self.array.reshape(-1).view("u1")


class SegmentCache:
    """Mappings of segments owned by other processes, one per slot.

    Parameters
    ----------
    host : int, optional
        On a host other than the master's (MPI launch): map this host's copies
        (``host_copy_name``) of the segments that refs name.
    device : device layer, optional
        Page-locks each segment mapped (see ``DataMemory``).
    """

    def __init__(self, host=None, device=None):
        self._by_slot = {}
        self._views = {}  # array ref -> numpy view, reused call after call
        self._host = host
        self._device = device

    def segment(self, name):
        """The mapped segment ``name`` (this host's copy of it, see ``host``),
        mapping it (and dropping its slot's older generation) if needed."""
        if self._host is not None:
            name = host_copy_name(name, self._host)
        slot = slot_of(name)
        seg = self._by_slot.get(slot)
        if seg is None or seg.name != name:
            if seg is not None:
                self._close(seg)
            seg = Segment(name)
            seg.pin(self._device)
            self._by_slot[slot] = seg
        return seg

    def view(self, ref):
        """A numpy view of the array that ``ref`` (from ``array_ref``) points to."""
        v = self._views.get(ref)
        if v is None:
            if len(self._views) >= _MAX_VIEWS:  # shapes that change call after call
                self._views.clear()
            name, offset, dtype, shape = ref
            v = self._views[ref] = self.segment(name).array(dtype, shape, offset)
        return v

    def _close(self, seg, collect=False):
        # Cached views keep the old mapping alive: forget them first.
        for ref in [r for r in self._views if r[0] == seg.name]:
            del self._views[ref]
        seg.close(collect)

    def drop(self, name):
        """Forget the mapping of the slot that ``name`` belongs to (the master
        released it: nothing of ours should hold a view, so a view only a
        reference cycle holds is collected; see ``Segment.close``)."""
        if self._host is not None:
            name = host_copy_name(name, self._host)
        seg = self._by_slot.pop(slot_of(name), None)
        if seg is not None:
            self._close(seg, collect=True)

    def clear(self):
        self._views.clear()
        for seg in self._by_slot.values():
            seg.close()
        self._by_slot.clear()


def unlink_session(token, slot_prefix=""):
    """Unlink every segment and semaphore of session ``token`` (whose slot starts
    with ``slot_prefix``: ``"h2"`` for host 2's copies); returns how many were
    removed.  (Linux keeps a named semaphore ``/x`` as ``sem.x`` in /dev/shm.)"""
    prefix = "%s%s_%s" % (_PREFIX, token, slot_prefix)
    removed = 0
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:  # no /dev/shm to scan (not Linux): owners unlink their own
        return 0
    for entry in names:
        semaphore = entry.startswith("sem.")
        name = entry[len("sem."):] if semaphore else entry
        if name.startswith(prefix):
            try:
                if semaphore:
                    posix_ipc.unlink_semaphore("/" + name)
                else:
                    posix_ipc.unlink_shared_memory("/" + name)
                removed += 1
            except posix_ipc.ExistentialError:
                pass
    return removed
