"""When callers that ask again and again are expected back.

Chains ask for one evaluation after another.  A run that could hold the points
of several chains waits a little for those served by the run before it: each
caller's time from its result to its next request is measured (a moving
average), and one that is expected back within ``linger`` times the last run's
time is waited for, until it asks, or the linger is over, or it is late (four
times its usual time: a chain's steps that end a draw take longer than the
rest, and waiting for such a step cost less than a run without it).  A caller
that thinks longer is not waited for, and one that has stopped costs one short
wait.  ``Returns`` keeps those times; ``pymc._batch.Batcher`` (threads of this
process) and ``_session.child_service`` (child processes) wait by it.
"""

__all__ = ["Returns", "LINGER_CAP_S"]

LINGER_CAP_S = 0.02  # never wait longer than this for a caller, whatever a run takes
_CALLERS_KEPT = 256
_LATE = 4.0  # a caller not back within this many times its usual time is not waited for


class Returns:
    """Callers' return times; not thread-safe (hold the owner's lock).

    ``linger``: the fraction of the last run's time that a run may wait for the
    last run's callers (0: never waits)."""

    def __init__(self, linger=0.0):
        self.linger = linger
        self._last_callers = frozenset()
        self._last_run_s = 0.0
        self._released = {}  # caller -> when its last result was handed back
        self._think_s = {}  # caller -> its time from a result to its next request (moving average)

    def arrived(self, caller, now):
        """``caller`` asks again at ``now`` (``time.monotonic()``)."""
        released = self._released.pop(caller, None)
        if released is not None:
            took = now - released
            before = self._think_s.get(caller)
            self._think_s[caller] = took if before is None else 0.7 * before + 0.3 * took

    def released(self, callers, started, now, waiting=()):
        """A run that began at ``started`` handed its results to ``callers`` at
        ``now``; ``waiting``: callers with requests pending (kept in mind)."""
        self._last_callers = frozenset(callers)
        self._last_run_s = now - started
        self._released.update((c, now) for c in self._last_callers)
        if len(self._released) + len(self._think_s) > _CALLERS_KEPT:  # threads come and go
            kept = self._last_callers.union(waiting)
            self._released = {c: t for c, t in self._released.items() if c in kept}
            self._think_s = {c: t for c, t in self._think_s.items() if c in kept}

    def expected(self, now):
        """``(callers, until)``: the last run's callers expected back before the
        linger ends, and when to stop waiting for them."""
        deadline = now + min(self.linger * self._last_run_s, LINGER_CAP_S)
        due = {c: self._released[c] + self._think_s[c] for c in self._last_callers
               if c in self._released and c in self._think_s}
        expected = {c for c, t in due.items() if t <= deadline}
        late = max((self._released[c] + _LATE * self._think_s[c] for c in expected), default=now)
        return expected, min(deadline, late)
