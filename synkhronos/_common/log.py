"""Synkhronos' status messages, through the ``logging`` module.

Every module logs to a logger under ``synkhronos`` (``synkhronos._api``,
``synkhronos._session.runtime``, ...).  Out of the box the ``synkhronos`` logger is at
INFO and writes plain messages to stderr, so the status lines of ``fork()`` and
``distribute()`` show as they always did.  The usual ``logging`` calls control
them::

    logging.getLogger("synkhronos").setLevel(logging.WARNING)   # quiet
    logging.getLogger("synkhronos").setLevel(logging.DEBUG)     # diagnose

The environment variable ``SYNKHRONOS_LOG_LEVEL`` (a level name such as
``WARNING``, or a number) sets the level when Synkhronos is imported.

The default handler steps aside once the application configures logging
itself: it emits a record only while no other handler would receive it (none
on the root logger, say from ``logging.basicConfig()``, and none on the
``synkhronos`` loggers), so no line is printed twice.

Worker processes log to their own stderr, at the level the master's
``synkhronos`` logger had when ``fork()`` started them.

``SYNKHRONOS_COMPILE_NOTICE_S`` (seconds, default 2) is how long the first call
of a function that Numba or JAX compiles when first called may run before
Synkhronos says that it is compiling (0: say it at once, on every such call).
"""

import logging
import os
import sys
import threading
import time

from .env import env_nonnegative

__all__ = ["LOGGER_NAME", "LEVEL_ENV", "NOTICE_ENV", "parse_level", "configure", "worker_level",
           "set_level", "compile_notice", "CompileNotice"]

LOGGER_NAME = "synkhronos"
LEVEL_ENV = "SYNKHRONOS_LOG_LEVEL"
NOTICE_ENV = "SYNKHRONOS_COMPILE_NOTICE_S"
_DEFAULT_NOTICE_S = 2.0

logger = logging.getLogger(__name__)


def parse_level(text, source=LEVEL_ENV):
    """The logging level named by ``text``: a level name (any case) or an integer.

    Raises
    ------
    ValueError
        If ``text`` names no level; the message names ``source`` and the value.
    """
    value = text.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    level = logging.getLevelName(value.upper())
    if not isinstance(level, int):
        raise ValueError("%s=%r is not a logging level: use a name such as DEBUG, INFO, WARNING, "
                         "ERROR, CRITICAL, or a number" % (source, text))
    return level


class _StepAside(logging.Filter):
    """Pass a record only while no other handler would receive it: none on the
    loggers it propagates through (the application's own), root included."""

    def filter(self, record):
        log = logging.getLogger(record.name)
        while log is not None:
            for handler in log.handlers:
                # A handler carrying this filter is ours, or a copy of ours (as
                # tqdm's logging_redirect_tqdm makes): it does not count.
                if self not in handler.filters:
                    return False
            if not log.propagate:
                break
            log = log.parent
        return True


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (so that
    redirections made after import, as pytest's, apply)."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler.setStream; stderr it stays
        pass


def configure():
    """Give the ``synkhronos`` logger its defaults (once per process): the
    level from ``SYNKHRONOS_LOG_LEVEL``, else INFO unless the application set
    one, and a stderr handler that steps aside for the application's handlers.

    Raises
    ------
    ValueError
        If ``SYNKHRONOS_LOG_LEVEL`` is set to something that is not a level.
    """
    top = logging.getLogger(LOGGER_NAME)
    # Raised, not warned about and ignored: a misspelt level would otherwise
    # leave the user wondering why the setting has no effect, and the error
    # names the variable and its value, so the fix is plain.
    text = os.environ.get(LEVEL_ENV)
    if text is not None and text.strip():
        top.setLevel(parse_level(text))
    elif top.level == logging.NOTSET:
        top.setLevel(logging.INFO)
    if not any(isinstance(h, _StderrHandler) for h in top.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_StepAside())
        top.addHandler(handler)


def worker_level():
    """The level for worker processes: the master's effective level of the
    ``synkhronos`` logger, raised above whatever ``logging.disable`` disabled."""
    level = logging.getLogger(LOGGER_NAME).getEffectiveLevel()
    disabled = logging.root.manager.disable
    return max(level, disabled + 1) if disabled else level


def set_level(level):
    """Set the level of the ``synkhronos`` logger (a worker, from its master)."""
    logging.getLogger(LOGGER_NAME).setLevel(level)


def _notice_delay():
    return env_nonnegative(NOTICE_ENV, _DEFAULT_NOTICE_S, "seconds")


def _numba_note():
    import pytensor

    return ("Numba: can take a minute on a cold cache; later runs reuse PyTensor's cache in %s"
            % pytensor.config.base_compiledir)


# Linkers that compile a function on its first call (PyTensor's C linker compiles
# when ``synkhronos.function`` builds it): what the notice says about each.
_JIT_NOTES = {
    "NumbaLinker": _numba_note,
    "JAXLinker": lambda: "JAX: traced and compiled by XLA for each new set of input shapes",
}


def compile_notice(label, fn, n_ranks, when="on its first call"):
    """A started ``CompileNotice`` for the first call of PyTensor function
    ``fn`` (or ``when`` else it compiles), or None if its linker does not
    compile on a first call."""
    note = _JIT_NOTES.get(type(fn.maker.linker).__name__)
    return None if note is None else CompileNotice(label, note, n_ranks, when)


class CompileNotice:
    """Says, for the first call of a function, that it is compiling, once it has
    taken longer than ``SYNKHRONOS_COMPILE_NOTICE_S`` seconds, and then how long
    it took.  A first call that finishes sooner (a warm cache) says nothing.

    Only first calls make one, so the timer thread costs nothing per call.

    Parameters
    ----------
    label : str
        The function, as the messages name it.
    note : callable
        Returns what the message says about the compiler, in parentheses.
    n_ranks : int
    when : str, optional
        When it compiles, as the message says (default: on its first call).
    """

    def __init__(self, label, note, n_ranks, when="on its first call"):
        self._label = label
        self._when = when
        self._note = note
        self._n = n_ranks
        self._lock = threading.Lock()
        self._said = False
        self._done = False
        self._timer = None
        self._t0 = time.monotonic()
        if not logger.isEnabledFor(logging.INFO):
            self._done = True
            return
        delay = _notice_delay()
        if delay <= 0:
            self._say()
        else:
            self._timer = threading.Timer(delay, self._say)
            self._timer.daemon = True
            self._timer.start()

    def _say(self):
        # Under the lock, so that the closing message cannot come first.
        with self._lock:
            if self._done:
                return
            self._said = True
            logger.info("Synkhronos: compiling %s %s, on %d rank%s (%s)...", self._label, self._when,
                        self._n, "" if self._n == 1 else "s", self._note())

    def close(self, failed=False):
        """The call is over (``failed``: it raised): cancel the pending message,
        or say how long it took."""
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self._done:
                return
            self._done = True
            if self._said:
                logger.info("...%s %s after %.0f s." if failed else "...%s %s in %.0f s.", self._label,
                            "failed" if failed else "compiled", time.monotonic() - self._t0)
