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
import os
import time
import traceback

__all__ = ["Command", "ok", "failure", "recv", "spin_seconds"]

# How long a process polls for the next message before it blocks: a process
# woken from sleep runs its first microseconds slowly, so a short poll makes
# back-to-back calls much faster, while an idle session still sleeps.  (Polling
# 3 ms instead of 100 us did not speed up a tiny call on 2 GPUs.)
SPIN_ENV = "SYNKHRONOS_SPIN_US"
SPIN_DEFAULT = 100e-6


def spin_seconds():
    """Seconds to poll before blocking: ``$SYNKHRONOS_SPIN_US`` (microseconds)
    if set, else ``SPIN_DEFAULT``.  Read at ``fork()``; workers get the master's.

    Raises
    ------
    ValueError
        If the variable is not a non-negative number.
    """
    text = os.environ.get(SPIN_ENV)
    if text is None or not text.strip():
        return SPIN_DEFAULT
    try:
        micros = float(text)
    except ValueError:
        micros = -1.0
    if not micros >= 0 or micros == float("inf"):
        raise ValueError("%s must be a non-negative number of microseconds, got %r" % (SPIN_ENV, text))
    return micros * 1e-6


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
    NCCL_INIT = 8  # join the NCCL communicator
    NCCL = 9  # queue a device collective on shared variables
    SYNC = 10  # wait until this rank's device work is done


def ok(result=None):
    return True, result


def failure(exc):
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return False, (type(exc).__name__, str(exc), tb)


def recv(conn, spin):
    """``conn.recv()``, polling for up to ``spin`` seconds before blocking."""
    if spin > 0 and not conn.poll(0):
        deadline = time.perf_counter() + spin
        while not conn.poll(0) and time.perf_counter() < deadline:
            pass
    return conn.recv()
