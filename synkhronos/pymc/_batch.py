"""Several chains' evaluations in one pass over the rows.

Chains ask for the log-density at their points independently: nutpie's chains
from threads of this process, PyMC's from processes of their own (through the
session's service, whose thread then asks here).  ``Batcher`` lets whoever asks
while no evaluation runs take every point pending at that moment and evaluate
them in one call of the ranks, each rank reading its rows once for all of them;
the others wait for their results.  A point asked for alone is evaluated alone,
at once.

Taking only what is pending splits K chains into groups that take turns: the
chains of one run ask again while the next run (the other group's) goes on,
so each run holds about K/2 points and every chain waits a whole run for
nothing.  With ``linger``, a run first waits for the callers of the run before
it that have not asked again yet but are expected to soon (``_common.returns``).
So the groups merge.  The session's service asks for all its children's
points at once (``evaluate_many``), having waited for them the same way.
"""

import collections
import threading
import time

from .._common.returns import Returns

__all__ = ["Batcher", "LINGER"]

LINGER = 0.5  # a batched evaluator's linger (see the docs page "PyMC" for what it measured)


class _Request:
    __slots__ = ("point", "caller", "result", "error", "done")

    def __init__(self, point, caller):
        self.point = point
        self.caller = caller
        self.result = self.error = None
        self.done = False


class Batcher:
    """``evaluate(point)`` or ``evaluate_many(points)`` from any thread;
    ``run(points) -> results`` (one per point, in order) is called with every
    point pending, one call at a time.

    ``linger``: the fraction of the last run's time that a run waits for the
    last run's callers to ask again (0: never waits; see the module docstring).
    An exception raised by ``run`` is raised to every caller whose point was in
    that call; later calls go on (unless it closed the session)."""

    def __init__(self, run, linger=0.0):
        self._run = run
        self._cond = threading.Condition()
        self._pending = []
        self._busy = False
        self._returns = Returns(linger)
        self.sizes = collections.Counter()  # points in one run -> runs (read by tests and benchmarks)
        self.lingered_s = 0.0  # time runs waited for chains, all told (read by tests and benchmarks)
        self.waits = 0  # runs that waited for a chain (read by tests: the scheduler adds no runs)

    def evaluate(self, point):
        return self.evaluate_many([point])[0]

    def evaluate_many(self, points):
        """The results at ``points``, all computed in one run (with any other
        caller's points pending then)."""
        caller = threading.get_ident()  # a chain: a thread here, or the service's for its children
        requests = [_Request(p, caller) for p in points]
        with self._cond:
            self._returns.arrived(caller, time.monotonic())
            self._pending += requests
            self._cond.notify_all()  # a run waiting for this caller looks again
            while self._busy and not requests[0].done:
                self._cond.wait()
            if not requests[0].done:  # nothing runs: take every pending point
                self._busy = True
                self._wait_for_last_callers()
                batch, self._pending = self._pending, []
        if not requests[0].done:
            self._lead(batch)
        for r in requests:
            if r.error is not None:
                raise r.error
        return [r.result for r in requests]

    def _wait_for_last_callers(self):
        """(Holding the lock.)  Until every caller of the last run that is
        expected back before the linger is over has a point pending, or is
        late, or the linger is over."""
        start = time.monotonic()
        expected, until = self._returns.expected(start)
        expected.difference_update(r.caller for r in self._pending)
        self.waits += bool(expected)
        while expected:
            left = until - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
            expected.difference_update(r.caller for r in self._pending)
        self.lingered_s += time.monotonic() - start

    def _lead(self, batch):
        start = time.monotonic()
        try:
            results = self._run([r.point for r in batch])
            if len(results) != len(batch):
                raise AssertionError("%d results for %d points" % (len(results), len(batch)))
            for r, res in zip(batch, results):
                r.result = res
        except BaseException as exc:
            for r in batch:
                r.error = exc
        finally:
            with self._cond:
                self.sizes[len(batch)] += 1
                self._returns.released({r.caller for r in batch}, start, time.monotonic(),
                                       {r.caller for r in self._pending})
                for r in batch:
                    r.done = True
                self._busy = False
                self._cond.notify_all()
