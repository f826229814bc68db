"""Helpers shared by the failure and cleanup tests: processes and /dev/shm."""

import os

__all__ = ["SHM_DIR", "segments", "proc_stat", "proc_exists"]

SHM_DIR = "/dev/shm"


def segments(token):
    """Shared-memory names of session ``token``."""
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith("synk_%s_" % token))


def proc_stat(pid):
    """(state, start time) of process ``pid``, or None if there is no such process."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def proc_exists(pid, start):
    """Whether that very process (pid and start time) still exists, even as an
    unreaped zombie."""
    st = proc_stat(pid)
    return st is not None and st[1] == start
