"""Values from every rank reduced: ``reduce`` into the master, ``all_reduce``
onto every rank."""

import numpy as np

from .._common.reduce import check_op, reduce_values
from .._common.values import check_flag
from .._session import runtime
from .targets import as_given, targets
from .transfer import device_collective, equal_shapes, gather_arrays, set_all, uniform_shapes, use_nccl

__all__ = ["reduce", "all_reduce"]


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
    on_device = use_nccl(rt, nccl)
    check_flag(in_place, "in_place")
    if on_device:
        check_op(op, allow_none=False)
        variables, ids, single = targets(rt, shared_vars)
        shapes = uniform_shapes(rt, variables, ids)
        results = device_collective(rt, "reduce", ids, (op, rt.master_rank, in_place, shapes), op)
        return None if in_place else as_given(results, single)
    variables, _, single, results = _reduced(rt, shared_vars, op)
    if not in_place:
        return as_given(results, single)
    for var, r in zip(variables, results):
        rt.device.set_value(var, r)
    return None


@runtime.action("all_reduce")
def all_reduce(shared_vars, op="avg", nccl=True):
    """Reduce each shared variable over all ranks and leave the result on every
    rank.  ``op`` as in ``reduce``."""
    rt = runtime.require(distributed=True)
    if use_nccl(rt, nccl):
        check_op(op, allow_none=False)
        variables, ids, _ = targets(rt, shared_vars)
        device_collective(rt, "all_reduce", ids, (op, uniform_shapes(rt, variables, ids)), op)
        return
    variables, ids, _, results = _reduced(rt, shared_vars, op)
    set_all(rt, variables, ids, results)
