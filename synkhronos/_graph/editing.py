"""Small helpers that read and edit PyTensor graphs: the values of data in a
graph, stand-ins for rows, whether a variable has a gradient, graphs rebuilt
with parts replaced, graphs rewritten by named rules, the one value of a
constant, and PyTensor's Ops of indexing by arrays.  They know nothing of a
session (``synkhronos.pymc`` builds its pipeline with them)."""

import functools

import numpy as np

__all__ = ["continuous", "data_leading", "leading", "value_of", "row_input", "replaced", "rewritten",
           "rewritten_in_turn", "scalar_constant", "array_indexing"]


def leading(var):
    """The leading length of a shared variable's or constant's value, or None."""
    value = value_of(var)
    return None if value is None or value.ndim == 0 else value.shape[0]


def data_leading(value):
    """The leading length of ``value``, a graph of shared variables and
    constants only (a cast of one, say), or None if it has no axes or reads
    anything else."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import graph_inputs

    data = all(isinstance(v, SharedVariable | Constant) for v in graph_inputs([value]))
    if value.type.ndim == 0 or not data:
        return None
    return int(value.shape[0].eval(mode="FAST_COMPILE"))


def value_of(var):
    """The value of a shared variable or constant, as numpy; None for anything else."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant

    if isinstance(var, SharedVariable):
        return np.asarray(var.get_value(borrow=True))
    if isinstance(var, Constant):
        return np.asarray(var.data)
    return None


def row_input(var, name):
    """A symbolic stand-in for ``var``'s value, of any number of rows."""
    from pytensor.tensor import TensorType

    return TensorType(var.dtype, shape=(None,) + tuple(var.type.shape[1:]))(name=name)


def continuous(var):
    """Whether ``var`` has a gradient: a float, not data or a discrete variable."""
    return var.dtype.startswith("float")


def replaced(outputs, replace):
    """``outputs`` made again with the variables of ``replace`` replaced."""
    from pytensor.graph.replace import clone_replace

    # Nodes are made again from their new inputs, so static shapes (the rows'
    # count, say) are inferred anew rather than asserted.
    replace = {k: v for k, v in replace.items() if k is not v}
    return list(clone_replace(outputs, replace, rebuild_strict=False)) if replace else list(outputs)


def rewritten(outputs, *rules):
    """``outputs`` rewritten in place by ``rules``, each node at a time."""
    from pytensor.graph.fg import FunctionGraph
    from pytensor.graph.rewriting.basic import in2out

    fgraph = FunctionGraph(outputs=outputs, clone=False)
    in2out(*rules).rewrite(fgraph)
    return list(fgraph.outputs)


def rewritten_in_turn(outputs, *rules):
    """``outputs`` rewritten in place by each of ``rules`` in turn, a pass each
    (where one pass of them all would not do what each does alone)."""
    for rule in rules:
        outputs = rewritten(outputs, rule)
    return outputs


def scalar_constant(var):
    """The one value of constant ``var`` (a scalar, or filled with one value), as
    a float; None if it is not a constant or holds several values."""
    from pytensor.tensor.basic import get_underlying_scalar_constant_value

    try:
        return float(get_underlying_scalar_constant_value(var))
    except Exception:  # not a constant, or not one value
        return None


@functools.cache
def array_indexing():
    """PyTensor's Ops of indexing by arrays: ``(picks, increments)``, the types
    of ``x[idx]`` (index inputs from the second) and of its gradient's
    ``inc(x, y, idx)`` (from the third).  (AdvancedSubtensor1 and its increment
    are gone in PyTensor 3.3, whose AdvancedSubtensor lists where its index
    inputs go: (0,) is the leading axis.)"""
    from pytensor.tensor import subtensor

    def present(*names):
        return tuple(getattr(subtensor, n) for n in names if hasattr(subtensor, n))

    return (present("AdvancedSubtensor", "AdvancedSubtensor1"),
            present("AdvancedIncSubtensor", "AdvancedIncSubtensor1"))
