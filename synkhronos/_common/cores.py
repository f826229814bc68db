"""The cores this process may use: those it may run on (its affinity), and no
more than the CPU time its cgroups allow (``docker run --cpus``, a Kubernetes
CPU limit), rounded up.

A container's limit does not hide the host's cores: affinity still names them
all, so counting them would start a rank per host core on two cores' worth of
time, their workers waiting in spin loops that use that time up.  The limit
is a cgroup's ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``,
cgroup v2) or ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (v1, -1 for
none), on the process's cgroup or any above it: the least one counts.
"""

import functools
import math
import os

__all__ = ["usable_cores", "cpu_quota"]


def usable_cores():
    """Cores this process may use (at least 1): its affinity as it is now (a
    rank narrows it for a moment to start JAX's pool), its CPU limit as it was
    first read (reading the cgroup files takes tens of microseconds, and a
    forked chain's service asks before each run)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    quota = _own_quota()
    return n if quota is None else max(1, min(n, math.ceil(quota - 1e-9)))


def cpu_quota(proc="/proc/self"):
    """CPUs' worth of time per period that this process's cgroups allow (the
    least along its cgroup's path), or None where none is set or nothing can
    be read.  ``proc``: where to read ``cgroup`` and ``mountinfo`` (tests)."""
    try:
        with open(os.path.join(proc, "cgroup")) as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f]
        with open(os.path.join(proc, "mountinfo")) as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    limits = []
    for fields in mounts:
        if "-" not in fields:
            continue
        root, point, kind = fields[3], fields[4], fields[fields.index("-") + 1]
        options = fields[-1].split(",")
        if kind == "cgroup2":
            path = next((g[2] for g in groups if g[0] == "0" and g[1] == ""), None)
            limits += _along(point, root, path, _v2)
        elif kind == "cgroup" and "cpu" in options:
            path = next((g[2] for g in groups if "cpu" in g[1].split(",")), None)
            limits += _along(point, root, path, _v1)
    return min(limits) if limits else None


_own_quota = functools.cache(cpu_quota)  # (this process's, read once)


def _along(point, root, path, read):
    """The limits ``read`` finds in the directories of cgroup ``path`` (as
    ``/proc/self/cgroup`` names it) under a mount of ``root`` at ``point``,
    from the process's own up to the mount's."""
    if path is None:
        return []
    root = root.rstrip("/")
    if root and (path + "/").startswith(root + "/"):  # the mount shows a cgroup above ours
        path = path[len(root):]
    elif root:  # a container's own cgroup mounted, named from outside: the mount is ours
        path = "/"
    found, here = [], os.path.join(point, path.lstrip("/")).rstrip("/")
    while True:
        limit = read(here)
        if limit is not None:
            found.append(limit)
        if len(here) <= len(point.rstrip("/")) or here == os.path.dirname(here):
            return found
        here = os.path.dirname(here)


def _v2(directory):
    fields = _read(os.path.join(directory, "cpu.max"))
    if fields is None or len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1(directory):
    quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read(os.path.join(directory, "cpu.cfs_period_us"))
    if not quota or not period:
        return None
    return _ratio(quota[0], period[0])


def _ratio(quota, period):
    try:
        quota, period = int(quota), int(period)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path):
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return None
