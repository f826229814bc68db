"""Values on one rank (``set_value``, ``get_value``), shapes on each
(``get_shapes``, ``get_lengths``)."""

import numbers

import numpy as np

from .._common.brief import brief
from .._common.selections import check_selection_fits, normalize_batch
from .._session import runtime
from .targets import array_of, as_given, targets, values_for
from .transfer import all_shapes, gather_arrays, set_all

__all__ = ["set_value", "get_value", "get_shapes", "get_lengths"]


def _check_rank(rt, rank):
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise TypeError("rank must be an int, got %r" % (rank,))
    if not 0 <= rank < rt.n_parallel:
        raise ValueError("rank must be in [0, %d), got %d" % (rt.n_parallel, rank))
    return int(rank)


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
    return as_given([np.array(a) for a in arrays], single)


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
