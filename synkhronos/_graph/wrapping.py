"""Ops that compute another Op differently: ``WrappingOp`` applies an Op to the
same inputs, with outputs of the same types, and computes it its own way
(``_graph.jax_shapes.ConcreteShapeOp`` evaluates it with numpy while JAX traces;
``_graph.bf16.Bf16Op`` in bfloat16)."""

from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

__all__ = ["WrappingOp"]


class WrappingOp(Op):
    """``op`` on the same inputs; subclasses say how it is computed.

    Parameters
    ----------
    op : Op
        The wrapped op; its node on the same inputs is ``inner_node(node)``.
    """

    __props__ = ("op",)

    def __init__(self, op):
        self.op = op

    def make_node(self, *inputs):
        inner = self.op.make_node(*inputs)
        return Apply(self, list(inner.inputs), [out.type() for out in inner.outputs])

    def inner_node(self, node):
        """The node of the wrapped op on the same inputs."""
        return self.op.make_node(*node.inputs)

    def infer_shape(self, *args):  # PyTensor 3.3: (node, shapes); before: (fgraph, node, shapes)
        """The wrapped op's shapes."""
        *fgraph, node, shapes = args
        return self.op.infer_shape(*fgraph, self.inner_node(node), shapes)
