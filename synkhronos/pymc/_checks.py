"""PyMC's parameter checks as the ranks compute them.

PyMC guards a log-density with checks on its parameters (``check_parameters``):
outside the domain the log-density is -inf.  Compiled as PyMC compiles them
(``parameter_checks``), a term's rows then sum ``switch(ok, logp, -inf)``, where
``ok`` reduces a condition over every row first: two reductions, one after the
other, over the same rows.  For the batched graphs the ranks compile with JAX
(``ranks_checks``), two rewrites that keep every value (a sum may add its terms
in another order, as a compiler may anyway):

- ``summed_checks``: a sum over rows of ``switch(ok, x, -inf)`` (or ``0``), where
  ``ok`` is the same for every row, is ``switch(ok, sum(x), -inf)``: the two
  reductions become independent and XLA computes them in one pass;
- ``bounded_checks``: a check of a link function's output against that
  function's own range, as the Bernoulli's ``0 <= sigmoid(eta) <= 1``, fails
  only where its argument is NaN; it becomes ``not isnan(eta)``, which saves a
  transcendental per row and point.

See the docs page "PyMC" for what they measured.
"""

import numpy as np
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.scalar.basic import GE, LE, Add, Exp, Switch
from pytensor.scalar.math import Sigmoid
from pytensor.tensor import cast, eq, invert, isnan, prod, squeeze, switch
from pytensor.tensor.basic import Alloc, alloc
from pytensor.tensor.elemwise import CAReduce, Elemwise

from ._graphs import rewritten, scalar_constant

__all__ = ["bounded_checks", "parameter_checks", "ranks_checks", "summed_checks"]


def parameter_checks(outputs, check_bounds):
    """``outputs`` with PyMC's parameter checks as PyMC compiles them: a log-density
    of -inf where a parameter is out of its domain (``model.check_bounds=False``:
    no check), rather than an error raised on a rank, or no check under JAX.

    PyMC's rule alone, not the ``canonicalize`` pass it sits in: that pass ran
    for minutes on the gradient of a censored likelihood (PyTensor 2.38)."""
    from pymc.logprob.utils import local_check_parameter_to_ninf_switch, local_remove_check_parameter

    return rewritten(outputs, local_check_parameter_to_ninf_switch if check_bounds
                      else local_remove_check_parameter)


def ranks_checks(outputs):
    """``outputs`` with ``summed_checks`` and ``bounded_checks`` (see the module
    docstring; the docs page "PyMC" has what each did alone and together)."""
    return rewritten(outputs, summed_checks, bounded_checks)


@node_rewriter([CAReduce])
def summed_checks(fgraph, node):
    """``sum(switch(ok, x, fill))`` over axes along which ``ok`` is the same, with
    ``fill`` 0 or -inf, as ``switch(ok, sum(x), fill)`` (-inf only where those
    axes hold a value: the sum of none is 0)."""
    (summed,) = node.inputs
    if not isinstance(node.op.scalar_op, Add) or summed.owner is None:
        return None
    inner, shape = summed.owner, None
    if isinstance(inner.op, Alloc) and inner.inputs[0].owner is not None:
        # (a vectorized graph broadcasts the switch to its full shape: the sum of
        # the broadcast switch is the switch of the broadcast values' sum)
        inner, shape = inner.inputs[0].owner, inner.inputs[1:]
    if not isinstance(inner.op, Elemwise) or not isinstance(inner.op.scalar_op, Switch):
        return None
    ok, x, fill = inner.inputs
    if shape is not None:
        x = alloc(x, *shape)
    value = scalar_constant(fill)
    plus_zero = value == 0.0 and not np.signbit(value)  # a sum of -0.0s is -0.0, not 0
    axes = tuple(range(summed.ndim)) if node.op.axis is None else tuple(node.op.axis)
    if (not (plus_zero or value == -np.inf) or x.type != summed.type or not axes
            or not all(ok.type.broadcastable[a] for a in axes)):
        return None
    total = node.op(x)
    if plus_zero:
        out = switch(squeeze(ok, axis=axes), total, 0)
    else:
        rows = prod([summed.shape[a] for a in axes])
        out = switch(squeeze(ok, axis=axes), total, switch(eq(rows, 0), 0, -np.inf))
    return [cast(out, node.outputs[0].dtype)]


# The range of each link function, on every input but NaN.
_RANGES = {Sigmoid: (0.0, 1.0), Exp: (0.0, float("inf"))}


def _holds_unless_nan(op, fn_side, bound, low, high):
    """Whether ``f(x) op bound`` (``fn_side`` 0) or ``bound op f(x)`` (1) holds for
    every value ``f`` takes, all in ``[low, high]``."""
    at_least = isinstance(op, GE) == (fn_side == 0)  # f(x) >= bound
    return bound <= low if at_least else bound >= high


@node_rewriter([Elemwise])
def bounded_checks(fgraph, node):
    """``f(x) >= low`` and ``f(x) <= high``, where ``[low, high]`` holds every
    value ``f`` takes (see the module docstring), as ``not isnan(x)``."""
    if not isinstance(node.op.scalar_op, (GE, LE)) or len(node.inputs) != 2:
        return None
    for side, var in enumerate(node.inputs):
        inner = var.owner
        if inner is None or not isinstance(inner.op, Elemwise) or type(inner.op.scalar_op) not in _RANGES:
            continue
        bound = scalar_constant(node.inputs[1 - side])
        x = inner.inputs[0]
        if bound is None or x.type.broadcastable != node.outputs[0].type.broadcastable:
            continue
        if _holds_unless_nan(node.op.scalar_op, side, bound, *_RANGES[type(inner.op.scalar_op)]):
            return [invert(isnan(x))]
    return None
