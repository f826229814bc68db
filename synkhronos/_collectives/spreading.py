"""Values from the master out to every rank: ``broadcast`` one to all,
``scatter`` rows among them."""

from .._common.selections import (
    check_selection_fits,
    normalize_batch,
    selection_length,
    split_bounds,
    sub_selection,
)
from .._session import runtime
from .targets import array_of, check_static, targets, values_for
from .transfer import device_collective, set_all, use_nccl

__all__ = ["broadcast", "scatter"]


@runtime.action("broadcast")
def broadcast(shared_vars, values=None, nccl=True):
    """Give every rank the same value of each shared variable.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
    values : array_like, Data, or a list of those, optional
        New values, one per variable; default: the master's current values.
    nccl : bool, optional
        Use the device collective when there is one.
    """
    rt = runtime.require(distributed=True)
    on_device = use_nccl(rt, nccl)
    variables, ids, single = targets(rt, shared_vars)
    if on_device:
        if values is not None:
            values = values_for(values, variables, single)
            for var, v in zip(variables, values):
                check_static(var, array_of(v).shape)
            rt.device.check_collective(variables)  # before the master's values change
            for var, v in zip(variables, values):
                rt.device.set_value(var, array_of(v))
        shapes = [rt.device.shape(v) for v in variables]
        device_collective(rt, "broadcast", ids, (rt.master_rank, shapes))
        for i, shape in zip(ids, shapes):
            rt.registry.record_shapes(i, [shape] * rt.n_parallel)
        return
    if values is None:
        values = [rt.device.get_value(v) for v in variables]
        ranks = rt.worker_ranks
    else:
        values = values_for(values, variables, single)
        ranks = None
    set_all(rt, variables, ids, values, ranks=ranks)


@runtime.action("scatter")
def scatter(shared_vars, values, batch=None):
    """Split each value along axis 0 as evenly as possible and give rank r the
    r-th part (the first ``length % n`` ranks get one extra row).

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
    values : array_like, Data, or a list of those
        One per variable.  Workers read their rows of a ``Data`` in place.
    batch : int, slice, list of int or 1-d int array, optional
        Scatter only these rows of each value.
    """
    rt = runtime.require(distributed=True)
    variables, ids, single = targets(rt, shared_vars)
    values = values_for(values, variables, single)
    rows = [[] for _ in range(rt.n_parallel)]
    for v, var in zip(values, variables):
        arr = array_of(v)
        if arr.ndim == 0:
            raise TypeError("cannot scatter the 0-d value for %s" % (var,))
        sel = slice(0, len(arr)) if batch is None else normalize_batch(batch, len(arr))
        check_selection_fits(sel, len(arr), "the value for %s" % (var,))
        for r, (p0, p1) in enumerate(split_bounds(selection_length(sel), rt.n_parallel)):
            rows[r].append(sub_selection(sel, p0, p1))
    set_all(rt, variables, ids, values, rows=rows)
