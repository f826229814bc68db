"""Helpers shared by the failure, fault and cleanup tests: processes, /dev/shm and
the session's temporary directory."""

import os
import re
import tempfile
import time

__all__ = ["distribute_unhurried", "SHM_DIR", "segments", "session_names", "proc_stat", "proc_exists",
           "proc_parent", "worker_children", "our_segments", "session_segments", "orphaned_segments",
           "new_orphans", "orphaned_tmpdirs", "our_tmpdirs", "socket_inodes", "Leftovers"]

SHM_DIR = "/dev/shm"


def _listing(path):
    return set(os.listdir(path)) if os.path.isdir(path) else set()


# What earlier processes left: a name there that starts with this process's pid is
# another's (pids are reused), not this process's doing.
_LEFT_BEFORE = _listing(SHM_DIR) | _listing(tempfile.gettempdir())


def distribute_unhurried():
    """``synk.distribute()`` with the session's stall timeout lifted for it: a
    worker's first distribute waits for its PyTensor import, which takes seconds on
    PyTensor 2 (it imports scipy.signal), past these tests' one-second timeouts."""
    import synkhronos as synk
    from synkhronos._session import runtime

    dispatcher = runtime.current().dispatcher
    timeout, dispatcher.timeout = dispatcher.timeout, None
    try:
        synk.distribute()
    finally:
        dispatcher.timeout = timeout


def segments(token):
    """Shared-memory segments and semaphores (``sem.`` names) of session ``token``."""
    prefix = "synk_%s_" % token
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix) or n.startswith("sem." + prefix))


def session_names(pid):
    """The pattern of the segment and semaphore names of every session that
    process ``pid`` started (a session's token begins with its master's pid)."""
    return re.compile(r"(sem\.)?synk_%d[0-9a-f]{32}_" % pid)


def our_segments():
    """Shared-memory segments and semaphores of any session started by this process."""
    pattern = session_names(os.getpid())
    return sorted(n for n in os.listdir(SHM_DIR) if pattern.match(n) and n not in _LEFT_BEFORE)


def session_segments():
    """``{name: pid of the session's master}`` of every session's segment and
    semaphore on this machine."""
    if not os.path.isdir(SHM_DIR):
        return {}
    pattern = re.compile(r"(sem\.)?synk_(\d+)[0-9a-f]{32}_")
    return {name: int(m.group(2)) for name in os.listdir(SHM_DIR) for m in [pattern.match(name)] if m}


def orphaned_segments():
    """Segments and semaphores of any session whose master process is gone: what
    finished runs left behind.  Live sessions of other processes (another worker
    of a parallel test run) are not counted."""
    return {name for name, pid in session_segments().items() if proc_stat(pid) is None}


def orphaned_tmpdirs():
    """Session temporary directories (named by the pid of the process that made
    them: a master, or an MPI rank) whose maker is gone, made since this process
    started: what a session that broke left, unless its other processes removed it."""
    pattern = re.compile(r"synkhronos_(\d+)_")
    return {n for n in os.listdir(tempfile.gettempdir()) for m in [pattern.match(n)]
            if m and n not in _LEFT_BEFORE and proc_stat(int(m.group(1))) is None}


def new_orphans(before, grace_s=15.0):
    """Orphaned segments (``orphaned_segments``) and temporary directories
    (``orphaned_tmpdirs``) not in ``before`` (take it with
    ``session_segments``: a segment left long ago by a process whose pid a live
    process has since taken is no orphan then, and becomes one when that process
    ends) that are still there after up to ``grace_s`` seconds: what a finished
    run leaked.  When a
    master dies its workers remove the session on their next look (``worker.
    _watch_master``): a session that a test running beside this one kills leaves
    orphans for that moment, which must not count here."""
    deadline = time.monotonic() + grace_s
    while True:
        left = (orphaned_segments() | orphaned_tmpdirs()) - set(before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def our_tmpdirs():
    """Session temporary directories made by this process."""
    prefix = "synkhronos_%d_" % os.getpid()
    names = os.listdir(tempfile.gettempdir())
    return sorted(n for n in names if n.startswith(prefix) and n not in _LEFT_BEFORE)


def _stat_fields(pid):
    """The fields of ``/proc/<pid>/stat`` after the command name (state first,
    then the parent's pid), or None if there is no such process."""
    try:
        with open("/proc/%s/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def proc_stat(pid):
    """(state, start time) of process ``pid``, or None if there is no such process."""
    fields = _stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[19]))


def proc_parent(pid):
    """The parent's pid of process ``pid``, or None if there is no such process."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def proc_exists(pid, start):
    """Whether that very process (pid and start time) still exists, even as an
    unreaped zombie."""
    st = proc_stat(pid)
    return st is not None and st[1] == start


def worker_children():
    """Live worker processes of this process: its children that run a
    Synkhronos worker, and the children of its template processes (which fork
    its CPU workers; the templates themselves live on between sessions)."""
    from synkhronos._session import template

    templates = {str(pid) for pid in template.pids()}
    parents = {str(os.getpid())} | templates
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry in templates:
            continue
        fields = _stat_fields(entry)
        if fields is None or fields[1] not in parents or fields[0] == "Z":
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if b"synkhronos._session.worker" in cmdline:
            found.append(int(entry))
    return found


def socket_inodes(pid):
    """Inodes of the sockets process ``pid`` has open."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


class Leftovers:
    """What a live session owns, to check that none of it outlives the session:
    its workers (pid and start time), shared-memory segments and temporary
    directory."""

    def __init__(self, rt):
        self.token = rt.token
        self.tmpdir = rt.tmpdir
        self.workers = {r: (w.process.pid, proc_stat(w.process.pid)[1]) for r, w in rt.workers.items()}

    def remaining(self):
        """A description of everything still there (empty when clean)."""
        left = []
        for rank, (pid, start) in self.workers.items():
            if proc_exists(pid, start):
                left.append("worker rank %d (pid %d)" % (rank, pid))
        left += ["segment %s" % n for n in segments(self.token)]
        if self.tmpdir is not None and os.path.exists(self.tmpdir):
            left.append("directory %s" % self.tmpdir)
        return left

    def assert_gone(self, wait=5.0):
        """Assert that the session is closed and, after up to ``wait`` seconds
        for killed processes to be reaped, that none of it remains."""
        from synkhronos._session import runtime

        assert runtime.current() is None
        deadline = time.monotonic() + wait
        while self.remaining() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.remaining() == []
        assert worker_children() == []
