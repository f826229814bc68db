"""Exceptions raised by Synkhronos.

Besides these, Synkhronos raises the built-in exceptions the API reference names:
``RuntimeError`` for calls in the wrong state (before ``fork()`` or
``distribute()``, after ``close()``), ``TypeError`` for malformed arguments and
``ValueError`` for arguments of the right type but a bad value.

Both classes pickle and unpickle to the same type, message and attributes, so
that they reach a parent process intact when ``multiprocessing``, PyMC, joblib
or ``concurrent.futures`` send a child's exception back.
"""

__all__ = ["WorkerError", "StallError"]


class WorkerError(RuntimeError):
    """An exception raised inside a worker process, re-raised in the master.

    Attributes
    ----------
    rank : int
        Rank of the worker that failed.
    exc_type : str
        Name of the exception type raised in the worker (``"ValueError"``, ...),
        ``"WorkerDied"`` when the worker process exited, or ``"Stall"`` for a
        ``StallError``.
    message : str
        What the worker's exception said (without rank and traceback).
    worker_traceback : str
        The worker's formatted traceback (empty when the process died, unless
        it crashed and left a Python stack behind).
    """

    def __init__(self, rank, exc_type, message, worker_traceback=""):
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.worker_traceback = worker_traceback
        text = "%s in worker rank %d: %s" % (exc_type, rank, message)
        if worker_traceback:
            text += "\n\nWorker traceback (rank %d):\n%s" % (rank, worker_traceback.rstrip())
        super().__init__(text)

    def __reduce__(self):
        # Exception's own reduce would call __init__ with the formatted text alone.
        return type(self), (self.rank, self.exc_type, self.message, self.worker_traceback), self.__dict__


class StallError(WorkerError):
    """Worker ranks did not answer within ``fork(timeout=...)`` seconds.

    The session is closed before this is raised (the stuck workers are
    killed); ``fork()`` may start a new one.

    Attributes
    ----------
    ranks : list of int
        The ranks that did not answer, lowest first (``rank`` is the first).
    command : str
        What the first of them was asked to do (``"call of function 'train'"``,
        ``"all_reduce"``, ...); ``commands`` has it for each rank.
    commands : dict
        rank -> what that rank was asked to do.
    timeout : float
        The timeout that passed, in seconds.
    stacks : dict
        rank -> the Python stack of every thread of that worker when it was
        found stuck (as ``faulthandler`` prints it), or a line saying why
        none could be taken.
    waited : dict
        rank -> seconds that rank had been silent when it was given up on.
    """

    def __init__(self, ranks, commands, timeout, stacks, waited):
        self.ranks = sorted(ranks)
        self.waited = {r: waited[r] for r in self.ranks}
        self.commands = {r: commands[r] for r in self.ranks}
        self.command = self.commands[self.ranks[0]]
        self.timeout = timeout
        self.stacks = {r: stacks[r] for r in self.ranks}
        plural = len(self.ranks) > 1
        head = ("rank%s %s did not answer %s within %g s (fork(timeout=%g)), so the session was "
                "closed. If the work legitimately takes longer, give fork() a longer timeout, or "
                "timeout=None." % ("s" if plural else "", ", ".join(str(r) for r in self.ranks),
                                   self.command, timeout, timeout))
        parts = [head]
        for r in self.ranks:
            parts.append("Rank %d, silent for %.1f s on %s; its Python stack:\n%s"
                         % (r, waited[r], self.commands[r], self.stacks[r].rstrip()))
        WorkerError.__init__(self, self.ranks[0], "Stall", "\n\n".join(parts))

    def __reduce__(self):
        return (type(self), (self.ranks, self.commands, self.timeout, self.stacks, self.waited),
                self.__dict__)
