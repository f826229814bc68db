"""The ranks' graph of several points at once, where it pays and PyTensor can
build it (the pipeline's fifth stage).

Chains ask for the log-density at their points at about the same time
(``_batch``).  Batched, each parameter gains a leading axis of points and each
output one value (or gradient) per point, so that a rank reads its rows once
for all of them.  It pays where the ranks compile with JAX, and is built only
where PyTensor vectorizes every Op (a Blockwise left in the graph loops over
the points, no faster than one call each); otherwise the ranks evaluate one
point a call.

A batched graph compiled as PyMC compiles its parameter checks
(``_gradient.parameter_checks``) sums ``switch(ok, logp, -inf)`` over a term's
rows, where ``ok`` reduces a condition over every row first: two reductions,
one after the other, over the same rows.  Two rewrites that keep every value
(a sum may add its terms in another order, as a compiler may anyway) make the
batched graph's checks cheaper under JAX:

- ``summed_checks``: a sum over rows of ``switch(ok, x, -inf)`` (or ``0``), where
  ``ok`` is the same for every row, is ``switch(ok, sum(x), -inf)``: the two
  reductions become independent and XLA computes them in one pass;
- ``bounded_checks``: a check of a link function's output against that
  function's own range, as the Bernoulli's ``0 <= sigmoid(eta) <= 1``, fails
  only where its argument is NaN; it becomes ``not isnan(eta)``, which saves a
  transcendental per row and point.

See the docs page "PyMC" for what they measured.
"""

import dataclasses
import logging

import numpy as np
from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.scalar.basic import GE, LE, Add, Exp, Switch
from pytensor.scalar.math import Sigmoid
from pytensor.tensor import cast, eq, invert, isnan, prod, squeeze, switch
from pytensor.tensor.basic import Alloc, alloc
from pytensor.tensor.elemwise import CAReduce, Elemwise

from .._graph.editing import continuous, rewritten, scalar_constant
from .._session import runtime
from ._gradient import gradient, parameter_checks
from ._unlooped import shape_unlooping, unlooping

__all__ = ["bounded_checks", "jax_compiles", "summed_checks", "vectorized"]

logger = logging.getLogger("synkhronos")


def vectorized(graph, batch, check_bounds):
    """``graph`` (a ``RanksGraph`` of one point) batched where ``batch`` (True,
    False or None: where the ranks compile with JAX) asks for it and PyTensor
    can; as it is otherwise."""
    if batch is None:
        batch = jax_compiles(graph.single)
    found = batch and _batched(graph.params, graph.single, graph.totals, check_bounds)
    if not found:
        return graph
    stacked, outputs = found
    return dataclasses.replace(graph, inputs=stacked, outputs=outputs, batched=True)


def jax_compiles(outputs):
    """Whether the ranks compile ``outputs`` with JAX: GPU ranks, and CPU ranks
    where JAX is Synkhronos' default linker, for a graph PyTensor's JAX backend
    converts (a batched pass pays only there: see the docs page "PyMC")."""
    from pytensor.graph.basic import Constant
    from pytensor.graph.fg import FunctionGraph
    from pytensor.graph.traversal import graph_inputs

    device = runtime.require().device
    if device.name != "gpu" and not device.jax_default:
        return False
    from pytensor.link.jax.dispatch import jax_funcify

    from .._graph.jax_checks import checks_kept

    # Converting constants starts JAX's backend in this process: on this rank's
    # cores, as a rank's function would start it, not on all (its pool would
    # crowd the workers' cores at every call).
    device.start_jax_pool()
    inputs = [v for v in graph_inputs(outputs) if not isinstance(v, Constant)]
    try:
        with checks_kept():  # as the ranks' linker converts it: checks kept, no warning
            jax_funcify(FunctionGraph(inputs, outputs, clone=True))
    except NotImplementedError:
        return False
    return True


def _batched(params, single, totals, check_bounds):
    """``(inputs, outputs)`` of the terms evaluated at several points at once:
    each parameter gains a leading axis of points, and each output one value
    (or gradient) per point, so that a rank reads its rows once for all points.
    None where PyTensor cannot vectorize the graph.

    ``single`` (the log-density and its gradient at one point, checks
    compiled) vectorized, where that needs no more than products made matrix
    products (a GLM's); otherwise ``totals`` (each term's log-density, checks
    not compiled) vectorized and differentiated, which batches more graphs (varying
    slopes, say) but gives 0, not PyMC's value, for the gradient at a point out of
    a parameter's domain, and ran slower on a GPU (docs page "PyMC"); where that
    loops still, the same with the shapes taken once per point made one
    (``_unlooped.shape_unlooping``: a multinomial logit).  Graphs batched by the
    ways before do not meet the last one's rewrites."""
    import pytensor.tensor as pt
    from pytensor.graph.replace import vectorize_graph

    # (TensorType, not pt.tensor: pt.tensor reads a name such as bambi's
    # "1|group_sigma" as a dtype string, and fails)
    stacked = [pt.TensorType(p.dtype, shape=(None,) + p.type.shape)(name=p.name) for p in params]
    replace = dict(zip(params, stacked))
    try:
        outputs = rewritten(vectorize_graph(single, replace=replace), *unlooping())
        if _looped(outputs):
            outputs = _core_products(outputs)
        for rules in (unlooping(), shape_unlooping()):
            if _looped(outputs):
                batched = rewritten(vectorize_graph(list(totals), replace=replace), *rules)
                outputs = rewritten(_differentiated(batched, params, stacked, check_bounds), *rules)
    except Exception as exc:
        why = "%s: %s" % (type(exc).__name__, exc)
    else:
        looped = _looped(outputs)
        if not looped:  # both check rewrites in one pass (the docs page "PyMC" has each alone)
            return stacked, rewritten(outputs, summed_checks, bounded_checks)
        why = "no batched form of %s" % ", ".join(looped)
    logger.info("synkhronos.pymc: one point at a time on the ranks (%s)", why)
    return None


def _differentiated(batched, params, stacked, check_bounds):
    """The batched log-densities ``batched`` (one per term) with the gradient
    of each with respect to the continuous ``stacked`` (the batched
    ``params``), in the ranks' order of outputs, checks compiled."""
    from pytensor.graph.rewriting.utils import rewrite_graph

    wrt = [s for s, p in zip(stacked, params) if continuous(p)]
    grads = [g for total in batched for g in gradient(total, wrt)]
    outputs = parameter_checks(list(batched) + grads, check_bounds)
    if _looped(outputs):  # (canonicalize ran for minutes on the first way's Gamma GLM, 0.2 s here)
        outputs = list(rewrite_graph(outputs, include=("canonicalize",)))
    return outputs


def _core_products(outputs):
    """``outputs`` with each product of one batched side made one matrix product
    (and Blockwise with no batched input plain), by those rewrites alone: the
    ranks' compiling rewrites the rest.  PyTensor's whole canonicalize,
    stabilize and specialize here turned a Normal's gradient into a graph that
    asserts one row per rank, and ran for minutes on a Gamma GLM's."""
    from pytensor.tensor.rewriting.blockwise import (
        local_eager_useless_unbatched_blockwise,
        local_useless_unbatched_blockwise,
    )
    from pytensor.tensor.rewriting.math import local_batched_matmul_to_core_matmul

    return rewritten(outputs, local_batched_matmul_to_core_matmul, local_useless_unbatched_blockwise,
                     local_eager_useless_unbatched_blockwise)


def _looped(outputs):
    """The Ops of ``outputs`` left with no rule for a leading axis: each stays a
    Blockwise, which loops over the points one by one (no faster than one point
    a call)."""
    from pytensor.graph.traversal import apply_ancestors
    from pytensor.tensor.blockwise import Blockwise

    return sorted({str(n.op.core_op) for n in apply_ancestors(outputs) if isinstance(n.op, Blockwise)})


# ------------------------------------------------------------ the batched checks
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
