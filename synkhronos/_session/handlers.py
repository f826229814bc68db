"""What a worker does for each command of the master: one handler per command,
each taking the worker's state (``_session.worker``) and the command's record
(``_wire.protocol``) and returning the reply's payload.
"""

import logging
import time

from .._call.share import device_reduction, run_share, run_share_reduced
from .._common.selections import take_rows
from .._devices.cpu import thread_pools
from .._graph.function_core import reseed_generators
from .._graph.precompile import counts_by_variant, precompile
from .._wire import shared_memory
from .._wire.exchange_buffer import unpack
from .._wire.pickling import loads_cores
from .._wire.protocol import Command

__all__ = ["HANDLERS"]

logger = logging.getLogger("synkhronos._session.worker")  # one logger for all of the worker's lines


def _on_distribute(state, msg):
    flags, blob = msg.flags, msg.blob
    t0 = time.monotonic()
    state._importer.join()
    import pytensor

    for name, value in flags.items():
        if str(getattr(pytensor.config, name)) != value:
            setattr(pytensor.config, name, value)
    state.device.configure_jax()
    if msg.jax:  # before loading the functions starts JAX's backend
        state.device.start_jax_pool()
    known = state.shareds or []
    cores, shareds = loads_cores(blob, known)
    reseed_generators(shareds, cores, state.rank, known)
    state.device.place_shareds(shareds)
    state.cores = (state.cores or []) + cores
    state.shareds = known + shareds
    logger.debug("worker rank %d: loaded %d functions and %d shared variables in %.2f s", state.rank,
                 len(cores), len(shareds), time.monotonic() - t0)
    t0 = time.monotonic()
    compiled = [i for i in msg.compile_shares.get(state.rank, ()) if precompile(cores[i].plain)]
    if compiled:
        logger.debug("worker rank %d: compiled functions %s for the others in %.2f s", state.rank,
                     compiled, time.monotonic() - t0)


def _on_call(state, msg):
    # Unpacked in one step, in the record's order: cheaper than seven field reads on every call.
    function, scattered, bcast, share_sel, subset, num_slices, weighted = msg
    view = state.cache.view
    core = state.cores[function]
    args = ([(view(ref), sel) for ref, sel in scattered], [view(ref) for ref in bcast],
            share_sel, subset, num_slices)
    specs = device_reduction(core, state.device, subset, num_slices)
    if specs is not None:  # reduced into the master on the device: nothing to send
        weight, had_rows, _ = run_share_reduced(core, state.device, specs, state.master_rank, weighted, *args)
        return weight, had_rows
    weight, outputs = run_share(core, state.device, *args)
    return weight, None if outputs is None else state.exchange.pack(state.device.to_host(outputs))


def _on_map_data(state, msg):
    state.cache.segment(msg.name)


def _on_drop_data(state, msg):
    state.drop(msg.name)


def _on_send_shareds(state, msg):
    return state.exchange.pack([state.device.get_value(state.shared(i)) for i in msg.ids])


def _on_set_shareds(state, msg):
    for ID, token, rows in msg.values:
        (value,) = unpack([token], state.cache)
        state.device.set_value(state.shared(ID), take_rows(value, rows))


def _on_get_shapes(state, msg):
    return [state.device.shape(state.shared(i)) for i in msg.ids]


def _on_comm_init(state, msg):
    state.device.init_comm(state.n_parallel, state.rank, msg.uid)


_COLLECTIVES = ("all_reduce", "reduce", "broadcast", "gather", "all_gather")


def _on_collective(state, msg):
    if msg.op not in _COLLECTIVES:
        raise ValueError("unknown device collective %r" % (msg.op,))
    return getattr(state.device, msg.op)([state.shared(i) for i in msg.ids], *msg.args)


def _on_host_data(state, msg):
    """Take this host's copy of a Data segment from the master, over MPI."""
    name, nbytes, used = msg.name, msg.nbytes, msg.used
    local = shared_memory.host_copy_name(name, state.cluster.host)
    slot = shared_memory.slot_of(local)
    seg = state.host_copies.get(slot)
    if seg is None or seg.name != local:
        if seg is not None:
            state.cache.drop(name)
            seg.unlink()
            seg.close()
        seg = state.host_copies[slot] = shared_memory.Segment(local, nbytes)
    state.cluster.bcast_to_leaders(seg.array("u1", (used,)))


def _on_sync(state, msg):
    state.device.synchronize(state.shareds or [])


def _on_thread_pools(state, msg):
    return thread_pools()


def _on_compile_counts(state, msg):
    return counts_by_variant(state.cores)


HANDLERS = {
    Command.SYNC: _on_sync,
    Command.COMM_INIT: _on_comm_init,
    Command.COLLECTIVE: _on_collective,
    Command.DISTRIBUTE: _on_distribute,
    Command.CALL: _on_call,
    Command.MAP_DATA: _on_map_data,
    Command.DROP_DATA: _on_drop_data,
    Command.SEND_SHAREDS: _on_send_shareds,
    Command.SET_SHAREDS: _on_set_shareds,
    Command.GET_SHAPES: _on_get_shapes,
    Command.HOST_DATA: _on_host_data,
    Command.THREAD_POOLS: _on_thread_pools,
    Command.COMPILE_COUNTS: _on_compile_counts,
}
