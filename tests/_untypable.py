"""A user Op whose Numba implementation cannot compile (it adds text to a
number): Numba fails only when the graph is compiled, after PyTensor built it."""

import pytensor.tensor as pt
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op
from pytensor.link.numba.dispatch import numba_funcify

__all__ = ["untypable"]


class Untypable(Op):
    __props__ = ()

    def make_node(self, x):
        x = pt.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0].copy()


@numba_funcify.register(Untypable)
def _numba_untypable(op, **kwargs):
    from pytensor.link.numba.dispatch.basic import numba_njit

    @numba_njit
    def untypable(x):
        return x + "text"

    return untypable


untypable = Untypable()
