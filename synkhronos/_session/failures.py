"""What the master does when a worker fails without a reply saying so: a worker
process that died (``WorkerError`` with its exit code and crash stack) and
workers past the session's timeout (``StallError`` with each silent rank's
stack).  Both close the session first (``Dispatcher.on_failure``): the ranks
are out of step.  A worker's own exception comes back as a reply, which
``_session.dispatch`` raises."""

import subprocess
import time

from ..exceptions import StallError, WorkerError
from . import stacks

__all__ = ["check_alive", "raise_death", "raise_stall"]


def check_alive(dispatcher):
    """Raise WorkerError for the lowest rank whose process has died."""
    for w in dispatcher.workers.values():
        if w.channel.hung_up() and not w.channel.ready():
            raise_death(dispatcher, w.rank)


def raise_death(dispatcher, rank):
    """Close the session and raise WorkerError for worker ``rank``, whose
    channel closed: it died."""
    w = dispatcher.workers[rank]
    code = stack = None
    if w.process is not None:
        try:  # its channel closed, so it is exiting: let it finish, for the exit code
            code = w.process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        stack = stacks.crash_stack(dispatcher.tmpdir, rank)
    dispatcher.on_failure()
    how = "" if w.process is None else " (exit code %s)" % code  # an MPI rank's is the launcher's
    raise WorkerError(rank, "WorkerDied", "worker process on %s exited unexpectedly%s; "
                      "Synkhronos has been closed" % (w.where, how), stack)


def raise_stall(dispatcher):
    """Close the session and raise StallError for every worker that is past
    the timeout without a reply (none: return, a reply has just come)."""
    now = time.monotonic()
    timeout = dispatcher.timeout
    stuck = {r: w for r, w in dispatcher.workers.items()
             if w.busy and now - w.since >= timeout and not w.channel.ready()}
    if not stuck:
        return
    labels = {r: (w.owed[0] if w.owed else w.asked) for r, w in stuck.items()}
    waited = {r: now - w.since for r, w in stuck.items()}
    taken = stacks.take({r: w.process.pid for r, w in stuck.items() if w.process is not None},
                        dispatcher.tmpdir)
    dispatcher.on_failure()
    raise StallError(stuck, labels, timeout, taken, waited)
