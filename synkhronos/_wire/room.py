"""Room in ``/dev/shm`` for a segment's bytes, taken before anything is
written there.

``/dev/shm`` is a tmpfs: a segment of any size is created at once, and its
pages are taken only as they are first written.  Where the tmpfs is full, or
smaller than the arrays (64 MB in a Docker container by default), that first
write kills the process with SIGBUS.  ``posix_fallocate`` takes the pages
ahead, and fails with ENOSPC instead, which ``reserve`` turns into an
``OSError`` that says what to do.  Taking the pages ahead costs no more than
taking them at the first write (they are taken once either way).
"""

import errno
import os

__all__ = ["reserve", "no_room", "SHM_DIR"]

SHM_DIR = "/dev/shm"


def reserve(fd, start, stop):
    """Take the pages of bytes ``[start, stop)`` of the segment open as ``fd``.
    Returns False where the file system cannot take them ahead (they then come
    at the first write, as without this).

    Raises
    ------
    OSError
        ENOSPC (``no_room``), where ``/dev/shm`` has no room for them.
    """
    if not hasattr(os, "posix_fallocate"):  # not Linux
        return False
    try:
        os.posix_fallocate(fd, start, stop - start)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.ENOMEM):
            return False
        raise no_room(stop - start) from None
    return True


def no_room(nbytes):
    """The error for ``nbytes`` that ``/dev/shm`` has no room for."""
    try:
        st = os.statvfs(SHM_DIR)
        free = "has %s free" % _size(st.f_bavail * st.f_frsize)
    except OSError:
        free = "is full"
    return OSError(errno.ENOSPC, "No space left on device: %s %s, and Synkhronos needs %s more shared "
                   "memory there; free Data you no longer need (Data.free_memory()), or enlarge %s "
                   "(in Docker: docker run --shm-size=...)" % (SHM_DIR, free, _size(nbytes), SHM_DIR))


def _size(nbytes):
    for unit in ("bytes", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return ("%d %s" if unit == "bytes" else "%.1f %s") % (nbytes, unit)
        nbytes /= 1000
