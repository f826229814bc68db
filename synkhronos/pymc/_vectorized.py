"""The ranks' graph of several points at once, where it pays and PyTensor can
build it (the pipeline's fifth stage).

Chains ask for the log-density at their points at about the same time
(``_batch``).  Batched, each parameter gains a leading axis of points and each
output one value (or gradient) per point, so that a rank reads its rows once
for all of them.  It pays where the ranks compile with JAX, and is built only
where PyTensor vectorizes every Op (a Blockwise left in the graph loops over
the points, no faster than one call each); otherwise the ranks evaluate one
point a call.
"""

import dataclasses
import logging

from .._session import runtime
from ._checks import parameter_checks, ranks_checks
from ._graphs import continuous, rewritten
from ._stable import gradient

__all__ = ["vectorized"]

logger = logging.getLogger("synkhronos")


def vectorized(graph, batch, check_bounds):
    """``graph`` (a ``RanksGraph`` of one point) batched where ``batch`` (True,
    False or None: where the ranks compile with JAX) asks for it and PyTensor
    can; as it is otherwise."""
    if batch is None:
        batch = _jax_compiles(graph.single)
    found = batch and _batched(graph.params, graph.single, graph.total, check_bounds)
    if not found:
        return graph
    stacked, outputs = found
    return dataclasses.replace(graph, inputs=stacked, outputs=outputs, batched=True)


def _jax_compiles(outputs):
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

    inputs = [v for v in graph_inputs(outputs) if not isinstance(v, Constant)]
    try:
        with checks_kept():  # as the ranks' linker converts it: checks kept, no warning
            jax_funcify(FunctionGraph(inputs, outputs, clone=True))
    except NotImplementedError:
        return False
    return True


def _batched(params, single, total, check_bounds):
    """``(inputs, outputs)`` of the terms evaluated at several points at once:
    each parameter gains a leading axis of points, and each output one value
    (or gradient) per point, so that a rank reads its rows once for all points.
    None where PyTensor cannot vectorize the graph.

    ``single`` (the log-density and its gradient at one point, checks
    compiled) vectorized, where that needs no more than products made matrix
    products (a GLM's); otherwise ``total`` (the log-density, checks not
    compiled) vectorized and differentiated, which batches more graphs (varying
    slopes, say) but gives 0, not PyMC's value, for the gradient at a point out of
    a parameter's domain, and ran slower on a GPU (docs page "PyMC")."""
    import pytensor.tensor as pt
    from pytensor.graph.replace import vectorize_graph

    stacked = [pt.tensor(dtype=p.dtype, shape=(None,) + p.type.shape, name=p.name) for p in params]
    replace = dict(zip(params, stacked))
    try:
        outputs = vectorize_graph(single, replace=replace)
        if _looped(outputs):
            outputs = _core_products(outputs)
        if _looped(outputs):
            outputs = _differentiated(vectorize_graph(total, replace=replace), params, stacked, check_bounds)
    except Exception as exc:
        why = "%s: %s" % (type(exc).__name__, exc)
    else:
        looped = _looped(outputs)
        if not looped:
            return stacked, ranks_checks(outputs)
        why = "no batched form of %s" % ", ".join(looped)
    logger.info("synkhronos.pymc: one point at a time on the ranks (%s)", why)
    return None


def _differentiated(batched, params, stacked, check_bounds):
    """The batched log-density ``batched`` with its gradient with respect to the
    continuous ``stacked`` (the batched ``params``), checks compiled."""
    from pytensor.graph.rewriting.utils import rewrite_graph

    grads = gradient(batched, [s for s, p in zip(stacked, params) if continuous(p)])
    outputs = parameter_checks([batched] + grads, check_bounds)
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
