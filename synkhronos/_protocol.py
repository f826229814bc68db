"""The command protocol between the master and each worker (how messages travel
is ``_channel``'s business).

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
import traceback

__all__ = ["Command", "ok", "failure", "spin_seconds", "env_nonnegative", "env_flag"]

# How long a process polls for the next message before it sleeps (see
# ``_channel``).  (Polling 3 ms instead of 100 us did not speed up a tiny call on
# 2 GPUs.)
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
