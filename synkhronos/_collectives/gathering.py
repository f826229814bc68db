"""Values from every rank joined: ``gather`` into the master, ``all_gather``
onto every rank."""

import numpy as np

from .._session import runtime
from .targets import as_given, check_static, targets
from .transfer import device_collective, gather_arrays, set_all, shape_table, use_nccl

__all__ = ["gather", "all_gather"]


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
    on_device = use_nccl(rt, nccl)
    if nd_up not in (0, 1) or isinstance(nd_up, bool):
        raise ValueError("nd_up must be 0 or 1, got %r" % (nd_up,))
    variables, ids, single = targets(rt, shared_vars)
    if on_device:
        per_var = device_collective(rt, "gather", ids, (rt.master_rank, shape_table(rt, variables, ids)))
        arrays = {r: [per_var[k][r] for k in range(len(ids))] for r in range(rt.n_parallel)}
    else:
        arrays = gather_arrays(rt, ids)
    results = []
    for k, var in enumerate(variables):
        values = [arrays[r][k] for r in range(rt.n_parallel)]
        results.append(_join(values, nd_up, var, hint="; use nd_up=1"))
    return as_given(results, single)


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
    on_device = use_nccl(rt, nccl)
    variables, ids, _ = targets(rt, shared_vars)
    if on_device:
        table = shape_table(rt, variables, ids)
        joined = []
        for var, per_rank in zip(variables, table):
            _check_concatenable(var, per_rank)
            joined.append((sum(s[0] for s in per_rank),) + per_rank[0][1:])
            check_static(var, joined[-1], "all_gather")  # before the ranks start: see device_collective
        device_collective(rt, "all_gather", ids, (table,))
        for i, shape in zip(ids, joined):
            rt.registry.record_shapes(i, [shape] * rt.n_parallel)
        return
    arrays = gather_arrays(rt, ids)
    joined = [_join([arrays[r][k] for r in range(rt.n_parallel)], 0, var) for k, var in enumerate(variables)]
    set_all(rt, variables, ids, joined, argname="all_gather")
