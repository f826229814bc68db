"""The one way Synkhronos waits on something that cannot wake it: poll alone for
a moment (a short wait, say a tiny call's outputs, should not pay for a sleep),
then keep polling with a short sleep between polls, calling a hook each time so
that a failure elsewhere (a worker that died or raised) is noticed instead of
waited on.

Command channels wait differently: they can block in the kernel (``_wire.channel``).
"""

import time

__all__ = ["poll_until", "wait_requests", "POLL_ALONE_S", "POLL_SLEEP_S"]

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
