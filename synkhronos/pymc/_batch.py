"""Several chains' evaluations in one pass over the rows.

Chains ask for the log-density at their points independently: nutpie's chains
from threads of this process, PyMC's from processes of their own (through the
session's service, whose threads then ask here).  ``Batcher`` lets whoever asks
while no evaluation runs take every point pending at that moment and evaluate
them in one call of the ranks, each rank reading its rows once for all of them;
the others wait for their results.  A point asked for alone is evaluated alone,
at once.

Taking only what is pending splits K chains into groups that take turns: the
chains of one run ask again while the next run (the other group's) goes on,
so each run holds about K/2 points and every chain waits a whole run for
nothing.  With ``linger``, a run first waits for the callers of the run before
it that have not asked again yet but are expected to soon: each caller's time
from its result to its next point is measured, and one that is expected within
``linger`` times the last run's time is waited for, until it asks or is late
(half its usual time again).  So the groups merge; a chain that thinks longer
than that is not waited for, and one that has stopped costs one short wait.
"""

import collections
import threading
import time

__all__ = ["Batcher", "LINGER"]

LINGER = 0.5  # a batched evaluator's linger (see the docs page "PyMC" for what it measured)
LINGER_CAP_S = 0.02  # never wait longer than this for a chain, whatever a run takes
_CALLERS_KEPT = 256
_LATE = 1.5  # a chain not back within this many times its usual time is not waited for


class _Request:
    __slots__ = ("point", "caller", "result", "error", "done")

    def __init__(self, point):
        self.point = point
        self.caller = threading.get_ident()  # a chain: a thread here, or a child's service thread
        self.result = self.error = None
        self.done = False


class Batcher:
    """``evaluate(point)`` from any thread; ``run(points) -> results`` (one per
    point, in order) is called with every point pending, one call at a time.

    ``linger``: the fraction of the last run's time that a run waits for the
    last run's callers to ask again (0: never waits; see the module docstring).
    An exception raised by ``run`` is raised to every caller whose point was in
    that call; later calls go on (unless it closed the session)."""

    def __init__(self, run, linger=0.0):
        self._run = run
        self._linger = linger
        self._cond = threading.Condition()
        self._pending = []
        self._busy = False
        self._last_callers = frozenset()
        self._last_run_s = 0.0
        self._released = {}  # caller -> when its last result was handed back
        self._think_s = {}  # caller -> its time from a result to its next point (moving average)
        self.sizes = collections.Counter()  # points in one run -> runs (read by tests and benchmarks)
        self.lingered_s = 0.0  # time runs waited for chains, all told (read by tests and benchmarks)

    def evaluate(self, point):
        request = _Request(point)
        with self._cond:
            self._measure_think(request.caller)
            self._pending.append(request)
            self._cond.notify_all()  # a run waiting for this caller looks again
            while self._busy and not request.done:
                self._cond.wait()
            if not request.done:  # nothing runs: take every pending point
                self._busy = True
                self._wait_for_last_callers()
                batch, self._pending = self._pending, []
        if not request.done:
            self._lead(batch)
        if request.error is not None:
            raise request.error
        return request.result

    def _forget_callers_but(self, kept):
        self._released = {c: t for c, t in self._released.items() if c in kept}
        self._think_s = {c: t for c, t in self._think_s.items() if c in kept}

    def _measure_think(self, caller):
        released = self._released.pop(caller, None)
        if released is not None:
            took = time.monotonic() - released
            before = self._think_s.get(caller)
            self._think_s[caller] = took if before is None else 0.7 * before + 0.3 * took

    def _wait_for_last_callers(self):
        """(Holding the lock.)  Until every caller of the last run that is
        expected before the linger is over has a point pending, or is late
        (half its usual time again), or the linger is over."""
        start = time.monotonic()
        deadline = start + min(self._linger * self._last_run_s, LINGER_CAP_S)
        expected = {c: self._released[c] + _LATE * self._think_s[c] for c in self._last_callers
                    if c in self._released and c in self._think_s}
        expected = {c: t for c, t in expected.items() if t <= deadline}
        until = min(deadline, max(expected.values(), default=start))
        while expected:
            for r in self._pending:
                expected.pop(r.caller, None)
            left = until - time.monotonic()
            if not expected or left <= 0:
                break
            self._cond.wait(left)
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
                now = time.monotonic()
                self._last_callers = frozenset(r.caller for r in batch)
                self._last_run_s = now - start
                self._released.update((c, now) for c in self._last_callers)
                if len(self._released) + len(self._think_s) > _CALLERS_KEPT:  # threads come and go
                    self._forget_callers_but(self._last_callers.union(r.caller for r in self._pending))
                for r in batch:
                    r.done = True
                self._busy = False
                self._cond.notify_all()
