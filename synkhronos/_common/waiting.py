"""The one way Synkhronos waits on something that cannot wake it: poll alone for
a moment (a short wait, say a tiny call's outputs, should not pay for a sleep),
then keep polling with a short sleep between polls, calling a hook each time so
that a failure elsewhere (a worker that died or raised) is noticed instead of
waited on.

Command channels wait differently: they poll for a while, then block in the
kernel (``_wire.channel``); ``WorkerSpin`` is the master's rule for how long the
workers poll between its commands.
"""

import collections
import os
import time

__all__ = ["poll_until", "wait_requests", "WorkerSpin", "cores_crowded", "POLL_ALONE_S", "POLL_SLEEP_S",
           "SPIN_CAP_S"]

POLL_ALONE_S = 1e-3  # seconds of polling before the hook is first called
POLL_SLEEP_S = 20e-6  # sleep between polls after that


def poll_until(done, hook=None, deadline=None, alone_s=POLL_ALONE_S, sleep_s=POLL_SLEEP_S):
    """Call ``done()`` until it returns true.

    Parameters
    ----------
    done : callable
        Returns true once the wait is over.
    hook : callable, optional
        Called between polls once ``alone_s`` seconds have passed; it may raise
        to break off the wait.
    deadline : float, optional
        ``time.monotonic()`` value after which to give up.
    alone_s, sleep_s : float, optional
        Seconds of polling before the first hook call, and between polls after.

    Returns
    -------
    bool
        True when ``done()`` returned true, False at the deadline.
    """
    checks_from = time.perf_counter() + alone_s
    while not done():
        if deadline is not None and time.monotonic() > deadline:
            return False
        if time.perf_counter() > checks_from:
            if hook is not None:
                hook()
            time.sleep(sleep_s)
    return True


SPIN_CAP_S = 2e-3  # the longest a worker polls between commands where the master sees short gaps
_GAPS = 8  # the gaps between commands that the rule looks at
_CROWDED_EVERY_S = 0.5  # how often ``WorkerSpin`` asks whether the cores are crowded


class WorkerSpin:
    """How long the workers poll for their next command before they block.

    A worker that blocks is woken by the kernel when the command comes, which
    on a small virtual machine costs tens of microseconds on every call (and
    the first microseconds after are slow).  Calls spaced by a little more than
    the device's poll (``base``: 100 µs on CPU ranks) pay that every time: the
    master's own work between two calls (PyMC's between two evaluations) is
    about that long.  So where the master has seen short gaps between the end of
    one request and the next, the workers poll for twice the median of the last
    few, up to ``SPIN_CAP_S``; never less than ``base``.  Not where the cores
    are crowded (``crowded()``: a polling worker would take a core another
    process needs), nor where ``fixed`` (the user set ``$SYNKHRONOS_SPIN_US``).

    The master calls ``replied()`` once it has read a request's replies, and
    ``next()`` for the seconds to send with the next command.
    """

    def __init__(self, base, fixed=False, crowded=None, cap=SPIN_CAP_S):
        self.base = base
        self.fixed = fixed
        self.cap = cap
        self._crowded = crowded
        self._gaps = collections.deque(maxlen=_GAPS)
        self._since = None  # when the last request's replies were read
        self._crowded_at = -float("inf")
        self._was_crowded = False

    def replied(self):
        self._since = time.perf_counter()

    def next(self):
        """Seconds the workers poll after answering the command sent now."""
        if self._since is not None:
            self._gaps.append(time.perf_counter() - self._since)
            self._since = None
        if self.fixed or len(self._gaps) < _GAPS // 2:
            return self.base
        gap = sorted(self._gaps)[len(self._gaps) // 2]
        if 2 * gap > self.cap or 2 * gap <= self.base or self._is_crowded():
            return self.base
        return 2 * gap

    def _is_crowded(self):
        now = time.monotonic()
        if self._crowded is not None and now - self._crowded_at > _CROWDED_EVERY_S:
            self._crowded_at = now
            self._was_crowded = bool(self._crowded())
        return self._was_crowded


def cores_crowded(processes, cores):
    """Whether ``processes`` (this session's on this host: its ranks and the
    children it serves) outnumber ``cores``, or the host's load (runnable
    processes, averaged over the last minute) exceeds them by more than one
    (other sessions, say a test suite's processes at once)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # (no load average on this system)
        load = 0.0
    return processes > cores or load > cores + 1


# MPI requests whose wait was broken off (the hook raised).  mpi4py keeps a
# request's buffers alive only while the request object lives, and MPI may still
# write into them: they are kept for the life of the process.
_ABANDONED = []


def wait_requests(requests, hook=None):
    """Wait for mpi4py ``requests``; with ``hook``, through ``poll_until``
    (``Testall`` also drives MPI's progress, so polling is all MPI needs)."""
    from mpi4py import MPI

    if hook is None:
        MPI.Request.Waitall(requests)
        return
    try:
        poll_until(lambda: MPI.Request.Testall(requests), hook)
    except BaseException:
        _ABANDONED.append(requests)
        raise
