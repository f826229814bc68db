"""Rewrites that give a Blockwise of the batched graph a batched form.

``vectorize_graph`` gives each parameter a leading axis of points, and an Op
with no rule for that axis becomes a Blockwise, which the ranks run point by
point.  These rewrites make such a Blockwise plain Ops where the points'
axis allows it (``_vectorized`` applies them):

- ``unlooping()`` (every batched graph): an identity (``unlooped_views``),
  and the Ops that name their axes, ``Join`` and ``LogSumExp``
  (``unlooped_axes``), which a mixture's log-density holds;
- ``shape_unlooping()`` (a graph still looped after that): shapes.  A graph
  that takes a shape of a value computed from a parameter (``arange(n)``
  over a softmax's rows, a categorical's ``p[arange(n), y]``) gets, once
  vectorized, that shape once per point (PyTensor broadcasts the core shape
  to the points), and every Op it reaches becomes a Blockwise looping over
  points whose shapes are all the same.  ``shared_shapes`` keeps one shape
  for all points; ``tightened`` gives the Elemwise it reaches their types
  again; ``revectorized`` vectorizes a Blockwise again with the inputs that
  are the same for every point taken as one; and a product of rows and a
  parameter becomes one matrix product.  A multinomial logit runs batched
  so.
"""

from pytensor.graph.rewriting.basic import node_rewriter
from pytensor.tensor.basic import Alloc
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import DimShuffle, Elemwise
from pytensor.tensor.subtensor import Subtensor

from .._graph.editing import scalar_constant

__all__ = ["shape_unlooping", "unlooping"]


def unlooping():
    """The rewrites that give the Blockwise PyTensor leaves a batched form
    (and drop those that have no points' axis)."""
    from pytensor.tensor.rewriting.blockwise import local_useless_unbatched_blockwise

    return (unlooped_views, unlooped_axes, local_useless_unbatched_blockwise)


def shape_unlooping():
    """The rewrites of shapes taken once per point (module docstring), with
    ``unlooping()``'s."""
    from pytensor.tensor.rewriting.math import local_batched_matmul_to_core_matmul_with_reshape

    return (*unlooping(), shared_shapes, tightened, revectorized,
            local_batched_matmul_to_core_matmul_with_reshape)


@node_rewriter([Blockwise])
def unlooped_views(fgraph, node):
    """A Blockwise of ``ViewOp`` as its input: ``ViewOp`` (what PyMC leaves of a
    ``pm.Deterministic`` in a log-density) is an identity, which PyTensor gives
    no batched form, so a model with a deterministic in its likelihood was
    evaluated one point at a time."""
    from pytensor.compile.ops import ViewOp

    if not isinstance(node.op.core_op, ViewOp):
        return None
    return [node.outputs[0].type.filter_variable(node.inputs[0])]


@node_rewriter([Blockwise])
def unlooped_axes(fgraph, node):
    """A Blockwise of an Op that names the axes it works along, as the Op itself
    along those axes moved past the points' leading axes: ``Join`` (its inputs
    broadcast to the points first) and ``LogSumExp``, which PyTensor gives no
    batched form.  A mixture's log-density (a zero-inflated count, a Normal
    mixture) joins its components' log-densities along an axis and takes their
    log-sum-exp, so such a model was evaluated one point at a time."""
    from pytensor.tensor.basic import Join, join

    core, points = node.op.core_op, node.op.batch_ndim(node)
    if isinstance(core, Join):
        axis, parts = _join_axis(core, node.inputs, points)
        if axis is None:
            return None
        out = join(axis + points, *_broadcast_points(parts, points))
    elif isinstance(core, _log_sum_exp()):
        (x,) = node.inputs
        axes = tuple(a % (x.ndim - points) + points for a in core.axis)
        out = type(core)(axis=axes)(x)
    else:
        return None
    return [node.outputs[0].type.filter_variable(out)]


def _log_sum_exp():
    """PyTensor's ``LogSumExp`` Op (PyTensor 3; 2 writes it as Elemwise and
    reductions, which have a batched form): a type ``isinstance`` takes."""
    try:
        from pytensor.tensor.special import LogSumExp
    except ImportError:
        return ()
    return LogSumExp


def _join_axis(core, inputs, points):
    """``(axis, tensors)`` of a ``Join``'s Blockwise, the axis counted in one
    point's dimensions: PyTensor 3 keeps it in the Op, 2 as the first input
    (a constant there, else ``(None, None)``)."""
    axis = getattr(core, "axis", None)
    parts = list(inputs)
    if axis is None:
        axis = scalar_constant(inputs[0])
        if axis is None:
            return None, None
        parts = parts[1:]
    return int(axis) % (parts[0].ndim - points), parts


def _broadcast_points(parts, points):
    """Each of ``parts`` broadcast along its leading ``points`` axes to the
    points' shape they share: along each such axis, the length of a part whose
    type does not fix it at 1 (PyTensor broadcasts only lengths fixed at 1, so
    every other part has that length too)."""
    from pytensor.tensor import broadcast_to

    shape = [next((p.shape[i] for p in parts if p.type.shape[i] != 1), 1) for i in range(points)]
    return [broadcast_to(p, (*shape, *(p.shape[i] for i in range(points, p.ndim)))) for p in parts]


# ------------------------------------------------------------------ shapes
@node_rewriter([Alloc])
def shared_shapes(fgraph, node):
    """The shape of a batched value ``x`` as PyTensor vectorizes it (its core
    shape ``shape(x)[k:]`` broadcast to the points' shape ``shape(x)[:k]``) as
    that core shape alone, with the points' axes of length 1: every point
    has the same shape, and what takes it broadcasts along those axes."""
    from pytensor.tensor import shape_padleft

    value, *lengths = node.inputs
    points = node.outputs[0].ndim - value.ndim
    x = _shape_of(value)
    if points <= 0 or x is None or value.ndim != 1:
        return None
    if [_shape_of(n, x) for n in lengths[:points]] != [x] * points:
        return None
    return [shape_padleft(value, points)]


def _shape_of(var, x=None):
    """``x`` (or any variable, where ``x`` is None) where ``var`` is ``x``'s
    shape or an index or slice of it (of a slice...); else None."""
    from pytensor.tensor.shape import Shape

    owner = var.owner
    while owner is not None and isinstance(owner.op, Subtensor):
        owner = owner.inputs[0].owner
    if owner is None or not isinstance(owner.op, Shape) or (x is not None and owner.inputs[0] is not x):
        return None
    return owner.inputs[0]


@node_rewriter([Elemwise, DimShuffle, Subtensor])
def tightened(fgraph, node):
    """The node made again from its inputs, where their types now fix more
    lengths at 1 (``shared_shapes``): its outputs' types follow, so that a
    Blockwise it feeds sees which inputs are the same for every point."""
    new = node.op.make_node(*node.inputs)
    if all(n.type == o.type for n, o in zip(new.outputs, node.outputs)):
        return None
    return new.outputs


@node_rewriter([Blockwise])
def revectorized(fgraph, node):
    """A Blockwise with inputs the same for every point (the points' axes of
    length 1) and others not, as the core Op vectorized again with the first
    taken as one value: PyTensor's rule for the Op may batch that (an
    advanced index the same for every point, as ``x[:, idx]``)."""
    from pytensor.graph.replace import vectorize_graph
    from pytensor.graph.traversal import apply_ancestors

    points = node.op.batch_ndim(node)
    axes = tuple(range(points))
    inputs = [i.squeeze(axes) if all(i.type.broadcastable[:points]) else i for i in node.inputs]
    same = [new is not old for new, old in zip(inputs, node.inputs)]
    if not points or all(same) or not any(same):
        return None
    core, dummies = node.op._create_dummy_core_node(node.inputs, return_dummy_inputs=True)
    outputs = vectorize_graph(core.outputs, replace=dict(zip(dummies, inputs)))
    if any(isinstance(n.op, Blockwise) for n in apply_ancestors(outputs, blockers=inputs)):
        return None
    if any(new.ndim != old.ndim for new, old in zip(outputs, node.outputs)):
        return None
    return outputs
