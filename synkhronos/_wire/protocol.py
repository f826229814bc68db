"""The command protocol between the master and each worker (how messages travel
is ``_wire.channel``'s business).

Every action is one round trip: the master sends ``(Command, payload)`` to the
workers it needs (each command's payload is one record below, built by the
master and read by the worker), does its own share, then reads one reply from each.  A reply is
``(True, result)`` or ``(False, (exception type name, message, traceback))``.
Because the master always reads every reply it asked for, the channel never gets
out of step, and the round trip is the barrier that guards each action.  The one
exception is device work that the ranks only queue (NCCL collectives): the master
reads those replies later, before its next round trip, since the device itself
orders the work.
"""

import enum
import traceback
from typing import Any, NamedTuple

__all__ = ["Command", "PAYLOADS", "Exit", "Distribute", "Call", "MapData", "DropData", "SendShareds",
           "SetShareds", "GetShapes", "CommInit", "Collective", "Sync", "HostData", "ThreadPools",
           "CompileCounts", "COMMAND_OF", "wire", "from_wire", "ok", "failure"]

class Command(enum.IntEnum):
    """What a worker is asked to do (its payload: the record in ``PAYLOADS``)."""

    EXIT = 0
    DISTRIBUTE = 1  # unpickle all functions and shared variables
    CALL = 2  # run a function on this rank's share
    MAP_DATA = 3  # map (or re-map) a Data object's segment
    DROP_DATA = 4  # forget a Data object's segment
    SEND_SHAREDS = 5  # return values of shared variables
    SET_SHAREDS = 6  # overwrite values of shared variables
    GET_SHAPES = 7  # return shapes of shared variables
    COMM_INIT = 8  # join the device communicator (NCCL; MPI's, for CPU ranks launched by MPI)
    COLLECTIVE = 9  # run (or queue) a device collective on shared variables
    SYNC = 10  # wait until this rank's device work is done
    HOST_DATA = 11  # (host leaders of other hosts) take a copy of a Data segment over MPI
    THREAD_POOLS = 12  # return this rank's BLAS and OpenMP thread pools
    COMPILE_COUNTS = 13  # return how this rank got each function's Numba code


class Exit(NamedTuple):
    failed: bool  # the session broke: leave without MPI's finalize


class Distribute(NamedTuple):
    flags: dict  # PyTensor flags the workers take from the master
    blob: bytes  # the pickled (function cores, shared variables)
    compile_shares: dict  # {rank: indices of the functions it compiles now} (see _graph.precompile)
    jax: bool  # some functions run on JAX: start its backend first (Device.start_jax_pool)


class Call(NamedTuple):
    function: int  # index of the function among the session's
    scattered: list  # (array ref, this rank's rows) per scattered input
    bcast: list  # array ref per broadcast input
    share_sel: Any  # this rank's batch_s, or None
    subset: tuple  # output indices to compute
    num_slices: int
    weighted: bool  # whether avg outputs go weighted by rows (see run_share_reduced)


class MapData(NamedTuple):
    name: str  # segment name


class DropData(NamedTuple):
    name: str


class SendShareds(NamedTuple):
    ids: list  # shared variable indices


class SetShareds(NamedTuple):
    # One (shared variable index, value, rows) per variable, plain tuples (they pickle
    # fast): the value is an exchange token or array ref (this host) or the rows
    # themselves (another host); rows selects the rows this rank takes, None for all.
    values: list


class GetShapes(NamedTuple):
    ids: list


class CommInit(NamedTuple):
    uid: Any  # the device's rendezvous token (None for MPI)


class Collective(NamedTuple):
    op: str  # a Device collective: "all_reduce", "reduce", "broadcast", "gather", "all_gather"
    ids: list
    args: tuple  # that method's arguments after the variables


class Sync(NamedTuple):
    pass


class ThreadPools(NamedTuple):
    pass


class CompileCounts(NamedTuple):
    pass


class HostData(NamedTuple):
    name: str  # the master's segment
    nbytes: int  # its size
    used: int  # bytes in use, which travel


PAYLOADS = {
    Command.EXIT: Exit, Command.DISTRIBUTE: Distribute, Command.CALL: Call,
    Command.MAP_DATA: MapData, Command.DROP_DATA: DropData, Command.SEND_SHAREDS: SendShareds,
    Command.SET_SHAREDS: SetShareds, Command.GET_SHAPES: GetShapes, Command.COMM_INIT: CommInit,
    Command.COLLECTIVE: Collective, Command.SYNC: Sync, Command.HOST_DATA: HostData,
    Command.THREAD_POOLS: ThreadPools, Command.COMPILE_COUNTS: CompileCounts,
}
COMMAND_OF = {record: cmd for cmd, record in PAYLOADS.items()}
_NUMBER_OF = {record: int(cmd) for cmd, record in PAYLOADS.items()}


_RECORD_OF = {int(cmd): record for cmd, record in PAYLOADS.items()}


def wire(record, drops=()):
    """What travels to a worker for ``record`` (a payload record):
    ``(command number, its fields as a plain tuple, names of Data segments to
    drop first)``.  A plain tuple pickles faster than a named one, and every
    call pays for its message's pickling."""
    return _NUMBER_OF[type(record)], tuple(record), drops


def from_wire(number, fields):
    """The record that ``wire`` sent as ``(number, fields)``."""
    # ``_make`` would also count the fields, which ``wire`` took from a record of this type.
    record = _RECORD_OF[number]
    return tuple.__new__(record, fields)


def ok(result=None):
    return True, result


def failure(exc):
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return False, (type(exc).__name__, str(exc), tb)
