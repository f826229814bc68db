"""Elementwise work kept at its operands' own number of axes.

PyTensor's ``local_dimshuffle_lift`` moves an added axis below an elementwise
operation: ``expand_dims(a / s)`` becomes ``expand_dims(a) / expand_dims(s)``.
The division then runs over an ``(n, 1)`` array, which elementwise fusion cannot
join with the ``(n,)`` loop that computed ``a``: one more pass over the rows,
reading and writing ``n`` values.  The gradient of a matrix-vector product
(``X @ b`` written as PyTensor writes it, ``squeeze(X @ expand_dims(b))``) reads
its rows' values that way; in a linear model's likelihood with a scale
parameter this is the division by the scale (bambi's normal GLMM on PyTensor's
own linkers: 0.93 -> 0.86 ms a call over 200,000 rows, one core, measured).

The rewrite here puts the axis back after the operation:

- ``elemwise(x_1, ..., x_k)`` whose output has static length 1 on some axes
  becomes ``expand_dims(elemwise(x_1', ..., x_k'))``, each ``x_i'`` being
  ``x_i`` without those axes (where ``x_i`` added them, the array it added them
  to).

The values are the same element for element.  It runs after PyTensor's
canonical forms and before fusion, so the lift does not undo it.  Synkhronos
adds the rewrite (tag ``synk_expand_dims_sunk``) to its own functions; other
PyTensor functions are unchanged.
"""

from pytensor.compile import optdb
from pytensor.compile.mode import get_mode
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.tensor.elemwise import DimShuffle, Elemwise

__all__ = ["TAG", "expand_dims_sunk_mode"]

TAG = "synk_expand_dims_sunk"


def _without(var, axes):
    """``var`` without its ``axes`` (each of static length 1): the array a
    DimShuffle made it from where that DimShuffle only added them."""
    keep = [k for k in range(var.ndim) if k not in axes]
    node = var.owner
    if node is not None and isinstance(node.op, DimShuffle):
        order = [node.op.new_order[k] for k in keep]  # (an axis of length 1 it moved is dropped)
        source = node.inputs[0]
        return source if order == list(range(source.ndim)) else source.dimshuffle(order)
    return var.dimshuffle(keep)


@node_rewriter([Elemwise])
def expand_dims_sunk(fgraph, node):
    """``elemwise(x_1, ..., x_k)`` with axes of static length 1 as
    ``expand_dims(elemwise(x_1', ..., x_k'))`` (see the module docstring), where
    an operand added such an axis itself; else None."""
    if len(node.outputs) != 1:
        return None
    out = node.outputs[0]
    axes = [k for k, length in enumerate(out.type.shape) if length == 1]
    if not axes or not any(_adds(x, axes) for x in node.inputs):
        return None
    inner = node.op(*[_without(x, axes) for x in node.inputs])
    order, kept = [], iter(range(inner.ndim))
    for k in range(out.ndim):
        order.append("x" if k in axes else next(kept))
    new = inner.dimshuffle(order)
    if not out.type.is_super(new.type):
        return None
    return [new]


def _adds(var, axes):
    """Whether ``var`` is a DimShuffle that added any of ``axes``."""
    node = var.owner
    if node is None or not isinstance(node.op, DimShuffle):
        return False
    return any(node.op.new_order[k] == "x" for k in axes)


# After the canonical forms that lift added axes (canonicalize, stabilize,
# specialize), before the maximum's gradient rule (47.8) and fusion (48-49).
optdb.register("synk_expand_dims_sunk_rewrite", in2out(expand_dims_sunk), TAG, position=47.7)


def expand_dims_sunk_mode(mode):
    """``mode`` (a name, a Mode or None for PyTensor's default) with the rewrite included."""
    return get_mode(mode).including(TAG)  # get_mode returns a Mode as it is
