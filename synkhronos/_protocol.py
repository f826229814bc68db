"""The command channel between the master and each worker.

Every action is one round trip: the master sends ``(Command, payload)`` to the
workers it needs, does its own share, then reads one reply from each.  A reply is
``(True, result)`` or ``(False, (exception type name, message, traceback))``.
Because the master always reads every reply it asked for, the channel never gets
out of step, and the round trip is the barrier that guards each action.  The one
exception is device work that the ranks only queue (NCCL collectives): the master
reads those replies later, before its next round trip, since the device itself
orders the work.
"""

import enum
import math
import os
import select
import time
import traceback

__all__ = ["Command", "Receiver", "ok", "failure", "spin_seconds", "env_nonnegative", "env_flag"]

# How long a process polls for the next message before it blocks: a process
# woken from sleep runs its first microseconds slowly, so a short poll makes
# back-to-back calls much faster, while an idle session still sleeps.  (Polling
# 3 ms instead of 100 us did not speed up a tiny call on 2 GPUs.)
SPIN_ENV = "SYNKHRONOS_SPIN_US"
SPIN_DEFAULT = 100e-6


def env_nonnegative(name, default, unit):
    """The non-negative, finite number in environment variable ``name``, or
    ``default`` when it is unset or blank; ``unit`` names the unit in the error.

    Raises
    ------
    ValueError
        If the variable is not a non-negative, finite number (the message names
        the variable and the value).
    """
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError("%s must be a non-negative number of %s, got %r" % (name, unit, text))
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_flag(name, default):
    """The boolean in environment variable ``name`` (1/0, true/false, yes/no,
    on/off, any case), or ``default`` when it is unset or blank.

    Raises
    ------
    ValueError
        For any other value (the message names the variable and the value).
    """
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError("%s must be 1 or 0 (or true/false, yes/no, on/off), got %r" % (name, text))
    return word in _TRUE


def spin_seconds():
    """Seconds to poll before blocking: ``$SYNKHRONOS_SPIN_US`` (microseconds)
    if set, else ``SPIN_DEFAULT``.  Read at ``fork()``; workers get the master's.

    Raises
    ------
    ValueError
        If the variable is not a non-negative number.
    """
    micros = env_nonnegative(SPIN_ENV, None, "microseconds")
    return SPIN_DEFAULT if micros is None else micros * 1e-6


class Command(enum.IntEnum):
    """What a worker is asked to do."""

    EXIT = 0
    DISTRIBUTE = 1  # unpickle all functions and shared variables
    CALL = 2  # run a function on this rank's share
    MAP_DATA = 3  # map (or re-map) a Data object's segment
    DROP_DATA = 4  # forget a Data object's segment
    SEND_SHAREDS = 5  # return values of shared variables
    SET_SHAREDS = 6  # overwrite values of shared variables
    GET_SHAPES = 7  # return shapes of shared variables
    NCCL_INIT = 8  # join the NCCL communicator (MPI's, for CPU ranks launched by MPI)
    NCCL = 9  # queue a device collective on shared variables
    SYNC = 10  # wait until this rank's device work is done
    HOST_DATA = 11  # (host leaders of other hosts) take a copy of a Data segment over MPI


def ok(result=None):
    return True, result


def failure(exc):
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return False, (type(exc).__name__, str(exc), tb)


class Receiver:
    """Reads the messages of one connection, polling for ``spin`` seconds before
    it blocks (a ``select.poll`` object made once: a poll costs ~0.6 us, where
    ``Connection.poll`` builds a selector each time, ~5 us).

    Parameters
    ----------
    conn : multiprocessing.connection.Connection
    spin : float
        Seconds to poll before blocking (see ``spin_seconds``).
    """

    def __init__(self, conn, spin):
        self.conn = conn
        self.spin = spin
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLIN)
        self._hup = None

    def hung_up(self):
        """Whether the other end has closed the connection (its process died),
        seen without reading anything that is still to be read."""
        if self._hup is None:
            self._hup = select.poll()
            self._hup.register(self.conn.fileno(), getattr(select, "POLLRDHUP", 0x2000))
        return bool(self._hup.poll(0))

    def ready(self, timeout=0.0):
        """Whether a message (or the end of the stream) can be read within
        ``timeout`` seconds (None: wait as long as it takes)."""
        ms = -1 if timeout is None else max(0, math.ceil(timeout * 1000))
        return bool(self._poll.poll(ms))

    def wait(self, timeout=None):
        """Poll for up to ``spin`` seconds, then block until a message can be read
        or ``timeout`` seconds (counted from now) have passed; returns whether
        one can be read."""
        if self.spin > 0 and not self.ready():
            start = time.perf_counter()
            deadline = start + self.spin
            while time.perf_counter() < deadline:
                if self.ready():
                    return True
            if timeout is not None:
                timeout -= time.perf_counter() - start
        return self.ready(timeout)

    def recv(self):
        """The next message, waiting as long as it takes."""
        self.wait()
        return self.conn.recv()
