"""Shape arithmetic that JAX sees as concrete numbers.

Under ``jax.jit`` an array's shape is a tuple of Python ints, but PyTensor's JAX
backend computes everything derived from it (``(h - k) // s + 1`` for a pooled
image, ``n * c`` for a flattened one) with ``jax.numpy``, which turns those ints
into traced values.  Wherever such a value becomes a shape again (``reshape``,
``zeros``, ``arange``), JAX then refuses it: "Shapes must be 1D sequences of
concrete values of integer type".  That is why the gradient of a CNN with a
``tensor4`` input of unknown size failed on GPU ranks while its forward pass,
which needs no such shape, compiled.

The rewrite here wraps every node that computes only from shapes and constants
(scalar ops and ``Elemwise``, casts between scalars and tensors, ``MakeVector``,
``ARange``) in ``ConcreteShapeOp``, whose JAX implementation runs the node's own
``perform`` with numpy while the inputs are concrete, and falls back to the
traced implementation otherwise.  JAX then specialises each shape as usual: one trace
per input shape, cached by ``jax.jit``; PyTensor compiles the function once.

Checks whose conditions come from shapes alone (PyTensor asserts that inputs of
unknown shape broadcast) are wrapped in ``ConcreteCheck`` and run when JAX
traces, where PyTensor's JAX backend would drop them with a warning; a shape
that passed such a check counts as a shape still.  Checks of data are
``_graph.jax_checks``'s.

Synkhronos adds the rewrite (tag ``synk_concrete_shapes``) to the modes of its
JAX-mode functions only (``jax_mode``); other PyTensor functions are unchanged.
"""

import functools

import numpy as np
from pytensor.compile import optdb
from pytensor.compile.mode import get_mode
from pytensor.graph.basic import Apply, Constant
from pytensor.graph.op import Op
from pytensor.graph.rewriting.basic import GraphRewriter
from pytensor.raise_op import CheckAndRaise
from pytensor.scalar.basic import ScalarOp
from pytensor.tensor.basic import ARange, MakeVector, ScalarFromTensor, TensorFromScalar
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.shape import Shape_i

from .wrapping import WrappingOp

__all__ = ["ConcreteCheck", "ConcreteShapeOp", "ConcreteShapes", "TAG", "jax_mode"]

TAG = "synk_concrete_shapes"


class ConcreteShapeOp(WrappingOp):
    """``op`` applied to values known when JAX traces (shapes and constants);
    evaluated with numpy at trace time (see module docstring)."""

    def perform(self, node, inputs, outputs):
        self.op.perform(self.inner_node(node), inputs, outputs)

    def __str__(self):
        return "Concrete{%s}" % (self.op,)


class ConcreteCheck(Op):
    """A PyTensor check (``Assert``, ``CheckAndRaise``) whose conditions are
    computed from shapes: checked when JAX traces, instead of being dropped with
    a warning as PyTensor's JAX backend drops every check.  PyTensor adds such
    checks where shapes must agree (say, broadcasting two inputs of unknown
    shapes)."""

    __props__ = ("op",)
    view_map = {0: [0]}

    def __init__(self, op):
        self.op = op

    def make_node(self, value, *conditions):
        inner = self.op.make_node(value, *conditions)
        return Apply(self, list(inner.inputs), [inner.outputs[0].type()])

    def perform(self, node, inputs, outputs):
        self.op.perform(self.op.make_node(*node.inputs), inputs, outputs)

    def infer_shape(self, *args):  # PyTensor 3.3: (node, shapes); before: (fgraph, node, shapes)
        shapes = args[-1]
        return [shapes[0]]

    def __str__(self):
        return "Concrete{%s}" % (self.op,)


_WRAPPED = (ScalarOp, Elemwise, ScalarFromTensor, TensorFromScalar, MakeVector, ARange)


def _wrappable(node, concrete):
    if not isinstance(node.op, _WRAPPED):
        return False
    if isinstance(node.op, Elemwise) and any(out.ndim for out in node.outputs):
        return False  # shapes are scalars; a tensor result is data
    inputs = [i for i in node.inputs if not isinstance(i, Constant)]
    return bool(inputs) and all(i in concrete for i in inputs)


def _wrappable_check(node, concrete):
    conditions = [c for c in node.inputs[1:] if not isinstance(c, Constant)]
    return bool(conditions) and all(c in concrete for c in conditions)


class ConcreteShapes(GraphRewriter):
    """Wrap the nodes that compute only from shapes in ``ConcreteShapeOp``."""

    def apply(self, fgraph):
        concrete = set()
        new_of = {}  # output of a wrapped node -> the same output of its wrapper
        for node in fgraph.toposort():
            if isinstance(node.op, (Shape_i, ConcreteShapeOp)):
                concrete.update(node.outputs)
            elif isinstance(node.op, CheckAndRaise) and _wrappable_check(node, concrete):
                new = ConcreteCheck(node.op).make_node(*[new_of.get(i, i) for i in node.inputs])
                new_of[node.outputs[0]] = new.outputs[0]
                if node.inputs[0] in concrete:  # a checked shape: a shape still (PyTensor checks
                    concrete.add(node.outputs[0])  # that broadcast shapes agree, then uses one)
            elif _wrappable(node, concrete):
                # A wrapper reads the wrappers of its inputs, so that replacing
                # brings no wrapped node back into the graph.
                new = ConcreteShapeOp(node.op).make_node(*[new_of.get(i, i) for i in node.inputs])
                new_of.update(zip(node.outputs, new.outputs))
                concrete.update(node.outputs)
        if new_of:
            fgraph.replace_all(list(new_of.items()), reason=TAG, import_missing=True)


# After PyTensor's own JAX rewrites (position 100), which turn shape vectors
# into tuples, and after fusion, which builds the Composite scalars wrapped here.
optdb.register("synk_concrete_shapes_rewrite", ConcreteShapes(), TAG, position=100.5)


def _register_jax():
    import jax
    from pytensor.link.jax.dispatch import jax_funcify

    @jax_funcify.register(ConcreteShapeOp)
    def _jax_concrete_shape(op, node, **kwargs):
        inner = op.inner_node(node)
        try:
            traced = jax_funcify(op.op, node=inner, **kwargs)
        except NotImplementedError as exc:  # e.g. ARange of values only known when traced
            traced = functools.partial(_refuse, exc)
        dtypes = [i.type.dtype for i in inner.inputs]
        single = len(inner.outputs) == 1

        def concrete_shape(*args):
            if any(isinstance(a, jax.core.Tracer) for a in args):
                return traced(*args)
            storage = [[None] for _ in inner.outputs]
            op.op.perform(inner, [np.asarray(a, dtype=d) for a, d in zip(args, dtypes)], storage)
            return storage[0][0] if single else [s[0] for s in storage]

        return concrete_shape

    @jax_funcify.register(ConcreteCheck)
    def _jax_concrete_check(op, node, **kwargs):
        def concrete_check(value, *conditions):
            if any(isinstance(c, jax.core.Tracer) for c in conditions):
                # ConcreteShapes wraps only checks of shapes, which JAX knows as it
                # traces: refuse rather than drop the check, were that ever untrue.
                raise NotImplementedError("%s: its condition is not known when JAX traces" % op.op)
            if not all(np.all(c) for c in conditions):
                raise op.op.exc_type(op.op.msg)
            return value

        return concrete_check


def _refuse(exc, *args):
    raise exc


_register_jax()


def jax_mode(mode):
    """``mode`` (JAX) with the concrete-shape rewrite included."""
    return get_mode(mode).including(TAG)  # get_mode returns a Mode as it is
