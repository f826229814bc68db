"""The rewrite that keeps elementwise work at its operands' own axes: the
gradient of a matrix-vector product divided by a scale is one pass over the rows
(no elementwise node over an added axis left), and any elementwise expression
over operands that add or hold axes of length 1 gives the values numpy gives,
with and without PyTensor's rewrites (Hypothesis).  That Synkhronos functions
include it: ``test_linking``."""

import numpy as np
import pytensor
import pytensor.tensor as pt
from hypothesis import given, settings
from hypothesis import strategies as st
from pytensor.compile.mode import Mode
from pytensor.tensor.elemwise import DimShuffle, Elemwise

from synkhronos._graph.expand_dims import expand_dims_sunk_mode


def _over_added_axes(fn):
    """The elementwise nodes of ``fn`` whose output has axes of length 1 that an
    operand added."""
    def added(var, axes):
        return var.owner is not None and isinstance(var.owner.op, DimShuffle) and any(
            var.owner.op.new_order[k] == "x" for k in axes)

    nodes = [n for n in fn.maker.fgraph.toposort() if isinstance(n.op, Elemwise)]
    return [n for n in nodes if any(added(i, [k for k, d in enumerate(n.outputs[0].type.shape) if d == 1])
                                    for i in n.inputs)]


def test_the_gradient_of_a_matrix_vector_product_is_one_pass():
    """A normal likelihood ``y ~ N(X @ b, s)``: its gradient for ``b`` reads
    ``(y - X @ b) / s**2``, which PyTensor's lift leaves over ``(n, 1)``."""
    x, y, b, s = pt.matrix("x"), pt.vector("y"), pt.vector("b"), pt.scalar("s")
    logp = (-0.5 * ((y - x @ b) / s) ** 2).sum()
    grad = pytensor.grad(logp, b)
    rng = np.random.default_rng(0)
    args = rng.standard_normal((50, 3)), rng.standard_normal(50), rng.standard_normal(3), 1.7
    mode = Mode(optimizer="fast_run").excluding("BlasOpt")  # (a BLAS product needs no added axis)
    plain = pytensor.function([x, y, b, s], [logp, grad], mode=mode)
    sunk = pytensor.function([x, y, b, s], [logp, grad], mode=expand_dims_sunk_mode(mode))
    assert _over_added_axes(plain), "the premise: PyTensor alone leaves one"
    assert not _over_added_axes(sunk)
    r = (args[1] - args[0] @ args[2]) / args[3] ** 2
    for got in (plain(*args), sunk(*args)):
        np.testing.assert_allclose(got[1], args[0].T @ r, rtol=1e-12)


_OPS = [pt.add, pt.mul, pt.true_div, pt.maximum, lambda a, b: pt.exp(a) - b]


@st.composite
def _expressions(draw):
    """An output's number of axes, which of them have length 1, and operands
    that hold each such axis as an added axis, an axis of their own of length
    1, or (a scalar) as every axis added."""
    ndim = draw(st.integers(1, 3))
    ones = draw(st.sets(st.integers(0, ndim - 1), min_size=1, max_size=ndim))
    shape = [1 if k in ones else draw(st.integers(2, 4)) for k in range(ndim)]
    kinds = [draw(st.sampled_from(["added", "own", "some added"]))]  # (one operand has the output's shape)
    kinds += draw(st.lists(st.sampled_from(["added", "own", "scalar", "some added"]), max_size=3))
    ops = draw(st.lists(st.integers(0, len(_OPS) - 1), min_size=len(kinds) - 1, max_size=len(kinds) - 1))
    return shape, sorted(ones), kinds, ops


def _operand(kind, shape, ones, rng, k):
    """``(variable, value as the operand holds it, value at the output's axes)``."""
    if kind == "scalar":
        v, val = pt.dscalar("s%d" % k), np.float64(rng.uniform(0.5, 2))
        return v.dimshuffle(["x"] * len(shape)), val, val
    added = ones if kind == "added" else ones[:1] if kind == "some added" else []
    inner = [d for j, d in enumerate(shape) if j not in added]
    v = pt.tensor("x%d" % k, dtype="float64", shape=tuple(1 if d == 1 else None for d in inner))
    val = rng.uniform(0.5, 2, inner)
    order, it = [], iter(range(len(inner)))
    for j in range(len(shape)):
        order.append("x" if j in added else next(it))
    return (v.dimshuffle(order) if added else v), val, val.reshape(shape)


@settings(max_examples=60, deadline=None)
@given(_expressions(), st.sampled_from(["fast_compile", "fast_run"]))
def test_any_expression_over_added_axes_equals_numpy(case, optimizer):
    shape, ones, kinds, ops = case
    rng = np.random.default_rng(len(kinds))
    parts = [_operand(kind, shape, ones, rng, k) for k, kind in enumerate(kinds)]
    expr, want = parts[0][0], np.broadcast_to(parts[0][2], shape)
    for op, (var, _, full) in zip(ops, parts[1:]):
        expr = _OPS[op](expr, var)
        want = _OPS[op](pt.as_tensor(want), pt.as_tensor(full)).eval()
    inputs = [v.owner.inputs[0] if v.owner is not None else v for v, _, _ in parts]
    inputs = list(dict.fromkeys(inputs))
    values = {id(v.owner.inputs[0] if v.owner is not None else v): val for v, val, _ in parts}
    fn = pytensor.function(inputs, expr, mode=expand_dims_sunk_mode(Mode(optimizer=optimizer)))
    got = fn(*[values[id(v)] for v in inputs])
    assert got.shape == tuple(shape)
    np.testing.assert_allclose(got, np.broadcast_to(want, shape), rtol=1e-14)
    if optimizer == "fast_run":
        assert not _over_added_axes(fn)
