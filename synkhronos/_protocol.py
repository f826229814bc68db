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

__all__ = ["Command", "ok", "failure", "recv"]

# Poll this long before blocking: a process woken from sleep runs its first
# microseconds slowly, so a short spin makes back-to-back calls much faster,
# while an idle session still sleeps.
SPIN_SECONDS = float(os.environ.get("SYNKHRONOS_SPIN_US", "100")) * 1e-6


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


def recv(conn, spin=SPIN_SECONDS):
    """``conn.recv()``, polling for up to ``spin`` seconds before blocking."""
    if spin > 0 and not conn.poll(0):
        deadline = time.perf_counter() + spin
        while not conn.poll(0) and time.perf_counter() < deadline:
            pass
    return conn.recv()
