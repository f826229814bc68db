"""Rows picked by a constant index, taken from the data instead of the results.

PyMC imputes missing observed values by splitting the variable in two: the
observed part is the full-length graph indexed by a constant mask, as in
``(b * x)[mask]``.  Split as it is, every rank would compute ``b * x`` over all
rows and index its share of the mask into rows it does not hold.  Pushed down
to the data, ``b * x[mask]``, the selected rows are data of the term's own
length, split like any other.  Only elementwise operations, a matrix product's
rows and further constant indexing are looked through; anything else stays as
written (and ``check_rowwise`` refuses it, naming the term).
"""

import functools

import numpy as np

__all__ = ["select_rows_in_data"]


def select_rows_in_data(logp, rows):
    """``logp`` with each constant selection of ``rows`` leading rows (a boolean
    mask or integer indices) moved down to the data it selects from."""
    from pytensor.graph.traversal import apply_ancestors

    from ._graphs import replaced

    replace = {}
    for node in apply_ancestors([logp]):
        picked = _picked_rows(node)
        if picked is None or len(picked) != rows:
            continue
        new = _taken(node.inputs[0], picked)
        if new is not None:
            replace[node.outputs[0]] = new
    return replaced([logp], replace)[0] if replace else logp


def _picked_rows(node):
    """The leading rows ``node`` selects with one constant index, as integers;
    None if it is not such a selection."""
    from pytensor.graph.basic import Constant

    if not isinstance(node.op, _advanced_subtensors()) or len(node.inputs) != 2 or \
            tuple(getattr(node.op, "idx_list", (0,))) != (0,):
        return None
    index = node.inputs[1]
    if not isinstance(index, Constant) or np.ndim(index.data) != 1:
        return None
    data = np.asarray(index.data)
    if data.dtype == bool:
        return np.flatnonzero(data)
    return data if data.dtype.kind in "iu" else None


@functools.cache
def _advanced_subtensors():
    """PyTensor's Ops of indexing by arrays.  (AdvancedSubtensor1 is gone in
    PyTensor 3.3, whose AdvancedSubtensor lists where its index inputs go: (0,)
    is the leading axis.)"""
    from pytensor.tensor import subtensor

    names = ("AdvancedSubtensor", "AdvancedSubtensor1")
    return tuple(getattr(subtensor, n) for n in names if hasattr(subtensor, n))


def _taken(x, picked):
    """A graph equal to ``x[picked]`` that selects from data (constants and
    shared variables, whose selected rows become constants), or None."""
    import pytensor.tensor as pt
    from pytensor.tensor.elemwise import Elemwise

    from ._graphs import value_of

    value = value_of(x)  # a constant, or pm.Data: its rows copied now, as split data are
    if value is not None:
        return pt.constant(value[picked]) if value.ndim else None
    node = x.owner
    if node is None:
        return None
    if isinstance(node.op, Elemwise):
        inputs = []
        for i in node.inputs:
            if i.type.ndim < x.type.ndim or i.type.broadcastable[0]:
                inputs.append(i)  # the same for every row
                continue
            taken = _taken(i, picked)
            if taken is None:
                return None
            inputs.append(taken)
        return node.op(*inputs)
    if _rows_from_first_input(node):  # (A @ w)[picked] = A[picked] @ w, and axes kept in place
        taken = _taken(node.inputs[0], picked)
        return None if taken is None else node.op(taken, *node.inputs[1:])
    inner = _picked_rows(node)
    if inner is not None:  # x = y[inner]: x[picked] = y[inner[picked]]
        return node.inputs[0][pt.constant(inner[picked])]
    return None


def _rows_from_first_input(node):
    """Whether ``node``'s output rows are its first input's rows, one for one: a
    matrix product of a matrix (``Dot``, or ``@``'s ``Blockwise`` of it), or a
    reshuffle of axes that keeps the leading one first (``@``'s squeeze)."""
    from pytensor.tensor.blockwise import Blockwise
    from pytensor.tensor.elemwise import DimShuffle
    from pytensor.tensor.math import Dot

    op, first = node.op, node.inputs[0]
    if isinstance(op, DimShuffle):
        return first.type.ndim >= 1 and len(op.new_order) >= 1 and op.new_order[0] == 0
    core = op.core_op if isinstance(op, Blockwise) else op
    return isinstance(core, Dot) and first.type.ndim == 2 and all(i.type.ndim <= 2 for i in node.inputs)
