"""Synkhronos: data-parallel PyTensor functions on every GPU or CPU core.

Build graphs with PyTensor as usual, call ``synkhronos.function`` instead of
``pytensor.function``, and every call runs on all ranks at once::

    import synkhronos as synk
    synk.fork()
    f = synk.function(inputs=[x], bcast_inputs=[y], outputs=z)
    synk.distribute()
    r = f(synk.data(x_dat), synk.data(y_dat))
"""

from ._api import close, device_kind, distribute, fork, gpus, mpi_launched, n_parallel, synchronize
from ._collectives import (
    all_gather,
    all_reduce,
    broadcast,
    gather,
    get_lengths,
    get_shapes,
    get_value,
    reduce,
    scatter,
    set_value,
)
from ._common import log
from ._data import Data, data
from ._function import Function, function
from .exceptions import StallError, WorkerError

__version__ = "0.2.0"

log.configure()  # raises for a malformed SYNKHRONOS_LOG_LEVEL

__all__ = [
    "fork",
    "distribute",
    "close",
    "synchronize",
    "n_parallel",
    "device_kind",
    "gpus",
    "mpi_launched",
    "function",
    "Function",
    "data",
    "Data",
    "broadcast",
    "scatter",
    "gather",
    "all_gather",
    "reduce",
    "all_reduce",
    "set_value",
    "get_value",
    "get_lengths",
    "get_shapes",
    "WorkerError",
    "StallError",
]
