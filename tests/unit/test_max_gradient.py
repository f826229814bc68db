"""The rewrite that takes a maximum's (or minimum's) gradient from its operands:
same gradients as plain PyTensor, ties, NaN, infinities and broadcasting included,
and the comparison of the output is gone from the graph."""

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import Mode
from pytensor.scalar import EQ
from pytensor.tensor.elemwise import Elemwise

from synkhronos._graph.max_gradient import max_gradient_mode

VALUES = np.array([[1.0, 0.0, -1.0, np.nan, np.inf, -np.inf], [2.0, 3.0, 0.0, 5.0, 0.0, -2.0]], "float32")
ROW = np.array([0.0, 3.0, np.nan, 1.0, np.inf, -2.0], "float32")


def _cases(x, b):
    return {"relu": pt.maximum(x, 0), "min with a row": pt.minimum(x, b), "row first": pt.maximum(b, x),
            "same operand": pt.maximum(x, x), "clip": pt.minimum(pt.maximum(x, -1), 2)}


@pytest.mark.parametrize("optimizer", ["fast_compile", "fast_run"])
@pytest.mark.parametrize("case", sorted(_cases(pt.matrix(), pt.vector())))
def test_gradient_equals_plain_pytensor(optimizer, case):
    mode = Mode(optimizer=optimizer)
    x, b = pt.matrix("x", dtype="float32"), pt.vector("b", dtype="float32")
    expr = _cases(x, b)[case]
    up = np.arange(VALUES.size, dtype="float32").reshape(VALUES.shape) + 1
    grads = pytensor.grad((expr * up).sum(), [x, b], disconnected_inputs="ignore")
    plain = pytensor.function([x, b], grads, mode=mode, on_unused_input="ignore")
    rewritten = pytensor.function([x, b], grads, mode=max_gradient_mode(mode), on_unused_input="ignore")
    for want, got in zip(plain(VALUES, ROW), rewritten(VALUES, ROW)):
        np.testing.assert_array_equal(got, want)
    if case in ("relu", "min with a row", "clip"):
        compares = [n for n in rewritten.maker.fgraph.toposort()
                    if isinstance(n.op, Elemwise) and isinstance(n.op.scalar_op, EQ)]
        assert not compares  # the rewrite fired
