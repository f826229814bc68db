"""Several chains' evaluations in one pass over the rows.

Chains ask for the log-density at their points independently: nutpie's chains
from threads of this process, PyMC's from processes of their own (through the
session's service, whose threads then ask here).  ``Batcher`` lets whoever asks
while no evaluation runs take every point pending at that moment and evaluate
them in one call of the ranks, each rank reading its rows once for all of them;
the others wait for their results.  It never waits for a chain that has nothing
pending: a point asked for alone is evaluated alone, at once.
"""

import collections
import threading

__all__ = ["Batcher"]


class _Request:
    __slots__ = ("point", "result", "error", "done")

    def __init__(self, point):
        self.point = point
        self.result = self.error = None
        self.done = False


class Batcher:
    """``evaluate(point)`` from any thread; ``run(points) -> results`` (one per
    point, in order) is called with every point pending, one call at a time.

    An exception raised by ``run`` is raised to every caller whose point was in
    that call; later calls go on (unless it closed the session)."""

    def __init__(self, run):
        self._run = run
        self._cond = threading.Condition()
        self._pending = []
        self._busy = False
        self.sizes = collections.Counter()  # points in one run -> runs (read by tests and benchmarks)

    def evaluate(self, point):
        request = _Request(point)
        with self._cond:
            self._pending.append(request)
            while self._busy and not request.done:
                self._cond.wait()
            if not request.done:  # nothing runs: take every pending point
                self._busy = True
                batch, self._pending = self._pending, []
        if not request.done:
            self._lead(batch)
        if request.error is not None:
            raise request.error
        return request.result

    def _lead(self, batch):
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
                for r in batch:
                    r.done = True
                self._busy = False
                self._cond.notify_all()
