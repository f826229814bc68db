"""A maximum's gradient from its operands alone.

PyTensor differentiates ``maximum(a, b)`` as ``eq(maximum(a, b), a) * gz``: the
backward pass reads the maximum's output and its input, two arrays the size of
the activation, where one comparison of the operands gives the same mask.  For a
ReLU (``maximum(x, 0)``) that is one full-size read per layer per step more than
a model written in JAX reads.  The rewrite here replaces the comparison:

- ``eq(maximum(a, b), a)`` by ``ge(a, b)``, and ``eq(minimum(a, b), a)`` by
  ``le(a, b)`` (either operand, either side of ``eq``).

The two are equal element for element, ties (``a == b``: true) and NaN (false
on both sides) included, so results do not change.  Under
``fork(precision="bf16")`` the comparison also no longer sets a rounded value
against an unrounded one.

Synkhronos adds the rewrite (tag ``synk_max_gradient``) to its own functions;
other PyTensor functions are unchanged.
"""

from pytensor.compile import optdb
from pytensor.compile.mode import get_mode
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.scalar import EQ, Maximum, Minimum
from pytensor.tensor import math as ptm
from pytensor.tensor.elemwise import Elemwise

__all__ = ["TAG", "max_gradient_mode"]

TAG = "synk_max_gradient"
_ORDER = {Maximum: ptm.ge, Minimum: ptm.le}  # max(a, b) == a  <=>  a >= b


def _extremum(var):
    """The comparison that ``var`` (a maximum's or minimum's output) equals its
    operand in, or None."""
    node = var.owner
    if node is None or not isinstance(node.op, Elemwise) or len(node.inputs) != 2:
        return None
    return _ORDER.get(type(node.op.scalar_op))


@node_rewriter([Elemwise])
def operands_compared(fgraph, node):
    """``eq(maximum(a, b), a)`` -> ``ge(a, b)`` (and ``le`` for a minimum)."""
    if not isinstance(node.op.scalar_op, EQ):
        return None
    for ext, operand in (node.inputs, node.inputs[::-1]):
        compare = _extremum(ext)
        if compare is None or operand not in ext.owner.inputs:
            continue
        a, b = ext.owner.inputs
        mask = compare(a, b) if operand is a else compare(b, a)
        if mask.type.broadcastable == node.outputs[0].type.broadcastable:
            return [mask]
    return None


# After the gradient's canonical forms (canonicalize, specialize), before the bf16
# rule (47.9) and elementwise fusion (48-49).
optdb.register("synk_max_gradient_rewrite", in2out(operands_compared), TAG, position=47.8)


def max_gradient_mode(mode):
    """``mode`` (a name, a Mode or None for PyTensor's default) with the rewrite included."""
    return get_mode(mode).including(TAG)  # get_mode returns a Mode as it is
