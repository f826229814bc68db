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

import numbers

import numpy as np

from .._common.brief import brief
from .._common.reduce import check_op, reduce_values
from .._common.selections import (
    check_selection_fits,
    normalize_batch,
    selection_length,
    split_bounds,
    sub_selection,
)
from .._common.values import check_flag as _check_flag
from .._session import runtime
from .targets import array_of, check_static, targets, values_for
from .transfer import (
    all_shapes,
    device_collective,
    equal_shapes,
    gather_arrays,
    set_all,
    shape_table,
    uniform_shapes,
)

__all__ = [
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
]


def _check_rank(rt, rank):
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError("rank must be an int, got %r" % (rank,))
    if not 0 <= rank < rt.n_parallel:
        raise ValueError("rank must be in [0, %d), got %d" % (rt.n_parallel, rank))
    return int(rank)


def _result(items, single):
    return items[0] if single else tuple(items)


def _use_nccl(rt, nccl):
    """Whether to run the device's own collective (``nccl=True`` and it has one)."""
    _check_flag(nccl, "nccl")
    return nccl and rt.device.has_collectives


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
    use_nccl = _use_nccl(rt, nccl)
    variables, ids, single = targets(rt, shared_vars)
    if use_nccl:
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


@runtime.action("gather")
def gather(shared_vars, nd_up=1, nccl=True):
    """Collect each shared variable's values from all ranks into the master.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
    nd_up : {1, 0}, optional
        1: stack the ranks' values along a new axis 0 (if their shapes differ, a
        list of per-rank arrays is returned instead); 0: concatenate along axis 0.
    nccl : bool, optional
        Use the device collective when there is one.

    Returns
    -------
    array (or list of arrays, see ``nd_up``), or a tuple of them for a list
    """
    rt = runtime.require(distributed=True)
    use_nccl = _use_nccl(rt, nccl)
    if nd_up not in (0, 1) or isinstance(nd_up, bool):
        raise ValueError("nd_up must be 0 or 1, got %r" % (nd_up,))
    variables, ids, single = targets(rt, shared_vars)
    if use_nccl:
        per_var = device_collective(rt, "gather", ids, (rt.master_rank, shape_table(rt, variables, ids)))
        arrays = {r: [per_var[k][r] for k in range(len(ids))] for r in range(rt.n_parallel)}
    else:
        arrays = gather_arrays(rt, ids)
    results = []
    for k, var in enumerate(variables):
        values = [arrays[r][k] for r in range(rt.n_parallel)]
        results.append(_join(values, nd_up, var, hint="; use nd_up=1"))
    return _result(results, single)


def _check_concatenable(var, shapes, hint=""):
    """Raise ValueError unless values of ``shapes`` (one per rank) concatenate
    along axis 0."""
    if len(shapes[0]) == 0:
        raise ValueError("cannot concatenate 0-d values of %s%s" % (var, hint))
    if len({s[1:] for s in shapes}) > 1:
        raise ValueError("cannot concatenate values of %s with shapes %s along axis 0" % (var, list(shapes)))


def _join(values, nd_up, var, hint=""):
    if nd_up == 1:
        if len({v.shape for v in values}) == 1:
            return np.stack(values)
        return [np.array(v) for v in values]
    _check_concatenable(var, [v.shape for v in values], hint)
    return np.concatenate(values)


@runtime.action("all_gather")
def all_gather(shared_vars, nccl=True):
    """Every rank's variable becomes the concatenation (along axis 0) of all
    ranks' values, in rank order.  ndim is unchanged."""
    rt = runtime.require(distributed=True)
    use_nccl = _use_nccl(rt, nccl)
    variables, ids, _ = targets(rt, shared_vars)
    if use_nccl:
        table = shape_table(rt, variables, ids)
        joined = []
        for var, per_rank in zip(variables, table):
            _check_concatenable(var, per_rank)
            joined.append((sum(s[0] for s in per_rank),) + per_rank[0][1:])
            check_static(var, joined[-1], "all_gather")  # before the ranks start: see _device_collective
        device_collective(rt, "all_gather", ids, (table,))
        for i, shape in zip(ids, joined):
            rt.registry.record_shapes(i, [shape] * rt.n_parallel)
        return
    arrays = gather_arrays(rt, ids)
    joined = [_join([arrays[r][k] for r in range(rt.n_parallel)], 0, var) for k, var in enumerate(variables)]
    set_all(rt, variables, ids, joined, argname="all_gather")


def _reduced(rt, shared_vars, op):
    check_op(op, allow_none=False)
    variables, ids, single = targets(rt, shared_vars)
    arrays = gather_arrays(rt, ids)
    results = []
    for k, var in enumerate(variables):
        values = [arrays[r][k] for r in range(rt.n_parallel)]
        equal_shapes([var], [[v.shape for v in values]], "reduce")
        results.append(np.asarray(reduce_values(values, op, pool=rt.reduce_pool), dtype=var.dtype))
    return variables, ids, single, results


@runtime.action("reduce")
def reduce(shared_vars, op="avg", in_place=True, nccl=True):
    """Reduce each shared variable's values from all ranks into the master.

    Parameters
    ----------
    shared_vars : SharedVariable or list of SharedVariable
    op : {"avg", "sum", "prod", "max", "min"}, optional
    in_place : bool, optional
        Overwrite the master's value (default) instead of returning the result.
    nccl : bool, optional
        Use the device collective when there is one.

    Returns
    -------
    None, or with ``in_place=False`` the result(s)
    """
    rt = runtime.require(distributed=True)
    use_nccl = _use_nccl(rt, nccl)
    _check_flag(in_place, "in_place")
    if use_nccl:
        check_op(op, allow_none=False)
        variables, ids, single = targets(rt, shared_vars)
        shapes = uniform_shapes(rt, variables, ids)
        results = device_collective(rt, "reduce", ids, (op, rt.master_rank, in_place, shapes), op)
        return None if in_place else _result(results, single)
    variables, _, single, results = _reduced(rt, shared_vars, op)
    if not in_place:
        return _result(results, single)
    for var, r in zip(variables, results):
        rt.device.set_value(var, r)
    return None


@runtime.action("all_reduce")
def all_reduce(shared_vars, op="avg", nccl=True):
    """Reduce each shared variable over all ranks and leave the result on every
    rank.  ``op`` as in ``reduce``."""
    rt = runtime.require(distributed=True)
    if _use_nccl(rt, nccl):
        check_op(op, allow_none=False)
        variables, ids, _ = targets(rt, shared_vars)
        device_collective(rt, "all_reduce", ids, (op, uniform_shapes(rt, variables, ids)), op)
        return
    variables, ids, _, results = _reduced(rt, shared_vars, op)
    set_all(rt, variables, ids, results)


@runtime.action("set_value")
def set_value(rank, shared_vars, values, batch=None):
    """Set shared variable value(s) on one rank.

    Parameters
    ----------
    rank : int
    shared_vars : SharedVariable or list of SharedVariable
    values : array_like, Data, or a list of those (one per variable)
    batch : int, slice, list of int or 1-d int array, optional
        Use only these rows of each value.
    """
    rt = runtime.require(distributed=True)
    rank = _check_rank(rt, rank)
    variables, ids, single = targets(rt, shared_vars)
    values = values_for(values, variables, single)
    rows = None
    if batch is not None:
        sels = []
        for v, var in zip(values, variables):
            arr = array_of(v)
            if arr.ndim == 0:
                raise TypeError("batch=%s selects rows, but the value for %s is 0-d" % (brief(batch), var))
            sel = normalize_batch(batch, len(arr))
            check_selection_fits(sel, len(arr), "the value for %s" % (var,))
            sels.append(sel)
        rows = {rank: sels}
    set_all(rt, variables, ids, values, rows=rows, ranks=[rank])


@runtime.action("get_value")
def get_value(rank, shared_vars):
    """Value(s) of shared variable(s) on one rank, as numpy arrays (copies)."""
    rt = runtime.require(distributed=True)
    rank = _check_rank(rt, rank)
    variables, ids, single = targets(rt, shared_vars)
    arrays = gather_arrays(rt, ids, ranks=[rank])[rank]
    return _result([np.array(a) for a in arrays], single)


@runtime.action("get_shapes")
def get_shapes(shared_vars):
    """Shapes of shared variable(s) on every rank: a list (one shape per rank),
    or a list of such lists for a list of variables."""
    rt = runtime.require(distributed=True)
    _, ids, single = targets(rt, shared_vars)
    per_var = all_shapes(rt, ids)
    return per_var[0] if single else per_var


@runtime.action("get_lengths")
def get_lengths(shared_vars):
    """Lengths (axis 0) of shared variable(s) on every rank, like ``get_shapes``."""
    shapes = get_shapes(shared_vars)
    nested = shapes if isinstance(shared_vars, (list, tuple)) else [shapes]
    for per_rank in nested:
        if any(len(s) == 0 for s in per_rank):
            raise TypeError("a 0-d shared variable has no length; use get_shapes()")
    lengths = [[s[0] for s in per_rank] for per_rank in nested]
    return lengths if isinstance(shared_vars, (list, tuple)) else lengths[0]
