"""Exceptions raised by Synkhronos.

Besides these, Synkhronos raises the built-in exceptions the API reference names:
``RuntimeError`` for calls in the wrong state (before ``fork()`` or
``distribute()``, after ``close()``), ``TypeError`` for malformed arguments and
``ValueError`` for arguments of the right type but a bad value.
"""

__all__ = ["WorkerError"]


class WorkerError(RuntimeError):
    """An exception raised inside a worker process, re-raised in the master.

    Attributes
    ----------
    rank : int
        Rank of the worker that failed.
    exc_type : str
        Name of the exception type raised in the worker (``"ValueError"``, ...),
        or ``"WorkerDied"`` when the worker process exited.
    worker_traceback : str
        The worker's formatted traceback (empty when the process died).
    """

    def __init__(self, rank, exc_type, message, worker_traceback=""):
        self.rank = rank
        self.exc_type = exc_type
        self.worker_traceback = worker_traceback
        text = "%s in worker rank %d: %s" % (exc_type, rank, message)
        if worker_traceback:
            text += "\n\nWorker traceback (rank %d):\n%s" % (rank, worker_traceback.rstrip())
        super().__init__(text)
