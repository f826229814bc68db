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

from . import _runtime
from ._data import Data, _check_flag
from ._exchange import receive
from ._plan import (
    brief,
    check_selection_fits,
    normalize_batch,
    selection_length,
    split_bounds,
    sub_selection,
    take_rows,
)
from ._protocol import Command
from ._reduce import check_op, reduce_values

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


def _targets(rt, shared_vars):
    """(variables, ids, single) for a ``shared_vars`` argument."""
    from pytensor.compile.sharedvalue import SharedVariable

    single = isinstance(shared_vars, SharedVariable)
    variables = [shared_vars] if single else shared_vars
    if not isinstance(variables, (list, tuple)) or not variables or \
            not all(isinstance(v, SharedVariable) for v in variables):
        raise TypeError("shared_vars must be a shared variable or a non-empty list of them, got %r"
                        % (shared_vars,))
    ids = []
    for v in variables:
        i = rt.shared_id(v)
        if i is None:
            raise ValueError("shared variable %r is not used in any Synkhronos function, so the "
                             "workers do not have it" % (v,))
        ids.append(i)
    return list(variables), ids, single


def _values_for(values, variables, single, argname="values"):
    """One value per variable, as numpy arrays or Data of the variable's type.

    For a list of variables (``single`` False) ``values`` is a list or tuple with
    one value for each.  For one variable it is that variable's value; a list
    holding one Data or array of the variable's ndim is taken as a list of one
    value (``set_value(0, s, [v])``)."""
    if single:
        first = values[0] if isinstance(values, (list, tuple)) and len(values) == 1 else None
        ndim = variables[0].ndim
        listed = isinstance(first, Data) or (isinstance(first, np.ndarray) and first.ndim == ndim)
        values = [first] if listed else [values]
    if not isinstance(values, (list, tuple)) or len(values) != len(variables):
        raise ValueError("%s must give one value for each of the %d shared variables, got %r"
                         % (argname, len(variables), values))
    out = []
    for k, (v, var) in enumerate(zip(values, variables)):
        where = argname if len(values) == 1 else "%s[%d]" % (argname, k)  # which value is wrong
        if isinstance(v, Data):
            if v.dtype != var.dtype or v.ndim != var.ndim:
                raise TypeError("%s: %r (dtype %s, ndim %d) does not fit shared variable %s (dtype %s, "
                                "ndim %d)" % (where, v, v.dtype, v.ndim, var, var.dtype, var.ndim))
            if v._array is None:
                raise ValueError("%s: Data %r holds no memory" % (where, v))
            out.append(v)
            continue
        try:
            arr = np.asarray(v)
            if arr.dtype != var.dtype:
                # PyTensor's own casting rules; a static shape is checked on the rows
                # each rank gets (``_check_static``), whatever the dtype given.
                arr = np.asarray(var.type.clone(shape=(None,) * var.ndim).filter(v))
        except (TypeError, ValueError) as exc:
            raise TypeError("%s: %s does not fit shared variable %s (dtype %s): %s"
                            % (where, brief(v), var, var.dtype, exc)) from None
        if arr.ndim != var.ndim:
            raise TypeError("%s: value of ndim %d does not fit shared variable %s (ndim %d)"
                            % (where, arr.ndim, var, var.ndim))
        out.append(arr)
    return out


def _check_static(var, shape, argname="values"):
    """Raise TypeError (before any rank changes) if a value of ``shape`` does not
    fit the static shape of ``var``'s type (``pytensor.shared(..., shape=...)``)."""
    static = getattr(var.type, "shape", None) or ()
    if any(d is not None and d != n for d, n in zip(static, shape)):
        raise TypeError("%s: a value of shape %s does not fit %s, whose shape is fixed to %s"
                        % (argname, tuple(shape), var, tuple("?" if d is None else d for d in static)))


def _tokens(rt, values):
    """How workers on this host find each of ``values``: a Data by its segment,
    the arrays through the master's exchange buffer, all laid out in one send
    (see ``_exchange``).  The caller releases the buffer once the command's
    round trip is over."""
    arrays = [v for v in values if not isinstance(v, Data)]
    packed = iter(rt.exchange.send(arrays))
    return [v._ref() if isinstance(v, Data) else next(packed) for v in values]


def _array(value):
    return value._array if isinstance(value, Data) else value


def _check_rank(rt, rank):
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError("rank must be an int, got %r" % (rank,))
    if not 0 <= rank < rt.n_parallel:
        raise ValueError("rank must be in [0, %d), got %d" % (rt.n_parallel, rank))
    return int(rank)


def _result(items, single):
    return items[0] if single else tuple(items)


def _gather_arrays(rt, ids, ranks=None):
    """Values of shared variables ``ids`` from ``ranks`` (default all), as
    {rank: [arrays]}; worker arrays are views valid until their next send."""
    dev = rt.device
    m = rt.master_rank
    ranks = list(range(rt.n_parallel)) if ranks is None else ranks
    workers = [r for r in ranks if r != m]
    local = (lambda: [dev.get_value(rt.shareds[i]) for i in ids]) if m in ranks else None
    mine, replies = rt.request(Command.SEND_SHAREDS, ids, ranks=workers, local=local)
    out = {r: receive(tokens, rt.cache) for r, tokens in replies.items()}
    if m in ranks:
        out[m] = mine
    return out


def _set_all(rt, variables, ids, values, rows=None, ranks=None, argname="values"):
    """Set shared variables on ``ranks`` (default all) to ``values``, taking
    ``rows[rank][k]`` (a selection or None) of value k on each rank.  Values that
    do not fit a variable's static shape raise TypeError naming ``argname``."""
    m = rt.master_rank
    ranks = list(range(rt.n_parallel)) if ranks is None else ranks

    def rows_of(rank):
        return [None] * len(ids) if rows is None else rows[rank]

    for r in ranks:
        for var, v, sel in zip(variables, values, rows_of(r)):
            shape = _array(v).shape
            _check_static(var, shape if sel is None else (selection_length(sel),) + shape[1:], argname)
    if any(rt.remote(r) for r in ranks):
        rt.publish([v for v in values if isinstance(v, Data)])  # a round trip of its own: first

    def payload(rank, tokens):
        if not rt.remote(rank):
            return [(i, t, s) for i, t, s in zip(ids, tokens, rows_of(rank))]
        # Another host: Data from its own copy, arrays inline (only this rank's rows).
        return [(i, v._ref(), s) if isinstance(v, Data) else (i, take_rows(v, s), None)
                for i, v, s in zip(ids, values, rows_of(rank))]

    def local():
        for var, v, sel in zip(variables, values, rows_of(m)):
            rt.device.set_value(var, take_rows(_array(v), sel))

    for i in ids:
        rt.shapes.pop(i, None)
    here = [r for r in ranks if r != m and not rt.remote(r)]
    try:
        tokens = _tokens(rt, values) if here else None
        payloads = {r: payload(r, tokens) for r in ranks if r != m}
        rt.request(Command.SET_SHAREDS, payloads, ranks=sorted(payloads), local=local if m in ranks else None)
    finally:
        rt.exchange.release()  # the round trip is over: every rank has read its values


def _use_nccl(rt, nccl):
    _check_flag(nccl, "nccl")
    return nccl and rt.device.nccl


def _all_shapes(rt, ids):
    """Shapes of shared variables ``ids`` on every rank: ``[var][rank]`` (and
    recorded for device collectives)."""
    dev = rt.device
    mine, replies = rt.request(Command.GET_SHAPES, ids,
                               local=lambda: [dev.shape(rt.shareds[i]) for i in ids])
    replies[rt.master_rank] = mine
    table = [[tuple(replies[r][k]) for r in range(rt.n_parallel)] for k in range(len(ids))]
    for i, per_rank in zip(ids, table):
        rt.shapes[i] = per_rank
    return table


def _shape_table(rt, variables, ids):
    """``[var][rank]`` shapes for a device collective: as recorded, unless unknown
    or the master's own value has changed shape since; then asked of every rank."""
    m = rt.master_rank
    unknown = [i for var, i in zip(variables, ids)
               if i not in rt.shapes or rt.shapes[i][m] != rt.device.shape(var)]
    if unknown:
        _all_shapes(rt, unknown)
    return [rt.shapes[i] for i in ids]


def _equal_shapes(variables, shapes, what):
    for var, per_rank in zip(variables, shapes):
        if len(set(per_rank)) > 1:
            raise ValueError("cannot %s %s: its shapes differ between ranks: %s" % (what, var, per_rank))


def _device_collective(rt, op, ids, args, reduce_op=None):
    """Queue device collective ``op`` on every rank; returns the master's result.
    Workers' replies are read later (``Runtime.post``).  Whatever the device
    cannot do (a dtype, ``reduce_op`` on it) is refused before any rank starts:
    once the workers have the command, the master's failure closes the session."""
    variables = [rt.shareds[i] for i in ids]
    rt.device.check_collective(variables, reduce_op)
    local = getattr(rt.device, "nccl_" + op)
    return rt.post(Command.NCCL, (op, ids, args), local=lambda: local(variables, *args))


def _uniform_shapes(rt, variables, ids):
    """The one shape of each variable on every rank, for reductions."""
    table = _shape_table(rt, variables, ids)
    _equal_shapes(variables, table, "reduce")
    return [per_rank[0] for per_rank in table]


@_runtime.action("broadcast")
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
    rt = _runtime.require(distributed=True)
    use_nccl = _use_nccl(rt, nccl)
    variables, ids, single = _targets(rt, shared_vars)
    if use_nccl:
        if values is not None:
            values = _values_for(values, variables, single)
            for var, v in zip(variables, values):
                _check_static(var, _array(v).shape)
            rt.device.check_collective(variables)  # before the master's values change
            for var, v in zip(variables, values):
                rt.device.set_value(var, _array(v))
        shapes = [rt.device.shape(v) for v in variables]
        _device_collective(rt, "broadcast", ids, (rt.master_rank, shapes))
        for i, shape in zip(ids, shapes):
            rt.shapes[i] = [shape] * rt.n_parallel
        return
    if values is None:
        values = [rt.device.get_value(v) for v in variables]
        ranks = rt.worker_ranks
    else:
        values = _values_for(values, variables, single)
        ranks = None
    _set_all(rt, variables, ids, values, ranks=ranks)


@_runtime.action("scatter")
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
    rt = _runtime.require(distributed=True)
    variables, ids, single = _targets(rt, shared_vars)
    values = _values_for(values, variables, single)
    rows = [[] for _ in range(rt.n_parallel)]
    for v, var in zip(values, variables):
        arr = _array(v)
        if arr.ndim == 0:
            raise TypeError("cannot scatter the 0-d value for %s" % (var,))
        sel = slice(0, len(arr)) if batch is None else normalize_batch(batch, len(arr))
        check_selection_fits(sel, len(arr), "the value for %s" % (var,))
        for r, (p0, p1) in enumerate(split_bounds(selection_length(sel), rt.n_parallel)):
            rows[r].append(sub_selection(sel, p0, p1))
    _set_all(rt, variables, ids, values, rows=rows)


@_runtime.action("gather")
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
    rt = _runtime.require(distributed=True)
    use_nccl = _use_nccl(rt, nccl)
    if nd_up not in (0, 1) or isinstance(nd_up, bool):
        raise ValueError("nd_up must be 0 or 1, got %r" % (nd_up,))
    variables, ids, single = _targets(rt, shared_vars)
    if use_nccl:
        per_var = _device_collective(rt, "gather", ids, (rt.master_rank, _shape_table(rt, variables, ids)))
        arrays = {r: [per_var[k][r] for k in range(len(ids))] for r in range(rt.n_parallel)}
    else:
        arrays = _gather_arrays(rt, ids)
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


@_runtime.action("all_gather")
def all_gather(shared_vars, nccl=True):
    """Every rank's variable becomes the concatenation (along axis 0) of all
    ranks' values, in rank order.  ndim is unchanged."""
    rt = _runtime.require(distributed=True)
    use_nccl = _use_nccl(rt, nccl)
    variables, ids, _ = _targets(rt, shared_vars)
    if use_nccl:
        table = _shape_table(rt, variables, ids)
        joined = []
        for var, per_rank in zip(variables, table):
            _check_concatenable(var, per_rank)
            joined.append((sum(s[0] for s in per_rank),) + per_rank[0][1:])
            _check_static(var, joined[-1], "all_gather")  # before the ranks start: see _device_collective
        _device_collective(rt, "all_gather", ids, (table,))
        for i, shape in zip(ids, joined):
            rt.shapes[i] = [shape] * rt.n_parallel
        return
    arrays = _gather_arrays(rt, ids)
    joined = [_join([arrays[r][k] for r in range(rt.n_parallel)], 0, var) for k, var in enumerate(variables)]
    _set_all(rt, variables, ids, joined, argname="all_gather")


def _reduced(rt, shared_vars, op):
    check_op(op, allow_none=False)
    variables, ids, single = _targets(rt, shared_vars)
    arrays = _gather_arrays(rt, ids)
    results = []
    for k, var in enumerate(variables):
        values = [arrays[r][k] for r in range(rt.n_parallel)]
        _equal_shapes([var], [[v.shape for v in values]], "reduce")
        results.append(np.asarray(reduce_values(values, op), dtype=var.dtype))
    return variables, ids, single, results


@_runtime.action("reduce")
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
    rt = _runtime.require(distributed=True)
    use_nccl = _use_nccl(rt, nccl)
    _check_flag(in_place, "in_place")
    if use_nccl:
        check_op(op, allow_none=False)
        variables, ids, single = _targets(rt, shared_vars)
        shapes = _uniform_shapes(rt, variables, ids)
        results = _device_collective(rt, "reduce", ids, (op, rt.master_rank, in_place, shapes), op)
        return None if in_place else _result(results, single)
    variables, _, single, results = _reduced(rt, shared_vars, op)
    if not in_place:
        return _result(results, single)
    for var, r in zip(variables, results):
        rt.device.set_value(var, r)
    return None


@_runtime.action("all_reduce")
def all_reduce(shared_vars, op="avg", nccl=True):
    """Reduce each shared variable over all ranks and leave the result on every
    rank.  ``op`` as in ``reduce``."""
    rt = _runtime.require(distributed=True)
    if _use_nccl(rt, nccl):
        check_op(op, allow_none=False)
        variables, ids, _ = _targets(rt, shared_vars)
        _device_collective(rt, "all_reduce", ids, (op, _uniform_shapes(rt, variables, ids)), op)
        return
    variables, ids, _, results = _reduced(rt, shared_vars, op)
    _set_all(rt, variables, ids, results)


@_runtime.action("set_value")
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
    rt = _runtime.require(distributed=True)
    rank = _check_rank(rt, rank)
    variables, ids, single = _targets(rt, shared_vars)
    values = _values_for(values, variables, single)
    rows = None
    if batch is not None:
        sels = []
        for v, var in zip(values, variables):
            arr = _array(v)
            if arr.ndim == 0:
                raise TypeError("batch=%s selects rows, but the value for %s is 0-d" % (brief(batch), var))
            sel = normalize_batch(batch, len(arr))
            check_selection_fits(sel, len(arr), "the value for %s" % (var,))
            sels.append(sel)
        rows = {rank: sels}
    _set_all(rt, variables, ids, values, rows=rows, ranks=[rank])


@_runtime.action("get_value")
def get_value(rank, shared_vars):
    """Value(s) of shared variable(s) on one rank, as numpy arrays (copies)."""
    rt = _runtime.require(distributed=True)
    rank = _check_rank(rt, rank)
    variables, ids, single = _targets(rt, shared_vars)
    arrays = _gather_arrays(rt, ids, ranks=[rank])[rank]
    return _result([np.array(a) for a in arrays], single)


@_runtime.action("get_shapes")
def get_shapes(shared_vars):
    """Shapes of shared variable(s) on every rank: a list (one shape per rank),
    or a list of such lists for a list of variables."""
    rt = _runtime.require(distributed=True)
    _, ids, single = _targets(rt, shared_vars)
    per_var = _all_shapes(rt, ids)
    return per_var[0] if single else per_var


@_runtime.action("get_lengths")
def get_lengths(shared_vars):
    """Lengths (axis 0) of shared variable(s) on every rank, like ``get_shapes``."""
    shapes = get_shapes(shared_vars)
    nested = shapes if isinstance(shared_vars, (list, tuple)) else [shapes]
    for per_rank in nested:
        if any(len(s) == 0 for s in per_rank):
            raise TypeError("a 0-d shared variable has no length; use get_shapes()")
    lengths = [[s[0] for s in per_rank] for per_rank in nested]
    return lengths if isinstance(shared_vars, (list, tuple)) else lengths[0]
