"""The ranks' log-density and its gradient as PyMC compiles its own: stabilized
before it is differentiated, and PyMC's parameter checks compiled in.

Stabilized, as PyTensor 3 does it.  PyMC differentiates a log-density after
PyTensor's canonicalize and stabilize (``rewrite_pregrad``).  PyTensor 2.38's
canonicalize writes ``-x`` as ``-1 * x``, which hides a Bernoulli's
``log1p(-sigmoid(eta))`` from the stabilize rule that makes it
``-softplus(eta)``: its gradient then is ``-s(1 - s) / (1 - s)``, NaN where
``s`` rounds to 1 (``eta`` above 37), and a GPU rank computes it slower.
PyTensor 3.3 gives ``-softplus(eta)``, whose gradient is ``-s``;
``log1p_minus_sigmoid`` is its rule for ``-1 * x``, and ``gradient`` takes
every gradient of the ranks' graph as PyMC takes its own.

Checks.  PyMC guards a log-density with checks on its parameters
(``check_parameters``): outside the domain the log-density is -inf.
``parameter_checks`` compiles them as PyMC compiles them (the batched graph's
own forms of them are ``_vectorized``'s).
"""

from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.scalar.basic import Log1p, Mul
from pytensor.scalar.math import Sigmoid
from pytensor.tensor.elemwise import Elemwise

from .._graph.editing import rewritten, scalar_constant

__all__ = ["gradient", "log1p_minus_sigmoid", "parameter_checks", "stabilized"]


def _elemwise(var, scalar_op):
    node = var.owner
    if node is not None and isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, scalar_op):
        return node
    return None


@node_rewriter([Elemwise])
def log1p_minus_sigmoid(fgraph, node):
    """``log1p(-1 * sigmoid(x))`` as ``-softplus(x)``."""
    import pytensor.tensor as pt

    if not isinstance(node.op.scalar_op, Log1p):
        return None
    product = _elemwise(node.inputs[0], Mul)
    if product is None or len(product.inputs) != 2:
        return None
    for minus_one, other in (product.inputs, product.inputs[::-1]):
        sigmoid = _elemwise(other, Sigmoid)
        if sigmoid is not None and scalar_constant(minus_one) == -1.0:
            out = pt.cast(-pt.softplus(sigmoid.inputs[0]), node.outputs[0].dtype)
            return [out] if out.type == node.outputs[0].type else None
    return None


def stabilized(var):
    """``var`` (rewritten in place) with ``log1p_minus_sigmoid`` applied."""
    return rewritten([var], log1p_minus_sigmoid)[0]


def gradient(total, wrt):
    """The gradient of ``total`` (summed first where it holds one value per
    point) with respect to each of ``wrt`` (zero where it does not depend on
    one: one term of several may not), taken as PyMC takes its own: of the
    log-density stabilized first (log(sigmoid(x)) as -softplus(-x), say, and
    ``log1p_minus_sigmoid``), or it differs at saturating points.  (The
    rewrites work in place: on a copy, so that ``total`` stays PyMC's graph.)"""
    import pytensor
    from pymc.pytensorf import rewrite_pregrad
    from pytensor.graph.replace import clone_replace

    if not wrt:
        return []
    return pytensor.grad(stabilized(rewrite_pregrad(clone_replace(total))).sum(), wrt,
                         disconnected_inputs="ignore")


def parameter_checks(outputs, check_bounds):
    """``outputs`` with PyMC's parameter checks as PyMC compiles them: a log-density
    of -inf where a parameter is out of its domain (``model.check_bounds=False``:
    no check), rather than an error raised on a rank, or no check under JAX.

    PyMC's rule alone, not the ``canonicalize`` pass it sits in: that pass ran
    for minutes on the gradient of a censored likelihood (PyTensor 2.38)."""
    from pymc.logprob.utils import local_check_parameter_to_ninf_switch, local_remove_check_parameter

    return rewritten(outputs, local_check_parameter_to_ninf_switch if check_bounds
                      else local_remove_check_parameter)
