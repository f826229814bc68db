"""The master's command engine: sends each command to the workers, runs the
master's own share meanwhile and reads the replies (see ``_wire.protocol``), and turns
what goes wrong on the way into exceptions: a worker's error (``WorkerError``
with its rank and traceback), a worker that died, a worker past the session's
timeout (``StallError`` with every silent rank's stack; the last two are
``_session.failures``'s).  A failure that leaves the ranks out of step calls
``on_failure`` (the session closes)."""

import logging
import time

from .._common.waiting import WorkerSpin
from .._wire.protocol import COMMAND_OF, wire
from ..exceptions import WorkerError
from .failures import check_alive, raise_death, raise_stall

__all__ = ["Dispatcher"]

_MAX_OWED = 64  # posted commands a worker may be behind before post() waits for a reply
_DEATH_CHECK_S = 0.1  # while waiting for one worker, how often to check that none died (a wake-up
# costs microseconds; a death is then reported within a tenth of a second)

logger = logging.getLogger(__name__)


def _take_all(queue):
    """Empty ``queue`` (a deque that ``Data.__del__`` may append to from another
    thread meanwhile) into a list: each popleft is atomic, so nothing is lost."""
    items = []
    while queue:
        items.append(queue.popleft())
    return items


class _InterruptCloses:
    """A context in which Ctrl-C breaks the session: while the master talks to
    the workers, replies may still be in flight, so the channels cannot be
    trusted any more.  A class made once, not a generator per use: every call and
    collective enters it."""

    __slots__ = ("dispatcher",)

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is KeyboardInterrupt:
            self.dispatcher.on_failure()
        return False


class Dispatcher:
    """Sends commands to the workers and reads their replies.

    Parameters
    ----------
    guard : callable
        Raises when the session may not be driven now (closed, another
        process); called before anything is sent.
    on_failure : callable
        Closes the session after a failure that leaves the ranks out of step.
    timeout : float or None
        Seconds a worker may take to answer (None: no limit).

    Attributes
    ----------
    workers : dict
        rank -> ``_session.launch.WorkerHandle``.
    action : str or None
        The public call under way, which names its commands in errors.
    tmpdir : str or None
        The workers' temporary directory (their crash stacks are there).
    spin : _common.waiting.WorkerSpin
        How long the workers poll between commands (sent with each).
    """

    def __init__(self, guard, on_failure, timeout=None):
        self.guard = guard
        self.on_failure = on_failure
        self.timeout = timeout
        self.workers = {}
        self.action = None
        self.tmpdir = None
        self.spin = WorkerSpin(0.0, fixed=True)  # (the runtime sets the session's)
        self._interrupt_closes = _InterruptCloses(self)

    # ------------------------------------------------------------- public
    def request(self, message, ranks=None, local=None):
        """One round trip: send ``message`` to workers, run ``local()`` here, collect.

        Replies still owed for earlier ``post()`` commands are read first, so a
        failure there is raised here, before anything new runs.

        Parameters
        ----------
        message : payload record or dict
            One record of ``_wire.protocol`` for all, or a dict rank -> record
            (``ranks`` defaults to its keys then).
        ranks : list of int, optional
            Worker ranks to ask (default: all workers).
        local : callable, optional
            The master's own share, run while the workers work.

        Returns
        -------
        (local_result, replies)
            ``replies`` maps rank -> result.

        Raises
        ------
        WorkerError
            If a worker raised (the lowest such rank is reported) or died.
        StallError
            If a worker did not answer within ``timeout`` seconds.
        """
        self.guard()
        with self._interrupt_closes:
            self._settle()
            return self._round_trip(message, ranks, local)

    def post(self, message, ranks=None, local=None, binding=True):
        """Send ``message`` to workers and run ``local()`` here without waiting
        for the workers' replies: they are read by the next ``request()`` or
        ``settle()``, which raise any failure then.  For device work that the
        ranks only queue (device collectives, function calls without results):
        the device orders it, so no barrier is needed.  Arguments as for
        ``request``; returns ``local()``'s result.

        If ``local()`` raises and the command is ``binding`` (a collective), the
        session is closed: the workers are already committed to a collective
        that the master will not join.  Otherwise the error is raised as it is.
        """
        self.guard()
        with self._interrupt_closes:
            ranks = self._ranks_for(message, ranks)
            for r in ranks:
                w = self.workers[r]
                if len(w.owed) >= _MAX_OWED:
                    self._read_owed(w)
            _, dead = self._deliver(message, ranks, posted=True)
            if dead is not None:
                raise_death(self, dead)
            if local is None:
                return None
            if not binding:
                return local()
            try:
                return local()
            except Exception:
                self.on_failure()
                raise

    def settle(self):
        """Read every reply still owed for posted commands; raise the first failure."""
        self.guard()
        with self._interrupt_closes:
            self._settle()

    def check_posted(self):
        """Read owed replies that have already arrived, without waiting; raise a
        failure at once (closing the session, whose devices may now be stuck in
        a collective), and a ``StallError`` if a worker is past its timeout.
        For the master to call while it waits on its device."""
        for w in self.workers.values():
            while w.owed and w.channel.ready():
                try:
                    self._read_owed(w)
                except WorkerError:
                    self.on_failure()
                    raise
        check_alive(self)
        if self.timeout is not None:
            now = time.monotonic()
            if any(w.busy and now - w.since >= self.timeout for w in self.workers.values()):
                raise_stall(self)

    # ------------------------------------------------------------ replies
    def _settle(self):
        """Read every owed reply; then raise the failure of the lowest rank, if any."""
        failure = None
        for w in self.workers.values():
            while w.owed:
                try:
                    self._read_owed(w)
                except WorkerError as exc:
                    if exc.exc_type in ("WorkerDied", "Stall"):
                        raise
                    if failure is None or exc.rank < failure.rank:
                        failure = exc
        if failure is not None:
            raise failure

    def _read_owed(self, w):
        """Read worker ``w``'s oldest owed reply; raise WorkerError if it failed."""
        try:
            (okay, result), label = self._reply(w)
        except (EOFError, OSError):
            raise_death(self, w.rank)
        if not okay:
            exc_type, message, tb = result
            raise WorkerError(w.rank, exc_type, "%s (during an earlier %s, which returned before "
                              "the workers finished it)" % (message, label), tb)

    def _reply(self, w):
        """Worker ``w``'s next reply and the label of its command; raises
        ``StallError`` once ``w`` is past the timeout, and EOFError or OSError
        when it died."""
        # Waits in slices, checking meanwhile that no other rank died: a rank may be
        # stuck in a collective with a dead one and never answer.
        while True:
            left = None if self.timeout is None else w.since + self.timeout - time.monotonic()
            if w.channel.wait(_DEATH_CHECK_S if left is None else min(left, _DEATH_CHECK_S)):
                break
            check_alive(self)
            if left is not None and left <= _DEATH_CHECK_S:
                raise_stall(self)
        msg = w.channel.recv()
        if w.owed:  # replies come in the order of the commands: posted ones first
            label = w.owed.popleft()
        else:
            label, w.asked = w.asked, None
        if w.busy:
            w.since = time.monotonic()
        return msg, label

    def _round_trip(self, message, ranks, local):
        sent, dead = self._deliver(message, self._ranks_for(message, ranks))
        local_result, local_exc = None, None
        if local is not None:
            try:
                local_result = local()
            except Exception as exc:  # re-raised once the workers have answered
                local_exc = exc
        replies, failures = {}, []
        for r in sent:
            try:
                (okay, result), _ = self._reply(self.workers[r])
            except (EOFError, OSError):
                dead = r if dead is None else min(dead, r)
                continue
            if okay:
                replies[r] = result
            else:
                failures.append((r, result))
        self.spin.replied()
        if dead is not None:
            raise_death(self, dead)
        if local_exc is not None:
            raise local_exc
        if failures:
            rank, (exc_type, message, tb) = min(failures, key=lambda f: f[0])
            raise WorkerError(rank, exc_type, message, tb)
        return local_result, replies

    # ------------------------------------------------------------ sending
    def _ranks_for(self, message, ranks):
        """The worker ranks a command goes to: ``ranks``, else the keys of a
        per-rank ``message``, else every worker."""
        if ranks is not None:
            return ranks
        return sorted(message) if isinstance(message, dict) else sorted(self.workers)

    def _deliver(self, message, ranks, posted=False):
        per_rank = isinstance(message, dict)
        if not ranks:
            return [], None
        if self.action is not None:
            label = self.action
        else:
            label = COMMAND_OF[type(message[ranks[0]] if per_rank else message)].name.lower()
        shared = None if per_rank else wire(message)  # one message for all: made once
        spin = self.spin.next()
        now = time.monotonic()
        sent = []
        dead = None
        for r in ranks:
            w = self.workers[r]
            number, fields, _ = wire(message[r]) if per_rank else shared
            drops = _take_all(w.pending_drops)
            try:
                w.channel.send((number, fields, drops, spin))
            except OSError:
                dead = r if dead is None else min(dead, r)
                continue
            sent.append(r)
            if not w.busy:
                w.since = now
            if posted:
                w.owed.append(label)
            else:
                w.asked = label
        return sent, dead

    def forget_segment(self, name):
        """A Data segment was released in the master without a round trip (the
        object was garbage-collected): workers unmap it with their next command."""
        for w in self.workers.values():
            w.pending_drops.append(name)
