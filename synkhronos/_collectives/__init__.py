"""Collectives on shared variables: every rank holds its own copy of each shared
variable used in a Synkhronos function; these calls move values between copies.

Naming rule (as in MPI): ``X`` acts toward or from the master (rank
``master_rank``); ``all_X`` leaves the result on every rank.  Every call takes one
shared variable or a list/tuple of them, and returns one result or a tuple.
``nccl=True`` means "use the device collective when there is one": on GPU workers
``broadcast``, ``gather``, ``all_gather``, ``reduce`` and ``all_reduce`` run over
NCCL.  The master checks every rank's shapes before it starts one (it keeps them
from earlier calls while nothing could have changed them), so unequal shapes raise
a ValueError instead of corrupting data or hanging.  Device collectives that leave
their results on the devices return as soon as every rank has queued them:
whatever reads the results afterwards waits for them on the device, and
``synchronize()`` waits for everything.  ``scatter``, ``set_value`` and
``get_value`` move host data through shared memory.  CPU workers always use
shared memory and return when done.
"""

from .gathering import all_gather, gather
from .per_rank import get_lengths, get_shapes, get_value, set_value
from .reducing import all_reduce, reduce
from .spreading import broadcast, scatter

__all__ = ["broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce",
           "set_value", "get_value", "get_lengths", "get_shapes"]
